"""``--overlap backward|full`` replayed for the flat ring (``allreduce``, ``ring``; with G workers a host a send
inside a host is free; the PS's chunks: ``overlapped_ps``): the units ``ReduceSync`` cuts (``unit_ranges``: its
own ``_ranges``), each ready on a worker once backward made its last parameter's gradient (``train.emulation``'s clock: forward 1/3, backward 2/3, readiness and per-layer
forward in proportion to the parameters' elements), reduced on one ring one after another in an order every
rank shares. (The ring runs two at once, on two lanes, and gloo's all-reduce on its two threads: what that buys
is the time a lockstep round waits on the CPU, which no link here spends; two at once would share the links and
end together no earlier.)

* ``backward``: units leave in the order they became ready (index order), each as soon as it is ready on a
  rank; the step ends once every unit is back, and the next forward starts then.
* ``full``: the priority scheduler (``sync.schedule``): a decision takes the highest index ready on every
  rank, once fewer than ``CREDITS`` reductions are in flight on every rank, after a consensus round
  (2(N-1) alpha), for ``LEARN_STEPS`` steps; later steps keep the order planned from their timing
  (``timed_plan``), with no rounds (each rank enters a unit once it is ready there); the next forward starts right after backward and each parameter's share of it waits for
  the units holding that parameter (``sync.overlap``'s gates); the waits are booked as sync, as the trainer
  books them. The local optimizer's update (``--update-ms``) runs before each forward (``full``: at the gates).
"""
from __future__ import annotations

import numpy as np

from ..sync.ring import chunk_sizes, schedule
from ..sync.schedule import CREDITS, LEARN_STEPS, timed_step
from .timed_plan import TimedSteps, source

SEND, RECV = 1, 2


def partition_bytes(cfg, m_bytes: int, alpha_s: float) -> int:
    """``--bucket-mb``, else the partition ``link_probe.reduce_partition_bytes`` cuts for a probe of this
    link: its TCP goodput and, as a call's fixed cost, the ring's 2(N-1) alphas (the replay's own)."""
    from ..sync.link_probe import MIN_FIXED_S, LinkProbe, reduce_partition_bytes
    from .plans import link_Bps

    if cfg.bucket_mb:
        return int(cfg.bucket_mb * 2**20)
    rate = link_Bps(cfg.link_rate)
    fixed = max(MIN_FIXED_S, 2 * (cfg.workers - 1) * alpha_s)
    return reduce_partition_bytes(m_bytes, cfg.workers, LinkProbe(rate, fixed))


class _PlanOnly:
    """What ``ReduceSync._ranges`` reads of a reducer that keeps the default plan."""
    from ..sync.reducer import Reducer
    ranges = Reducer.ranges


def unit_ranges(cfg, layout, cap_bytes: int):
    """The units ``ReduceSync._ranges`` cuts with this overlap mode (whole-parameter buckets after a first
    small one; with ``full``, partitions cut at the parameters' boundaries, a larger one split:
    ``buckets.aligned_ranges``)."""
    from types import SimpleNamespace

    from ..sync.reducer import ReduceSync

    plan = SimpleNamespace(scheduled=cfg.overlap == "full", reducer=_PlanOnly(), cap=cap_bytes,
                           first_cap=int(cfg.first_bucket_mb * 2**20))
    return ReduceSync._ranges(plan, layout)


class Plan:
    """One dtype's units and parameters: ``numels[u]``; ``ready[u]``, the share of backward after which
    unit u is ready; ``shares[p]`` and ``covering[p]`` per parameter in forward (registration) order."""

    def __init__(self, layout, units, weights: dict[str, float] | None = None):
        """``weights``: each parameter's share of compute by name (``profile.param_weights``), else its size."""
        if len(layout) != 1:
            raise ValueError("the overlap replay takes one dtype's gradients")
        members = layout[0].members  # backward order
        sizes = np.array([p.numel() for _, p, _ in members], dtype=np.int64)
        ends = np.cumsum(sizes)
        work = sizes.astype(np.float64) if weights is None else np.array([weights[n] for n, _, _ in members])
        done = np.cumsum(work)  # backward's progress once each parameter has its gradient
        total = float(done[-1])
        self.numels = [u.end - u.start for u in units]
        # a unit is ready once the parameter holding its last element has its gradient
        self.ready = [float(done[np.searchsorted(ends, u.end - 1, side="right")]) / total for u in units]
        starts = ends - sizes
        cover = [[i for i, u in enumerate(units) if u.start < e and u.end > s] for s, e in zip(starts, ends)]
        self.shares = [float(w) / total for w in work[::-1]]
        self.covering = cover[::-1]


