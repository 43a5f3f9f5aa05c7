"""``ddp``: torch's DistributedDataParallel, the reference baseline.

DDP all-reduces gradient buckets *during* backward, overlapped with it, so its communication cannot be
timed apart from backward: ``sync_s`` is reported as ``None`` and the cost shows in backward time.
"""
from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..config import OptimConfig
from .allreduce import ring_bytes_per_worker
from .base import Synchronizer, SyncStats, grad_bytes, make_local_optimizer, timed_update
from .process_group import ProcessGroupInfo


class DDPSync(Synchronizer):
    name = "ddp"

    def __init__(self, pg: ProcessGroupInfo, optim: OptimConfig):
        super().__init__(pg.rank, pg.world, pg.device)
        self.pg, self.optim_cfg = pg, optim

    def attach(self, model: nn.Module) -> nn.Module:
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=device_ids, process_group=self.pg.group)
        self.wire_bytes = ring_bytes_per_worker(grad_bytes(model), self.world)
        self.optimizer = make_local_optimizer(ddp.parameters(), self.optim_cfg)
        self._restore_optimizer()
        return ddp

    def step(self, step: int) -> SyncStats:
        return SyncStats(sync_s=None, update_s=timed_update(self.optimizer, self.device),
                         bytes_sent=self.wire_bytes, bytes_recv=self.wire_bytes)
