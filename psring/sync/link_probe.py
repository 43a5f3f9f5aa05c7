"""The link, measured at start (``--link-tuning``; issue #29 item 3): partition sizes and credits without
being told the rate, so a multi-host torchrun run is scheduled as an emulated one is.

Every worker times the same exchange at two sizes, all workers together (so the probe sees the contention
a step's own traffic will: N pushes converging on S servers, or the ring's N concurrent transfers), and
the ranks agree on the slowest rank's times. ``t = fixed + wire / rate`` fitted through the two points
gives the rate of the link *between* them: both sizes are beyond tbf's 1 MB burst (``net/emulated.py``)
and a TCP window's ramp, which a single size would count as bandwidth (ByteScheduler tunes online with
Bayesian optimisation instead; two sizes are enough for the two numbers the schedules below need).

The reduce family cuts its gradients into partitions of ``reduce_partition_bytes`` (the last partition is
the tail after backward; each one costs ``fixed``); the PS fits its chunks and credits to the rate as it
does to a known link (``ps.sharding.fitted_chunk_bytes``; its probe is ``ps.probe``).

The fit sees time, not CPU. Where every rank shares one machine's cores (an emulated cluster) a partition's
reduction also costs CPU on all of them: at N = 8 on 2 cores a call of a few kB takes 0.02-0.04 core-seconds
(gloo's all-reduce and the hand-written ring alike), and partitions that the link alone would favour (1.2 MB at 1 Gbit) leave the
cores saturated and double the step (``results/overlap_n8_1gbit``, its partition ladder). So the collective
probe also reads the CPU a call of a few kB takes, summed over the ranks (``call_cpu_s``), and
``cores_partition_bytes`` keeps the partitions as large as those cores need, as ``ps.sharding.cores_chunks``
does for the PS's chunks.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import torch

# Both beyond tbf's 1 MB burst. The PS's probe echoes 2 and 6 MB; the collective's reduces 4 and 12 MB, because
# a 2 MB reduction at N = 8 on 2 cores reads up to 16 ms slow (the ranks' turns on the cores, not the link), which
# lifted the fit's intercept to 9-27 ms and its rate to 130-169 MB/s on a 119.6 MB/s link, and cut 4-10 MB
# partitions where 3.5 MB is fastest; 4-12 MB lie within 2 ms of the line (results/overlap_n8_1gbit,
# probe_sizes.csv). At 100 Mbit the larger takes 1.5 s (all-reduce, N = 4).
PROBE_BYTES = (2 << 20, 6 << 20)
REDUCE_PROBE_BYTES = (4 << 20, 12 << 20)
REPEATS = 2  # the fastest of each size: one late start (a page fault, a scheduler tick) is not the link
# The collective's: the fastest of three. At N = 8 on 2 cores the hand-written ring's 4 MB calls read 54-93 ms
# across ranks and calls; the fastest of two lifted its intercept to 15-16 ms in two of six starts, of three in one.
REDUCE_REPEATS = 3
# A call of a few kB, its CPU the fewest of fifteen calls' (each rank's, summed over the ranks): what a partition
# costs beyond its bytes. The median of seven read 24-49 ms for the same hand-written ring call at N = 8 on 2 cores
# and spread the partitions over 10-17; the fewest of 21 read 17.8-19.8 ms (all-reduce 14.0-15.3 ms;
# call_cpu_readings.csv).
CALL_BYTES, CALL_REPEATS = 4 << 10, 15
# The share of shared cores a step's partition calls may take (each at the probe's fewest CPU, the rest of a
# call's CPU is the cores' contention, which the share absorbs) over the step's communication bound. Calibrated
# at N = 8, 1 Gbit, 2 cores (results/overlap_n8_1gbit): with `--overlap backward` both strategies are fastest
# at 5-10 MB partitions (2.9-4.4 MB: 5-10% slower), 0.1 cuts 5-6 MB; with `--overlap full`, partitions cut at
# the parameters' boundaries (buckets.aligned_ranges), all-reduce is fastest at 13-18 partitions and the ring
# at 13 (10: 3% slower, 17: 10%), and 0.17 draws about 15 and 12. The bytes' CPU is not in the budget: it
# is the same whatever the partition. The rest of a step's CPU (the emulated gradients, the optimizer, the
# kernel's links) is per rank, so the share scales as 1/N.
CALLS_CORE_SHARE_N8 = 0.1
CALLS_CORE_SHARE_N8_FULL = 0.17
TUNINGS = ("auto", "probe", "off")
MIN_PARTITION, MAX_PARTITION = 256 << 10, 25 << 20  # 25 MB: DDP's bucket_cap_mb, the untuned default
MIN_FIXED_S, MAX_FIXED_S = 5e-4, 0.05  # a call's cost beyond its bytes, clamped against a noisy intercept


@dataclass(frozen=True)
class LinkProbe:
    """What the probe found: ``rate_Bps``, one worker's payload rate on the wire under the exchange's own
    contention; ``fixed_s``, an exchange's cost beyond its bytes (the fit's intercept, clamped). The
    collective probe also gives ``call_cpu_s``, the CPU of all ranks together for a call of a few kB, and
    ``call_s``, the slowest rank's fastest wall time for it, which bounds ``fixed_s`` (0: not read)."""
    rate_Bps: float
    fixed_s: float
    call_cpu_s: float = 0.0
    call_s: float = 0.0

    def as_dict(self) -> dict:
        out = {"probe_rate_Bps": round(self.rate_Bps), "probe_fixed_ms": round(self.fixed_s * 1e3, 3)}
        if self.call_cpu_s:
            out["probe_call_cpu_ms"] = round(self.call_cpu_s * 1e3, 3)
        if self.call_s:
            out["probe_call_ms"] = round(self.call_s * 1e3, 3)
        return out