class UnitRing:
    """Reductions one after another on a ring of all ranks, in ``order`` ((step, unit), shared by every
    rank): a rank enters a reduction's first round once it was launched there; a round's transfer from
    position i to i + 1 starts once both are in that round and ends the round for i once its send and its
    receive arrived (as ``programs.RingProgram``). ``unit_done(rank, step, unit)`` when a rank has a sum."""

    def __init__(self, net, host_of: list[int], numels: list[int], itemsize: int, unit_done):
        self.net, self.host_of, self.unit_done = net, host_of, unit_done
        n = self.n = len(host_of)
        self.sends = [[sent for _, _, sent, _ in schedule(i, n)] for i in range(n)]
        self.sizes = [[c * itemsize for c in chunk_sizes(m, n)] for m in numels]
        self.order: list[tuple[int, int]] = []
        self.launched: set = set()  # (rank, step, unit)
        self.seq, self.round = [0] * n, [-1] * n  # the reduction each rank is on; its round (-1: not entered)
        self.arrived: dict = {}  # (rank, seq, round) -> SEND | RECV bits
        self.going: set = set()  # (rank, seq, round) whose send started

    def step_bytes(self, i: int) -> float:
        """What rank i sends (and receives) in a step: every unit's rounds."""
        return float(sum(sizes[c] for sizes in self.sizes for c in self.sends[i]))

    def append(self, step: int, unit: int) -> None:
        self.order.append((step, unit))
        for i in range(self.n):
            self._enter(i)

    def launch(self, rank: int, step: int, unit: int) -> None:
        self.launched.add((rank, step, unit))
        self._enter(rank)

    def _enter(self, i: int) -> None:
        k = self.seq[i]
        if self.round[i] == -1 and k < len(self.order) and (i, *self.order[k]) in self.launched:
            self.round[i] = 0
            self._try(i)
            self._try((i - 1) % self.n)

    def _try(self, i: int) -> None:
        right = (i + 1) % self.n
        k, j = self.seq[i], self.round[i]
        if j < 0 or self.seq[right] != k or self.round[right] != j or (i, k, j) in self.going:
            return
        self.going.add((i, k, j))
        nbytes = self.sizes[self.order[k][1]][self.sends[i][j]]
        self.net.send(self.host_of[i], self.host_of[right], nbytes,
                      lambda: (self._arrive(i, k, j, SEND), self._arrive(right, k, j, RECV)))

    def _arrive(self, i: int, k: int, j: int, what: int) -> None:
        got = self.arrived.get((i, k, j), 0) | what
        if got != SEND | RECV:
            self.arrived[i, k, j] = got
            return
        self.arrived.pop((i, k, j), None)
        self.going.discard((i, k, j))
        if j + 1 < len(self.sends[i]):
            self.round[i] = j + 1
            self._try(i)
            self._try((i - 1) % self.n)
            return
        self.round[i], self.seq[i] = -1, k + 1
        step, unit = self.order[k]
        self.launched.discard((i, step, unit))
        self.unit_done(i, step, unit)
        self._enter(i)


