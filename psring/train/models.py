"""Image classifiers for 3x32x32 inputs, written in plain torch (no torchvision).

- ``cnn``: a small CNN *without* BatchNorm. Its gradient on a global batch is exactly the mean of the
  per-worker gradients, so it is the model of the equivalence tests.
- ``resnet18``: ResNet-18, CIFAR variant (3x3 stem, no max-pool; He et al. 2016), 11,173,962 parameters.
  ``resnet18_narrow``: the same with half the channels (width 32, 2.8 M parameters), for CPU benchmarks.
  BatchNorm statistics are per worker (as with DDP's default broadcast they would come from rank 0), so
  data-parallel training of it is not bit-equivalent to one process; use it for speed, not equivalence.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

NUM_CLASSES = 10


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 8 * 8, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = NUM_CLASSES, width: int = 64):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        layers, c_in = [], width
        for i, stride in enumerate((1, 2, 2, 2)):
            c_out = width * 2**i
            layers += [BasicBlock(c_in, c_out, stride), BasicBlock(c_out, c_out, 1)]
            c_in = c_out
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build_model(name: str, seed: int) -> nn.Module:
    """The model ``name`` with weights initialised from ``seed`` (identical on every worker)."""
    builders = {"cnn": SmallCNN, "resnet18": ResNet18, "resnet18_narrow": lambda: ResNet18(width=32)}
    if name not in builders:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(builders)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return builders[name]()
