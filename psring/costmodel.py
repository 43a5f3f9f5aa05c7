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


def emulated_links_Bps(net, link_rate, server_link_rate=None, tuning="auto") -> tuple[float, float] | None:
    """(worker, server) link rates in bytes/s of a run on an emulated network (the server's defaults to the
    workers'), where psring fits the PS to its links; else None (also ``--link-tuning off``: one-host chunks).

    >>> emulated_links_Bps("emulated", "1gbit"), emulated_links_Bps("loopback", "1gbit")
    ((125000000.0, 125000000.0), None)
    """
    if net != "emulated" or tuning == "off" or not (isinstance(link_rate, str) and link_rate):
        return None
    w = Link.from_rate(link_rate).bandwidth_Bps
    s = server_link_rate if isinstance(server_link_rate, str) and server_link_rate else None
    return w, Link.from_rate(s).bandwidth_Bps if s else w


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
       overlap: bool = False, chunks_per_server: int | None = None, per_host: int = 1) -> float:
    """Parameter server on ``servers`` dedicated hosts, each holding 1/S of the parameters.

    Per step each worker pushes M (split over the servers) and pulls M back: its link carries M each
    way; each server receives N*M/S and sends N*M/S. The bandwidth bound of one direction is the
    slowest link's, ``T = max(M/B_w, N*M/(S*B_s))``. With ``per_host`` = G workers sharing a host's
    link (each pushes its own gradients: no aggregation inside the host), that link carries G*M:
    ``T = max(G*M/B_w, N*M/(S*B_s))``.

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
    bw = max(per_host * m_bytes / worker_link.bandwidth_Bps, n * m_bytes / (servers * server_link.bandwidth_Bps))
    if chunks_per_server:
        return 2 * worker_link.alpha_s + bw * (1 + 1 / chunks_per_server)
    return 2 * worker_link.alpha_s + (1 if overlap else 2) * bw


def ps_colocated(n: int, m_bytes: float, link: Link, per_host: int = 1) -> float:
    """A PS shard of M/H on every one of the H = N/G worker hosts (ps-lite/BytePS colocated mode).

    With G = 1: a host sends the (N-1) shards it does not hold and its server's replies to the N-1
    others, 2(N-1)/N*M, and receives as much: ``2 alpha + 2(N-1)/N * M/B``, ring all-reduce's bandwidth
    term (as BytePS notes); pushes and replies leave by the same link, so pipelining cannot shorten it.
    Messages to the N-1 peers are in flight together: one alpha per phase, as in ``ps``.
    With G workers per host, each pushing its own gradients, the host link carries G times that:
    ``2 alpha + 2 G (H-1)/H * M/B``.

    >>> [round(ps_colocated(n, 1e8, Link(1e-4, 1e8), g), 6) for n, g in ((4, 1), (8, 2))]  # 2e-4 + 2G*3/4
    [1.5002, 3.0002]
    """
    hosts = n // per_host
    if hosts <= 1:
        return 0.0
    return 2 * link.alpha_s + 2 * per_host * (hosts - 1) / hosts * m_bytes / link.bandwidth_Bps


def unified_split(n: int, k: int) -> float:
    """BytePS's optimal share x of the gradients for k dedicated (CPU) server hosts beside n worker
    hosts that each run a colocated server (Jiang et al., OSDI 2020, section 3.1; derived here):

    A worker host's link carries, each way, x*M for the dedicated servers plus 2y(n-1)/n * M for the
    share y = 1 - x of the colocated ones (pushes to the n-1 others, its server's replies to them); a
    dedicated host's, n*x*M/k. Equal loads, ``x + 2(1-x)(n-1)/n = n x / k``, give the optimum
    ``x = 2k(n-1) / (n^2 + kn - 2k)``; for k >= n, x = 1.

    >>> unified_split(4, 0), unified_split(4, 2), unified_split(4, 4)
    (0.0, 0.6, 1.0)
    """
    if k <= 0:
        return 0.0
    if k >= n:
        return 1.0
    return 2 * k * (n - 1) / (n * n + k * n - 2 * k)


def ps_unified(hosts: int, k: int, m_bytes: float, link: Link, per_host: int = 1,
               chunks_per_server: int | None = None) -> float:
    """BytePS's unified architecture: colocated servers on the ``hosts`` worker hosts and ``k``
    dedicated server hosts, the load split by ``unified_split``. The busiest link carries, each way,
    ``T = 2 n (n-1) / (n^2 + kn - 2k) * G*M / B`` (n = hosts; G*M: what a host's G workers push);
    pipelined as in ``ps``: ``2 alpha + T (1 + 1/c)`` with c chunks per server (T alone without).
    At k = 0 this is ring all-reduce's bandwidth term, 2(n-1)/n * M/B; at k = n the dedicated PS's with
    S = n, M/B (BytePS's two endpoints).

    >>> [round(ps_unified(4, k, 1e8, Link(0.0, 1e8)), 6) for k in (0, 2, 4)]  # ring 1.5; 24/20; S=n PS 1.0
    [1.5, 1.2, 1.0]
    """
    n = hosts
    if n * per_host <= 1:
        return 0.0
    x = unified_split(n, k)
    worker_side = x + 2 * (1 - x) * (n - 1) / n
    server_side = n * x / k if k else 0.0
    t = max(worker_side, server_side) * per_host * m_bytes / link.bandwidth_Bps
    return 2 * link.alpha_s + t * (1 + 1 / chunks_per_server if chunks_per_server else 1)


def hierarchical(n: int, m_bytes: float, link: Link, per_host: int = 1, intra: Link | None = None) -> float:
    """Hierarchical all-reduce (``sync/hierarchical.py``), N = H*G workers, G per host: G rings of M/G
    across the H hosts at once share the host link, ``2(H-1) alpha + 2(H-1)/H * M/B``; inside a host,
    on ``intra`` (NVLink/PCIe; None: free, an emulated host's loopback), ``2(G-1) alpha_i + 2(G-1)/G *
    M/B_i`` more. A flat ring over the N ranks, consecutive per host, is ``ring_allreduce(N)``: each
    host link carries one ring edge, 2(N-1)/N * M, in 2(N-1) steps.

    >>> L = Link(1e-4, 1e8)
    >>> round(hierarchical(8, 1e8, L, per_host=2), 6), round(ring_allreduce(8, 1e8, L), 6)
    (1.5006, 1.7514)
    """
    hosts = n // per_host
    t = ring_allreduce(hosts, m_bytes, link)
    if intra is not None and per_host > 1:
        t += 2 * (per_host - 1) * intra.alpha_s + 2 * (per_host - 1) / per_host * m_bytes / intra.bandwidth_Bps
    return t


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
#   STRATEGIES[model](n, m_bytes, link, servers=None, server_link=None, per_host=1) -> seconds
# (PS_MODEL also takes chunks_per_server=k: the pipelined bound instead of the sequential one, and
# placement: "dedicated", "colocated" or "mixed", whose servers are then H colocated plus S - H
# dedicated). A strategy names its model in the registry (``strategies.Strategy.cost_model``); these
# keys are models.
CostModel = Callable[..., float]
RING_MODEL = "allreduce"  # ring all-reduce (``ring_allreduce``)
PS_MODEL = "ps"  # the parameter server (``ps``; ``ps_colocated``, ``ps_unified`` by placement)
HIERARCHICAL_MODEL = "two_level"  # reduce inside hosts, ring across them (``hierarchical``)


def _ps(n, m_bytes, link, servers=None, server_link=None, chunks_per_server=None, per_host=1,
        placement="dedicated"):
    if placement == "colocated":
        return ps_colocated(n, m_bytes, link, per_host)
    if placement == "mixed":
        return ps_unified(n // per_host, (servers or 0) - n // per_host, m_bytes, link, per_host, chunks_per_server)
    return ps(n, servers or 1, m_bytes, link, server_link, chunks_per_server=chunks_per_server, per_host=per_host)


STRATEGIES: dict[str, CostModel] = {
    RING_MODEL: lambda n, m_bytes, link, servers=None, server_link=None, per_host=1: ring_allreduce(n, m_bytes, link),
    PS_MODEL: _ps,  # servers=None means one server
    "ps_colocated":
        lambda n, m_bytes, link, servers=None, server_link=None, per_host=1: ps_colocated(n, m_bytes, link, per_host),
    HIERARCHICAL_MODEL:
        lambda n, m_bytes, link, servers=None, server_link=None, per_host=1: hierarchical(n, m_bytes, link, per_host),
    "tree": lambda n, m_bytes, link, servers=None, server_link=None, per_host=1: tree_allreduce(n, m_bytes, link),
    "halving_doubling":
        lambda n, m_bytes, link, servers=None, server_link=None, per_host=1: halving_doubling(n, m_bytes, link),
}


def save_calibration(link: Link, path: str | Path, meta: dict | None = None) -> None:
    """Write ``{"alpha_s", "bandwidth_Bps", **meta}`` as JSON (e.g. ``calibration.json``)."""
    data = {"alpha_s": link.alpha_s, "bandwidth_Bps": link.bandwidth_Bps, **(meta or {})}
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def load_calibration(path: str | Path) -> Link:
    """The ``Link`` that ``save_calibration`` (or ``python -m psring.calibrate``) wrote."""
    data = json.loads(Path(path).read_text())
    return Link(float(data["alpha_s"]), float(data["bandwidth_Bps"]))
