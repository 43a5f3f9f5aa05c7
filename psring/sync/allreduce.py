"""``allreduce``: average the gradients with torch.distributed's all-reduce (a ring in gloo and NCCL),
then every worker runs the same local SGD step, so parameters stay identical without ever being sent.

All gradients are packed into one flat buffer and reduced with a single collective (no per-parameter
collectives: their per-call latency dominates for small tensors), then unpacked in place.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from ..config import OptimConfig
from .base import Synchronizer, SyncStats, grad_bytes, make_local_sgd, timed_update
from .process_group import ProcessGroupInfo


def ring_bytes_per_worker(m: int, world: int) -> int:
    """Bytes a ring all-reduce of ``m`` bytes sends (and receives) per worker: 2(N-1)/N * M
    (reduce-scatter then all-gather; Thakur, Rabenseifner & Gropp 2005). gloo exposes no byte counters,
    so this figure is derived from the algorithm, not counted on the wire."""
    return int(2 * (world - 1) * m // world) if world > 1 else 0


class AllReduceSync(Synchronizer):
    name = "allreduce"

    def __init__(self, pg: ProcessGroupInfo, optim: OptimConfig):
        super().__init__(pg.rank, pg.world, pg.device)
        self.pg, self.optim_cfg = pg, optim

    def attach(self, model: nn.Module) -> nn.Module:
        self.params = [p for p in model.parameters() if p.requires_grad]
        for p in self.params:  # gradients must exist (zero) even if a parameter got none this step
            p.grad = torch.zeros_like(p)
        self.flat = torch.zeros(sum(p.numel() for p in self.params), dtype=self.params[0].dtype,
                                device=self.device)
        self.wire_bytes = ring_bytes_per_worker(grad_bytes(model), self.world)
        self.optimizer = make_local_sgd(self.params, self.optim_cfg)
        return model

    def step(self, step: int) -> SyncStats:
        clock = self._clock
        t0 = clock()
        offset = 0
        for p in self.params:
            n = p.numel()
            self.flat[offset:offset + n].copy_(p.grad.reshape(-1))
            offset += n
        t1 = clock()
        dist.all_reduce(self.flat, op=dist.ReduceOp.SUM, group=self.pg.group)
        self.flat.div_(self.world)
        t2 = clock()
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad.copy_(self.flat[offset:offset + n].view_as(p))
            offset += n
        t3 = clock()
        update_s = timed_update(self.optimizer, self.device)
        return SyncStats(t3 - t0, update_s, self.wire_bytes, self.wire_bytes,
                         {"pack_s": t1 - t0, "allreduce_s": t2 - t1, "unpack_s": t3 - t2},
                         messages=[["all_reduce bucket 0", t1 - t0, t2 - t1]])

    def _clock(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()
