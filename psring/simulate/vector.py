"""The flat ring (``allreduce``, ``ring``; one worker per host, or G with the sends inside a host free) replayed
round by round for every rank at once, with numpy: the same rounds as ``programs.RingProgram`` on
``network.Network``, for thousands of workers.

In a flat ring with one worker per host, rank r's uplink carries only r -> r+1 and rank r+1's downlink only
the same transfers, one round after the other, so no link is ever shared and the flow model reduces to a
recurrence per round j (vectors over the ranks r)::

    start  = max(in[r], in[r+1]) + alpha          # both in round j (gloo pairs the send with its receive)
    end    = start + time(bytes[j, r], tokens[r])  # tbf: the bucket's tokens at the veth's speed, then B
    in'[r] = max(end[r], end[r-1])                # its send and its receive arrived

with the same bytes (``ring.schedule``, ``ring.chunk_sizes`` over ``buckets.param_ranges``), the same token
bucket (refilled at B while the link idles, up to the burst; a dry bucket bursts again only from
``network.REFILL``) and the same alpha. ``tests/test_simulate.py`` holds the two replays equal.
"""
from __future__ import annotations

import functools

import numpy as np

from ..sync.ring import chunk_sizes, schedule
from .network import PEAK_BPS, REFILL


@functools.lru_cache(maxsize=8)
def sent_chunks(world: int) -> np.ndarray:
    """[round, rank]: the chunk each rank sends in each of a bucket's 2(N-1) rounds (``ring.schedule``)."""
    return np.array([[sent for _, _, sent, _ in schedule(r, world)] for r in range(world)], dtype=np.int64).T


class VectorRing:
    """A flat ring of ``world`` ranks (G a host: ``per_host``) on links of ``rate_Bps`` with tbf's ``burst_bytes``."""

    def __init__(self, world: int, bucket_numels: list[int], itemsize: int, rate_Bps: float, alpha_s: float,
                 burst_bytes: float = 0.0, peak_Bps: float = PEAK_BPS, per_host: int = 1,
                 gathered: list[int] | None = None):
        """``per_host``: G ranks a host, in rank order; a send from a rank to the next on its own host is
        free (no alpha, no time: the flow network's same-host send), the others cross a host link.
        ``gathered``: an all-gather instead of the buckets' reductions (``codec_bytes.gathered_rounds``: per
        round, the bytes every rank sends), as ``programs.RingProgram`` takes it."""
        self.n, self.rate, self.alpha = world, rate_Bps, alpha_s
        self.cross = (np.arange(world) // per_host) != ((np.arange(world) + 1) % world // per_host)
        self.burst, self.peak = float(burst_bytes), max(peak_Bps, rate_Bps)
        chunks = sent_chunks(world)
        # per bucket: [round, rank] bytes sent
        self.rounds = [np.asarray(chunk_sizes(numel, world), dtype=np.float64)[chunks] * itemsize
                       for numel in bucket_numels] if world > 1 else []
        if gathered is not None:
            self.rounds = [np.repeat(np.asarray(gathered, dtype=np.float64)[:, None], world, axis=1)] \
                if world > 1 and gathered else []
        self.tokens = np.full(world, self.burst)
        self.wet = np.full(world, self.burst > 0)
        self.free_at = np.zeros(world)  # when each uplink last finished sending

    def step(self, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """When each rank holds the sum of every bucket, given when each began (backward ended); and the
        bytes each rank sent."""
        start = np.asarray(start, dtype=np.float64)
        if not self.rounds:  # a ring of one, or of ranks on one host: nothing crosses, nothing to wait for
            return start.copy(), np.zeros(self.n)
        return self.units(np.broadcast_to(start, (len(self.rounds), self.n)))

    def units(self, ready: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every bucket reduced one after another in index order, each entered by a rank once it is
        ``ready[bucket, rank]`` there and the rank is done with the one before (``--overlap backward``:
        ``overlapped.UnitRing`` in ready order); when each rank holds the last sum, and what it sent.
        Without rounds (a ring of one) each rank is done when its last bucket is ready."""
        ready = np.asarray(ready, dtype=np.float64)
        if not self.rounds:
            return ready.max(axis=0) if len(ready) else np.zeros(self.n), np.zeros(self.n)
        inside = ready[0].copy()
        sent = np.zeros(self.n)
        for u, at in enumerate(ready):
            inside = self.reduce(u, np.maximum(inside, at))
            sent += self.rounds[u].sum(axis=0)  # what each rank sends, to its own host's ranks too (as recorded)
        return inside, sent

    def reduce(self, u: int, entry: np.ndarray) -> np.ndarray:
        """Bucket (unit) u's rounds, each rank entering the first at ``entry[rank]``; when each holds its sum."""
        every = bool(self.cross.all())  # one rank a host: no masks (the 1,024-worker replay's hot loop)
        alpha = self.alpha if every else self.alpha * self.cross
        inside = entry
        for nbytes in self.rounds[u]:
            begin = np.maximum(inside, np.roll(inside, -1)) + alpha
            end = begin + self._time(begin, nbytes if every else np.where(self.cross, nbytes, 0.0))
            self.free_at = end if every else np.where(self.cross, end, self.free_at)
            inside = np.maximum(end, np.roll(end, 1))
        return inside

    def _time(self, begin: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """Each transfer's duration from ``begin`` with the uplink's tokens, which it uses up."""
        if self.burst <= 0 or self.peak <= self.rate:  # (above the veth's speed tokens buy nothing)
            return nbytes / self.rate
        self.tokens = np.minimum(self.burst, self.tokens + self.rate * np.maximum(0.0, begin - self.free_at))
        self.wet |= self.tokens >= REFILL
        usable = np.where(self.wet, self.tokens, 0.0)
        at_peak = np.minimum(nbytes, usable * self.peak / (self.peak - self.rate))  # sent while tokens last
        self.tokens = np.where(self.wet, usable - at_peak * (self.peak - self.rate) / self.peak, self.tokens)
        self.wet &= self.tokens > 1.0
        self.tokens = np.where(self.wet, self.tokens, np.where(at_peak > 0, 0.0, self.tokens))
        return at_peak / self.peak + (nbytes - at_peak) / self.rate


class VectorHierarchy:
    """``hierarchical`` with G workers on each of H hosts: the in-host stages are free (loopback) and the G
    cross-host rings (ring l: local rank l of every host, slice l of every bucket) run side by side on the
    same host links, which together carry one flat ring's bytes over the H hosts in the same rounds; so the
    step is a ``VectorRing`` over the hosts on whole buckets, started once a host's last rank ended its
    backward. Against the flow replay's G rings (FIFO on each uplink): within 3% (its rings pipeline a
    little, one alpha behind the other), held by ``tests/test_simulate_ps.py``."""

    def __init__(self, hosts: int, per_host: int, ring: VectorRing):
        self.hosts, self.g, self.ring = hosts, per_host, ring

    def step(self, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        end, sent = self.ring.step(np.asarray(start, dtype=np.float64).reshape(self.hosts, self.g).max(axis=1))
        return np.repeat(end, self.g), np.repeat(sent / self.g, self.g)

    def units(self, ready: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``--overlap backward``: a host enters a unit once its last rank has it (``VectorRing.units`` over the
        hosts); its G ranks hold the sum together, each having sent 1/G of the host's bytes."""
        ready = np.asarray(ready, dtype=np.float64)
        end, sent = self.ring.units(ready.reshape(len(ready), self.hosts, self.g).max(axis=2))
        return np.repeat(end, self.g), np.repeat(sent / self.g, self.g)
