"""Gradient buckets: flat buffers that parameters' ``.grad`` are views into, handed to a communication
callback in a fixed order as soon as all their gradients are accumulated during backward.

As in DDP (Li et al., VLDB 2020): parameters are bucketed in reverse registration order (roughly the
order backward produces their gradients), the first bucket is small so communication starts early, and
buckets are launched strictly in index order so every rank issues the same collectives in the same
order (out-of-order launches would mismatch collectives across ranks and hang). With ``groups`` (the
PS: one group per server) the order is kept within each group only: a server's messages from one
worker arrive in order on their own socket, and no server's buckets wait for another's.

Example::

    buckets = GradBuckets(model.named_parameters(), cap_bytes=25 << 20, first_cap_bytes=1 << 20,
                          on_ready=lambda b: handles.append(dist.all_reduce(b.flat, async_op=True)))
    loss.backward()        # buckets are launched from inside backward
    buckets.flush()        # launch what backward did not complete (parameters without a gradient)
    ...wait on handles...; buckets.reset()
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class Bucket:
    index: int
    names: list[str]
    params: list[nn.Parameter]
    flat: torch.Tensor
    offsets: list[int]
    ready: int = 0
    launched_at: float = 0.0
    extra: dict = field(default_factory=dict)  # per-strategy state (e.g. the PS server it goes to)

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()

    def views(self, flat: torch.Tensor | None = None) -> list[tuple[str, torch.Tensor]]:
        """(name, view of its slice of ``flat``) per parameter, in bucket order; ``flat`` defaults to the
        bucket's own buffer (any buffer of the same layout works, e.g. a pinned host copy)."""
        flat = self.flat if flat is None else flat
        return [(n, flat[o:o + p.numel()].view_as(p)) for n, p, o in zip(self.names, self.params, self.offsets)]


def plan_buckets(sizes: list[int], dtypes: list, cap_bytes: int, first_cap_bytes: int) -> list[list[int]]:
    """Indices (into the given order) per bucket: consecutive, capped by bytes, one dtype per bucket."""
    buckets, cur, cur_bytes = [], [], 0
    for i, (size, dtype) in enumerate(zip(sizes, dtypes)):
        cap = first_cap_bytes if not buckets else cap_bytes
        if cur and (cur_bytes + size > cap or dtype != dtypes[cur[-1]]):
            buckets.append(cur)
            cur, cur_bytes = [], 0
        cur.append(i)
        cur_bytes += size
    if cur:
        buckets.append(cur)
    return buckets


class GradBuckets:
    def __init__(self, named_params, cap_bytes: int, first_cap_bytes: int, on_ready: Callable[[Bucket], None],
                 device: torch.device | None = None, groups: list[list[str]] | None = None):
        """``groups``: optional partition of the parameter names (e.g. one group per PS server); buckets
        never span groups. Within a group, order follows reverse registration order."""
        named = [(n, p) for n, p in named_params if p.requires_grad][::-1]
        by_name = dict(named)
        order = [n for n, _ in named]
        groups = groups or [order]
        self.on_ready = on_ready
        self.buckets: list[Bucket] = []
        self._of: dict[int, tuple[Bucket, torch.Tensor]] = {}  # id(param) -> (its bucket, its grad view)
        for g, group in enumerate(groups):
            in_group = set(group)
            members = [n for n in order if n in in_group]
            plan = plan_buckets([by_name[n].numel() * by_name[n].element_size() for n in members],
                                [by_name[n].dtype for n in members], cap_bytes, first_cap_bytes)
            for idx in plan:
                names = [members[i] for i in idx]
                params = [by_name[n] for n in names]
                offsets, total = [], 0
                for p in params:
                    offsets.append(total)
                    total += p.numel()
                flat = torch.zeros(total, dtype=params[0].dtype, device=device or params[0].device)
                b = Bucket(len(self.buckets), names, params, flat, offsets, extra={"group": g})
                self.buckets.append(b)
                for (_, view), p in zip(b.views(), params):
                    p.grad = view  # autograd accumulates into the bucket in place: no copy at launch time
                    self._of[id(p)] = (b, view)
                    p.register_post_accumulate_grad_hook(self._hook)
        self._ready: set[int] = set()
        self._group_of = [b.extra["group"] for b in self.buckets]
        self._order = [[b.index for b in self.buckets if b.extra["group"] == g] for g in range(len(groups))]
        self._next = [0] * len(groups)  # per group: position in _order of its next bucket to launch

    def _hook(self, p: nn.Parameter) -> None:
        b, view = self._of[id(p)]
        if p.grad.data_ptr() != view.data_ptr():  # someone set .grad to None (zero_grad(set_to_none=True))
            view.copy_(p.grad)
            p.grad = view
        b.ready += 1
        if b.ready == len(b.params):
            self._ready.add(b.index)
            self._launch_in_order(self._group_of[b.index])

    def _launch_in_order(self, g: int) -> None:
        order = self._order[g]
        while self._next[g] < len(order) and order[self._next[g]] in self._ready:
            self.on_ready(self.buckets[order[self._next[g]]])
            self._next[g] += 1

    def flush(self) -> None:
        """Launch every bucket backward did not complete (some parameter got no gradient), in order."""
        self._ready.update(range(len(self.buckets)))
        for g in range(len(self._order)):
            self._launch_in_order(g)

    def reset(self) -> None:
        for b in self.buckets:
            b.ready = 0
        self._ready.clear()
        self._next = [0] * len(self._order)
