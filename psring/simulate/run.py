"""``psring simulate``: a run's steps replayed on the flow-level network instead of run.

The cluster is the one ``--net emulated`` builds: hosts of G workers (``--workers-per-host``), one host per
dedicated PS server (colocated ones on the worker hosts, ``--ps-placement``), every host link ``--link-rate`` each way (the servers' ``--server-link-rate``) at TCP's
payload share, alpha per message (``--alpha-us``, default the emulated link's calibrated 205 us). Compute is
``--compute emulated:MS`` (forward 1/3, backward 2/3), each worker's step drawn from ``--jitter`` (``none``,
``lognormal:CV``) and stretched by ``--straggler``. The communication after backward (``--overlap none``) is the strategy's plan
(``programs``); overlapped with backward, or with the next forward too, the flat ring's (``overlapped``); a worker's next step starts once it holds this step's result (under BSP that waits for every
worker's pushes; the PS's ASP and SSP replay their own waits, ``programs.PSProgram``).

The output folder gets what a run writes, read by ``psring plot``, ``bounds`` and the notebooks unchanged:
``config.json``, ``steps.jsonl`` (one record per worker and step, the trainer's columns) and ``summary.json``
(``metrics.summary``'s figures, plus ``simulated: true``, the jitter and alpha).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from .. import costmodel as cm
from .. import strategies
from ..compress.spec import NONE
from ..config import ConfigError, TrainConfig
from ..fileio import write_atomic
from ..metrics.summary import finalize_run
from .checks import DEFAULT_ALPHA_US, burst_bytes, check, overlapped, parse_jitter
from .network import Network
from .plans import bucket_numels, layout_of, link_Bps, ps_plan
from .profile import NO_JITTER
from .programs import PSProgram, RingProgram
from .records import check_update, record, vector_records


def compute_times(cfg: TrainConfig, compute_s: float, jitter: tuple[str, float]) -> np.ndarray:
    """[step, rank]: each worker's forward+backward, drawn from the jitter model (mean ``compute_s``, seeded
    by ``--seed``) and stretched by ``--straggler``."""
    kind, cv = jitter
    shape = (cfg.steps, cfg.workers)
    if kind == NO_JITTER or cv == 0:
        factors = np.ones(shape)
    else:
        sigma = math.sqrt(math.log1p(cv * cv))
        factors = np.random.default_rng(cfg.seed).lognormal(-sigma * sigma / 2, sigma, shape)
    slow = np.array([cfg.straggler_factor(r) for r in range(cfg.workers)])
    return compute_s * factors * slow


def cluster(cfg: TrainConfig, alpha_s: float) -> tuple[Network, list[int], list[int]]:
    """The network, each worker's host and each server's host where the launcher puts them
    (``launch.placement.server_host``: colocated servers on worker hosts, sharing their links; dedicated ones
    on hosts of their own, at ``--server-link-rate``)."""
    from ..launch.placement import server_host

    hosts = cfg.workers // cfg.per_host
    servers = cfg.servers if strategies.uses_servers(cfg.sync) else 0
    w, srv = link_Bps(cfg.link_rate), link_Bps(cfg.server_link_rate or cfg.link_rate)
    server_hosts = [server_host(cfg, s) for s in range(servers)]
    dedicated = max(server_hosts, default=hosts - 1) + 1 - hosts
    net = Network([w] * hosts + [srv] * dedicated, alpha_s, burst_bytes=burst_bytes(cfg.link_burst))
    return net, [r // cfg.per_host for r in range(cfg.workers)], server_hosts


def program(cfg: TrainConfig, net: Network, host_of: list[int], server_host: list[int], done):
    """The strategy's step plan on this cluster, from the planners its synchronizer runs."""
    from ..compress.codecs import parse
    from .codec_bytes import gathered_rounds, ps_reply_bytes

    layout = layout_of(cfg)
    codec = None if cfg.compress == NONE else parse(cfg.compress, cfg.error_feedback)
    itemsize = layout[0].dtype.itemsize
    model = strategies.attr(cfg.sync, "cost_model")
    if strategies.uses_servers(cfg.sync):
        chunks, window = ps_plan(cfg, layout)
        pushes = None
        if codec is not None:  # pushed in the codec's bytes; replied as the design answers (codec_bytes)
            numels = [b // itemsize for _, b in chunks]
            pushes = [codec.wire_bytes(n) for n in numels]
            chunks = [(s, ps_reply_bytes(codec, n, itemsize, cfg.workers, cfg.ps_design))
                      for (s, _), n in zip(chunks, numels)]
        return PSProgram(net, host_of, server_host, chunks, window, done, cfg.consistency, cfg.staleness, pushes)
    numels = bucket_numels(cfg, layout)
    if codec is not None and not codec.dense:  # every rank's encoding all-gathered, hierarchical's too
        return RingProgram(net, host_of, [list(range(cfg.workers))], [numels], itemsize, done,
                           gathered_rounds(codec, numels, cfg.workers))
    if codec is not None:  # the shadow bucket in the codec's dtype, reduced as it is (sync/compressed.py)
        itemsize = codec.wire_bytes(1)
    if model == cm.HIERARCHICAL_MODEL:
        from ..sync.ring import chunk_sizes

        g, hosts = cfg.per_host, cfg.workers // cfg.per_host
        rings = [[h * g + lr for h in range(hosts)] for lr in range(g)]
        slices = [[chunk_sizes(n, g)[lr] for n in numels] for lr in range(g)]
        return RingProgram(net, host_of, rings, slices, itemsize, done)
    if model == cm.RING_MODEL:
        return RingProgram(net, host_of, [list(range(cfg.workers))], [numels], itemsize, done)
    return None


def simulate(cfg: TrainConfig, out: Path, jitter: str = NO_JITTER, alpha_us: float = DEFAULT_ALPHA_US,
             flows: bool = False, tuned: dict | None = None, readiness: str = "bytes", update_s: float = 0.0) -> dict:
    """Replay ``cfg`` (validated) and write its run folder ``out``; returns the summary. On a numpy replay
    where ``vector_of`` (or, overlapped, ``vector_overlap_of``) has one, unless ``flows`` (the flow network
    always). ``tuned``: an overlapped run's recorded partition or chunk (``partition_bytes``,
    ``chunk_bytes``: what its probe and cores cut); ``readiness``: when backward makes each gradient
    (``profile``: ``bytes``, as the emulation does, or ``flops``); ``update_s``: the local optimizer's update a
    step (``records``: where a step spends it, and ``check_update``)."""
    from .profile import check_readiness
    from .vector_overlap import overlap_records, vector_overlap_of

    check_readiness(readiness)
    compute = compute_times(cfg, check(cfg), parse_jitter(jitter))
    check_update(cfg, update_s)
    vector = None if flows or overlapped(cfg) else vector_of(cfg, alpha_us * 1e-6)
    unitwise = None if flows or not overlapped(cfg) else vector_overlap_of(cfg, alpha_us * 1e-6, tuned, readiness)
    if flows and overlapped(cfg) and strategies.attr(cfg.sync, "cost_model") == cm.HIERARCHICAL_MODEL:
        raise ConfigError("the flow replay has no hierarchical overlap: its numpy replay is the only one")
    from .vector_async import AsyncPS, async_records

    if isinstance(vector, AsyncPS):  # SSP, ASP, BSP with 1 < S < N: each worker its own steps
        records = async_records(cfg, compute, vector)
    elif vector is not None:
        records = vector_records(cfg, compute, vector, update_s)
    elif unitwise is not None and cfg.overlap == "full":
        from .vector_full import full_records

        records = full_records(cfg, compute, *unitwise, alpha_us * 1e-6, update_s)
    elif unitwise is not None:
        records = overlap_records(cfg, compute, *unitwise, update_s)
    else:
        if overlapped(cfg):
            from .overlapped import OverlapReplay

            replay = OverlapReplay(cfg, compute, alpha_us * 1e-6, tuned, readiness, update_s)
        else:
            replay = Replay(cfg, compute, alpha_us * 1e-6, update_s)
        replay.net.run()
        records = replay.records
    extra = {"simulated": True, "jitter": jitter, "alpha_us": alpha_us}
    if readiness != "bytes":  # (the default left out: runs replayed before it existed stay finished for sweeps)
        extra["readiness"] = readiness
    return write_run(cfg, out, records, extra)


def vector_of(cfg: TrainConfig, alpha_s: float):
    """The numpy replay of this run, where one exists: the flat ring, one worker a host or G with the sends
    inside a host free (``vector.VectorRing``, exact), in a codec's bytes too (fp16/bf16 reduced in 2 bytes, the
    sparse and 1-bit encodings all-gathered over every rank, hierarchical's as well: ``codec_bytes``);
    hierarchical without a codec (``vector.VectorHierarchy``: its rings as one over the hosts); the PS without a
    codec, with dedicated servers, one worker per host and no tbf burst: BSP with S = 1 or S >= N
    ``vector_ps.VectorPS``, SSP, ASP and BSP with 1 < S < N ``vector_async.AsyncPS`` (fluids); else None (the flow
    network)."""
    from ..compress.codecs import parse
    from ..topology import colocated_servers
    from .codec_bytes import gathered_rounds

    model, hosts = strategies.attr(cfg.sync, "cost_model"), cfg.workers // cfg.per_host
    codec = None if cfg.compress == NONE else parse(cfg.compress, cfg.error_feedback)
    gathered = codec is not None and not codec.dense and model in (cm.RING_MODEL, cm.HIERARCHICAL_MODEL)
    dedicated = colocated_servers(cfg.ps_placement, hosts, cfg.servers) == 0
    fluid = strategies.uses_servers(cfg.sync) and codec is None and cfg.per_host == 1 and dedicated \
        and burst_bytes(cfg.link_burst) == 0
    if not (gathered or model == cm.RING_MODEL or model == cm.HIERARCHICAL_MODEL and codec is None or fluid):
        return None
    layout, rate, burst = layout_of(cfg), link_Bps(cfg.link_rate), burst_bytes(cfg.link_burst)
    if gathered or model == cm.RING_MODEL:
        from .vector import VectorRing

        numels, itemsize = bucket_numels(cfg, layout), layout[0].dtype.itemsize
        if gathered:
            return VectorRing(cfg.workers, [], itemsize, rate, alpha_s, burst, per_host=cfg.per_host,
                              gathered=gathered_rounds(codec, numels, cfg.workers))
        itemsize = codec.wire_bytes(1) if codec is not None else itemsize  # fp16/bf16: the shadow bucket
        return VectorRing(cfg.workers, numels, itemsize, rate, alpha_s, burst, per_host=cfg.per_host)
    if model == cm.HIERARCHICAL_MODEL:
        from .vector import VectorHierarchy, VectorRing

        ring = VectorRing(hosts, bucket_numels(cfg, layout), layout[0].dtype.itemsize, rate, alpha_s, burst)
        return VectorHierarchy(hosts, cfg.per_host, ring)
    if cfg.consistency != "bsp" or 1 < cfg.servers < cfg.workers:
        # workers drift apart (SSP, ASP), or (BSP) a server with several workers answers them in turn: each worker
        # its own point on the step's bytes (within 0.94-0.99 of the flow replay at S = N/4, where VectorPS's
        # replies all at once read 1.01-1.20: results/simulate/fluid_check.csv; at S = 1 it costs minutes a run)
        from .vector_async import async_of

        return async_of(cfg, alpha_s)
    from .vector_ps import vector_ps_of

    return vector_ps_of(cfg, alpha_s)


class Replay:
    """Every worker's steps on the flow network: compute (``compute[step, rank]``), then the strategy's
    communication; the next step once the worker holds this one's result (BSP)."""

    def __init__(self, cfg: TrainConfig, compute: np.ndarray, alpha_s: float, update_s: float = 0.0):
        self.cfg, self.compute, self.update_s = cfg, compute, update_s
        self.net, host_of, server_host = cluster(cfg, alpha_s)
        n = cfg.workers
        self.records: list[list[dict]] = [[] for _ in range(n)]
        self.began, self.backward_end, self.step = [0.0] * n, [0.0] * n, [0] * n
        self.prog = program(cfg, self.net, host_of, server_host, self.finish)
        for r in range(n):
            self.begin(r)

    def begin(self, r: int) -> None:
        self.began[r] = self.net.now
        self.backward_end[r] = self.net.now + self.update_s + float(self.compute[self.step[r], r])
        self.net.at(self.backward_end[r], lambda: self.prog.start(r) if self.prog else self.finish(r, 0.0))

    def finish(self, r: int, sent: float, recv: float | None = None) -> None:
        """Worker ``r`` holds its step's result: its record, and its next step."""
        self.records[r].append(record(self.cfg, r, self.step[r], self.began[r], self.backward_end[r],
                                      self.net.now, sent, recv, self.update_s))
        self.step[r] += 1
        if self.step[r] < self.cfg.steps:
            self.begin(r)


def write_run(cfg: TrainConfig, out: Path, records: list[list[dict]], extra: dict) -> dict:
    """The run folder a real run leaves: config.json, ranks/, steps.jsonl, summary.json (+ ``extra``)."""
    (out / "ranks").mkdir(parents=True, exist_ok=True)
    cfg.save(out / "config.json")
    for r, recs in enumerate(records):
        write_atomic(out / "ranks" / f"rank{r}.jsonl", "".join(json.dumps(x) + "\n" for x in recs))
    summary = finalize_run(out, cfg.to_dict())
    summary.update(extra)
    write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary
