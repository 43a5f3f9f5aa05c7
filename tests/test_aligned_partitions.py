"""The priority scheduler's partitions (``buckets.aligned_ranges``): exactly the partitions asked for, every
element once and in order, and cut at the tensors' boundaries, so that no partition holds parts of two large
tensors; ``--overlap full`` runs, the replay and the reduce floor cut them alike."""
from __future__ import annotations

import random

import pytest

from psring.bounds import param_bytes
from psring.config import TrainConfig
from psring.sync.buckets import aligned_ranges


def _check(sizes: list[int], count: int) -> list:
    rs = aligned_ranges([sizes], [4], count)
    assert len(rs) == min(count, sum(sizes))
    assert rs[0].start == 0 and rs[-1].end == sum(sizes) and [r.start for r in rs[1:]] == [r.end for r in rs[:-1]]
    assert all(r.end > r.start and r.group == 0 and r.space == 0 for r in rs)
    return rs


@pytest.mark.parametrize("count", [5, 9, 13, 35, 120])
def test_resnet18_partitions_keep_its_large_tensors_apart(count):
    sizes = [b // 4 for b in param_bytes("resnet18")][::-1]  # the flat layout: backward's order
    rs = _check(sizes, count)
    offs = [0]
    for n in sizes:
        offs.append(offs[-1] + n)
    for r in rs:  # a partition cuts at most one large tensor: it never waits for two of them to be made
        cut = [(lo, hi) for lo, hi in zip(offs, offs[1:]) if r.start < hi and r.end > lo
               and not r.start <= lo < hi <= r.end and (hi - lo) * 4 >= 1 << 20]
        assert len(cut) <= 1, (count, r, cut)
    avg = sum(sizes) / count
    assert max(r.end - r.start for r in rs) <= 2.2 * avg  # halving the largest: none far above the average


def test_random_layouts_give_the_count_asked():
    rng = random.Random(7)
    for _ in range(200):
        sizes = [rng.choice([1, 3, 50, 400, 5000]) for _ in range(rng.randint(1, 30))]
        _check(sizes, rng.randint(1, 60))


def test_several_dtypes_share_the_count_by_bytes():
    rs = aligned_ranges([[10, 2], [6]], [4, 2], 5)  # 48 and 12 bytes: four partitions and one
    assert [(r.space, r.start, r.end) for r in rs] == [(0, 0, 3), (0, 3, 6), (0, 6, 10), (0, 10, 12), (1, 0, 6)]


def test_full_overlap_runs_the_replay_and_the_floor_cut_the_same_partitions():
    """``psring simulate`` imports the cut (``simulate.overlapped.unit_ranges`` calls ``ReduceSync._ranges``):
    with ``--overlap full`` it is ``aligned_ranges`` with as many partitions as the cap makes of the model, and
    DDP's whole-parameter buckets otherwise; ``bench.reduce_paced`` cuts the same, in forward order."""
    from psring.bench.reduce_paced import aligned
    from psring.simulate.overlapped import unit_ranges
    from psring.simulate.plans import layout_of
    from psring.sync.buckets import param_ranges, space_sizes

    cap = 3 << 20
    for overlap in ("full", "backward"):
        cfg = TrainConfig(sync="allreduce", workers=4, model="resnet18", overlap=overlap)
        layout = layout_of(cfg)
        m_bytes = sum(sp.numel * sp.dtype.itemsize for sp in layout)
        want = aligned_ranges(*space_sizes(layout), -(-m_bytes // cap)) if overlap == "full" else \
            param_ranges(layout, cap, int(cfg.first_bucket_mb * 2**20))
        got = unit_ranges(cfg, layout, cap)
        assert [tuple(r) for r in got] == [tuple(r) for r in want]
        if overlap == "full":
            floor = aligned(list(param_bytes("resnet18")), cap)
            assert sorted((m_bytes - 4 * r.end, m_bytes - 4 * r.start) for r in got) == floor
