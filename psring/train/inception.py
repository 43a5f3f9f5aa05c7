"""Inception V3 (Szegedy et al., "Rethinking the Inception Architecture", 2015) in plain torch, torchvision's
layout and parameter names (``Conv2d_1a_3x3`` ... ``Mixed_7c``, ``fc``): 23,834,568 parameters without the
auxiliary classifier, 27,161,264 with it (torchvision's count; tested). ``psring.train.zoo:inception_v3`` is the
model of Horovod's published Inception V3 scaling, replayed by ``psring simulate`` (tf_cnn_benchmarks'
``inception3`` has no auxiliary head, so the zoo's has none either). Input 299 x 299 (75 and up run)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BasicConv2d(nn.Sequential):
    """Convolution without bias, batch norm (eps 0.001), ReLU."""

    def __init__(self, c_in: int, c_out: int, **kw):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, bias=False, **kw)
        self.bn = nn.BatchNorm2d(c_out, eps=0.001)
        self.relu = nn.ReLU(inplace=True)


def _avg3(x: torch.Tensor) -> torch.Tensor:
    return F.avg_pool2d(x, 3, stride=1, padding=1)


class InceptionA(nn.Module):  # 35 x 35: 1x1, 5x5, double 3x3, pool
    def __init__(self, c_in: int, pool_features: int):
        super().__init__()
        self.branch1x1 = BasicConv2d(c_in, 64, kernel_size=1)
        self.branch5x5_1 = BasicConv2d(c_in, 48, kernel_size=1)
        self.branch5x5_2 = BasicConv2d(48, 64, kernel_size=5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(c_in, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, padding=1)
        self.branch_pool = BasicConv2d(c_in, pool_features, kernel_size=1)

    def forward(self, x):
        return torch.cat([self.branch1x1(x), self.branch5x5_2(self.branch5x5_1(x)),
                          self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x))),
                          self.branch_pool(_avg3(x))], 1)


class InceptionB(nn.Module):  # 35 -> 17: strided 3x3, double 3x3, max pool
    def __init__(self, c_in: int):
        super().__init__()
        self.branch3x3 = BasicConv2d(c_in, 384, kernel_size=3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(c_in, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, stride=2)

    def forward(self, x):
        return torch.cat([self.branch3x3(x), self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x))),
                          F.max_pool2d(x, 3, stride=2)], 1)


def _row(c_in: int, c_out: int) -> BasicConv2d:
    return BasicConv2d(c_in, c_out, kernel_size=(1, 7), padding=(0, 3))


def _col(c_in: int, c_out: int) -> BasicConv2d:
    return BasicConv2d(c_in, c_out, kernel_size=(7, 1), padding=(3, 0))


class InceptionC(nn.Module):  # 17 x 17: factorised 7x7 (1x7 then 7x1), twice in the double branch
    def __init__(self, c_in: int, channels_7x7: int):
        super().__init__()
        c7 = channels_7x7
        self.branch1x1 = BasicConv2d(c_in, 192, kernel_size=1)
        self.branch7x7_1 = BasicConv2d(c_in, c7, kernel_size=1)
        self.branch7x7_2, self.branch7x7_3 = _row(c7, c7), _col(c7, 192)
        self.branch7x7dbl_1 = BasicConv2d(c_in, c7, kernel_size=1)
        self.branch7x7dbl_2, self.branch7x7dbl_3 = _col(c7, c7), _row(c7, c7)
        self.branch7x7dbl_4, self.branch7x7dbl_5 = _col(c7, c7), _row(c7, 192)
        self.branch_pool = BasicConv2d(c_in, 192, kernel_size=1)

    def forward(self, x):
        b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        d = self.branch7x7dbl_1(x)
        for conv in (self.branch7x7dbl_2, self.branch7x7dbl_3, self.branch7x7dbl_4, self.branch7x7dbl_5):
            d = conv(d)
        return torch.cat([self.branch1x1(x), b7, d, self.branch_pool(_avg3(x))], 1)


class InceptionD(nn.Module):  # 17 -> 8: strided 3x3, 7x7 then strided 3x3, max pool
    def __init__(self, c_in: int):
        super().__init__()
        self.branch3x3_1 = BasicConv2d(c_in, 192, kernel_size=1)
        self.branch3x3_2 = BasicConv2d(192, 320, kernel_size=3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(c_in, 192, kernel_size=1)
        self.branch7x7x3_2, self.branch7x7x3_3 = _row(192, 192), _col(192, 192)
        self.branch7x7x3_4 = BasicConv2d(192, 192, kernel_size=3, stride=2)

    def forward(self, x):
        b7 = self.branch7x7x3_1(x)
        for conv in (self.branch7x7x3_2, self.branch7x7x3_3, self.branch7x7x3_4):
            b7 = conv(b7)
        return torch.cat([self.branch3x3_2(self.branch3x3_1(x)), b7, F.max_pool2d(x, 3, stride=2)], 1)


class InceptionE(nn.Module):  # 8 x 8: 3x3 split into 1x3 and 3x1 side by side
    def __init__(self, c_in: int):
        super().__init__()
        self.branch1x1 = BasicConv2d(c_in, 320, kernel_size=1)
        self.branch3x3_1 = BasicConv2d(c_in, 384, kernel_size=1)
        self.branch3x3_2a = BasicConv2d(384, 384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, kernel_size=(3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(c_in, 448, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, kernel_size=3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(384, 384, kernel_size=(3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(c_in, 192, kernel_size=1)

    def forward(self, x):
        b3 = self.branch3x3_1(x)
        d = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        return torch.cat([self.branch1x1(x), self.branch3x3_2a(b3), self.branch3x3_2b(b3),
                          self.branch3x3dbl_3a(d), self.branch3x3dbl_3b(d), self.branch_pool(_avg3(x))], 1)


class InceptionAux(nn.Module):  # the auxiliary classifier on the 17 x 17 grid (training only)
    def __init__(self, c_in: int, num_classes: int):
        super().__init__()
        self.conv0 = BasicConv2d(c_in, 128, kernel_size=1)
        self.conv1 = BasicConv2d(128, 768, kernel_size=5)
        self.fc = nn.Linear(768, num_classes)

    def forward(self, x):
        x = self.conv1(self.conv0(F.avg_pool2d(x, 5, stride=3)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Inception3(nn.Module):
    """The stem, three 35 x 35 blocks, a reduction, four 17 x 17 blocks, a reduction, two 8 x 8 blocks, the
    classifier (dropout 0.5). With ``aux_logits`` the auxiliary head is registered (its parameters counted) but,
    as torchvision's in eval mode, not part of the output."""

    def __init__(self, num_classes: int = 1000, aux_logits: bool = False):
        super().__init__()
        self.Conv2d_1a_3x3 = BasicConv2d(3, 32, kernel_size=3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(32, 32, kernel_size=3)
        self.Conv2d_2b_3x3 = BasicConv2d(32, 64, kernel_size=3, padding=1)
        self.maxpool1 = nn.MaxPool2d(3, stride=2)
        self.Conv2d_3b_1x1 = BasicConv2d(64, 80, kernel_size=1)
        self.Conv2d_4a_3x3 = BasicConv2d(80, 192, kernel_size=3)
        self.maxpool2 = nn.MaxPool2d(3, stride=2)
        self.Mixed_5b, self.Mixed_5c, self.Mixed_5d = InceptionA(192, 32), InceptionA(256, 64), InceptionA(288, 64)
        self.Mixed_6a = InceptionB(288)
        self.Mixed_6b, self.Mixed_6c = InceptionC(768, 128), InceptionC(768, 160)
        self.Mixed_6d, self.Mixed_6e = InceptionC(768, 160), InceptionC(768, 192)
        self.AuxLogits = InceptionAux(768, num_classes) if aux_logits else None
        self.Mixed_7a = InceptionD(768)
        self.Mixed_7b, self.Mixed_7c = InceptionE(1280), InceptionE(2048)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in ("Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "maxpool1", "Conv2d_3b_1x1",
                     "Conv2d_4a_3x3", "maxpool2", "Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b",
                     "Mixed_6c", "Mixed_6d", "Mixed_6e", "Mixed_7a", "Mixed_7b", "Mixed_7c", "avgpool"):
            x = getattr(self, name)(x)
        return self.fc(self.dropout(torch.flatten(x, 1)))
