"""Consistency models of the parameter server: BSP, SSP and ASP, and the staleness of every update.

BSP  gradients of step t are summed over the N workers; each key is updated once all N pushed it, and
     every worker's step-t pushpull is answered with the result (version t+1).
ASP  every push is its own update, applied on arrival with the worker's gradient as is (no 1/N: each
     update is an SGD/Adam step on one worker's batch, as in Downpour SGD (Dean et al., NIPS 2012) and
     Hogwild); the pushpull is answered at once with the keys' current values. No worker waits.
SSP  (Ho et al., "More Effective Distributed ML via a Stale Synchronous Parallel Parameter Server",
     NIPS 2013) applies updates like ASP, but a worker's pushpull of step t is answered only once the
     slowest worker's clock is >= t + 1 - k: a worker about to start step t waits while the slowest has
     completed fewer than t - k steps. k = 0 waits like BSP (yet still applies per-worker updates).

Clocks are per server: a worker's clock is the number of steps for which it has pushed every key of
this server's shard. The shard's ``version`` under ASP/SSP is the slowest worker's clock (rounds that
every worker completed), so pulls of version v and the per-step metrics keep their BSP meaning.

Staleness, recorded per applied push (one worker's gradient for one request's keys), max over its keys:

  staleness  (clock units) t - c, where t is the step the gradient belongs to and c is the key's clock
             when the values the gradient was computed on were sent to this worker: the minimum over
             workers of how many of their updates of the key those values included. The values held
             every worker's updates of steps < c, so the gradient of step t lacked at most t - c steps
             of the slowest worker. Ho et al.'s guarantee (a worker at clock t sees all updates of
             steps <= t - k - 1) is exactly: staleness <= k under SSP. BSP: always 0. ASP: unbounded.
  delay      (update units) the key's number of updates applied when the gradient is applied minus the
             number it had when its values were read: how many updates (any worker's) the gradient
             missed, the tau of asynchronous-SGD analyses. BSP: 0 (one aggregated update per step).
             SSP with k: <= (N - 1)(2k + 1): each other worker's count was >= t - k when the values were
             read and is <= t + k + 1 when the step-t gradient lands (it cannot start step t + k + 1
             before this worker completed step t); the worker's own count does not move in between.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ...config import CONSISTENCY, PS_DESIGNS
from .errors import ProtocolError


@dataclass(frozen=True)
class Semantics:
    design: str = "server-optimizer"
    consistency: str = "bsp"
    staleness: int = 2

    @property
    def asynchronous(self) -> bool:
        return self.consistency != "bsp"

    def header(self) -> dict:
        """Fields of an init request (next to ``optim``)."""
        return {"design": self.design, "consistency": self.consistency, "staleness": self.staleness}


def check_semantics(design: str, consistency: str, staleness: int) -> Semantics:
    """A valid combination, or ``ValueError``: the aggregate design needs BSP (workers run the optimizer
    on the aggregated gradient; without a barrier there is nothing to aggregate and their replicas of the
    parameters would drift apart)."""
    if design not in PS_DESIGNS:
        raise ValueError(f"ps design must be one of {', '.join(PS_DESIGNS)}, got {design!r:.40}")
    if consistency not in CONSISTENCY:
        raise ValueError(f"consistency must be one of {', '.join(CONSISTENCY)}, got {consistency!r:.40}")
    if type(staleness) is not int or staleness < 0:
        raise ValueError(f"staleness bound must be an int >= 0, got {staleness!r:.40}")
    if design == "aggregate" and consistency != "bsp":
        raise ValueError(f"--ps-design aggregate needs --consistency bsp (got {consistency}): the workers "
                         f"run the optimizer on the aggregated gradient, which only BSP produces")
    return Semantics(design, consistency, staleness)


def parse_semantics(header: dict) -> Semantics:
    """An init's ``design``, ``consistency`` and ``staleness`` (each optional: server-optimizer, bsp, 2)."""
    d = Semantics()
    try:
        return check_semantics(header.get("design", d.design), header.get("consistency", d.consistency),
                               header.get("staleness", d.staleness))
    except ValueError as e:
        raise ProtocolError(f"init: {e}") from None


class Clocks:
    """ASP/SSP bookkeeping of one shard: workers' clocks, what each worker last read, staleness."""

    def __init__(self, workers: int, keys: list[str], start: int = 0):
        """``start``: every worker's clock at init (a resumed run's first step)."""
        self.workers, self.keys = workers, list(keys)
        self.clock = [start] * workers
        self.pending: list[set[str]] = [set() for _ in range(workers)]  # keys pushed in the current step
        self.updates = dict.fromkeys(self.keys, 0)  # updates applied per key (all workers)
        # per worker and key: (updates, key clock) of the values last sent to it (the initial ones: 0, start)
        self.read: list[dict[str, tuple[int, int]]] = [dict.fromkeys(self.keys, (0, start)) for _ in range(workers)]

    @property
    def slowest(self) -> int:
        return min(self.clock)

    def key_clock(self, key: str) -> int:
        """The fewest updates of ``key`` any worker has had applied."""
        return min(c + (key in p) for c, p in zip(self.clock, self.pending))

    def check(self, worker: int, step, keys: list[str], lead: int | None = None) -> None:
        """``lead``: SSP's k; a push more than k steps ahead of the slowest worker comes from a worker that
        did not wait for its previous step's replies (an honest one pushes step t once the slowest
        completed t - k steps), and is refused, so the replies waiting on the server stay bounded."""
        if type(step) is not int or step != self.clock[worker]:
            raise ProtocolError(f"push for step {step!r:.40} but worker {worker} is at step {self.clock[worker]} "
                                f"on this shard")
        if lead is not None and step > self.slowest + lead:
            raise ProtocolError(f"push for step {step} is more than {lead} steps ahead of the slowest worker "
                                f"(step {self.slowest}; SSP bound {lead})")
        for key in keys:
            if key in self.pending[worker]:
                raise ProtocolError(f"key {key!r} pushed twice by worker {worker} for step {step}")

    def applied(self, worker: int, step: int, keys: list[str], staleness: Counter, delay: Counter) -> bool:
        """Record one applied push (after ``check``); True when it completed a round (slowest advanced)."""
        if not keys:
            return False
        read = self.read[worker]
        staleness[max(step - read[k][1] for k in keys)] += 1
        delay[max(self.updates[k] - read[k][0] for k in keys)] += 1
        before = self.slowest
        pending = self.pending[worker]
        for k in keys:
            self.updates[k] += 1
            pending.add(k)
        if len(pending) == len(self.keys):
            pending.clear()
            self.clock[worker] += 1
        return self.slowest > before

    def mark_read(self, worker: int, keys: list[str]) -> None:
        """The current values of ``keys`` are being sent to ``worker``."""
        read = self.read[worker]
        for k in keys:
            read[k] = (self.updates[k], self.key_clock(k))
