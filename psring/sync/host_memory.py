"""``hierarchical``'s two in-host stages on CPU workers through shared memory instead of gloo over loopback TCP
(MPI's shared-memory transport, NCCL's SHM path between processes of one node; gloo has TCP only).

Over gloo the reduce-scatter and the all-gather inside a host are loopback TCP: each byte copied by the kernel
twice and driven by gloo's threads, about 0.5 GB/s here on two cores that every worker shares, 0.17-0.72 s a
step for the models of results/models, on top of a host link the bound prices alone. Through memory each local
rank writes its bucket once, sums its part straight from its peers' copies and reads theirs back: M(1 + 2(G-1)/G)
bytes of copies and adds a bucket and three small barriers. And the part's cross-host all-reduce is cut into pieces
(``hierarchical.PIECES``) whose all-gather runs while the next piece is on the host link, so of the in-host
stages only the reduce-scatter and the last piece's all-gather leave the link idle.

The G local ranks of a host each map G segments under ``/dev/shm`` (one per rank, written by its owner only),
named from a token the host's first rank draws and broadcasts; every rank maps every segment, then each owner
unlinks its own, so nothing is left behind whatever happens next (a mapping outlives its name). The segments
grow, collectively, to the largest bucket seen (every rank reduces the same buckets in the same order, so every
rank decides the same). Where a rank cannot map them (no ``/dev/shm``, too small), every rank of that host
learns it from one all-reduce and the host keeps gloo's collectives.
"""
from __future__ import annotations

import os
import secrets

import torch
import torch.distributed as dist

SHM_DIR = "/dev/shm"


class HostMemory:
    """The G local ranks of one host (``group``: their process group, ``ranks``: its global ranks in local
    order) sharing one segment each."""

    def __init__(self, group, ranks: list[int], local_rank: int):
        self.group, self.ranks, self.local = group, ranks, local_rank
        self.g = len(ranks)
        self.size, self.failed = 0, False
        self.segments: list[torch.Tensor] = []  # per local rank, its bytes (uint8)

    def ensure(self, nbytes: int) -> bool:
        """Segments of at least ``nbytes`` on every local rank (collective; False: this host keeps gloo)."""
        if self.failed or nbytes <= self.size:
            return not self.failed
        token = torch.zeros(16, dtype=torch.uint8)
        if self.local == 0:
            token.copy_(torch.frombuffer(bytearray(secrets.token_bytes(16)), dtype=torch.uint8))
        dist.broadcast(token, self.ranks[0], group=self.group)
        names = [os.path.join(SHM_DIR, f"psring-{bytes(token.tolist()).hex()}-{i}") for i in range(self.g)]
        size = max(nbytes, 2 * self.size)
        ok = torch.ones(1, dtype=torch.int32)
        try:
            mine = torch.from_file(names[self.local], shared=True, size=size, dtype=torch.uint8)
        except (OSError, RuntimeError):
            ok.zero_()
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=self.group)  # every file exists, or some rank failed
        segments = []
        if ok.item():
            try:
                segments = [mine if i == self.local else torch.from_file(n, shared=True, size=size, dtype=torch.uint8)
                            for i, n in enumerate(names)]
            except (OSError, RuntimeError):
                ok.zero_()
            dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=self.group)  # every rank mapped every segment
        if os.path.exists(names[self.local]):
            os.unlink(names[self.local])  # the mappings stay; the name goes
        if not ok.item():
            self.close()
            self.failed = True
            return False
        self.segments, self.size = segments, size
        return True

    def _views(self, buf: torch.Tensor) -> list[torch.Tensor]:
        n = buf.numel() * buf.element_size()
        return [s[:n].view(buf.dtype) for s in self.segments]

    def reduce_scatter(self, part: torch.Tensor, buf: torch.Tensor) -> None:
        """``part`` = local rank l's 1/G of ``buf`` summed over the host's ranks (``buf``: a multiple of G)."""
        views = self._views(buf)
        views[self.local].copy_(buf)
        dist.barrier(group=self.group)  # every rank's bucket is in its segment
        lo = self.local * part.numel()
        hi = lo + part.numel()
        part.copy_(views[0][lo:hi])
        for v in views[1:]:
            part.add_(v[lo:hi])

    def all_gather(self, buf: torch.Tensor, part: torch.Tensor, lo: int = 0, hi: int | None = None) -> None:
        """``buf`` = every local rank's ``part``, in local rank order; ``lo``:``hi``: only that slice of each
        part (the same on every rank), so that a part's slices can be shared as their cross-host sums land."""
        views, p = self._views(buf), part.numel()
        hi = p if hi is None else hi
        views[self.local][self.local * p + lo:self.local * p + hi].copy_(part[lo:hi])
        dist.barrier(group=self.group)  # every rank's summed slice is in its segment
        for i, v in enumerate(views):
            buf[i * p + lo:i * p + hi].copy_(v[i * p + lo:i * p + hi])
        dist.barrier(group=self.group)  # no rank writes its segment again before every peer read it

    def close(self) -> None:
        self.segments, self.size = [], 0
