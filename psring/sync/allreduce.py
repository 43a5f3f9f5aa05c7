"""``allreduce``: average the gradients with torch.distributed's all-reduce (a ring in gloo and NCCL),
then every worker runs the same local SGD step, so parameters stay identical without ever being sent.

Gradients live in one flat buffer cut into buckets of whole parameters (``buckets.GradBuckets``:
``.grad`` are views into it; 25 MB buckets by default, a 1 MB first one). Each bucket's all-reduce
starts asynchronously from inside backward the moment its last gradient is accumulated, so
communication overlaps the rest of backward;
``step`` only waits for what is still in flight and runs the optimizer, whose fused kernel divides the
summed gradients by N as it reads them (no pass of its own). No per-parameter collectives: their
per-call latency dominates for small tensors.
"""
from __future__ import annotations

import time

import torch.distributed as dist
from torch import nn

from ..config import OptimConfig
from .base import Synchronizer, SyncStats, grad_bytes, make_local_optimizer, timed_update
from .buckets import Bucket, GradBuckets, flat_layout, param_ranges
from .process_group import ProcessGroupInfo


def ring_bytes_per_worker(m: int, world: int) -> int:
    """Bytes a ring all-reduce of ``m`` bytes sends (and receives) per worker: 2(N-1)/N * M
    (reduce-scatter then all-gather; Thakur, Rabenseifner & Gropp 2005). gloo exposes no byte counters,
    so this figure is derived from the algorithm, not counted on the wire."""
    return int(2 * (world - 1) * m // world) if world > 1 else 0


class AllReduceSync(Synchronizer):
    name = "allreduce"

    def __init__(self, pg: ProcessGroupInfo, optim: OptimConfig, bucket_mb: float = 25.0,
                 first_bucket_mb: float = 1.0, overlap: bool = True):
        super().__init__(pg.rank, pg.world, pg.device)
        self.pg, self.optim_cfg, self.overlap = pg, optim, overlap
        self.cap, self.first_cap = int(bucket_mb * 2**20), int(first_bucket_mb * 2**20)

    def attach(self, model: nn.Module) -> nn.Module:
        layout = flat_layout(model.named_parameters())
        self.buckets = GradBuckets(layout, param_ranges(layout, self.cap, self.first_cap), self._on_ready, self.device)
        self.inflight: list[tuple[Bucket, object]] = []
        self.deferred: list[Bucket] = []
        self.wire_bytes = ring_bytes_per_worker(grad_bytes(model), self.world)
        self.optimizer = make_local_optimizer([p for p in model.parameters() if p.requires_grad], self.optim_cfg,
                                        grad_divisor=self.world)
        self._restore_optimizer()
        return model

    def _on_ready(self, b: Bucket) -> None:
        if not self.overlap:
            self.deferred.append(b)
            return
        self._launch(b)

    def _launch(self, b: Bucket) -> None:
        b.launched_at = time.perf_counter()
        # the sum; the optimizer divides by N (see make_local_optimizer), so nothing runs after the last bucket
        work = dist.all_reduce(b.flat, op=dist.ReduceOp.SUM, group=self.pg.group, async_op=True)
        self.inflight.append((b, work))

    def step(self, step: int) -> SyncStats:
        t0 = self.clock.now()
        self.buckets.flush()
        for b in self.deferred:
            self._launch(b)
        self.deferred.clear()
        messages = []
        for b, work in self.inflight:
            work.wait()
            messages.append([f"all_reduce bucket {b.index} ({b.nbytes / 2**20:.1f} MB)", b.launched_at - t0,
                             time.perf_counter() - b.launched_at])
        self.inflight.clear()
        self.buckets.reset()
        t1 = self.clock.now()
        update_s = timed_update(self.optimizer, self.device)
        return SyncStats(t1 - t0, update_s, self.wire_bytes, self.wire_bytes, {"allreduce_wait_s": t1 - t0},
                         messages=messages)

