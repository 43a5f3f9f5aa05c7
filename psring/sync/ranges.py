"""The ranges of the flat gradient buffers that buckets, partitions and PS chunks are (``BucketRange``), and the
bucket plan of whole parameters; torch-free, so the launcher's checks of a PS plan (``config_checks.check_ps``,
``ps/sharding.py``) run without importing torch."""
from __future__ import annotations

from typing import NamedTuple


class BucketRange(NamedTuple):
    """Elements ``[start, end)`` of space ``space``'s flat buffer, launched in order with the other
    buckets of ``group`` (all-reduce: one group; PS: the server that owns it)."""
    space: int
    start: int
    end: int
    group: int = 0


def whole_param_ranges(spaces: list[list[int]], itemsizes: list[int], cap_bytes: int,
                       first_cap_bytes: int) -> list[BucketRange]:
    """A ``BucketRange`` (group 0) per bucket: consecutive whole parameters, capped by bytes (a parameter
    larger than the cap is a bucket of its own), the first bucket capped by ``first_cap_bytes``.
    ``spaces``: per dtype, the element counts of its parameters in layout order."""
    out = []
    for s, (sizes, itemsize) in enumerate(zip(spaces, itemsizes)):
        start = end = 0
        for numel in sizes:
            cap = first_cap_bytes if not out else cap_bytes
            if end > start and (end - start + numel) * itemsize > cap:
                out.append(BucketRange(s, start, end))
                start = end
            end += numel
        if end > start:
            out.append(BucketRange(s, start, end))
    return out
