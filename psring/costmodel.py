"""The alpha-beta (latency-bandwidth) cost model of one synchronization step, per communication pattern.

A message of m bytes over one link costs ``alpha + m / B``: ``alpha`` (s) is the per-message latency,
``B`` (bytes/s) the link's bandwidth (``1/B`` is the "beta" of the literature). Sources:

* Collectives (ring, binomial tree, recursive halving-doubling): R. Thakur, R. Rabenseifner, W. Gropp,
  "Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1), 2005.
* Parameter-server traffic, dedicated and colocated servers: Y. Jiang et al., "A Unified Architecture for
  Accelerating Distributed DNN Training in Heterogeneous GPU/CPU Clusters" (BytePS), OSDI 2020.

Assumptions: every host has one full-duplex link (sending and receiving at ``B`` at once) to a
non-blocking switch, so only the hosts' own links limit a step; messages to distinct peers are in flight
at once; the reduction's compute is ignored (Thakur et al.'s gamma term: it adds (N-1)/N*M*gamma for
ring and halving-doubling, ceil(log2 N)*M*gamma for the tree, N*M/S*gamma on a PS server; account for
it separately if it matters). ``M`` is the bytes each worker synchronizes (its gradients). A single
worker needs no synchronization: every function returns 0 for ``n == 1``.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# TCP's payload share of an Ethernet link: 1448 bytes of data (MSS with timestamps, MTU 1500) per frame
# of 1514 bytes on the wire (tc's shaper counts the 14-byte Ethernet header). What a shaped link carries
# for a socket; measured 11.9 MB/s on an emulated 100 Mbit link (README, results/bandwidth).
TCP_GOODPUT = 1448 / 1514

_RATE = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8,
         "b/s": 1.0, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12}


@dataclass(frozen=True)
class Link:
    """A host's link: per-message latency ``alpha_s`` (s) and bandwidth ``bandwidth_Bps`` (bytes/s).

    >>> Link(1e-4, 1e8).time(1e8)  # alpha + m/B
    1.0001
    """
    alpha_s: float
    bandwidth_Bps: float

    def time(self, m_bytes: float) -> float:
        return self.alpha_s + m_bytes / self.bandwidth_Bps

    @classmethod
    def from_rate(cls, rate: str | float, alpha_s: float = 0.0, goodput: float = 1.0) -> Link:
        """``rate`` in bytes/s, or a string: tc's bit rates ("1gbit", "100mbit") or bytes ("2.5GB/s");
        ``goodput``: the share of it a socket gets (``TCP_GOODPUT`` for a shaped Ethernet link).

        >>> Link.from_rate("1gbit", 5e-5)
        Link(alpha_s=5e-05, bandwidth_Bps=125000000.0)
        >>> round(Link.from_rate("100mbit", goodput=TCP_GOODPUT).bandwidth_Bps)
        11955086
        """
        if not isinstance(rate, str):
            return cls(alpha_s, float(rate) * goodput)
        m = re.fullmatch(r"\s*([0-9.]+(?:e[+-]?\d+)?)\s*([a-z/]+)\s*", rate.lower())
        if not m or m.group(2) not in _RATE:
            raise ValueError(f"cannot read rate {rate!r}; use e.g. 1gbit, 100mbit, 2.5GB/s")
        return cls(alpha_s, float(m.group(1)) * _RATE[m.group(2)] * goodput)


def emulated_links_Bps(net, link_rate, server_link_rate=None) -> tuple[float, float] | None:
    """(worker, server) link rates in bytes/s of a run's settings on an emulated network (the server's
    rate defaults to the workers'), else None: where psring knows the links, and fits the PS to them.

    >>> emulated_links_Bps("emulated", "1gbit"), emulated_links_Bps("loopback", "1gbit")
    ((125000000.0, 125000000.0), None)
    """
    if net != "emulated" or not (isinstance(link_rate, str) and link_rate):
        return None
    w = Link.from_rate(link_rate).bandwidth_Bps
    return w, (Link.from_rate(server_link_rate).bandwidth_Bps if isinstance(server_link_rate, str)
               and server_link_rate else w)


def ring_allreduce(n: int, m_bytes: float, link: Link) -> float:
    """Ring all-reduce: reduce-scatter then all-gather, each N-1 steps of M/N bytes per host (Thakur
    et al.): ``2(N-1) alpha + 2(N-1)/N * M/B``.

    >>> round(ring_allreduce(4, 1e8, Link(1e-4, 1e8)), 6)  # 2*3*1e-4 + 2*3/4*1
    1.5006
    """
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * link.alpha_s + 2 * (n - 1) / n * m_bytes / link.bandwidth_Bps


def ps(n: int, servers: int, m_bytes: float, worker_link: Link, server_link: Link | None = None,
       overlap: bool = False, chunks_per_server: int | None = None) -> float:
    """Parameter server on ``servers`` dedicated hosts, each holding 1/S of the parameters.

    Per step each worker pushes M (split over the servers) and pulls M back: its link carries M each
    way; each server receives N*M/S and sends N*M/S. The bandwidth bound of one direction is the
    slowest link's, ``T = max(M/B_w, N*M/(S*B_s))``.

    * Sequential (the default): push, then pull (BSP: a pull is answered once every push is in):
      ``2 * (alpha + T)``.
    * Pipelined, ``chunks_per_server`` = k (BytePS's partitions, psring's chunks): each server's share
      is cut into k chunks, a chunk's reply leaves as soon as its N copies are in, so the pull of one
      chunk shares the full-duplex links with the pushes of later ones. Only the first chunk's push
      (fill) and the last chunk's reply (drain), each T/k, are not overlapped:
      ``2 alpha + T * (1 + 1/k)``. This is the physical limit of a PS step on these links.
    * ``overlap`` alone: the limit of infinitely many chunks, ``2 alpha + T`` (a lower bound).

    >>> round(ps(4, 1, 1e8, Link(1e-4, 1e8)), 6)  # 2*(1e-4 + max(1, 4*1/1))
    8.0002
    >>> round(ps(4, 4, 1e8, Link(1e-4, 1e8), chunks_per_server=10), 6)  # 2e-4 + 1 * (1 + 1/10)
    1.1002
    """
    if n <= 1:
        return 0.0
    server_link = server_link or worker_link
    bw = max(m_bytes / worker_link.bandwidth_Bps, n * m_bytes / (servers * server_link.bandwidth_Bps))
    if chunks_per_server:
        return 2 * worker_link.alpha_s + bw * (1 + 1 / chunks_per_server)
    return 2 * worker_link.alpha_s + (1 if overlap else 2) * bw


def ps_colocated(n: int, m_bytes: float, link: Link) -> float:
    """A PS shard of M/N on every worker host (ps-lite/BytePS colocated mode).

    Push: a host sends the (N-1) shards it does not hold, (N-1)/N*M, and at the same time receives
    (N-1) pushes of M/N for its own shard, (N-1)/N*M; the pull mirrors it. Messages to the N-1 peers
    are in flight together, so each phase costs one alpha, as in ``ps``:
    ``2 alpha + 2(N-1)/N * M/B`` - the bandwidth term of ring all-reduce (as BytePS notes). Charging
    alpha per message instead (one send at a time) gives ``2(N-1) alpha``, ring's latency term too.

    >>> round(ps_colocated(4, 1e8, Link(1e-4, 1e8)), 6)  # 2*1e-4 + 2*3/4*1
    1.5002
    """
    if n <= 1:
        return 0.0
    return 2 * link.alpha_s + 2 * (n - 1) / n * m_bytes / link.bandwidth_Bps


def tree_allreduce(n: int, m_bytes: float, link: Link) -> float:
    """Binomial-tree reduce to a root, then binomial-tree broadcast, whole M per step (Thakur
    et al.): ``2 ceil(log2 N) (alpha + M/B)``.

    >>> round(tree_allreduce(4, 1e8, Link(1e-4, 1e8)), 6)  # 2*2*(1e-4 + 1)
    4.0004
    """
    if n <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(n)) * link.time(m_bytes)


def halving_doubling(n: int, m_bytes: float, link: Link) -> float:
    """Rabenseifner: reduce-scatter by recursive halving, all-gather by recursive doubling (Thakur et
    al.): ``2 ceil(log2 N) alpha + 2(N-1)/N * M/B``; exact for N a power of two (otherwise
    MPICH adds a step that this ignores).

    >>> round(halving_doubling(4, 1e8, Link(1e-4, 1e8)), 6)  # 2*2*1e-4 + 2*3/4*1
    1.5004
    """
    if n <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(n)) * link.alpha_s + 2 * (n - 1) / n * m_bytes / link.bandwidth_Bps


def predict_step(compute_s: float, sync_s: float, overlap: float = 0.0) -> float:
    """One training step: compute, then the part of synchronization not hidden behind it.
    ``overlap`` is the fraction of ``sync_s`` that runs during compute (0 = none, as in plain BSP);
    what is hidden cannot exceed the compute itself, so the step is never shorter than either part.

    >>> predict_step(1.0, 0.5), predict_step(1.0, 0.5, overlap=1.0), predict_step(0.2, 1.0, overlap=1.0)
    (1.5, 1.0, 1.0)
    """
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap must be in [0, 1], got {overlap}")
    return compute_s + sync_s - min(overlap * sync_s, compute_s)


def predicted_speedup(n: int, compute_s: float, sync: float | Callable[[int], float],
                      overlap: float = 0.0) -> float:
    """Throughput speedup of N workers over one (same per-worker batch; one worker does not sync):
    ``N * compute_s / predict_step(compute_s, sync_s(N), overlap)``. ``sync`` is the sync time at N,
    or a function of N.

    >>> round(predicted_speedup(4, 1.0, lambda n: ring_allreduce(n, 1e8, Link(1e-4, 1e8))), 4)  # 4/2.5006
    1.5996
    """
    if n <= 1:
        return 1.0
    sync_s = sync(n) if callable(sync) else sync
    return n * compute_s / predict_step(compute_s, sync_s, overlap)


# Every cost model under one signature, for plots that loop over them:
#   STRATEGIES[model](n, m_bytes, link, servers=None, server_link=None) -> seconds
# (PS_MODEL also takes chunks_per_server=k: the pipelined bound instead of the sequential one). A
# strategy names its model in the registry (``strategies.Strategy.cost_model``); these keys are models.
CostModel = Callable[..., float]
RING_MODEL = "allreduce"  # ring all-reduce (``ring_allreduce``)
PS_MODEL = "ps"  # the parameter server on dedicated hosts (``ps``)


def _ps(n, m_bytes, link, servers=None, server_link=None, chunks_per_server=None):
    return ps(n, servers or 1, m_bytes, link, server_link, chunks_per_server=chunks_per_server)


STRATEGIES: dict[str, CostModel] = {
    RING_MODEL: lambda n, m_bytes, link, servers=None, server_link=None: ring_allreduce(n, m_bytes, link),
    PS_MODEL: _ps,  # servers=None means one server
    "ps_colocated": lambda n, m_bytes, link, servers=None, server_link=None: ps_colocated(n, m_bytes, link),
    "tree": lambda n, m_bytes, link, servers=None, server_link=None: tree_allreduce(n, m_bytes, link),
    "halving_doubling":
        lambda n, m_bytes, link, servers=None, server_link=None: halving_doubling(n, m_bytes, link),
}


def save_calibration(link: Link, path: str | Path, meta: dict | None = None) -> None:
    """Write ``{"alpha_s", "bandwidth_Bps", **meta}`` as JSON (e.g. ``calibration.json``)."""
    data = {"alpha_s": link.alpha_s, "bandwidth_Bps": link.bandwidth_Bps, **(meta or {})}
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def load_calibration(path: str | Path) -> Link:
    """The ``Link`` that ``save_calibration`` (or ``python -m psring.calibrate``) wrote."""
    data = json.loads(Path(path).read_text())
    return Link(float(data["alpha_s"]), float(data["bandwidth_Bps"]))
