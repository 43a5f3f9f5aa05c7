"""``ddp``: torch's DistributedDataParallel, the reference baseline.

DDP all-reduces gradient buckets *during* backward, overlapped with it, so its communication cannot be
timed apart from backward: ``sync_s`` is reported as ``None`` and the cost shows in backward time.

Buckets: ``--bucket-mb`` and ``--first-bucket-mb`` reach DDP as ``bucket_cap_mb_list=[first, cap]`` (the
last cap repeats), so it cuts its buckets as ``allreduce`` does; with the defaults (1 MB, then 25 MB)
that is DDP's own default. ``--no-overlap`` is refused for ddp (``config``): torch's reducer always
launches a bucket from inside backward and has no switch to defer it.
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

    def __init__(self, pg: ProcessGroupInfo, optim: OptimConfig, bucket_mb: float = 25.0,
                 first_bucket_mb: float = 1.0):
        super().__init__(pg.rank, pg.world, pg.device)
        self.pg, self.optim_cfg = pg, optim
        self.caps_mb = [first_bucket_mb, bucket_mb]

    def attach(self, model: nn.Module) -> nn.Module:
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=device_ids, process_group=self.pg.group,
                                      bucket_cap_mb_list=self.caps_mb)
        self.wire_bytes = ring_bytes_per_worker(grad_bytes(model), self.world)
        self.optimizer = make_local_optimizer(ddp.parameters(), self.optim_cfg)
        self._restore_optimizer()
        return ddp

    def step(self, step: int) -> SyncStats:
        return SyncStats(sync_s=None, update_s=timed_update(self.optimizer, self.device),
                         bytes_sent=self.wire_bytes, bytes_recv=self.wire_bytes)