def fit(wire_bytes: tuple[float, float], times_s: tuple[float, float], call_s: float = math.inf) -> LinkProbe:
    """The line through two (bytes on one worker's wire, seconds) points; a slope the noise made flat or
    negative (the larger size no slower) falls back to the larger point's mean rate.

    ``call_s``, the wall time of a call of almost no bytes, bounds the fixed cost: a call's cost beyond its
    bytes cannot exceed what a call without them takes. An intercept above it is the noise of a slow smaller
    point (which also flattens the slope, so the rate reads high too: results/overlap_n8_1gbit,
    probe_repeats.csv); the fit then takes ``call_s`` as the fixed cost and the larger point's rate beyond it.

    >>> fit((2e6, 6e6), (0.25, 0.65))  # 10 MB/s, 50 ms a call
    LinkProbe(rate_Bps=10000000.0, fixed_s=0.05, call_cpu_s=0.0, call_s=0.0)
    >>> fit((2e6, 6e6), (0.45, 0.65), call_s=0.05)  # the smaller point 0.2 s late: 20 MB/s and 350 ms by the line
    LinkProbe(rate_Bps=10000000.0, fixed_s=0.05, call_cpu_s=0.0, call_s=0.0)
    """
    (s1, s2), (t1, t2) = wire_bytes, times_s
    if not (s2 > s1 > 0 and t1 > 0 and t2 > 0):
        raise ValueError(f"probe needs two growing sizes and positive times, got {wire_bytes}, {times_s}")
    rate = (s2 - s1) / (t2 - t1) if t2 > t1 else s2 / t2
    rate = min(rate, s2 / t2 * 10)  # t2 - t1 tiny against t2: no more than 10x the mean rate
    fixed = t1 - s1 / rate
    if fixed > call_s and t2 > call_s:
        fixed, rate = call_s, s2 / (t2 - call_s)
    fixed = min(max(fixed, MIN_FIXED_S), MAX_FIXED_S)
    return LinkProbe(float(rate), float(round(fixed, 6)))


