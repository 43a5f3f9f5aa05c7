"""The parameter server under BSP, SSP and ASP (dedicated servers, one worker per host, ``--overlap none``)
replayed as a fluid with numpy, where workers drift apart: for the hundreds of workers at which
``programs.PSProgram`` on the flow network takes minutes a step.

Each worker runs its own steps: compute (its draw of ``--jitter``), then its pushes of the step's chunks, then
the replies; its next step starts once it holds every reply. The plan is the PS's own (``plans.ps_plan``:
chunk i of ``chunks`` on its server, round robin; ``window`` pushes unanswered per server). Every worker is a
point on the step's bytes, with:

* pushes moving at ``min(B_w, S*B_s/k_p)`` with k_p workers pushing (each spreads its stream over the S
  servers' downlinks, as ``vector_ps.VectorPS`` has it), and never more than ``window`` chunks a server
  ahead of the worker's own replies (chunk i waits for the reply to chunk i - window*S);
* replies moving at ``min(B_w, S*B_s/k_r)`` with k_r workers receiving, up to what the consistency lets a
  server answer (``sync/ps/consistency.py``): ASP a chunk once it is in; BSP a chunk once every worker's
  push of it is in; SSP with staleness k a worker's step t once every worker has pushed all of step t - k
  (and its own chunk is in); SSP with k = 0 once every worker has pushed the whole step.

Time moves in ticks of an eighth of a chunk's push at a worker link's rate (a worker alone pushes at it); a worker whose compute ends,
or whose last reply lands, inside a tick is timed inside it. What it leaves out: alpha but once a step (a
message's alpha is 20 us against chunks of 60 us to 1.3 ms at 25 Gbit/s here), the servers' update time
(free, as in every replay), and which server a chunk is on (the servers share every worker's stream alike).
``tests/test_simulate_async.py`` holds it within 5% of the flow replay at N = 16 (``benchmarks/async_check.py``:
0.98-1.03 at N = 16-32, 0.90-0.97 at N = 8, where the flow replay's workers settle into turns).
"""
from __future__ import annotations

import numpy as np

from ..config_choices import CONSISTENCY

BSP, SSP, ASP = CONSISTENCY

TICKS_PER_CHUNK = 8


