"""``none``: no communication. One worker is plain single-process training; N workers each train alone on
their shard, which measures the communication-free headroom (compute contention only)."""
from __future__ import annotations

from torch import nn

from ..config import OptimConfig
from .base import Synchronizer, SyncStats, make_local_optimizer, timed_update


class NoSync(Synchronizer):
    name = "none"

    def __init__(self, rank: int, world: int, device, optim: OptimConfig):
        super().__init__(rank, world, device)
        self.optim_cfg = optim

    def attach(self, model: nn.Module) -> nn.Module:
        self.optimizer = make_local_optimizer(model.parameters(), self.optim_cfg)
        self._restore_optimizer()
        return model

    def step(self, step: int) -> SyncStats:
        return SyncStats(update_s=timed_update(self.optimizer, self.device))
