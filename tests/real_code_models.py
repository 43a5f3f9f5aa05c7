"""Factories of models as real code has them, for ``--model tests.real_code_models:NAME`` (no BatchNorm, so
data-parallel training is exactly single-process training): a frozen layer (not communicated, not updated)
and tied weights (one parameter used twice: counted and sent once); ``with_unused`` adds a branch that
forward never uses (refused in one line naming it)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RealCode(nn.Module):
    def __init__(self, unused: bool):
        super().__init__()
        self.embed = nn.Linear(3 * 32 * 32, 64)
        self.frozen = nn.Linear(64, 64)
        self.frozen.requires_grad_(False)
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 64)
        self.b.weight = self.a.weight  # tied: one parameter, two uses
        self.head = nn.Linear(64, 10)
        self.branch = nn.Linear(64, 64) if unused else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.embed(torch.flatten(x, 1)))
        h = F.relu(self.frozen(h))
        h = F.relu(self.b(F.relu(self.a(h))))
        return self.head(h)


def tied_frozen() -> nn.Module:
    return RealCode(unused=False)


def with_unused() -> nn.Module:
    return RealCode(unused=True)


class Bf16(nn.Module):
    """A bf16 model (parameters and activations): the float32 batch is cast on the way in, the logits out."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Linear(3 * 32 * 32, 64), nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.embed(torch.flatten(x, 1).to(self.embed.weight.dtype)))
        return self.head(h).float()


def bf16() -> nn.Module:
    return Bf16().to(torch.bfloat16)