class OverlapReplay:
    """Every worker's steps on the flow network with its communication overlapped (``cfg.overlap``):
    ``records`` as ``run.Replay``'s."""

    def __init__(self, cfg, compute: np.ndarray, alpha_s: float, tuned: dict | None = None,
                 readiness: str = "bytes", update_s: float = 0.0):
        """``tuned``: what the run being replayed cut (``partition_bytes``, ``chunk_bytes``), else cut here;
        ``readiness``: when backward makes each gradient (``profile``); ``update_s``: the local optimizer's
        update, run before each forward (``full``: by the gates, with each parameter's forward share)."""
        from .. import strategies
        from ..sync.buckets import layout_bytes
        from .plans import layout_of
        from .profile import param_weights
        from .run import cluster

        self.cfg, self.compute, self.full, self.update_s = cfg, compute, cfg.overlap == "full", update_s
        self.net, host_of, server_host = cluster(cfg, alpha_s)
        layout, tuned = layout_of(cfg), tuned or {}
        if strategies.uses_servers(cfg.sync):
            from .overlapped_ps import OverlapPS, ps_schedule

            ranges, window, credit, link_Bps, by_acks = ps_schedule(cfg, layout, tuned.get("chunk_bytes"))
            chunks = [(r.group, (r.end - r.start) * layout[0].dtype.itemsize) for r in ranges]
            self.prog = OverlapPS(self.net, host_of, server_host, chunks, window, credit, self._unit_done,
                                  link_Bps, timed_busy=by_acks)
        else:
            m_bytes = layout_bytes(layout)
            cap = int(tuned.get("partition_bytes") or partition_bytes(cfg, m_bytes, alpha_s))
            ranges = unit_ranges(cfg, layout, cap)
            self.prog = UnitRing(self.net, host_of, [r.end - r.start for r in ranges], layout[0].dtype.itemsize,
                                 self._unit_done)
        self.plan = Plan(layout, ranges, param_weights(cfg, readiness))
        self.units = len(ranges)
        self.priority = self.full and isinstance(self.prog, UnitRing)  # the reduce family's scheduler
        n = cfg.workers
        if isinstance(self.prog, UnitRing) and not self.priority:  # every step's units in index order
            self.prog.order = [(s, u) for s in range(cfg.steps) for u in range(self.units)]
        self.consensus_s = 2 * (n - 1) * alpha_s
        self.records: list[list[dict]] = [[] for _ in range(n)]
        self.step, self.began, self.forward_s = [0] * n, [0.0] * n, [0.0] * n
        self.backward_end = [0.0] * n
        self.back: list[dict] = [{} for _ in range(n)]  # step -> units summed on this rank
        self.cursor, self.param, self.waiting = [0.0] * n, [0] * n, [False] * n
        self.ready: dict = {}  # (step, unit) -> ranks it is ready on (full)
        self.deciding, self.next_step = False, 0
        self.orders: dict[int, list[int]] = {}  # step -> its units in the order decided
        self.timed = TimedSteps(self.plan.numels, n)  # the scheduler's timed steps, and its plans
        for r in range(n):
            self._begin(r)

    def _begin(self, r: int) -> None:
        from ..train.compute_spec import FORWARD_SHARE

        s = self.step[r]
        self.began[r] = self.net.now
        self.forward_s[r] = float(self.compute[s, r]) * FORWARD_SHARE + self.update_s
        if self.full and s > 0:
            self.cursor[r], self.param[r] = self.net.now, 0
            self._forward(r)
        else:
            self.net.at(self.net.now + self.forward_s[r], lambda: self._backward(r))

    def _forward(self, r: int) -> None:
        """The gated forward: each parameter's share once the units holding it are summed here."""
        now, plan, back = self.net.now, self.plan, self.back[r].get(self.step[r] - 1, set())
        cur = max(self.cursor[r], now)
        while self.param[r] < len(plan.shares):
            p = self.param[r]
            if not all(u in back for u in plan.covering[p]):
                self.cursor[r] = cur
                if cur > now:
                    self.net.at(cur, lambda: self._forward(r))
                else:
                    self.waiting[r] = True
                return
            cur += self.forward_s[r] * plan.shares[p]
            self.param[r] += 1
        self.net.at(cur, lambda: self._backward(r))

    def _backward(self, r: int) -> None:
        from ..train.compute_spec import FORWARD_SHARE

        s, now = self.step[r], self.net.now
        backward_s = float(self.compute[s, r]) * (1 - FORWARD_SHARE)
        for u, share in enumerate(self.plan.ready):
            self.net.at(now + backward_s * share, lambda u=u: self._ready(r, s, u))
        self.backward_end[r] = now + backward_s
        if self.full:
            self.net.at(self.backward_end[r], lambda: self._step_done(r))

    def _mark(self, s: int, what: int, u: int, r: int | None = None) -> None:
        """A timed step's ready (``what`` 0), done (1) or commit (2) time of unit u (on rank r): now."""
        if self.priority and timed_step(s):
            self.timed.arrays(s)[what][u if r is None else (u, r)] = self.net.now

    def _ready(self, r: int, s: int, u: int) -> None:
        self.prog.launch(r, s, u)
        self._mark(s, 0, u, r)
        if self.priority:
            self.ready[s, u] = self.ready.get((s, u), 0) + 1
            self._decide()

    def _decide(self) -> None:
        """The priority scheduler's next decision: once no rank has ``CREDITS`` reductions in flight, the
        highest index ready on every rank, after a consensus round."""
        k, ring = len(self.prog.order), self.prog
        if self.deciding or self.next_step >= self.cfg.steps or min(ring.seq) < k - CREDITS + 1:
            return
        s = self.next_step
        if s >= LEARN_STEPS > 0:  # the order kept: the next unit in it, no round (once planned)
            order = self.timed.plan(source(s))
            return None if order is None else self._commit(s, order[len(self.orders.get(s, ()))])
        decided = self.orders.get(s, ())
        ready = [u for u in range(self.units) if u not in decided and self.ready.get((s, u), 0) == self.cfg.workers]
        if ready:
            self.deciding = True
            self.net.at(self.net.now + self.consensus_s, lambda: self._commit(s, max(ready)))

    def _commit(self, s: int, u: int) -> None:
        self.deciding = False
        self._mark(s, 2, u)
        self.orders.setdefault(s, []).append(u)
        if len(self.orders[s]) == self.units:
            self.next_step += 1
        self.prog.append(s, u)
        self._decide()

    def _unit_done(self, r: int, s: int, u: int) -> None:
        self._mark(s, 1, u, r)
        self.back[r].setdefault(s, set()).add(u)
        self.back[r].pop(s - 2, None)
        if self.full:
            if self.waiting[r] and self.step[r] == s + 1:
                self.waiting[r] = False
                self._forward(r)
            if self.priority:
                self._decide()
        elif len(self.back[r][s]) == self.units:
            self._step_done(r)

    def _step_done(self, r: int) -> None:
        """Worker r's step is over (``backward``: its units are back; ``full``: backward ended): its record
        (``full``: the gates' waits as sync), and its next step."""
        from .records import record

        s, now = self.step[r], self.net.now
        end = self.began[r] + float(self.compute[s, r]) + self.update_s if self.full else self.backward_end[r]
        self.records[r].append(record(self.cfg, r, s, self.began[r], end, now, self.prog.step_bytes(r), None, self.update_s))
        self.step[r] += 1
        if self.step[r] < self.cfg.steps:
            self._begin(r)