def spans_hosts() -> bool:
    """Whether this run's workers are on more than one host (torchrun's, and psring's emulated hosts',
    LOCAL_WORLD_SIZE below WORLD_SIZE): where there is a link between them to schedule."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return int(os.environ.get("LOCAL_WORLD_SIZE", str(world))) < world


def wants_probe(tuning: str, told: bool) -> bool:
    """Whether to probe: ``probe`` always (also where the rate is told: the test option that hides it);
    ``auto`` where the workers span hosts and the rate is not told; ``off`` never."""
    if tuning not in TUNINGS:
        raise ValueError(f"link tuning {tuning!r}; expected one of {', '.join(TUNINGS)}")
    return tuning == "probe" or (tuning == "auto" and not told and spans_hosts())


def ring_wire(nbytes: int, world: int) -> float:
    """Bytes one worker sends (and receives) in a ring all-reduce of ``nbytes``: 2(N-1)/N of them."""
    return 2 * (world - 1) / world * nbytes


class ProbeBucket:
    """What a ``Reducer`` reads of a bucket, around a probe's buffer (index -1: no step's bucket)."""
    index = -1

    def __init__(self, flat: torch.Tensor):
        self.flat, self.nbytes = flat, flat.numel() * flat.element_size()


def probe_collective(group, world: int, device: torch.device, reducer=None,
                     sizes: tuple[int, int] = REDUCE_PROBE_BYTES,
                     repeats: int = REDUCE_REPEATS) -> LinkProbe:
    """Time a reduction of each size on ``group`` (every rank calls it), the fastest of ``repeats``: the
    strategy's own (``reducer.launch(bucket).wait()``: its fixed cost is then that strategy's, e.g. the
    hand-written ring's 2(N-1) rounds driven from Python, far above gloo's all-reduce), else a plain
    all-reduce. The ranks agree on the slowest rank's times (a MAX all-reduce), so all cut the same
    partitions; the reducer's trace records of the probe are dropped."""
    import torch.distributed as dist

    def reduce(buf: torch.Tensor) -> None:
        if reducer is None:
            dist.all_reduce(buf, group=group)
        else:
            reducer.launch(ProbeBucket(buf)).wait()

    reduce(torch.zeros(1024, device=device))  # connections up, buffers touched
    def timed(nbytes: int, n: int) -> tuple[float, list[float]]:
        """The fastest of ``n`` reductions of ``nbytes`` and each one's CPU (the process's, every thread: gloo's too)."""
        buf, best, used = torch.zeros(nbytes // 4, device=device), math.inf, []
        for _ in range(n):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0, c0 = time.perf_counter(), time.process_time()
            reduce(buf)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - t0)
            used.append(time.process_time() - c0)
        return best, used

    call_s, used = timed(CALL_BYTES, CALL_REPEATS)
    t1, t2 = (timed(nbytes, repeats)[0] for nbytes in sizes)
    if reducer is not None:
        reducer.take_messages()
    slowest = torch.tensor([call_s, t1, t2], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    total = torch.tensor([min(used)], dtype=torch.float64, device=device)
    dist.all_reduce(total, group=group)  # every rank's CPU: what the machine's cores pay, where they share one
    call_s, t1, t2 = slowest.tolist()
    p = fit((ring_wire(sizes[0], world), ring_wire(sizes[1], world)), (t1, t2), call_s)
    return LinkProbe(p.rate_Bps, p.fixed_s, total.item(), call_s)


def reduce_partition_bytes(m_bytes: int, world: int, probe: LinkProbe) -> int:
    """The reduce family's partition: n = M/b of them cost n * fixed, and the last one, reduced after
    backward, 2(N-1)/N * b / rate; b = sqrt(M * fixed * rate * N / (2(N-1))) minimises the sum. Between
    ``MIN_PARTITION`` and ``MAX_PARTITION``.

    >>> reduce_partition_bytes(44_695_848, 4, LinkProbe(11.95e6, 0.005))  # ResNet-18, N=4, 100 Mbit
    1334310
    """
    k = 2 * (world - 1) / world
    b = math.sqrt(m_bytes * probe.fixed_s * probe.rate_Bps / k)
    return int(min(MAX_PARTITION, max(MIN_PARTITION, b)))


def calls_core_share(world: int, full: bool = False) -> float:
    """The share of the shared cores a step's partition calls may take at ``world`` ranks (``full``: under
    ``--overlap full``'s priority scheduler, its partitions cut at the parameters' boundaries)."""
    return min(1.0, (CALLS_CORE_SHARE_N8_FULL if full else CALLS_CORE_SHARE_N8) * 8 / max(1, world))


def cores_partition_bytes(m_bytes: int, world: int, probe: LinkProbe, cores: int, full: bool = False) -> int:
    """The smallest partition whose calls' CPU fits where every rank shares ``cores`` (an emulated cluster):
    M/b calls of ``call_cpu_s`` within ``calls_core_share(N, full)`` of the cores over the step's communication bound
    T = 2(N-1)/N * M / rate (as ``ps.sharding.cores_chunks`` keeps the PS's chunks); ``MIN_PARTITION``
    without a CPU reading.

    >>> probe = LinkProbe(119.6e6, 5e-4, call_cpu_s=0.015)  # gloo, N = 8, 1 Gbit, 2 cores
    >>> cores_partition_bytes(44_695_848, 8, probe, 2), cores_partition_bytes(44_695_848, 8, probe, 16)
    (5125714, 640714)
    >>> cores_partition_bytes(44_695_848, 8, probe, 2, full=True)  # 15 partitions
    3015126
    """
    if not probe.call_cpu_s:
        return MIN_PARTITION
    budget_s = calls_core_share(world, full) * cores * ring_wire(m_bytes, world) / probe.rate_Bps
    return int(min(MAX_PARTITION, max(MIN_PARTITION, m_bytes * probe.call_cpu_s / budget_s)))
