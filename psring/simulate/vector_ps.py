"""The parameter server (dedicated servers, one worker per host, BSP, ``--overlap none``) replayed as a fluid
with numpy, for hundreds of workers and servers, where ``programs.PSProgram`` on the flow network would
track N*S connections (N = S = 64: 1.6 minutes a step; 1,024: out of reach).

The same plan as ``PSProgram`` (``transport.chunk_ranges``: chunk i of ``chunks`` goes to its server; a
worker keeps ``window`` pushes unanswered per server, ``sharding.default_window``), on the same links
(worker and server links ``B_w``/``B_s`` each way, alpha per message), with two simplifications that make
every worker a point on one line:

* a worker's pushes leave as one stream in chunk order (its uplink is one queue); every worker pushing
  moves at ``min(B_w, S*B_s/k)`` with k workers pushing (the servers' downlinks shared fairly, each server
  taking 1/S of every stream: chunks go round-robin), so no worker overtakes another;
* a server answers chunk i once the last worker's push of it is in (``R_i``; the update is free) and sends
  its N replies together, one reply batch after the other (FIFO), each worker's copy at
  ``min(B_s/N, B_w/k_r)`` with k_r servers replying; every worker holds chunk i's reply at the same time
  ``E_i``, and a worker's push of chunk i waits for ``E`` of the chunk ``window`` earlier on its server.

Time moves in ticks of an eighth of the smallest chunk's push with every worker pushing (a worker waiting at a
gate that opens inside a tick moves for the rest of it; ``R`` and ``E`` are interpolated inside their tick),
and jumps over stretches in which nothing moves (compute). Without tbf's burst: a switch has none (``--link-burst 0kb``).

How close it stays to the flow replay (``benchmarks/fluid_check.py`` -> ``results/simulate/fluid_check.csv``,
ResNet-50, N = 8-32): S = N within 1% of the step at 10 and 25 Gbit/s, 4% fast at 100 Gbit/s (its sync 0.68-0.71x);
S = N/4, where one credit per server meets several chunks per server, 1.01-1.20x the step (sync up to 1.27x): a
server's FIFO answers its workers one after the other, so the first ones push their next chunk while the rest wait,
where the fluid lets every worker have the reply at once. ``tests/test_simulate_ps.py`` holds it to 3% at N <= 8.
"""
from __future__ import annotations

import numpy as np

TICKS_PER_CHUNK = 8


