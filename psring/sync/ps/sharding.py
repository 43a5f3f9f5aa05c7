"""Which server owns which parameter: whole parameters, balanced by bytes.

Greedy longest-processing-time assignment (largest parameter first, to the server with the fewest bytes
so far; ties to the lower server index) is deterministic, so every worker computes the same map from
the model alone, and its imbalance is at most one parameter's size.
"""
from __future__ import annotations


def assign_shards(sizes: list[int], servers: int) -> list[int]:
    """``owner[i]``: the server of parameter ``i`` whose size in bytes is ``sizes[i]``."""
    if servers < 1:
        raise ValueError(f"need at least one server, got {servers}")
    if servers > len(sizes):
        raise ValueError(f"{servers} servers for {len(sizes)} parameters: some servers would own nothing; "
                         f"use --servers {len(sizes)} or fewer")
    load = [0] * servers
    owner = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        s = min(range(servers), key=lambda s: (load[s], s))
        owner[i] = s
        load[s] += sizes[i]
    return owner
