"""The reduce floor's raw worker (``psring.bench.reduce_paced``) and the floors' shared timing (``bench.floor``),
on loopback: its fixed order serves the front-most ready partition whenever the link is free, and two ranks keep
their compute time, finish under one credit in every mode, and launch the same all-reduces."""
from __future__ import annotations

import json
import sys

import pytest

from psring.bench.reduce_paced import order, partitions
from psring.launch.children import Children
from psring.launch.launcher import child_env, free_port

SIZES = [4000, 12_000, 2000, 6000]  # bytes of four "tensors", in forward order


def test_doctests():
    """The examples in the floor's and the cut's docstrings (``bench.floor.timed``: each step its slowest rank's)."""
    import doctest

    from psring.bench import floor, reduce_paced
    from psring.sync import buckets

    for mod in (floor, reduce_paced, buckets):
        result = doctest.testmod(mod)
        assert result.failed == 0 and result.attempted > 0, mod.__name__


def test_partitions_cover_the_bytes_in_whole_floats():
    parts = partitions(24_000, 5000)
    assert parts[0] == (0, 4000 + 1000 - 1000 % 4) and parts[-1][1] == 24_000
    assert all(a % 4 == 0 and b > a for a, b in parts) and all(p[1] == q[0] for p, q in zip(parts, parts[1:]))


def test_order_is_readiness_order_on_a_fast_link_and_front_first_on_a_busy_one():
    parts = partitions(sum(SIZES), 4000)  # 6 partitions; tensor 1 spans partitions 1-3
    fast = order(SIZES, parts, 1.0, 1e-12)
    assert sorted(fast) == list(range(len(parts)))
    assert fast == [5, 4, 1, 2, 3, 0]  # as backward makes them: the last tensor first, a tensor's partitions together
    slow = order(SIZES, parts, 1.0, 1e-3)  # 4 s of link a partition: partition 5 is alone until the rest are made
    assert slow[0] == 5 and slow[1:] == sorted(slow[1:])


def _run(tmp_path, mode: str, steps: int, forward_s: float, backward_s: float, credits: int) -> list[dict]:
    sizes = tmp_path / "sizes.json"
    sizes.write_text(json.dumps(SIZES))
    kids, port = Children(), free_port()
    import time

    start_at = time.time() + 2  # (a rank later than that starts at once after the barrier both pass first)
    try:
        ranks = [kids.spawn(f"rank {r}", [sys.executable, "-m", "psring.bench.reduce_paced", "--sizes", str(sizes),
                                          "--partition", "4000", "--credits", str(credits), "--forward",
                                          str(forward_s), "--backward", str(backward_s), "--link-Bps", "1e6",
                                          "--mode", mode, "--steps", str(steps), "--start-at", str(start_at),
                                          "--out", str(tmp_path / f"rank{r}.json")],
                            child_env(1, RANK=r, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
                            tmp_path / f"rank{r}.log") for r in range(2)]
        for child in ranks:
            assert child.proc.wait(90) == 0, (tmp_path / f"rank{ranks.index(child)}.log").read_text()[-2000:]
    finally:
        kids.stop_all()
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("mode", ["none", "backward", "full"])
def test_two_ranks_keep_their_compute_and_finish_under_one_credit(tmp_path, mode):
    got = _run(tmp_path, mode, steps=3, forward_s=0.06, backward_s=0.12, credits=1)
    for g in got:
        starts = g["starts"]
        assert len(starts) == 4 and len(g["update_s"]) == 3
        steps = [b - a for a, b in zip(starts, starts[1:])]
        # every mode runs forward then backward in a step: at least their compute, and not stuck anywhere
        assert all(0.18 * 0.95 <= s < 5 for s in steps), steps
    assert abs(got[0]["starts"][0] - got[1]["starts"][0]) < 0.05  # a common start
