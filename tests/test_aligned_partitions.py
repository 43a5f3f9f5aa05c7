"""The priority scheduler's partitions (``buckets.aligned_ranges``): every element once and in order, none over
the cap, and cut at the boundaries of every parameter larger than it, so that no partition holds the end of
one large tensor and the start of the next; ``--overlap full`` runs and the replay cut them alike."""
from __future__ import annotations

import random

import pytest

from psring.bounds import param_bytes
from psring.config import TrainConfig
from psring.sync.buckets import aligned_ranges


def _check(sizes: list[int], cap_bytes: int, itemsize: int = 4) -> list:
    rs = aligned_ranges([sizes], [itemsize], cap_bytes)
    assert [r.start for r in rs[1:]] == [r.end for r in rs[:-1]] and rs[0].start == 0 and rs[-1].end == sum(sizes)
    assert all(r.end > r.start and r.group == 0 and r.space == 0 for r in rs)
    cap = max(1, cap_bytes // itemsize)
    assert all(r.end - r.start <= cap for r in rs), "a partition over the cap"
    cuts, off = {r.start for r in rs} | {sum(sizes)}, 0
    for n in sizes:
        if n > cap:  # a large tensor is cut where it begins and ends, and into equal pieces
            assert off in cuts and off + n in cuts
            pieces = [r.end - r.start for r in rs if off <= r.start < off + n]
            assert max(pieces) - min(pieces) <= 1 and len(pieces) == -(-n // cap)
        off += n
    return rs


@pytest.mark.parametrize("cap_mb", [0.25, 1.3, 3.5, 5.0, 12.0])
def test_resnet18_partitions_keep_its_tensors_apart(cap_mb):
    sizes = [b // 4 for b in param_bytes("resnet18")][::-1]  # the flat layout: backward's order
    rs = _check(sizes, int(cap_mb * 2**20))
    assert len(rs) >= -(-sum(sizes) * 4 // int(cap_mb * 2**20))  # never fewer calls than equal slices


def test_random_layouts():
    rng = random.Random(7)
    for _ in range(200):
        sizes = [rng.choice([1, 3, 50, 400, 5000]) for _ in range(rng.randint(1, 30))]
        _check(sizes, rng.choice([4, 40, 1000, 4000, 40_000]), itemsize=4)


def test_several_dtypes_each_cut_alone():
    rs = aligned_ranges([[10, 2], [6]], [4, 2], 16)
    assert [(r.space, r.start, r.end) for r in rs] == [(0, 0, 3), (0, 3, 6), (0, 6, 10), (0, 10, 12), (1, 0, 6)]


def test_full_overlap_runs_and_the_replay_cut_the_same_partitions():
    """``psring simulate`` imports the cut (``simulate.overlapped.unit_ranges`` calls ``ReduceSync._ranges``):
    with ``--overlap full`` it is ``aligned_ranges`` at the partition, and DDP's whole-parameter buckets
    otherwise."""
    from psring.simulate.overlapped import unit_ranges
    from psring.simulate.plans import layout_of
    from psring.sync.buckets import param_ranges, space_sizes

    cap = 3 << 20
    for overlap in ("full", "backward"):
        cfg = TrainConfig(sync="allreduce", workers=4, model="resnet18", overlap=overlap)
        layout = layout_of(cfg)
        want = aligned_ranges(*space_sizes(layout), cap) if overlap == "full" else \
            param_ranges(layout, cap, int(cfg.first_bucket_mb * 2**20))
        assert [tuple(r) for r in unit_ranges(cfg, layout, cap)] == [tuple(r) for r in want]
