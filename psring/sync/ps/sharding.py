"""Which server owns which part of the model: equal chunks of the flat parameter vector, round-robin.

The parameters, laid out as one flat vector in backward order (``buckets.flat_layout``), are cut into
``S * k`` equal chunks of at most ``cap_bytes`` each (k as small as that allows), and chunk i goes to
server i mod S. So every server owns the same number of bytes (to one element) whatever the tensor
sizes, and each owns chunks spread over the whole backward pass, so all servers work from its start.
This is BytePS's tensor partitioning (Jiang et al., OSDI 2020) and ps-lite's key-range slicing: a
large tensor is split over several servers. Owning whole tensors instead would leave ResNet-18's three
9.4 MB convolutions each on one server: with S = 8 the busiest server would carry 1.7x its share.

With one server there is nothing to balance: the chunks are then cut at parameter boundaries (whole
parameters up to the cap, a larger parameter a chunk of its own), so a CPU worker can use every
replied parameter in place, without a copy (``PSSync._load_params``).

The plan depends only on the model and S, so every worker computes the same one; chunks are named
``c<i>`` on the wire (checkpoints convert them back to parameters).
"""
from __future__ import annotations

import math

from ...strategies import OVERLAPS, during_backward
from ..ranges import BucketRange, whole_param_ranges


