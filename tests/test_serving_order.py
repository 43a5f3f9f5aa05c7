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
from psring.sync.serving_order import (busy_seconds, forward_end, next_forward, planned_order, rank_figures,
                                      serving_order, timed_order)


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


def test_the_model_of_a_plan_counts_credits_and_a_shared_link():
    """``forward_end``: a third bucket waits for a credit; two moving at once take the link in halves; the
    forward runs from the input (the highest index) down, each bucket's layers once it is back."""
    ready, cost, fwd = [0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.1, 0.1, 0.1]
    assert forward_end([2, 1, 0], ready, cost, fwd, parallel=1, credits=2) == pytest.approx((3.1, 3.0))
    assert forward_end([2, 1, 0], ready, cost, fwd, parallel=2, credits=2) == pytest.approx((3.1, 3.0))
    assert forward_end([0, 1, 2], ready, cost, fwd, parallel=1, credits=2) == pytest.approx((3.3, 3.0))
    late = [0.0, 0.0, 5.0]  # the front bucket is ready last: the link idles for it, the forward waits
    assert forward_end([1, 0, 2], late, cost, fwd) == pytest.approx((6.3, 6.0))
    assert next_forward([0.0, 0.2, 0.2], [4, 4, 4]) == pytest.approx([0.05, 0.1, 0.0])


def test_a_plan_priced_by_the_probe_beats_the_one_a_slow_timed_step_made():
    """A traced run (ring, N = 8, 1 Gbit, ``full``, two lanes; 2026-12-06): its ten partitions ready as below in
    every timed step, the probe's link 124.6 MB/s and 7.5 ms a call. The order it kept was planned from a step
    whose reductions looked 1.3x slower than the probe's link (consensus rounds and a late rank); on the
    probe's link it leaves the forward 87 ms later than the order planned from the probe's prices, which is
    at least as good as serving the ready front bucket first."""
    ready = [t / 1e3 for t in (0, 3, 95, 97, 190, 190, 236, 282, 317, 343)]
    nbytes = [int(mb * 1e6) for mb in (4.5, 4.5, 4.8, 4.8, 4.5, 4.5, 4.5, 4.6, 3.4, 2.6)]
    cost = [7.459e-3 + 1.75 * b / 124.6e6 for b in nbytes]
    fwd = next_forward(ready, nbytes)
    planned = planned_order(ready + [0.0], nbytes, parallel=2, credits=2, cost=cost)
    assert sorted(planned) == list(range(10)) and planned[-1] == 2, planned  # a back partition goes last
    kept_in_the_run = [1, 0, 3, 6, 9, 8, 5, 7, 4, 2]
    end = forward_end(planned, ready, cost, fwd, 2, 2)[0]
    assert forward_end(kept_in_the_run, ready, cost, fwd, 2, 2)[0] - end > 0.08
    greedy = serving_order(ready, cost, 0.1 * sum(cost) / len(cost))
    assert end <= forward_end(greedy, ready, cost, fwd, 2, 2)[0]
    timed = planned_order(ready + [0.8], nbytes, parallel=2, credits=2)  # no probe: the step's busy prices it
    assert sorted(timed) == list(range(10))
