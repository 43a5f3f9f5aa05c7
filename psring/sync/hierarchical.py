"""``hierarchical``: reduce inside each host, all-reduce across hosts, share the result inside the host
(Horovod's hierarchical all-reduce; NCCL's 2-D rings do the same across the rings of a node).

H hosts of G workers each (torchrun's LOCAL_WORLD_SIZE; ranks consecutive per host). Per bucket of M
bytes, three collectives on torch.distributed subgroups, one after the other on the comm thread:

1. **reduce-scatter inside the host** (the host's G ranks): local rank l ends with part l of the
   bucket, M/G bytes, summed over its host;
2. **all-reduce across hosts** (the H ranks of local rank l, one per host): part l summed over every
   host. The G cross groups run at once, each on 1/G of the bucket;
3. **all-gather inside the host**: every local rank gets the G summed parts back.

All local ranks work in parallel on 1/G of the bucket each (the parallel form, as NCCL and Horovod's
NCCL path do), rather than one leader per host all-reducing the whole bucket while G - 1 ranks wait:
the host link carries the same 2(H-1)/H * M either way, but G streams keep it busy while one rank
computes, and no rank does G times the reduction work. A flat ring over all N = H*G ranks in the same
order crosses each host link with 2(N-1)/N * M and takes 2(N-1) latency steps; this takes 2(H-1) across
hosts (``costmodel.hierarchical``). Inside a host the traffic is the host's own (NVLink/PCIe on a real
machine, the namespace's loopback on an emulated one).

Backends: the subgroups are NCCL groups when every worker has a GPU, gloo otherwise
(``ProcessGroupInfo.new_group``). On CPU the two in-host stages go through shared memory
(``host_memory``: gloo has only TCP, and loopback TCP on shared cores cost these stages 0.17-0.72 s a step in
results/models), gloo's collectives where a host cannot map it. A bucket whose length is not a multiple of G
is padded with zeros for the three stages (a copy in and out; at most G - 1 elements of padding).
"""
from __future__ import annotations

import time
from itertools import pairwise

import torch
import torch.distributed as dist

from ..topology import cross_groups, host_groups
from .allreduce import ring_bytes_per_worker
from .buckets import Bucket
from .host_memory import HostMemory
from .process_group import ALL_GATHER, REDUCE_SCATTER, ProcessGroupInfo
from .reducer import FutureHandle, Reducer
from .ring import _on_device

PHASES = ("host reduce-scatter", "cross-host all-reduce", "host all-gather")
# On gloo, a part's cross-host all-reduce in this many pieces, each all-gathered in the host (through shared memory
# on CPU) while the next is on the link (gloo runs the asynchronous all-reduces in order). ResNet-18, 2 hosts x 2 workers,
# 400 Mbit, --overlap none, three alternating rounds: sync 0.966-0.993 s with 4 pieces (0.974 / 0.976 s in one
# start each of 4 and 8), 0.993-1.027 s in one piece, 1.056-1.067 s through gloo's collectives; the schedule's
# replay 0.913 s.
PIECES = 4
MIN_PIECE_BYTES = 1 << 20  # a smaller part is one piece: two barriers a piece cost more than they hide


