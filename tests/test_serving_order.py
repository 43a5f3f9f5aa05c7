"""The order the reduce family's priority scheduler keeps (``sync.serving_order``): a serial link serving the
ready bucket nearest the input first, planned from a timed step; the replays plan it with the same functions
(``simulate.timed_plan``)."""
from __future__ import annotations

import numpy as np
import pytest

from psring.bench.reduce_paced import aligned, partition_ready
from psring.bounds import param_bytes
from psring.simulate.timed_plan import TimedSteps, source
from psring.sync.schedule import LEARN_STEPS, PLANS, timed_step
from psring.sync.serving_order import busy_seconds, planned_order, rank_figures, serving_order, timed_order


def resnet18_partitions(backward_s: float = 0.436, mib: float = 3.5):
    """ResNet-18's partitions as the priority scheduler cuts them, back first (its indices: the input last),
    each ready once backward made every tensor it holds part of."""
    sizes = list(param_bytes("resnet18"))
    parts = aligned(sizes, int(mib * 2**20))[::-1]
    return partition_ready(sizes, parts, backward_s), [hi - lo for lo, hi in parts]


def test_the_back_most_partition_goes_last_where_a_front_one_is_ready_by_the_time_the_link_frees():
    """N = 8, 1 Gbit: the link is behind backward from the first partition on, so whenever it frees a
    partition nearer the input is ready, and the one holding the output layer (ready first) goes last: the
    next forward needs it last. Deciding at each instant a credit frees sent it third."""
    ready, nbytes = resnet18_partitions()
    order = serving_order(ready, [n * 1.75 / 119.6e6 for n in nbytes])
    assert sorted(order) == list(range(len(ready))) and order[-1] == 0, order
    assert sorted(order[:2]) == [1, 2], order  # two pieces of the first 9.4 MB tensor, ready first


def test_pieces_ready_microseconds_apart_count_as_ready_together():
    """A tensor's pieces are ready together, their hooks a few microseconds apart: the nearest the input goes
    first, not the one whose hook fired first."""
    assert serving_order([0.0, 1e-5, 2e-5], [1.0] * 3) == [0, 2, 1]
    assert timed_order([0.0, 1e-5, 2e-5], 3.0, [4, 4, 4]) == [2, 1, 0]  # ties within a tenth of a bucket


def test_a_lone_bucket_is_served_when_nothing_nearer_the_input_is_ready():
    assert serving_order([0.0, 5.0], [1.0, 1.0]) == [0, 1]
    assert busy_seconds([]) == 0.0


def test_every_rank_plans_the_same_order_from_the_max_of_their_figures():
    """Rank 1's buckets are ready later and its link slower: the plan takes the latest of each."""
    a = rank_figures([0.0, 0.1, 0.2], [(0.0, 0.1), (0.1, 0.2), (0.2, 0.3)])
    b = rank_figures([1.0, 1.3, 1.2], [(1.0, 1.2), (1.3, 1.5), (1.5, 1.7)])
    figures = np.maximum(a, b).tolist()
    assert figures == pytest.approx([0.0, 0.3, 0.2, 0.6])
    assert planned_order(figures, [4, 4, 4]) == timed_order([0.0, 0.3, 0.2], 0.6, [4, 4, 4])


def test_the_replays_plan_from_the_steps_the_scheduler_times():
    """``TimedSteps`` turns a replay's ready, commit and done times into the scheduler's figures: a rank
    launches at the commit or once ready there, whichever is later."""
    assert [s for s in range(6) if timed_step(s)] == list(range(LEARN_STEPS - 1, LEARN_STEPS - 1 + PLANS))
    assert [source(s) for s in range(LEARN_STEPS, LEARN_STEPS + PLANS + 1)][-1] == LEARN_STEPS - 1 + PLANS - 1
    steps = TimedSteps([4, 4, 4], ranks=2)
    ready, done, commit = steps.arrays(1)
    ready[:] = [[0.0, 1.0], [0.1, 1.3], [0.2, 1.2]]
    commit[:] = [0.0, 0.1, 0.2]
    assert steps.plan(1) is None  # nothing done yet
    done[:] = [[0.1, 1.2], [0.2, 1.5], [0.3, 1.7]]
    a = rank_figures([0.0, 0.1, 0.2], [(0.0, 0.1), (0.1, 0.2), (0.2, 0.3)])
    b = rank_figures([1.0, 1.3, 1.2], [(1.0, 1.2), (1.3, 1.5), (1.2, 1.7)])
    assert steps.plan(1) == planned_order(np.maximum(a, b).tolist(), [4, 4, 4])


def test_each_plan_prices_the_buckets_by_the_steadiest_step_timed_so_far():
    """A step whose reductions looked slower (a late rank, the cores' turns) than an earlier one's does not price
    the buckets: the plan takes the fewest busy seconds timed so far, in the scheduler and in the replays alike."""
    ready = [0.0, 0.5, 1.0]
    assert planned_order([*ready, 3.0], [4, 4, 4], busy_before=1.2) == planned_order([*ready, 1.2], [4, 4, 4])
    assert planned_order([*ready, 1.0], [4, 4, 4], busy_before=1.2) == planned_order([*ready, 1.0], [4, 4, 4])
    steps = TimedSteps([4, 4, 4], ranks=1)
    for step, took in ((1, 0.4), (2, 2.0)):  # each reduction's seconds: busy 1.2 s, then 3.0 s
        r, done, commit = steps.arrays(step)
        r[:, 0], commit[:], done[:, 0] = ready, ready, [t + took for t in ready]
    assert steps.plan(1) == [0, 1, 2] and steps.busy[1] == pytest.approx(1.2)
    slow = rank_figures(ready, [(t, t + 2.0) for t in ready])
    assert planned_order(slow, [4, 4, 4]) == [0, 2, 1]  # priced by its own 3.0 s, bucket 1 would wait
    assert steps.plan(2) == [0, 1, 2] and steps.busy[2] == pytest.approx(3.0)
