"""ImageNet models of published scaling results, for ``psring simulate`` to replay their gradients: use them
as factories, ``--model psring.train.zoo:resnet101``, ``psring.train.zoo:vgg16`` or
``psring.train.zoo:inception_v3`` (1,000 classes, any input side of at least 32; Inception V3's of at least 75, 299
as published). Written in plain torch with torchvision's parameter counts (tested): ResNet-101 44,549,160, VGG-16
138,357,544, Inception V3 23,834,568 (``inception.py``, without the auxiliary head). They are not in ``psring
train``'s own list (``models.MODELS``): training them needs a measured memory footprint
(``launch/resources.py``), and on 2 CPU cores a step of any of them takes longer than any sweep here allows.

VGG-16's gradients are the opposite of ResNet's: 89% of its 553 MB sit in the first fully connected layer
(25,088 x 4,096) and the two after it, which backward reaches first, in a few percent of its time.
"""
from __future__ import annotations

import torch
from torch import nn

from .inception import Inception3
from .resnet import BLOCKS_101, ResNet50

VGG16_CONVS = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


class VGG16(nn.Module):
    """Simonyan and Zisserman's configuration D without BatchNorm, torchvision's layout: 13 3x3
    convolutions, average-pooled to 7x7, three fully connected layers with dropout."""

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        layers, c_in = [], 3
        for v in VGG16_CONVS:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(c_in, v, 3, padding=1), nn.ReLU(inplace=True)]
                c_in = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(),
            nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(),
            nn.Linear(4096, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def resnet101() -> nn.Module:
    return ResNet50(1000, BLOCKS_101)


def vgg16() -> nn.Module:
    return VGG16(1000)


def inception_v3() -> nn.Module:
    return Inception3(1000)
