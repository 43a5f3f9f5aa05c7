"""The order the reduce family's priority scheduler keeps for a run (``sync.schedule``), from a step's timing.

P3's priority (Jayarajan et al., SysML'19) says: whenever the link is free, send the ready bucket nearest the
input, since the next forward needs it first. TicTac (Hashemi et al., SysML'19) fixes one such order for the
whole run, so the ranks need not agree before each reduction. Here the order is the one a single serial link
would follow over a timed step: bucket i ready at ``ready[i]`` (the latest over the ranks), holding the link
for its bytes' share of the seconds the link was busy in that step.

Agreeing round by round instead (what the scheduler does while it learns) decides at the instant a credit
frees. A bucket nearer the input that becomes ready a few milliseconds later then loses to one the next
forward needs last: at N = 8 on 2 cores, 1 Gbit, the back-most of ResNet-18's 13 partitions went third and
the last front ones waited for it (``results/overlap_n8_1gbit``). Planned from the timing, the link idles for
those milliseconds and serves the front one first.

Indices follow the flat layout, which runs in backward order: a higher index is nearer the input.
"""
from __future__ import annotations

import math


# A bucket ready this share of a mean bucket's link time after the link frees counts as ready then: the
# pieces of one large tensor are ready together, but their hooks fire a few microseconds apart, and a front
# bucket a few milliseconds from ready is worth that much idle link.
TIE_SHARE = 0.1


def serving_order(ready: list[float], cost: list[float], tie_s: float = 0.0) -> list[int]:
    """The order one serial link serves the buckets in. Whenever it is free it takes the highest index among
    those ready (``ready[i]``, seconds) within ``tie_s``, or else, idle, the highest index ready within
    ``tie_s`` of the first to be ready, and holds it ``cost[i]`` seconds.

    >>> serving_order([0.0, 0.0, 0.5], [1.0, 1.0, 1.0])  # 2 is ready before the link frees from 1
    [1, 2, 0]
    >>> serving_order([0.0, 0.001, 0.5], [1.0, 1.0, 1.0], tie_s=0.01)  # 1 counts as ready with 0
    [1, 2, 0]
    """
    left, order, t = set(range(len(ready))), [], -math.inf
    while left:
        t = max(t, min(ready[k] for k in left))  # idle until the first is ready
        k = max(k for k in left if ready[k] <= t + tie_s)
        t = max(t, ready[k]) + cost[k]
        order.append(k)
        left.remove(k)
    return order


def busy_seconds(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one of the ``(start, end)`` spans: the link's busy time, with reductions
    in flight side by side counted once.

    >>> busy_seconds([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)])
    4.0
    """
    busy, end = 0.0, -math.inf
    for a, b in sorted(spans):
        if b > end:
            busy += b - max(a, end)
            end = b
    return busy


def rank_figures(ready: list[float], spans: list[tuple[float, float]]) -> list[float]:
    """One rank's figures of a timed step: each bucket's ready time after the step's first, then the seconds
    its link was busy (``spans``: each reduction's launch and end). Every rank's are reduced with MAX (a
    bucket leaves once every rank has it; the slowest link paces the ring) before ``planned_order``.

    >>> rank_figures([5.0, 5.5, 6.0], [(5.0, 6.0), (5.5, 7.0)])
    [0.0, 0.5, 1.0, 2.0]
    """
    first = min(ready)
    return [r - first for r in ready] + [busy_seconds(spans)]


def planned_order(figures: list[float], nbytes: list[int], busy_before: float = math.inf) -> list[int]:
    """The kept order from ``rank_figures`` reduced over the ranks (MAX) and each bucket's bytes.
    ``busy_before``: the fewest busy seconds of the steps timed before this one. A step's reductions only
    ever look slower than the link (a rank late to the ring, the shared cores' turns, its consensus rounds),
    never faster, so the plan prices the buckets by the least of them: at N = 8, 1 Gbit the first step run
    in a plan read 1.3x the steady steps' (``results/overlap_n8_1gbit``, "Each plan priced by the steadiest
    step timed so far").

    >>> planned_order([0.0, 0.5, 1.0, 3.0], [4, 4, 4]) != planned_order([0.0, 0.5, 1.0, 3.0], [4, 4, 4], 1.2)
    True
    """
    return timed_order(figures[:-1], min(figures[-1], busy_before), nbytes)


def timed_order(ready: list[float], busy_s: float, nbytes: list[int]) -> list[int]:
    """``serving_order`` for one timed step: each bucket's link time its bytes' share of ``busy_s``; ties
    within ``TIE_SHARE`` of a mean bucket's link time.

    >>> timed_order([0.0, 0.001, 0.5], 3.0, [4, 4, 4])
    [1, 2, 0]
    """
    per_byte = busy_s / max(1, sum(nbytes))
    cost = [n * per_byte for n in nbytes]
    return serving_order(ready, cost, TIE_SHARE * sum(cost) / max(1, len(cost)))