def plan_chunks(spaces: list[list[int]], itemsizes: list[int], servers: int,
                cap_bytes: int, split: bool = False, shares: list[float] | None = None) -> list[BucketRange]:
    """(space, start, end, server) per chunk, in chunk order. ``spaces``: per dtype, the element counts
    of its parameters in layout order. Each space is cut into a multiple of ``servers`` equal chunks (to
    one element) of at most ``cap_bytes``; the round-robin over servers continues from one space to the
    next. One server: whole parameters up to ``cap_bytes`` per chunk instead, unless ``split`` (chunks
    fitted to a link: a 9.4 MB tensor as one chunk would be the pipeline's fill and drain).
    ``shares``: each server's fraction of the parameters (``topology.server_shares``; None: equal), see
    ``plan_shared``."""
    if servers < 1:
        raise ValueError(f"need at least one server, got {servers}")
    total = sum(sum(sp) for sp in spaces)
    if servers > total:
        raise ValueError(f"{servers} servers for {total} parameter elements: some servers would own nothing; "
                         f"use --servers {total} or fewer")
    if shares is not None:
        return plan_shared(spaces, itemsizes, shares, cap_bytes)
    if servers == 1 and not split:
        return whole_param_ranges(spaces, itemsizes, cap_bytes, cap_bytes)
    out, i = [], 0
    for s, (sizes, itemsize) in enumerate(zip(spaces, itemsizes)):
        numel = sum(sizes)
        if numel == 0:
            continue
        per_server = math.ceil(numel * itemsize / servers)
        n = min(numel, servers * max(1, math.ceil(per_server / max(cap_bytes, itemsize))))
        bounds = [numel * j // n for j in range(n + 1)]
        for j in range(n):
            out.append(BucketRange(s, bounds[j], bounds[j + 1], i % servers))
            i += 1
    return out


def plan_shared(spaces: list[list[int]], itemsizes: list[int], shares: list[float],
                cap_bytes: int) -> list[BucketRange]:
    """Unequal shares (BytePS's split between dedicated and colocated servers): each space is cut into
    R rounds of one chunk per server, server j's chunk of a round ``shares[j]`` of it, so every server
    still owns chunks spread over the whole backward pass; R is as small as keeps the largest chunk
    within ``cap_bytes``. A server's chunk of a round may be empty (a tiny share of a tiny space): it
    is left out.

    >>> [(r.start, r.end, r.group) for r in plan_shared([[100]], [4], [0.2, 0.8], 1 << 20)]
    [(0, 20, 0), (20, 100, 1)]
    """
    if len(shares) < 1 or min(shares) <= 0 or abs(sum(shares) - 1) > 1e-9:
        raise ValueError(f"server shares must be positive and sum to 1, got {shares}")
    cuts = [sum(shares[:j]) for j in range(len(shares) + 1)]
    out = []
    for s, (sizes, itemsize) in enumerate(zip(spaces, itemsizes)):
        numel = sum(sizes)
        if numel == 0:
            continue
        rounds = shared_rounds(numel * itemsize, shares, cap_bytes, itemsize)
        for r in range(rounds):
            for j in range(len(shares)):
                lo, hi = (round(numel * (r + cuts[j]) / rounds), round(numel * (r + cuts[j + 1]) / rounds))
                if hi > lo:
                    out.append(BucketRange(s, lo, hi, j))
    owners = {r.group for r in out}
    if len(owners) < len(shares):
        raise ValueError(f"servers {sorted(set(range(len(shares))) - owners)} would own nothing of this model's "
                         f"parameters at their share; use fewer servers")
    return out


def shared_rounds(m_bytes: int, shares: list[float], cap_bytes: int, itemsize: int = 4) -> int:
    """R, the rounds ``plan_shared`` cuts ``m_bytes`` into (so every server owns R chunks): as few as
    keep the largest share's chunk within ``cap_bytes``."""
    return max(1, math.ceil(max(shares) * m_bytes / max(cap_bytes, itemsize)))


# The CPU a pushpull costs beyond its bytes, on the busiest side (one server process handles N of them
# per chunk): measured on this project's 2-core machine (results/bandwidth/README.md, "Chunk size").
MESSAGE_COST_S = 2e-4
MIN_CHUNK_BYTES = 64 << 10


def fitted_chunk_bytes(m_bytes: int, workers: int, servers: int, worker_Bps: float, server_Bps: float,
                       cap_bytes: int, message_cost_s: float = MESSAGE_COST_S, drain_chunks: float = 1.0,
                       shared_cores: int | None = None) -> int:
    """The chunk size for a link: k chunks per server make the pipeline's fill and drain about D*T/k,
    where T = max(M/B_w, N*M/(S*B_s)) is the bandwidth bound of a step and D the drain in chunk times
    (``drain_chunks``: 1 for a burst after backward; ``CREDITED_DRAIN_CHUNKS`` under credits with
    ``--overlap full``), and cost k*N messages at the busiest server; k = sqrt(D*T / (N * message_cost))
    minimises the sum. Where every process shares one machine's ``shared_cores`` (an emulated cluster),
    a k above the plain fit's (D = 1) is cut to what ``cores_chunks`` leaves room for. Between
    ``MIN_CHUNK_BYTES`` and ``cap_bytes``.

    >>> fitted_chunk_bytes(44_695_848, 8, 8, 12.5e6, 12.5e6, 4 << 20)  # ResNet-18, N=S=8, 100 Mbit: k=48
    116395
    >>> fitted_chunk_bytes(44_695_848, 4, 4, 62.5e6, 62.5e6, 4 << 20, drain_chunks=4, shared_cores=2)  # k=55
    203162
    """
    bound_s = max(m_bytes / worker_Bps, workers * m_bytes / (servers * server_Bps))
    plain = max(1, math.ceil(math.sqrt(bound_s / (workers * message_cost_s))))
    k = max(1, math.ceil(math.sqrt(drain_chunks * bound_s / (workers * message_cost_s))))
    if shared_cores and k > plain:
        k = max(plain, min(k, cores_chunks(m_bytes, workers, servers, bound_s, shared_cores)))
    return int(min(cap_bytes, max(MIN_CHUNK_BYTES, m_bytes / (servers * k))))


# The drain of a credited pipeline, in chunk times: a worker's last chunks wait behind the CREDIT_CHUNKS
# in flight on its uplink, then their replies share the downlink with the other servers' (traced at N = 2,
# 1 Gbit, --overlap full: the last replies 19-35 ms after their pushes, for 5.8 ms chunks).
CREDITED_DRAIN_CHUNKS = 4

# The CPU the PS takes on one machine's cores, all sides (workers, servers, the kernel's veth and tbf):
# per byte a worker moves (M each way) and per pushpull. Fitted to the 24 runs of
# results/overlap_chunks (this project's 2-core Intel Xeon; each within 0.89-1.14x of the fit).
CPU_PER_BYTE_S = 1.1e-9
CPU_PER_MESSAGE_S = 0.93e-3
# The share of the cores the PS may take, by this model, over a step's communication bound T before CPU
# contention costs more than smaller chunks gain (results/overlap_chunks): the chunks that helped took
# 0.32-0.84 of both cores (N = 4 at 500 Mbit: 207 KB, 0.84, gained 4% on 349 KB), those that did not
# 0.98-1.3 (N = 4: 1 Gbit, and 145 KB at 500 Mbit).
CORE_SHARE = 0.85


def cores_chunks(m_bytes: int, workers: int, servers: int, bound_s: float, cores: int) -> int:
    """k, the most chunks per server whose CPU (``CPU_PER_BYTE_S``, ``CPU_PER_MESSAGE_S``: N*S*k
    pushpulls a step) fits ``CORE_SHARE`` of ``cores`` over a step of ``bound_s``; 0 where the bytes
    alone take more.

    >>> cores_chunks(44_695_848, 2, 2, 0.374, 2), cores_chunks(44_695_848, 4, 4, 0.374, 2)
    (118, 16)
    """
    spare_s = CORE_SHARE * cores * bound_s - CPU_PER_BYTE_S * 2 * workers * m_bytes
    return max(0, int(spare_s / (CPU_PER_MESSAGE_S * workers * servers)))


def drain_chunks(overlap: str, credit_mb: float | None, links_Bps: tuple[float, float] | None, workers: int,
                 servers: int) -> float:
    """The drain ``fitted_chunk_bytes`` weighs: ``CREDITED_DRAIN_CHUNKS`` where credits pace the pushes
    (``credit_bytes``, as the worker's transport gets them) and the next forward waits for the last
    replies (``--overlap full``), else 1."""
    credited = credit_bytes(credit_mb, overlap, credit_chunks(links_Bps, workers, servers), 1) > 0
    return CREDITED_DRAIN_CHUNKS if overlap == "full" and credited else 1.0


def chunk_bytes(m_bytes: int, workers: int, servers: int, links_Bps: tuple[float, float] | None,
                cap_bytes: int, drain: float = 1.0, shared_cores: int | None = None) -> int:
    """The PS's chunk size: fitted to the links where they are known, else the cap (``--bucket-mb``)."""
    if links_Bps is None:
        return cap_bytes
    return fitted_chunk_bytes(m_bytes, workers, servers, *links_Bps, cap_bytes, drain_chunks=drain,
                              shared_cores=shared_cores)


def chunks_per_server(m_bytes: int, servers: int, chunk_bytes: int) -> int:
    """k, the chunks each server owns when ``plan_chunks`` cuts M bytes (one dtype) into chunks of at
    most ``chunk_bytes``: what the cost model's pipeline term needs (``costmodel.ps``)."""
    return max(1, math.ceil(math.ceil(m_bytes / servers) / max(chunk_bytes, 1)))


# Chunks a worker keeps unanswered across all servers when the link is scheduled: enough to keep its
# link busy while a chunk's reply is on its way, few enough that a fast TCP flow cannot run ahead of
# the other workers' copies of its chunks. Measured on emulated 100 Mbit links, N = S = 8: window 1
# per server gave 1.08x the bound, 2 gave 1.13x, 4 gave 1.19x; N = 4, S = 1: 4 gave 1.01x, 8 1.03x.
IN_FLIGHT = 4


def default_window(servers: int, link_known: bool) -> int:
    """Credits per server: ``ceil(IN_FLIGHT / S)`` on a known link, 0 (no limit) on loopback, where
    there is no link to schedule and every message sent at once is fastest."""
    return max(1, math.ceil(IN_FLIGHT / servers)) if link_known else 0


def waits_for_round(consistency: str, staleness: int) -> bool:
    """Whether a reply waits for every worker's whole round at its server: SSP with k = 0 answers a push of
    step t once every worker has pushed all of the server's chunks of step t (``consistency``). A window
    of unanswered pushpulls smaller than a server's chunks would then deadlock (found by ``psring
    simulate``'s replay: the emulated run hung), so there is none. With k >= 1 the slowest worker's
    replies are always ready, and BSP and ASP answer per chunk."""
    return consistency == "ssp" and staleness == 0


def window_for(window: int | None, servers: int, link_known: bool, consistency: str = "bsp",
               staleness: int = 2) -> int:
    """Credits per server a worker uses: ``--ps-window`` (None: ``default_window``), and none where a reply
    waits for the whole round (``waits_for_round``; ``config_checks`` refuses a window given there)."""
    if waits_for_round(consistency, staleness):
        return 0
    return default_window(servers, link_known) if window is None else window


# Credits of the priority scheduler (``--ps-credit-mb``), in chunks: enough to keep the worker's link busy
# while a push's ack comes back, few enough that a chunk the next forward needs first waits behind little.
# Measured on emulated 100 Mbit links, N = S = 4, ResNet-18 (164 KB chunks), --overlap full: 0.3 MB of
# credits 4.88 s a step, 1 MB 5.00 s, 4 MB 5.53 s (the bound: 4.53 s). At least this many, and one per two
# workers (``credit_chunks``): every worker pushes a chunk to the same server at about the same time, so an
# ack comes back once N copies crossed that server's link. At N = S = 8, 100 Mbit (65 KB chunks,
# results/overlap_ps8) four chunks took 1.075-1.107x the bound against 1.088-1.108x for two, and five
# 1.065-1.091x against 1.093-1.105x in an earlier draw: more credits faster in five of six alternating pairs.
CREDIT_CHUNKS = 2


def credit_chunks(links_Bps: tuple[float, float] | None, workers: int, servers: int) -> int:
    """The default credits in chunks: ``max(CREDIT_CHUNKS, N // 2)`` where they suit the links
    (``credits_fit``), else 0 (none: FIFO per server under the window).

    >>> credit_chunks((12.5e6, 12.5e6), 4, 4), credit_chunks((12.5e6, 12.5e6), 8, 8), credit_chunks(None, 8, 8)
    (2, 4, 0)
    """
    return max(CREDIT_CHUNKS, workers // 2) if credits_fit(links_Bps, workers, servers) else 0


def servers_narrower(links_Bps: tuple[float, float], workers: int, servers: int) -> bool:
    """Whether the servers' side of the links is the narrower one: S server links carry less than N worker
    links (a probed link, whose server side is unbounded, counts S < N). Then each server's link carries
    N/S workers' pushes, and the acks that give a worker its credits back queue behind that server's
    replies to the others: on emulated 50 Mbit links, N = 8 on 4 hosts, ps S=1 took 5.0-5.4 s a step with
    credits and 2.99 s without (bound 2.9), so credits are left off there (FIFO under the window)."""
    w, s = links_Bps
    return servers * (s if math.isfinite(s) else w) < workers * w


def credits_fit(links_Bps: tuple[float, float] | None, workers: int, servers: int) -> bool:
    """Whether default credits suit the links: they are known (told or probed) and the workers' side is
    the narrow one (``servers_narrower``)."""
    return links_Bps is not None and not servers_narrower(links_Bps, workers, servers)


def credit_bytes(credit_mb: float | None, overlap: str, chunks: int, chunk_bytes: int) -> int:
    """``--ps-credit-mb`` in bytes (0: no priority scheduler, FIFO per server under the window). Unset:
    ``chunks`` chunks (``credit_chunks``: 0 where the link is unknown) where communication overlaps
    compute; else 0 (with ``--overlap none`` every chunk leaves after backward, where FIFO under the
    window measured within 3% of the bound)."""
    if credit_mb is not None:
        return int(credit_mb * 2**20)
    return chunks * chunk_bytes if during_backward(overlap) else 0


def plan_link_Bps(order: str, links_Bps: tuple[float, float] | None, credit: int) -> float | None:
    """The worker's link rate its push order is planned with (``transport.push_order``), or None for no plan:
    only under ``--ps-order planned``, with credits (``credit`` bytes > 0) and the link known (told or
    probed). The worker's transport and the simulator's replay ask this one function.

    >>> link = (1e8, 1e8)
    >>> plan_link_Bps("planned", link, 1), plan_link_Bps("priority", link, 1), plan_link_Bps("planned", link, 0)
    (100000000.0, None, None)
    >>> plan_link_Bps("planned", None, 1)
    """
    ok = order == "planned" and credit > 0 and links_Bps is not None and math.isfinite(links_Bps[0])
    return links_Bps[0] if ok else None


def plan_paced_by_acks(overlap: str) -> bool:
    """Whether a planned push order is paced by the timed step's push-to-ack spans (``transport.push_order``'s
    ``spans``) rather than by the bytes at the link's rate: under ``--overlap full`` only, where a chunk is answered
    once every worker's copy is in and the pushes back up beyond what the link alone says (measured:
    results/overlap_floor, "Under `full`, paced by the acks"); under ``backward`` a plan from the busy time replayed
    slower than priority. The worker's transport and the simulator's replay ask this one function.

    >>> plan_paced_by_acks("full"), plan_paced_by_acks("backward")
    (True, False)
    """
    return overlap == OVERLAPS[2]
