"""Which server owns which part of the model: equal chunks of the flat parameter vector, round-robin.

The parameters, laid out as one flat vector in backward order (``buckets.flat_layout``), are cut into
``S * k`` equal chunks of at most ``cap_bytes`` each (k as small as that allows), and chunk i goes to
server i mod S. So every server owns the same number of bytes (to one element) whatever the tensor
sizes, and each owns chunks spread over the whole backward pass, so all servers work from its start.
This is BytePS's tensor partitioning (Jiang et al., OSDI 2020) and ps-lite's key-range slicing: a
large tensor is split over several servers. Owning whole tensors instead would leave ResNet-18's three
9.4 MB convolutions each on one server: with S = 8 the busiest server would carry 1.7x its share.

With one server there is nothing to balance: the chunks are then cut at parameter boundaries (whole
parameters up to the cap, a larger parameter a chunk of its own), so a CPU worker can use every
replied parameter in place, without a copy (``PSSync._load_params``).

The plan depends only on the model and S, so every worker computes the same one; chunks are named
``c<i>`` on the wire (checkpoints convert them back to parameters).
"""
from __future__ import annotations

import math

from ..buckets import whole_param_ranges


def plan_chunks(spaces: list[list[int]], itemsizes: list[int], servers: int,
                cap_bytes: int) -> list[tuple[int, int, int, int]]:
    """(space, start, end, server) per chunk, in chunk order. ``spaces``: per dtype, the element counts
    of its parameters in layout order. Each space is cut into a multiple of ``servers`` equal chunks (to
    one element) of at most ``cap_bytes``; the round-robin over servers continues from one space to the
    next. One server: whole parameters up to ``cap_bytes`` per chunk instead."""
    if servers < 1:
        raise ValueError(f"need at least one server, got {servers}")
    total = sum(sum(sp) for sp in spaces)
    if servers > total:
        raise ValueError(f"{servers} servers for {total} parameter elements: some servers would own nothing; "
                         f"use --servers {total} or fewer")
    if servers == 1:
        return whole_param_ranges(spaces, itemsizes, cap_bytes, cap_bytes)
    out, i = [], 0
    for s, (sizes, itemsize) in enumerate(zip(spaces, itemsizes)):
        numel = sum(sizes)
        if numel == 0:
            continue
        per_server = math.ceil(numel * itemsize / servers)
        n = min(numel, servers * max(1, math.ceil(per_server / max(cap_bytes, itemsize))))
        bounds = [numel * j // n for j in range(n + 1)]
        for j in range(n):
            out.append((s, bounds[j], bounds[j + 1], i % servers))
            i += 1
    return out
