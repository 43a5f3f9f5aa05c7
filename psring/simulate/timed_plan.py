"""The priority scheduler's kept order in a replay, planned as ``sync.schedule`` plans it: from the timing
of the last step agreed on round by round, then again from the first steps run in a plan (``PLANS``; each
priced by the fewest busy seconds timed so far), with ``sync.serving_order``'s own functions (each rank's
figures, their MAX over the ranks, the serial link's order).

A rank launches a unit at its commit (the decision every rank shares) or once the unit is ready there,
whichever is later, and has it back when its ring ends there: those are the spans whose union is the rank's
busy link.
"""
from __future__ import annotations

import math

import numpy as np

from ..sync.schedule import LEARN_STEPS, PLANS
from ..sync.serving_order import planned_order, rank_figures


def source(step: int) -> int:
    """The timed step whose plan a kept-order step (``step >= LEARN_STEPS``) runs in."""
    return min(step - 1, LEARN_STEPS - 1 + PLANS - 1)


class TimedSteps:
    """Each timed step's ``ready`` and ``done`` (units x ranks) and ``commit`` (per unit) times, as the replay
    makes them; ``plan(step)`` once every unit of it is done on every rank."""

    def __init__(self, numels: list[int], ranks: int):
        self.numels, self.ranks = list(numels), ranks
        self.ready: dict[int, np.ndarray] = {}
        self.done: dict[int, np.ndarray] = {}
        self.commit: dict[int, np.ndarray] = {}
        self.plans: dict[int, list[int]] = {}
        self.busy: dict[int, float] = {}  # each planned step's busy seconds (``planned_order``'s busy_before)

    def arrays(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ready, done, commit) of ``step``, made (NaN: not yet) at first use."""
        if step not in self.ready:
            units = len(self.numels)
            self.ready[step] = np.full((units, self.ranks), np.nan)
            self.done[step] = np.full((units, self.ranks), np.nan)
            self.commit[step] = np.full(units, np.nan)
        return self.ready[step], self.done[step], self.commit[step]

    def plan(self, step: int) -> list[int] | None:
        """The order planned from timed ``step``, or None while a unit of it is still on its way somewhere."""
        if step not in self.plans:
            ready, done, commit = self.arrays(step)
            if np.isnan(done).any():
                return None
            launch = np.maximum(commit[:, None], ready)
            figures = np.max([rank_figures(ready[:, r].tolist(), list(zip(launch[:, r], done[:, r])))
                              for r in range(self.ranks)], axis=0)
            before = min((self.busy[s] for s in self.busy if s < step), default=math.inf)
            self.plans[step] = planned_order(figures.tolist(), self.numels, before)
            self.busy[step] = float(figures[-1])
        return self.plans[step]