class HierarchicalAllReduce(Reducer):
    """Sums a bucket over H hosts of G workers; ``bucket.flat`` holds the sum when the handle returns."""

    name = "hierarchical"
    wait_phase = "hierarchical_wait_s"
    uses_thread = True

    def __init__(self, pg: ProcessGroupInfo, per_host: int):
        super().__init__(pg.rank, pg.world, pg.device)
        self.pg, self.per_host = pg, per_host
        self.hosts = pg.world // per_host
        self.local_rank = pg.rank % per_host
        # every rank creates every subgroup, in the same order (torch.distributed's rule)
        self.host_group = self.cross_group = self.memory = None
        for ranks in host_groups(pg.world, per_host):
            g = pg.new_group(ranks)
            if pg.rank in ranks:
                self.host_group = g
                if per_host > 1 and pg.device.type == "cpu":
                    self.memory = HostMemory(g, ranks, self.local_rank)
        for ranks in cross_groups(pg.world, per_host):
            g = pg.new_group(ranks)
            if pg.rank in ranks:
                self.cross_group = g
        self.messages: list[tuple[str, float, float]] = []

    def launch(self, bucket: Bucket) -> FutureHandle:
        return self.comm.submit(lambda: self._reduce(bucket))

    def _reduce(self, bucket: Bucket) -> None:
        """Runs on the comm thread: the three collectives, in place on ``bucket.flat``."""
        g, flat = self.per_host, bucket.flat
        pad = (-flat.numel()) % g
        buf = flat if pad == 0 else torch.cat([flat, flat.new_zeros(pad)])
        part = buf.new_empty(buf.numel() // g)
        mem = self.memory if self.memory is not None and self.memory.ensure(buf.numel() * buf.element_size()) else None
        if g > 1 and self.hosts > 1 and self.pg.backend == "gloo":  # (the same on every rank: the cross groups
            # must issue the same collectives, whichever hosts could map their memory)
            self._timed(bucket, 0, lambda: mem.reduce_scatter(part, buf) if mem is not None else
                        REDUCE_SCATTER(part, buf, group=self.host_group))
            self._pipelined(bucket, mem, buf, part)
        else:
            self._stages(bucket, mem, buf, part)
        if pad:
            flat.copy_(buf[:flat.numel()])

    def _pipelined(self, bucket: Bucket, mem: HostMemory | None, buf: torch.Tensor, part: torch.Tensor) -> None:
        """The part's cross-host all-reduce in pieces (asynchronous, in order), each piece all-gathered in the
        host once its sum is back: through memory, or gloo's all-gather where the host could not map it. Traced
        as two spans that overlap: from the first piece's all-reduce to the last one's sum, and from the first
        piece's all-gather to the last one's end."""
        pieces = max(1, min(PIECES, part.numel() * part.element_size() // MIN_PIECE_BYTES))
        cuts = [part.numel() * k // pieces for k in range(pieces + 1)]
        t0 = time.perf_counter()
        works = [dist.all_reduce(part[a:b], group=self.cross_group, async_op=True) for a, b in pairwise(cuts)]
        first = summed = None
        for w, (a, b) in zip(works, pairwise(cuts)):
            w.wait()
            summed = time.perf_counter()
            first = first or summed
            if mem is not None:
                mem.all_gather(buf, part, a, b)
            else:
                p = part.numel()
                dist.all_gather([buf[i * p + a:i * p + b] for i in range(self.per_host)], part[a:b],
                                group=self.host_group)
        self.messages.append((f"{self.name} b{bucket.index} {PHASES[1]}", t0, summed - t0))
        self.messages.append((f"{self.name} b{bucket.index} {PHASES[2]}", first, time.perf_counter() - first))

    def _stages(self, bucket: Bucket, mem: HostMemory | None, buf: torch.Tensor, part: torch.Tensor) -> None:
        """The three stages one after another (one host, one worker a host, or NCCL)."""
        g = self.per_host
        with _on_device(self.device):
            if mem is not None:
                self._timed(bucket, 0, lambda: mem.reduce_scatter(part, buf))
            elif g > 1:
                self._timed(bucket, 0, lambda: REDUCE_SCATTER(part, buf, group=self.host_group))
            else:
                part = buf
            if self.hosts > 1:
                self._timed(bucket, 1, lambda: dist.all_reduce(part, group=self.cross_group))
            if mem is not None:
                self._timed(bucket, 2, lambda: mem.all_gather(buf, part))
            elif g > 1:
                self._timed(bucket, 2, lambda: ALL_GATHER(buf, part, group=self.host_group))

    def _timed(self, bucket: Bucket, phase: int, op) -> None:
        start = time.perf_counter()
        op()
        self.messages.append((f"{self.name} b{bucket.index} {PHASES[phase]}", start, time.perf_counter() - start))

    def wire_bytes(self, bucket: Bucket) -> tuple[int, int]:
        """Sent (= received) by this worker: inside the host, (G-1)/G of the padded bucket for each of the
        reduce-scatter and the all-gather; across hosts, a ring all-reduce of its 1/G part."""
        return (n := self.host_bytes(bucket) + self.cross_bytes(bucket)), n

    def padded_bytes(self, bucket: Bucket) -> int:
        g = self.per_host
        return (bucket.flat.numel() + (-bucket.flat.numel()) % g) * bucket.flat.element_size()

    def host_bytes(self, bucket: Bucket) -> int:
        """What this worker sends inside its host for ``bucket`` (never on the host's link)."""
        g = self.per_host
        return 2 * (g - 1) * self.padded_bytes(bucket) // g

    def cross_bytes(self, bucket: Bucket) -> int:
        """What this worker sends across hosts for ``bucket``: its share of the host link's 2(H-1)/H * M."""
        return ring_bytes_per_worker(self.padded_bytes(bucket) // self.per_host, self.hosts)

    def close(self) -> None:
        if self.memory is not None:
            self.memory.close()

    def take_messages(self) -> list:
        taken, self.messages = self.messages, []
        return [[name, start, dur] for name, start, dur in taken]
