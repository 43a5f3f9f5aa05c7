"""Gradient buckets: ranges of one flat gradient buffer that parameters' ``.grad`` are views into, handed
to a communication callback in a fixed order as soon as every gradient they cover is accumulated.

Layout (``flat_layout``): parameters in reverse registration order (roughly the order backward produces
their gradients), one flat buffer per dtype. A bucket is a contiguous range ``[start, end)`` of one such
buffer, so it is sent or reduced as it lies, without a copy at launch time. Two ways to cut the ranges:

* ``param_ranges`` (all-reduce, as in DDP; Li et al., VLDB 2020): whole parameters, capped by bytes, the
  first bucket small so communication starts early.
* any explicit ranges, e.g. the PS's equal chunks (``ps.sharding``), which may split a parameter: a
  range is ready when every parameter overlapping it is.

Buckets are launched strictly in index order within their group (all-reduce: one group, so every rank
issues the same collectives in the same order; out-of-order launches would mismatch them and hang. PS:
one group per server, so a server's messages from one worker arrive in order on their own socket and no
server's buckets wait for another's).

Example::

    layout = flat_layout(model.named_parameters())
    buckets = GradBuckets(layout, param_ranges(layout, 25 << 20, 1 << 20),
                          on_ready=lambda b: handles.append(dist.all_reduce(b.flat, async_op=True)))
    loss.backward()        # buckets are launched from inside backward
    buckets.flush()        # launch what backward did not complete (parameters without a gradient)
    ...wait on handles...; buckets.reset()
"""
from __future__ import annotations

import bisect
import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .ranges import BucketRange, whole_param_ranges


@dataclass
class Space:
    """One dtype's flat buffer: ``members`` are (name, parameter, element offset), in layout order."""
    dtype: torch.dtype
    members: list[tuple[str, nn.Parameter, int]]
    numel: int
    flat: torch.Tensor | None = None


@dataclass
class Member:
    """The part of one parameter a bucket covers: its elements ``[lo, hi)`` (flattened), which sit at
    ``[at, at + hi - lo)`` of the bucket."""
    name: str
    param: nn.Parameter
    lo: int
    hi: int
    at: int

    @property
    def whole(self) -> bool:
        return self.lo == 0 and self.hi == self.param.numel()

    def in_bucket(self, flat: torch.Tensor) -> torch.Tensor:
        """This member's part of a bucket-shaped 1-D tensor (the bucket's buffer, a reply, a state chunk)."""
        return flat[self.at:self.at + self.hi - self.lo]

    def in_param(self, t: torch.Tensor) -> torch.Tensor:
        """This member's part of a parameter-shaped (contiguous) tensor, flattened."""
        return t.view(-1)[self.lo:self.hi]


@dataclass
class Bucket:
    index: int
    space: int
    start: int
    end: int
    members: list[Member]
    flat: torch.Tensor
    group: int = 0  # the launch order it is in (BucketRange.group)
    ready: int = 0

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()


def flat_layout(named_params) -> list[Space]:
    """Parameters that need gradients, in reverse registration order, one ``Space`` per dtype (in order of
    first appearance); deterministic, so every worker computes the same layout from the model alone."""
    spaces: dict[torch.dtype, Space] = {}
    for name, p in [(n, p) for n, p in named_params if p.requires_grad][::-1]:
        sp = spaces.setdefault(p.dtype, Space(p.dtype, [], 0))
        sp.members.append((name, p, sp.numel))
        sp.numel += p.numel()
    return list(spaces.values())


DOMINANT = 0.9  # a partition whose largest parameter holds this share of it is cut as that parameter alone


