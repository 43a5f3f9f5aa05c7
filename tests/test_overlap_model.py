"""The bound of each --overlap mode (psring/overlap_model.py) and its place in ``bounds``."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from psring import bounds
from psring.overlap_model import priority_arrivals, ready_times, step_bound

SIZES = [3, 1, 4, 1, 5, 9, 2, 6]  # bytes per layer, forward order


def test_doctests():
    import doctest

    from psring import overlap_model

    assert doctest.testmod(overlap_model).failed == 0


@pytest.mark.parametrize("f,b,comm", [(1.0, 2.0, 3.0), (1.0, 2.0, 0.5), (0.2, 0.4, 0.56), (1.0, 2.0, 10.0)])
def test_the_modes_order_as_they_overlap_more(f, b, comm):
    none, backward, full = (step_bound(m, SIZES, f, b, comm) for m in ("none", "backward", "full"))
    assert none == pytest.approx(f + b + comm)
    assert none >= backward >= full - 1e-12
    assert backward >= f + max(b, comm * SIZES[0] / sum(SIZES))  # the forward waits for everything
    assert full >= max(f + b, comm) - 1e-12  # neither the link nor the compute can be beaten


def test_full_overlap_hides_a_link_much_faster_than_compute_and_no_more():
    assert step_bound("full", SIZES, 1.0, 2.0, 1e-9) == pytest.approx(3.0)
    assert step_bound("backward", SIZES, 1.0, 2.0, 1e-9) == pytest.approx(3.0)
    # a link 10x slower than compute: full can hide at most the compute behind it. The link starts when the last
    # layer's gradient is ready (backward's share of its bytes, 2 * 6/31 s) and never idles after; that layer, served
    # last, is through it at 2 * 6/31 + 30 s, and then its forward share (1 * 6/31 s) is the step's end
    full = step_bound("full", SIZES, 1.0, 2.0, 30.0)
    assert full == pytest.approx(30.0 + (2.0 + 1.0) * SIZES[-1] / sum(SIZES))
    assert full < step_bound("backward", SIZES, 1.0, 2.0, 30.0) - 0.5


@pytest.mark.parametrize("comm", [0.5, 3.0])
def test_the_workers_own_update_is_added_once_in_every_mode(comm):
    """The update (the reduce family's optimizer step on the trainer's thread) is compute no schedule hides:
    after everything in ``none`` and ``backward``; in ``full`` each unit's share just before its layer, so
    it costs the whole update where the link is fast and at most that where the next forward waits anyway."""
    u = 0.25
    for mode in ("none", "backward"):
        assert step_bound(mode, SIZES, 1.0, 2.0, comm, update_s=u) == pytest.approx(
            step_bound(mode, SIZES, 1.0, 2.0, comm) + u)
    fast, with_u = step_bound("full", SIZES, 1.0, 2.0, 1e-9), step_bound("full", SIZES, 1.0, 2.0, 1e-9, update_s=u)
    assert with_u == pytest.approx(fast + u)
    slow = step_bound("full", SIZES, 1.0, 2.0, comm)
    assert slow <= step_bound("full", SIZES, 1.0, 2.0, comm, update_s=u) <= slow + u + 1e-12


def test_priority_serves_the_front_of_the_model_first():
    ready = ready_times([1, 1, 1], 3.0)  # the last layer's gradient first
    assert ready == [3.0, 2.0, 1.0]
    # 2 s of link each: unit 2 runs 1-2, unit 1 preempts it (2-3), unit 0 preempts that (3-5), then the
    # rest of unit 1 (5-6) and of unit 2 (6-7)
    assert priority_arrivals(ready, [2.0, 2.0, 2.0]) == pytest.approx([5.0, 6.0, 7.0])


def test_bad_modes_and_empty_models_are_refused():
    with pytest.raises(ValueError, match="overlap mode"):
        step_bound("sometimes", SIZES, 1, 1, 1)
    with pytest.raises(ValueError, match="no bytes"):
        step_bound("full", [0, 0], 1, 1, 1)


def test_bounds_put_a_run_beside_the_bound_of_its_own_overlap_mode():
    row = {"sync": "allreduce", "workers": 4, "servers": 1, "net": "emulated", "link_rate": "100mbit",
           "model": "cnn", "compute": "emulated:600", "sync_s_p50": 1.0, "step_s_p50": 1.0}
    runs = pd.DataFrame([{**row, "overlap": mode} for mode in ("none", "backward", "full", False)])
    m = sum(bounds.param_bytes("cnn"))
    out = bounds.with_bounds(runs, m_bytes=m)
    comm = out["bound_s"].iloc[0]
    assert out["step_bound_s"].iloc[0] == pytest.approx(0.6 + comm)
    assert out["step_bound_s"].iloc[3] == out["step_bound_s"].iloc[0]  # an old table's overlap = False
    assert out["step_bound_s"].iloc[0] > out["step_bound_s"].iloc[1] >= out["step_bound_s"].iloc[2]
    assert (out["step_over_bound"] == 1.0 / out["step_bound_s"]).all()
    updated = bounds.with_bounds(runs.assign(update_s_p50=0.05), m_bytes=m)  # the run's own update
    assert updated["step_bound_s"].iloc[0] == pytest.approx(0.6 + comm + 0.05)
    real = bounds.with_bounds(runs.assign(compute="real"), m_bytes=m)
    assert real["step_bound_s"].map(math.isnan).all()  # no emulated compute: no step bound