class AsyncPS:
    """``chunks``: (server, bytes) in chunk order; ``window``: pushes unanswered per server (0: no limit)."""

    def __init__(self, workers: int, chunks: list[tuple[int, int]], window: int, worker_Bps: float,
                 server_Bps: float, alpha_s: float, consistency: str, staleness: int):
        if consistency not in (BSP, SSP, ASP):
            raise ValueError(f"consistency must be one of {BSP}, {SSP}, {ASP}, got {consistency!r}")
        self.n, self.alpha, self.consistency, self.k = workers, alpha_s, consistency, staleness
        self.bw, self.bs = float(worker_Bps), float(server_Bps)
        sizes = np.array([b for _, b in chunks], dtype=np.float64)
        self.servers = max(s for s, _ in chunks) + 1
        self.cum = np.concatenate([[0.0], np.cumsum(sizes)])  # chunk i is bytes cum[i]..cum[i+1] of a step
        self.m, self.chunks = float(self.cum[-1]), len(chunks)
        self.ahead = window * self.servers if window else self.chunks  # chunks pushed beyond the replied ones
        self.dt = float(sizes.min()) / TICKS_PER_CHUNK / self.bw  # a worker alone pushes at its link's rate

    def _whole(self, pos: np.ndarray) -> np.ndarray:
        """Chunks wholly inside the first ``pos`` bytes of a step."""
        return np.searchsorted(self.cum, pos + 1e-6, side="right") - 1

    def run(self, compute: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every worker's steps given ``compute[step, rank]``: (began, backward_end, end), each [steps, N]."""
        steps, n, m, dt = compute.shape[0], self.n, self.m, self.dt
        began, backward_end, end = (np.full((steps, n), np.nan) for _ in range(3))
        step = np.zeros(n, dtype=np.int64)  # each worker's current step (steps: done)
        pushed, replied = np.zeros(n), np.zeros(n)  # bytes of the current step
        began[0] = 0.0
        go = compute[0] + self.alpha  # when each worker's pushes of its current step may start
        backward_end[0] = compute[0]
        t, cap = 0.0, self.servers * self.bs
        while (step < steps).any():
            live = step < steps
            limit = np.minimum(m, self.cum[np.minimum(self._whole(replied) + self.ahead, self.chunks)])
            pushing = live & (go < t + dt) & (pushed < limit)
            if pushing.any():
                rate = min(self.bw, cap / int(pushing.sum()))
                run = np.clip(t + dt - np.maximum(go, t), 0.0, dt)
                pushed = np.where(pushing, np.minimum(pushed + rate * run, limit), pushed)
            gate = self._gate(pushed, step, live)
            replying = live & (replied < gate)
            if replying.any():
                rate = min(self.bw, cap / int(replying.sum()))
                was = replied.copy()
                replied = np.where(replying, np.minimum(replied + rate * dt, gate), replied)
                done = replying & (replied >= m - 1e-6)
                for r in np.flatnonzero(done):
                    s = step[r]
                    end[s, r] = t + (m - was[r]) / rate
                    step[r] += 1
                    if step[r] < steps:
                        began[s + 1, r] = end[s, r]
                        backward_end[s + 1, r] = end[s, r] + compute[s + 1, r]
                        go[r] = backward_end[s + 1, r] + self.alpha
                    pushed[r] = replied[r] = 0.0
            elif not pushing.any():  # nothing moves: jump to the next compute's end
                waiting = live & (go > t)
                if not waiting.any():
                    raise RuntimeError("the PS replay stalled: no push, reply or compute left to wait for")
                t = max(t + dt, float(go[waiting].min()) - dt)
                continue
            t += dt
        return began, backward_end, end

    def _gate(self, pushed: np.ndarray, step: np.ndarray, live: np.ndarray) -> np.ndarray:
        """How far each worker's replies of its current step may go (bytes), given every worker's pushes
        (a worker past the last step counts as having pushed everything)."""
        own = self.cum[self._whole(pushed)]  # a server answers a chunk once it is in
        if self.consistency == ASP:
            return own
        if self.consistency == BSP:  # chunk i of step t once every worker has pushed it
            gate = np.zeros(self.n)
            for t in np.unique(step[live]):
                progress = np.where(step > t, self.m, np.where(step == t, pushed, 0.0))
                gate[step == t] = self.cum[self._whole(progress.min())]
            return gate
        rounds = step + (pushed >= self.m - 1e-6)  # steps each worker has wholly pushed
        ok = rounds.min() >= step + 1 - self.k  # SSP: step t once every worker has pushed all of step t - k
        return np.where(ok, self.m if self.k == 0 else own, 0.0)  # k = 0: the whole round (waits_for_round)


def async_of(cfg, alpha_s: float) -> AsyncPS:
    """The run's fluid from the PS's own plan (``plans.ps_plan``) and links, whatever its consistency (``psring
    simulate`` gives BSP this fluid where 1 < S < N and ``vector_ps.VectorPS`` at S = 1 and S = N;
    ``benchmarks/async_check.py`` and ``fluid_check.py`` compare the two)."""
    from .plans import layout_of, link_Bps, ps_plan

    chunks, window = ps_plan(cfg, layout_of(cfg))
    return AsyncPS(cfg.workers, chunks, window, link_Bps(cfg.link_rate), link_Bps(cfg.server_link_rate or cfg.link_rate),
                   alpha_s, cfg.consistency, cfg.staleness)


def async_records(cfg, compute: np.ndarray, replay: AsyncPS) -> list[list[dict]]:
    """Every step of every worker, as ``Replay`` records them (sync: from the compute's end to the last reply)."""
    from .records import add_step

    began, backward_end, end = replay.run(compute)
    records: list[list[dict]] = [[] for _ in range(cfg.workers)]
    for step in range(cfg.steps):
        add_step(records, cfg, step, began[step], backward_end[step], end[step], replay.m)
    return records


def async_summary(cfg, jitter: str, alpha_s: float) -> dict:
    """The run's summary figures (``metrics.summary.summarize``) on this fluid, without a run folder."""
    import pandas as pd

    from ..metrics.summary import summarize
    from .checks import check, parse_jitter
    from .run import compute_times

    compute = compute_times(cfg, check(cfg), parse_jitter(jitter))
    records = async_records(cfg, compute, async_of(cfg, alpha_s))
    return summarize(pd.DataFrame([x for rank in records for x in rank]), cfg.workers, cfg.warmup)
