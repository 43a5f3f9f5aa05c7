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

That rule alone (Schrage's, for one machine with release and delivery times) can starve a back bucket ready
early until the end, where the forward's last layers then wait for it, and it ignores that reductions side by
side share the link. So the plan starts from it and improves it a move at a time against the next forward's
end in a model of the link (``best_order``, ``forward_end``).

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


def planned_order(figures: list[float], nbytes: list[int], parallel: int = 1, credits: int = 2,
                  cost: list[float] | None = None) -> list[int]:
    """The kept order from ``rank_figures`` reduced over the ranks (MAX) and each bucket's bytes: the serial
    link's order (``timed_order``), then improved (``best_order``) against the next forward's end for the
    reductions the reducer runs at once (``parallel``) and the scheduler's ``credits``. ``cost``: each
    bucket's seconds alone on the link, as the link measured at start gives them; None: its bytes' share of
    the timed step's busy seconds."""
    ready, busy_s = figures[:-1], figures[-1]
    if cost is None:
        per_byte = busy_s / max(1, sum(nbytes))
        cost = [n * per_byte for n in nbytes]
    start = serving_order(ready, cost, TIE_SHARE * sum(cost) / max(1, len(cost)))
    return best_order(start, ready, cost, next_forward(ready, nbytes), parallel, credits)


def timed_order(ready: list[float], busy_s: float, nbytes: list[int]) -> list[int]:
    """``serving_order`` for one timed step: each bucket's link time its bytes' share of ``busy_s``; ties
    within ``TIE_SHARE`` of a mean bucket's link time.

    >>> timed_order([0.0, 0.001, 0.5], 3.0, [4, 4, 4])
    [1, 2, 0]
    """
    per_byte = busy_s / max(1, sum(nbytes))
    cost = [n * per_byte for n in nbytes]
    return serving_order(ready, cost, TIE_SHARE * sum(cost) / max(1, len(cost)))


# A layer's forward takes about half its backward (one product per layer against two: the input's gradient
# and the weights'); emulated compute (``--compute emulated``) has it exactly.
FORWARD_PER_BACKWARD = 0.5
# Orders tried by ``best_order``'s local search at most: it runs twice a run, on the scheduler's thread.
SEARCH_BUDGET = 3000
# A move is kept where it brings the forward's end (or, no later, the link's) earlier by this share of the
# buckets' link seconds: two replays of one run, whose figures differ in the last digits, plan the same.
IMPROVEMENT_SHARE = 1e-4


def next_forward(ready: list[float], nbytes: list[int]) -> list[float]:
    """Seconds the next forward spends in each bucket's layers, from when backward made them: bucket i's
    backward is the gap from bucket i - 1's ready time to its own (the layout runs in backward order), bucket
    0's at the others' mean seconds per byte; its forward ``FORWARD_PER_BACKWARD`` of that.

    >>> next_forward([1.0, 3.0, 4.0], [2, 4, 2])
    [0.5, 1.0, 0.5]
    """
    gaps = [max(0.0, b - a) for a, b in zip(ready, ready[1:])]
    rest = sum(nbytes[1:])
    first = nbytes[0] * sum(gaps) / rest if rest else 0.0
    return [FORWARD_PER_BACKWARD * g for g in [first, *gaps]]


def forward_end(order: list[int], ready: list[float], cost: list[float], forward: list[float], parallel: int = 1,
                credits: int = 2) -> tuple[float, float]:
    """(when the next forward ends, when the link frees) if the buckets are launched in ``order``, each once
    it is ready and fewer than ``credits`` are in flight, the first ``parallel`` of those in flight moving at
    once and sharing the link equally (``cost[i]``: bucket i's seconds alone on it). The forward starts when
    backward made the last bucket and runs the buckets' layers from the input (the highest index) down, each
    bucket's ``forward[i]`` seconds once that bucket is back.

    >>> forward_end([1, 0], [0.0, 0.0], [1.0, 1.0], [0.5, 0.5])  # one at a time: 1 back at 1, 0 at 2
    (2.5, 2.0)
    >>> forward_end([1, 0], [0.0, 0.0], [1.0, 1.0], [0.5, 0.5], parallel=2)  # side by side: both back at 2
    (3.0, 2.0)
    """
    n = len(order)
    flight: list[int] = []  # launched, not yet back, in launch order
    left, done = list(cost), [0.0] * len(cost)
    t, k = min(ready), 0
    while k < n or flight:
        while k < n and len(flight) < credits and ready[order[k]] <= t:
            flight.append(order[k])
            k += 1
        moving = flight[:parallel]
        times = [t + min(left[i] for i in moving) * len(moving)] if moving else []
        if k < n and len(flight) < credits:
            times.append(ready[order[k]])
        now = min(times)
        for i in moving:
            left[i] -= (now - t) / len(moving)
            if left[i] <= 1e-12:
                done[i] = now
                flight.remove(i)
        t = now
    end = max(ready)
    for i in range(len(cost) - 1, -1, -1):
        end = max(end, done[i]) + forward[i]
    return end, max(done)


def best_order(start: list[int], ready: list[float], cost: list[float], forward: list[float], parallel: int = 1,
               credits: int = 2) -> list[int]:
    """``start`` improved by moving one bucket at a time to another place in the order, kept while the next
    forward's end (then the link's) comes earlier (``forward_end``) by more than ``IMPROVEMENT_SHARE`` of the
    link's seconds, for at most ``SEARCH_BUDGET`` orders.
    Serving the ready bucket nearest the input first (``serving_order``) keeps the link busy, but it can leave
    a back bucket ready early for the end, where the forward's last layers then wait for it, and it ignores
    that reductions side by side share the link. Deterministic: every rank computes the same from the same
    figures.
    """
    n, tried = len(start), 0
    best = list(start)
    value = forward_end(best, ready, cost, forward, parallel, credits)
    window = n if n * n <= SEARCH_BUDGET // 4 else 6
    tol = IMPROVEMENT_SHARE * sum(cost)  # a gain the figures' rounding could make is none
    improved = True
    while improved and tried < SEARCH_BUDGET:
        improved = False
        for a in range(n):
            for b in range(max(0, a - window), min(n, a + window + 1)):
                if a == b or tried >= SEARCH_BUDGET:
                    continue
                order = list(best)
                order.insert(b, order.pop(a))
                tried += 1
                got = forward_end(order, ready, cost, forward, parallel, credits)
                if got[0] < value[0] - tol or (got[0] <= value[0] + tol and got[1] < value[1] - tol):
                    best, value, improved = order, got, True
    return best
