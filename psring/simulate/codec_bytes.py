"""What a ``--compress`` codec puts on the wire, for the replay: the bytes, from the codec's own ``wire_bytes``
and ``layout``; its CPU (encoding, decoding, summing: on these 2 cores most of a sparse or 1-bit codec's step,
``results/compression_sync``) is free here, as every computation is in ``psring simulate``.

* the reduce family, dense codecs (fp16, bf16): the shadow bucket reduced in the codec's dtype (``run.program``);
* the reduce family, sparse and 1-bit codecs (top-k, random-k, 1-bit): each bucket's encoding all-gathered, one
  gloo all-gather per part (``sync/compressed.py``): N - 1 ring rounds of each part (``gathered_rounds``);
* the PS: each chunk pushed in the codec's bytes; replied with the new parameters, dense (server-optimizer
  design), or the sum in its most compact form (aggregate design, ``sync/ps/encoded.py``): the codec's dtype for
  fp16/bf16, dense for 1-bit, and for top-k and random-k the sum's nonzeros, replayed as the expected union of N
  independent k-subsets of n (``sparse_union``: between k, where every worker picks the same elements, and N*k).
"""
from __future__ import annotations

import math


def part_bytes(codec, numel: int) -> list[int]:
    """The bytes of each part of one encoding of ``numel`` elements, in wire order."""
    return [math.prod(shape) * dtype.itemsize for dtype, shape in codec.layout(numel).values()]


def gathered_rounds(codec, bucket_numels: list[int], world: int) -> list[int]:
    """Per round of a step's all-gathers, the bytes each rank sends: every bucket, every part, N - 1 rounds."""
    return [b for numel in bucket_numels for b in part_bytes(codec, numel) for _ in range(world - 1)]


def sparse_union(numel: int, k: int, workers: int) -> float:
    """The expected number of elements in the union of ``workers`` independent uniform k-subsets of numel."""
    return numel * (1 - (1 - k / numel) ** workers) if numel else 0.0


def ps_reply_bytes(codec, numel: int, itemsize: int, workers: int, design: str) -> float:
    """One chunk's reply: dense parameters (server-optimizer), else the aggregate design's sum."""
    if design != "aggregate" or codec is None:
        return numel * itemsize
    if codec.dense:
        return codec.wire_bytes(numel)
    if getattr(codec, "sparse", False):
        return 8 * sparse_union(numel, codec.k(numel), workers)  # int32 index + float32 value each
    return numel * itemsize  # 1-bit: N sign vectors do not sum to signs