def aligned_ranges(spaces: list[list[int]], itemsizes: list[int], count: int) -> list[BucketRange]:
    """The priority scheduler's ``count`` partitions (group 0; fewer where there are fewer elements), cut at
    the parameters' boundaries: the largest partition is halved at the boundary nearest its middle, again and
    again, and one that holds a single parameter (or one with 90% of its elements, beside its bias or norm) is
    cut into one more equal piece instead. A gradient is ready a whole tensor at a time, so a partition that
    held the end of one large tensor and the start of the next would wait for both; cut at the tensors' own
    boundaries, each partition leaves once its tensors are made, with as many calls as equal slices of the
    flat buffer would take. (At N = 8, 1 Gbit, ResNet-18, ``--overlap full``: 9 partitions 0.931-0.935 s a step
    against 0.973-0.976 s for 9 equal slices, 13 partitions 0.896-0.917 s against 0.914-0.915 s.) Spaces
    (dtypes) share ``count`` by their bytes.

    >>> aligned_ranges([[3, 10, 2, 2]], [4], 5)  # the 10-element tensor in three, the two small ones together
    [BucketRange(space=0, start=0, end=3, group=0), BucketRange(space=0, start=3, end=6, group=0), \
BucketRange(space=0, start=6, end=9, group=0), BucketRange(space=0, start=9, end=13, group=0), \
BucketRange(space=0, start=13, end=17, group=0)]
    """
    total = sum(sum(sz) * item for sz, item in zip(spaces, itemsizes))
    out = []
    for s, (sizes, itemsize) in enumerate(zip(spaces, itemsizes)):
        offs = [0, *itertools.accumulate(sizes)]
        if not offs[-1]:
            continue
        want = min(offs[-1], max(1, round(count * offs[-1] * itemsize / total)))
        heap = [(-offs[-1], 0, len(sizes), 1)]  # (-elements a piece, first parameter, end parameter, pieces)
        for _ in range(want - 1):
            _, i, j, m = heapq.heappop(heap)
            if m > 1 or max(sizes[i:j]) >= DOMINANT * (offs[j] - offs[i]):  # one more equal piece
                heapq.heappush(heap, (-((offs[j] - offs[i]) / (m + 1)), i, j, m + 1))
            else:  # at the boundary nearest the middle
                mid = (offs[i] + offs[j]) / 2
                at = bisect.bisect_left(offs, mid, i + 1, j)
                k = min((x for x in (at - 1, at) if i < x < j), key=lambda x: abs(offs[x] - mid))
                heapq.heappush(heap, (-(offs[k] - offs[i]), i, k, 1))
                heapq.heappush(heap, (-(offs[j] - offs[k]), k, j, 1))
        for _, i, j, m in sorted(heap, key=lambda h: h[1]):
            lo, hi = offs[i], offs[j]
            out += [BucketRange(s, lo + (hi - lo) * q // m, lo + (hi - lo) * (q + 1) // m) for q in range(m)]
    return out


def layout_bytes(layout: list[Space]) -> int:
    """The bytes of every space's gradients together: M."""
    return sum(sp.numel * sp.dtype.itemsize for sp in layout)


def space_sizes(layout: list[Space]) -> tuple[list[list[int]], list[int]]:
    """(per space, its parameters' element counts in layout order; per space, its item size)."""
    return [[p.numel() for _, p, _ in sp.members] for sp in layout], [sp.dtype.itemsize for sp in layout]


def param_ranges(layout: list[Space], cap_bytes: int, first_cap_bytes: int) -> list[BucketRange]:
    """``whole_param_ranges`` of a layout (all-reduce's buckets, as DDP cuts them)."""
    return whole_param_ranges(*space_sizes(layout), cap_bytes, first_cap_bytes)


class UnusedParameterError(RuntimeError):
    """A trainable parameter got no gradient in a step (DDP's find_unused_parameters case)."""

    @classmethod
    def of(cls, names: list[str]) -> UnusedParameterError:
        """The one-line refusal naming the first of ``names`` (and counting the others)."""
        more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
        return cls(f"parameter {names[0]!r}{more} got no gradient in this step (a branch forward did not use?): "
                   f"psring synchronizes and updates every trainable parameter every step; set requires_grad=False "
                   f"on it, or use it in forward")


class GradBuckets:
    def __init__(self, layout: list[Space], ranges: list[BucketRange],
                 on_ready: Callable[[Bucket], None], device: torch.device | None = None,
                 after_launch: Callable[[], None] | None = None):
        """``ranges``: one ``BucketRange`` (or a 4-tuple in its field order) per bucket, covering every
        space exactly, in launch order within each group. ``after_launch``: called once after a hook
        launched any (a parameter may complete several buckets at once: a scheduler that is told then
        sees them all, and picks by priority rather than by who was handed over first)."""
        self.layout, self.on_ready, self.after_launch = layout, on_ready, after_launch
        for sp in layout:
            dev = device or (sp.members[0][1].device if sp.members else None)
            sp.flat = torch.zeros(sp.numel, dtype=sp.dtype, device=dev)
        covered = [[] for _ in layout]
        self.buckets: list[Bucket] = []
        self._of: dict[int, tuple[list[Bucket], torch.Tensor]] = {}  # id(param) -> (its buckets, its grad view)
        for s, sp in enumerate(layout):
            for name, p, off in sp.members:
                view = sp.flat[off:off + p.numel()].view_as(p)
                p.grad = view  # autograd accumulates into the bucket in place: no copy at launch time
                self._of[id(p)] = ([], view)
                p.register_post_accumulate_grad_hook(self._hook)
        for i, (s, start, end, group) in enumerate(BucketRange(*r) for r in ranges):
            sp = self.layout[s]
            members = [Member(n, p, max(start, off) - off, min(end, off + p.numel()) - off, max(start, off) - start)
                       for n, p, off in sp.members if off < end and off + p.numel() > start]
            b = Bucket(i, s, start, end, members, sp.flat[start:end], group)
            self.buckets.append(b)
            covered[s].append((start, end))
            for m in members:
                self._of[id(m.param)][0].append(b)
        for s, sp in enumerate(layout):
            spans = sorted(covered[s])
            if [a for a, _ in spans] != [0] + [e for _, e in spans[:-1]] or (spans[-1][1] if spans else 0) != sp.numel:
                raise ValueError(f"bucket ranges of space {s} do not cover its {sp.numel} elements exactly once")
        groups = 1 + max((b.group for b in self.buckets), default=0)
        self._ready: set[int] = set()
        self._order = [[b.index for b in self.buckets if b.group == g] for g in range(groups)]
        self._next = [0] * groups  # per group: position in _order of its next bucket to launch
        self.ready_at: list[tuple[int, float]] = []  # (bucket, perf_counter) when its gradients were all there
        self._fired: set[int] = set()  # id(param) of the parameters whose gradient backward produced

    def _hook(self, p: nn.Parameter) -> None:
        buckets, view = self._of[id(p)]
        self._fired.add(id(p))
        if p.grad.data_ptr() != view.data_ptr():  # someone set .grad to None (zero_grad(set_to_none=True))
            view.copy_(p.grad)
            p.grad = view
        launched = False
        for b in buckets:
            b.ready += 1
            if b.ready == len(b.members):
                self._ready.add(b.index)
                self.ready_at.append((b.index, time.perf_counter()))
                launched |= self._launch_in_order(b.group)
        if launched and self.after_launch is not None:
            self.after_launch()

    def _launch_in_order(self, g: int) -> bool:
        order, start = self._order[g], self._next[g]
        while self._next[g] < len(order) and order[self._next[g]] in self._ready:
            self.on_ready(self.buckets[order[self._next[g]]])
            self._next[g] += 1
        return self._next[g] > start

    def flush(self) -> None:
        """Launch every bucket backward did not complete, in order; a parameter that got no gradient at all
        (an unused branch) is refused in one line naming it (``UnusedParameterError``): its zero gradient
        would still move it (weight decay, momentum), where single-process training leaves it alone."""
        self.check_used()
        now = time.perf_counter()
        self.ready_at += [(b.index, now) for b in self.buckets if b.index not in self._ready]
        self._ready.update(range(len(self.buckets)))
        for g in range(len(self._order)):
            self._launch_in_order(g)

    def check_used(self) -> None:
        """Refuse a step whose backward gave some parameters a gradient and not others. A step without
        any backward at all (gradients written into the buckets directly: ``psring bench``) passes."""
        if not self._fired:
            return
        missing = [name for sp in self.layout for name, p, _ in sp.members if id(p) not in self._fired]
        if missing:
            raise UnusedParameterError.of(missing)

    def ready_offsets(self, since: float) -> list[list]:
        """``[bucket, seconds after since]`` of every bucket whose gradients were all there this step, in
        the order they became so (negative: before ``since``, i.e. during backward): the readiness marks
        of a timeline, where a straggler's buckets come late."""
        return [[i, t - since] for i, t in self.ready_at]

    def reset(self) -> None:
        for b in self.buckets:
            b.ready = 0
        self._ready.clear()
        self._fired.clear()
        self.ready_at = []
        self._next = [0] * len(self._order)
