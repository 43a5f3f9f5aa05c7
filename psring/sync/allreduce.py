"""``allreduce``: average the gradients with torch.distributed's all-reduce (a ring in gloo and NCCL),
then every worker runs the same local SGD step, so parameters stay identical without ever being sent.

A ``Reducer`` (``reducer.ReduceSync`` owns the buckets, the overlap and the optimizer): gradients live
in one flat buffer cut into buckets of whole parameters (25 MB by default, a 1 MB first one, as DDP
cuts them); each bucket's all-reduce starts asynchronously from inside backward the moment its last
gradient is accumulated, so communication overlaps the rest of backward. No per-parameter
collectives: their per-call latency dominates for small tensors.
"""
from __future__ import annotations

import torch.distributed as dist

from .buckets import Bucket
from .process_group import ProcessGroupInfo
from .reducer import Reducer, WorkHandle


def ring_bytes_per_worker(m: int, world: int) -> int:
    """Bytes a ring all-reduce of ``m`` bytes sends (and receives) per worker: 2(N-1)/N * M
    (reduce-scatter then all-gather; Thakur, Rabenseifner & Gropp 2005). gloo exposes no byte counters,
    so this figure is derived from the algorithm, not counted on the wire."""
    return int(2 * (world - 1) * m // world) if world > 1 else 0


class TorchAllReduce(Reducer):
    name = "allreduce"
    wait_phase = "allreduce_wait_s"

    def __init__(self, pg: ProcessGroupInfo):
        super().__init__(pg.rank, pg.world, pg.device)
        self.pg = pg

    def launch(self, bucket: Bucket) -> WorkHandle:
        # the sum; the optimizer divides by N (see make_local_optimizer), so nothing runs after the last bucket
        return WorkHandle(dist.all_reduce(bucket.flat, op=dist.ReduceOp.SUM, group=self.pg.group, async_op=True))

    def wire_bytes(self, bucket: Bucket) -> tuple[int, int]:
        n = ring_bytes_per_worker(bucket.nbytes, self.world)
        return n, n

    def step_bytes(self, buckets: list[Bucket]) -> tuple[int, int]:
        """2(N-1)/N of the step's M bytes, taken of M at once (per bucket, the rounding would add up)."""
        n = ring_bytes_per_worker(sum(b.nbytes for b in buckets), self.world)
        return n, n