class VectorPS:
    """``chunks``: (server, bytes) in chunk order; ``window``: pushes unanswered per server (0: no limit)."""

    def __init__(self, workers: int, chunks: list[tuple[int, int]], window: int, worker_Bps: float,
                 server_Bps: float, alpha_s: float):
        self.n, self.alpha = workers, alpha_s
        self.bw, self.bs = float(worker_Bps), float(server_Bps)
        self.server = np.array([s for s, _ in chunks], dtype=np.int64)
        self.size = np.array([b for _, b in chunks], dtype=np.float64)
        self.servers = int(self.server.max()) + 1
        self.cum = np.concatenate([[0.0], np.cumsum(self.size)])
        self.prev = np.full(len(chunks), -1, dtype=np.int64)  # the chunk whose reply frees chunk i's credit
        self.queue: list[list[int]] = [[] for _ in range(self.servers)]  # each server's chunks, in order
        for i, s in enumerate(self.server):
            q = self.queue[s]
            if window and len(q) >= window:
                self.prev[i] = q[len(q) - window]
            q.append(i)
        self.frees = np.full(len(chunks), -1, dtype=np.int64)  # the chunk whose credit chunk i's reply frees
        self.frees[self.prev[self.prev >= 0]] = np.flatnonzero(self.prev >= 0)
        self.lens = np.array([len(q) for q in self.queue])
        # a tick: an eighth of the smallest chunk's push with every worker pushing
        self.dt = float(self.size.min()) / TICKS_PER_CHUNK / min(self.bw, self.servers * self.bs / workers)

    def step(self, start: np.ndarray) -> tuple[float, float]:
        """When every worker holds every chunk's reply (the same time for all), given when each began to
        push (its backward ended); and the bytes each pushed."""
        c, n, alpha, dt = len(self.size), self.n, self.alpha, self.dt
        go = np.asarray(start, dtype=np.float64) + alpha  # a worker's first push starts alpha after it is sent
        pos = np.zeros(n)
        self.r_at, self.e_at = np.full(c, np.nan), np.full(c, np.nan)
        self.gate = np.where(self.prev < 0, -np.inf, np.inf)  # when chunk i's push may start
        self.head = np.zeros(self.servers, dtype=np.int64)  # per server, its next reply batch (index in queue)
        self.heads = np.array([q[0] for q in self.queue])  # the chunk of each server's head batch
        self.left = self.size[self.heads].copy()  # bytes per worker left of that batch
        self.ready = np.full(self.servers, np.inf)  # when each head batch may leave (inf: not yet known)
        self.ready_floor = np.full(self.servers, -np.inf)  # per server, when its last reply batch ended
        opened, lagged, t = 0, 0, float(go.min())
        cap = self.servers * self.bs
        while lagged < c or (self.head < self.lens).any():
            was, since = self.cum[opened], go
            while opened < c and self.gate[opened] < t + dt:  # a gate opening inside this tick: from then on
                since = np.where(pos >= was, np.maximum(go, self.gate[opened]), go)
                opened += 1
            bound = self.cum[opened]
            pushing = (go < t + dt) & (pos < bound)
            if pushing.any():
                rate = min(self.bw, cap / int(pushing.sum()))
                run = np.clip(t + dt - np.maximum(since, t), 0.0, dt)
                new = np.where(pushing, np.minimum(pos + rate * run, bound), pos)
                lag0, lag1 = pos.min(), new.min()
                while lagged < c and self.cum[lagged + 1] <= lag1 + 1e-6:  # the last worker's push is in
                    frac = (self.cum[lagged + 1] - lag0) / (lag1 - lag0) if lag1 > lag0 else 1.0
                    self.r_at[lagged] = t + dt * min(max(frac, 0.0), 1.0)
                    s = self.server[lagged]
                    if self.heads[s] == lagged and self.head[s] < self.lens[s]:
                        self.ready[s] = max(self.ready_floor[s], self.r_at[lagged] + alpha)
                    lagged += 1
                pos = new
            elif not self._replying(t, dt).any():  # nothing moves: jump to the next thing that can
                nxt = min(go[go > t].min(initial=np.inf), self.ready.min(), self.gate[opened] if opened < c else np.inf)
                if not np.isfinite(nxt):
                    raise RuntimeError("the PS replay stalled: no push, reply or gate left to wait for")
                t = max(t + dt, float(nxt))
                continue
            self._replies(t, dt)
            t += dt
        return float(np.nanmax(self.e_at)), float(self.cum[-1])

    def _replying(self, t: float, dt: float) -> np.ndarray:
        return (self.head < self.lens) & (self.ready < t + dt)

    def _replies(self, t: float, dt: float) -> None:
        """Move every server's head reply batch on by one tick; a batch that ends frees its successor
        (FIFO) and opens the gate of the push its reply frees."""
        replying = self._replying(t, dt)
        k_r = int(replying.sum())
        if not k_r:
            return
        rate = min(self.bs / self.n, self.bw / k_r)
        end = t + dt
        self.left[replying] -= rate * (end - np.maximum(self.ready[replying], t))
        for s in np.flatnonzero(replying & (self.left <= 0)):
            now = end + self.left[s] / rate  # when it ended, inside this tick
            while True:
                i = self.heads[s]
                self.e_at[i] = now
                if self.frees[i] >= 0:
                    self.gate[self.frees[i]] = now + self.alpha
                self.head[s] += 1
                self.ready_floor[s] = now
                if self.head[s] == self.lens[s]:
                    self.ready[s] = np.inf
                    break
                self.heads[s] = j = self.queue[s][self.head[s]]
                self.left[s] = self.size[j]
                self.ready[s] = max(now, self.r_at[j] + self.alpha) if np.isfinite(self.r_at[j]) else np.inf
                if self.ready[s] >= end:
                    break
                self.left[s] -= rate * (end - self.ready[s])
                if self.left[s] > 0:
                    break
                now = end + self.left[s] / rate


def vector_ps_of(cfg, alpha_s: float) -> VectorPS:
    """The run's lockstep fluid from the PS's own plan (``plans.ps_plan``) and links, whatever its S (``psring
    simulate`` takes it for BSP at S = 1 and S >= N: ``run.vector_of``)."""
    from .plans import layout_of, link_Bps, ps_plan

    chunks, window = ps_plan(cfg, layout_of(cfg))
    return VectorPS(cfg.workers, chunks, window, link_Bps(cfg.link_rate), link_Bps(cfg.server_link_rate or cfg.link_rate),
                    alpha_s)


def lockstep_summary(cfg, jitter: str, alpha_s: float) -> dict:
    """The run's summary figures (``metrics.summary.summarize``) on the lockstep fluid, without a run folder, at any
    S: what ``benchmarks/fluid_check.py`` and ``async_check.py`` set beside the flow replay and the drifting fluid."""
    import pandas as pd

    from ..metrics.summary import summarize
    from .records import vector_records
    from .checks import check, parse_jitter
    from .run import compute_times

    compute = compute_times(cfg, check(cfg), parse_jitter(jitter))
    records = vector_records(cfg, compute, vector_ps_of(cfg, alpha_s))
    return summarize(pd.DataFrame([x for rank in records for x in rank]), cfg.workers, cfg.warmup)
