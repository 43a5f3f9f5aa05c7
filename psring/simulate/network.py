"""A flow-level network for ``psring simulate``: full-duplex host links into one non-blocking switch, every
message a flow that starts alpha after it is sent and then shares each link it crosses max-min fairly with
the flows on it (progressive filling, recomputed whenever a flow starts or ends), as TCP flows through a
switch port roughly do.

An event loop with one clock: ``at(t, fn)`` runs ``fn`` at time t, ``send(src, dst, nbytes, done)`` moves
nbytes from host src's uplink to host dst's downlink and calls ``done()`` when the last byte arrived.
Messages inside a host (src == dst) cost nothing: an emulated host's loopback, the stand-in for NVLink/PCIe.

    >>> net = Network([1e6, 1e6, 1e6], alpha_s=0.0)
    >>> ends = []
    >>> for src in (0, 1):  # two flows into host 2's downlink: 0.5 MB/s each
    ...     net.send(src, 2, 1e6, lambda: ends.append(net.now))
    >>> net.run(); [round(t, 6) for t in ends]
    [2.0, 2.0]
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable

EPS = 1e-3  # bytes: a flow this close to its end after a step of the clock has ended (rounding)
REFILL = 64 << 10  # bytes: a dry bucket lets the link burst again once it holds a GSO packet's worth
TOKEN_EPS = 1.0  # bytes: a bucket holding less is dry (what the clock's rounding leaves of a drained one)
PEAK_BPS = 2e9  # what a veth pair moves with the bucket's tokens (a memory copy; well above any rate here)


class Flow:
    __slots__ = ("links", "left", "rate", "done")

    def __init__(self, links: tuple[int, int], nbytes: float, done: Callable[[], None]):
        self.links, self.left, self.rate, self.done = links, float(nbytes), 0.0, done


class Network:
    """Hosts 0..H-1, host h with an uplink and a downlink of ``rates_Bps[h]`` (bytes/s) each way."""

    def __init__(self, rates_Bps: list[float], alpha_s: float = 0.0, burst_bytes: float = 0.0,
                 peak_Bps: float = PEAK_BPS):
        """``burst_bytes``: tbf's bucket on every link: a link idle (or below its rate) banks up to that
        many bytes, which it then sends at ``peak_Bps`` (the veth's own speed) before falling back to its
        rate; 0: a plain rate."""
        self.rates = [float(r) for r in rates_Bps] * 2  # uplink h is link h, downlink h link H + h
        self.burst, self.peak = float(burst_bytes), max(float(peak_Bps), max(self.rates))
        self.tokens = [self.burst] * len(self.rates)  # full at the start, as after an idle link
        self.caps = [self.peak if self.burst > 0 else r for r in self.rates]
        self.hosts = len(rates_Bps)
        self.alpha = alpha_s
        self.now = 0.0
        self.flows: list[Flow] = []
        self.timers: list = []
        self.dirty = False  # flows started or ended, or a link's cap changed, since the rates were shared
        self._seq = itertools.count()

    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self.timers, (t, next(self._seq), fn))

    def send(self, src: int, dst: int, nbytes: float, done: Callable[[], None]) -> None:
        """Move ``nbytes`` from host ``src`` to host ``dst``; ``done()`` once they arrived."""
        if src == dst or nbytes <= 0:
            self.at(self.now, done)
            return
        flow = Flow((src, self.hosts + dst), nbytes, done)
        self.at(self.now + self.alpha, lambda: self._start(flow))

    def _start(self, flow: Flow) -> None:
        self.flows.append(flow)
        self.dirty = True  # re-shared once every event of this instant has run (rates only act as time moves)

    def _share(self) -> None:
        """Rates by progressive filling with each uplink FIFO: a host's messages leave in the order they
        were sent (one qdisc queue per link, as tbf's), so only an uplink's first unfinished flow fills it,
        and the next one takes what a busy downlink leaves it; at a downlink the flows of different senders
        share fairly (max-min), as TCP flows into one switch port do."""
        left = list(self.caps)
        queues: dict[int, list[Flow]] = {}
        for f in self.flows:  # self.flows is in start order
            f.rate = 0.0
            queues.setdefault(f.links[0], []).append(f)
        heads = {up: 0 for up in queues}  # per uplink, the index of its flow now filling
        active = {q[0] for q in queues.values()}
        while active:
            count: dict[int, int] = {}
            for f in active:
                for link in f.links:
                    count[link] = count.get(link, 0) + 1
            x = min(left[k] / n for k, n in count.items())
            for f in active:
                f.rate += x
                for k in f.links:
                    left[k] -= x
            full = {k for k in count if left[k] <= EPS}
            for f in [f for f in active if full.intersection(f.links)]:
                active.discard(f)
                up = f.links[0]
                if up in full:
                    continue
                q = queues[up]  # its downlink is full: the uplink's next flow takes what is left of it
                heads[up] += 1
                while heads[up] < len(q) and left[q[heads[up]].links[1]] <= EPS:
                    heads[up] += 1
                if heads[up] < len(q):
                    active.add(q[heads[up]])

    def _used(self) -> list[float]:
        used = [0.0] * len(self.rates)
        for f in self.flows:
            for k in f.links:
                used[k] += f.rate
        return used

    def _token_event(self, used: list[float]) -> float:
        """When the next link with tokens runs out of them at its current use (inf: none does)."""
        return min((self.now + self.tokens[k] / (u - self.rates[k]) for k, u in enumerate(used)
                    if self.caps[k] > self.rates[k] and u > self.rates[k]), default=math.inf)

    def _advance(self, dt: float, used: list[float]) -> bool:
        """Move flows and tokens on by ``dt``; whether a link's cap changed (its bucket ran dry or refilled)."""
        for f in self.flows:
            f.left -= f.rate * dt
        changed = False
        for k, u in enumerate(used):
            if self.burst > 0:
                self.tokens[k] = min(self.burst, max(0.0, self.tokens[k] + (self.rates[k] - u) * dt))
                if self.tokens[k] <= TOKEN_EPS:
                    self.tokens[k] = 0.0
                wet = self.caps[k] > self.rates[k]  # hysteresis: dry until a packet's worth is back
                cap = self.peak if self.tokens[k] > (0 if wet else REFILL - TOKEN_EPS) else self.rates[k]
                changed = changed or cap != self.caps[k]
                self.caps[k] = cap
        return changed

    def _refill_event(self, used: list[float]) -> float:
        """When a dry link has a packet's worth of tokens again (it runs below its rate). A link whose rate
        is the veth's own (``peak_Bps``) is never dry: its bucket changes nothing."""
        return min((self.now + (REFILL - self.tokens[k]) / (self.rates[k] - u) for k, u in enumerate(used)
                    if self.burst > 0 and self.caps[k] == self.rates[k] and u < self.rates[k] - EPS
                    and self.tokens[k] < REFILL), default=math.inf)

    def run(self) -> None:
        """Advance until nothing is left to happen."""
        while self.flows or self.timers:
            if self.dirty:
                self._share()
                self.dirty = False
            used = self._used()
            t_flow = min((self.now + f.left / f.rate for f in self.flows if f.rate > 0), default=math.inf)
            t_timer = self.timers[0][0] if self.timers else math.inf
            t = min(t_flow, t_timer, self._token_event(used), self._refill_event(used))
            if t == math.inf:
                return
            changed = self._advance(t - self.now, used)
            self.now = t
            finished = [f for f in self.flows if f.left <= EPS]
            if finished or changed:
                self.flows = [f for f in self.flows if f not in finished]
                self.dirty = True
                for f in finished:
                    f.done()
            while self.timers and self.timers[0][0] <= self.now:
                _, _, fn = heapq.heappop(self.timers)
                fn()
