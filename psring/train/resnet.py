"""ResNet-50 and ResNet-101 (He et al. 2016, "v1.5": the stride in the 3x3 convolution of a bottleneck, as
torchvision's), written in plain torch: 25,557,032 and 44,549,160 parameters at 1,000 classes, torchvision's
``resnet50`` and ``resnet101`` exactly (tested).

Its gradients are a few large tensors (the 2048x512 and 512x2048 1x1 convolutions, the 3x3 ones of the
last stage, the 2048x1000 classifier) beside 106 small BatchNorm vectors, so how they split into buckets
and server shards decides more than for a model of equal tensors (ViT's).
"""
from __future__ import annotations

import torch
from torch import nn

WIDTHS = (64, 128, 256, 512)
BLOCKS = (3, 4, 6, 3)
BLOCKS_101 = (3, 4, 23, 3)
EXPANSION = 4


class Bottleneck(nn.Module):
    def __init__(self, c_in: int, width: int, stride: int):
        super().__init__()
        c_out = width * EXPANSION
        self.conv1 = nn.Conv2d(c_in, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, c_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet50(nn.Module):
    """ImageNet's stem (7x7 stride 2, max-pool), four stages of bottlenecks, global average pooling: any
    input of at least 32x32 pixels."""

    def __init__(self, num_classes: int = 1000, blocks: tuple[int, ...] = BLOCKS):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, c_in = [], 64
        for i, (width, n) in enumerate(zip(WIDTHS, blocks)):
            blocks = []
            for j in range(n):
                blocks.append(Bottleneck(c_in, width, 2 if (j == 0 and i > 0) else 1))
                c_in = width * EXPANSION
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, num_classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))
