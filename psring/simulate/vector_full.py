"""``--overlap full`` of the flat ring (``allreduce``, ``ring``; G workers a host) replayed with numpy, for hundreds
of workers: ``overlapped.OverlapReplay``'s priority scheduler and gated forward, one decision at a time.

* each step's forward (after the first) runs parameter by parameter, each once the units holding it are summed on
  that rank (``Plan.covering``), each its share of the forward time; backward starts when forward ends and makes
  unit u ready at its share of the backward time (``Plan.ready``); the next step starts when backward ends;
* a decision waits for the one before it to be committed, for fewer than ``CREDITS`` reductions to be in flight
  on every rank, and for a unit of the step to be ready on every rank; it takes the highest such index (of
  several made ready at one instant by the same parameter, the flow replay sees the lowest first: its ready
  events fire in index order) and commits it after a consensus round of 2(N-1) alphas;
* a committed unit is reduced on ``vector.VectorRing`` in commit order, each rank entering it once it is done
  with the one before;
* from step ``LEARN_STEPS`` on, the units are committed in the order planned from the last learning step's timing
  (``timed_plan``; planned again from the first step run in it) with no round and no wait for readiness
  everywhere, each rank entering a unit once it is ready there.

``tests/test_simulate_vector_overlap.py`` holds it equal to the flow replay.
"""
from __future__ import annotations

import numpy as np

from ..sync.schedule import CREDITS, LEARN_STEPS, timed_step
from .timed_plan import TimedSteps, source


def full_records(cfg, compute: np.ndarray, ring, plan, alpha_s: float, update_s: float = 0.0) -> list[list[dict]]:
    """Every step of every worker, as ``OverlapReplay`` records them under ``full`` (sync: the gates' waits;
    ``update_s``: the update, each parameter's share of it run by its gate, with its forward share)."""
    from ..train.compute_spec import FORWARD_SHARE
    from .records import add_step

    n, units = cfg.workers, len(plan.numels)
    consensus = 2 * (n - 1) * alpha_s
    sent = sum(t.sum(axis=0) for t in ring.rounds) if ring.rounds else np.zeros(n)
    records: list[list[dict]] = [[] for _ in range(n)]
    began, inside = np.zeros(n), np.zeros(n)
    back = np.zeros((units, n))  # when each unit of the last step was summed on each rank
    done_at: list[float] = []  # per reduction, in commit order: when its last rank had the sum
    committed = -np.inf
    steps = TimedSteps(plan.numels, n)  # the timed steps, and the orders planned from them
    for s in range(cfg.steps):
        c = np.asarray(compute[s], dtype=np.float64)
        forward_s, backward_s = c * FORWARD_SHARE + update_s, c * (1 - FORWARD_SHARE)
        if s == 0:
            start = began + forward_s
        else:
            start = began.copy()
            for share, cover in zip(plan.shares, plan.covering):
                start = np.maximum(start, back[cover].max(axis=0)) + forward_s * share
        ready = start[None, :] + backward_s[None, :] * np.asarray(plan.ready)[:, None]
        add_step(records, cfg, s, began, began + c + update_s, start + backward_s, sent, update_s)
        t_ready, t_done, t_commit = steps.arrays(s) if timed_step(s) else (None, None, None)
        if t_ready is not None:
            t_ready[:] = ready
        if s >= LEARN_STEPS > 0:
            for u in steps.plan(source(s)):
                k = len(done_at)
                committed = max(committed, done_at[k - CREDITS] if k >= CREDITS else -np.inf)
                inside = _reduce(ring, u, np.maximum(np.maximum(inside, committed), ready[u]), back, done_at,
                                 (t_done, t_commit, committed))
            began = start + backward_s
            continue
        everywhere = ready.max(axis=1)
        left = set(range(units))
        while left:
            k = len(done_at)
            slots = done_at[k - CREDITS] if k >= CREDITS else -np.inf
            first = min(everywhere[u] for u in left)
            t0 = max(committed, slots, first)
            if t0 == first and first > max(committed, slots):  # a ready event decides: its unit, not its twins
                tied = [u for u in left if everywhere[u] == t0]
                pick = [u for u in left if everywhere[u] < t0] + [min(tied)]
            else:
                pick = [u for u in left if everywhere[u] <= t0]
            u = max(pick)
            left.discard(u)
            committed = t0 + consensus
            inside = _reduce(ring, u, np.maximum(inside, committed), back, done_at, (t_done, t_commit, committed))
        began = start + backward_s
    return records


def _reduce(ring, u: int, enter: np.ndarray, back: np.ndarray, done_at: list[float], timing: tuple) -> np.ndarray:
    """Unit u reduced on ``ring``, each rank entering at ``enter``: when each rank has the sum (also into ``back``
    and, its last rank's, ``done_at``); ``timing`` (a timed step's done and commit arrays, or None, and the
    commit time) records it."""
    inside = ring.reduce(u, enter)
    back[u] = inside
    done_at.append(float(inside.max()))
    t_done, t_commit, committed = timing
    if t_done is not None:
        t_done[u], t_commit[u] = inside, committed
    return inside
