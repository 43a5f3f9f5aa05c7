"""What a model brings to synchronization, from its shapes alone (built on the meta device): its bytes M,
how many tensors carry them and how small the smallest are, how many buckets the reduce family cuts and
how many chunks the PS's servers own, and how evenly S servers would share it if whole tensors were
placed on them instead of psring's equal chunks.

The buckets and chunks come from the functions the synchronizers run (``buckets.param_ranges``,
``sharding.plan_chunks``); the whole-tensor placements are the alternatives psring does not run: tensor i
on server i mod S (a key-hash placement, as ps-lite/MXNet's kvstore place arrays below their size bound),
and the best any whole-tensor placement can do, largest first onto the least loaded server.

Example::

    >>> f = model_facts("vit_b_16", servers=4)
    >>> f["tensors"], round(f["m_bytes"] / 1e6, 1), f["round_robin_imbalance"] > 1
    (152, 342.6, True)
"""
from __future__ import annotations

import functools

SMALL_BYTES = 64 << 10  # a tensor under 64 KB: its per-message cost outweighs its bytes on a 1 Gbit link


@functools.lru_cache(maxsize=None)
def model_facts(model: str, servers: int = 4, bucket_mb: float = 25.0, first_bucket_mb: float = 1.0,
                ps_chunk_mb: float = 4.0, num_classes: int = 10, image_size: int | None = 32) -> dict:
    """The facts of ``model`` (a built-in name or a ``MODULE:FACTORY``) as a flat dict (see the module doc)."""
    from .sync.buckets import flat_layout, param_ranges, space_sizes
    from .sync.ps.sharding import plan_chunks
    from .train.models import build_model, shapes_only

    with shapes_only():
        m = build_model(model, 0, num_classes, image_size)
    layout = flat_layout(m.named_parameters())
    sizes, itemsizes = space_sizes(layout)
    tensor_bytes = [n * i for sp, i in zip(sizes, itemsizes) for n in sp]
    total = sum(tensor_bytes)
    small = [b for b in tensor_bytes if b < SMALL_BYTES]
    chunks = plan_chunks(sizes, itemsizes, servers, int(ps_chunk_mb * 2**20))
    per_server = [0] * servers
    for c in chunks:
        per_server[c.group] += (c.end - c.start) * itemsizes[c.space]  # group: the owning server
    fair = total / servers
    return {"model": model, "m_bytes": total, "tensors": len(tensor_bytes), "largest_bytes": max(tensor_bytes),
            "small_tensors": len(small), "small_bytes_share": sum(small) / total,
            "buckets": len(param_ranges(layout, int(bucket_mb * 2**20), int(first_bucket_mb * 2**20))),
            "servers": servers, "ps_chunks": len(chunks), "chunks_imbalance": max(per_server) / fair,
            "round_robin_imbalance": max(round_robin(tensor_bytes, servers)) / fair,
            "largest_first_imbalance": max(largest_first(tensor_bytes, servers)) / fair}


def round_robin(tensor_bytes: list[int], servers: int) -> list[int]:
    """Each server's bytes when tensor i goes to server i mod S."""
    load = [0] * servers
    for i, b in enumerate(tensor_bytes):
        load[i % servers] += b
    return load


def largest_first(tensor_bytes: list[int], servers: int) -> list[int]:
    """Each server's bytes when every tensor, largest first, goes to the least loaded server (LPT: within
    4/3 of the best whole-tensor placement, and no placement beats max(largest tensor, M/S))."""
    load = [0] * servers
    for b in sorted(tensor_bytes, reverse=True):
        load[load.index(min(load))] += b
    return load
