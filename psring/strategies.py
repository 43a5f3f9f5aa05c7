"""The strategy registry: every synchronization strategy, by name, with what the rest of psring needs to
know about it. CLI choices and help, validation, the launcher, bench, sweeps, compare, bounds, plots
and the cost model ask this module; no other code compares a strategy's name.

Adding a strategy is one implementation module and one ``Strategy(...)`` entry in ``REGISTRY`` (see
docs/ARCHITECTURE.md, "How to add a strategy"). This module imports nothing heavy: each entry's
``build`` imports its implementation when a worker starts.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

OVERLAPS = ("none", "backward", "full")  # --overlap: after backward; during it; during the next forward too


def overlap_mode(value):
    """An ``overlap`` as a mode: a bool (config.json, experiment files and tables written before
    ``--overlap MODE``, when ``--no-overlap`` was False) as the mode it meant; anything else as it is."""
    return ("backward" if value else "none") if isinstance(value, bool) else value


def during_backward(mode: str) -> bool:
    """Whether ``--overlap MODE`` sends each bucket from backward's hooks (backward, full), not after it."""
    return mode != OVERLAPS[0]


if TYPE_CHECKING:
    from .config import TrainConfig
    from .sync.base import Synchronizer


@dataclass(frozen=True)
class Strategy:
    """One strategy. ``build(cfg)`` makes this process's synchronizer (rank and world from torchrun's
    environment). ``process_group``: it needs torch.distributed; ``servers``: it needs parameter servers
    (``--servers``, ``--ps-addrs``, the PS options). ``baseline``: the no-communication run every speedup
    is taken against. ``cost_model``: its key in ``costmodel.STRATEGIES`` (None: it moves no bytes).
    ``bench_raw``: the raw transport ``psring bench`` times it against (None: not benchable).
    ``sync_timed``: whether its communication can be timed apart from backward (DDP's cannot).
    ``bucket_mb``: its default ``--bucket-mb`` (None: partitions cut to the link, ``ReduceSync``). ``overlaps``: the ``--overlap`` modes it honours. ``options``: the config sections (``config.SECTIONS``)
    it reads beyond the common ones; an option of another strategy's section left off its default is
    refused. ``reducer``: for the "reduce, then local optimizer" family (``sync.reducer.ReduceSync``),
    ``reducer(process_group_info) -> Reducer``; ``build`` wraps it, and ``psring bench`` times it
    against a flat ``dist.all_reduce``. ``codecs``: the ``--compress`` codec names (``compress.codecs``)
    it takes besides ``none``. ``buffers``: what ``--buffers auto`` means for it (``sync.buffer_sync``):
    BatchNorm statistics kept per worker (local) or rank 0's everywhere (broadcast, DDP's default)."""

    name: str
    help: str
    label: str
    color: str
    build: Callable[[TrainConfig], Synchronizer]
    process_group: bool = False
    servers: bool = False
    baseline: bool = False
    cost_model: str | None = None
    bench_raw: str | None = None
    sync_timed: bool = True
    bucket_mb: float | None = 25.0
    overlaps: tuple[str, ...] = ("none", "backward", "full")
    options: tuple[str, ...] = ()
    reducer: Callable | None = None
    codecs: tuple[str, ...] = ()
    buffers: str = "local"


def _env():
    from .sync.process_group import env_rank, local_device

    rank, world, local = env_rank()
    return rank, world, local_device(local)


def _group(cfg: TrainConfig):
    from .sync.process_group import init_process_group

    return init_process_group(cfg.backend, cfg.timeout_s)


def _shared_cores(cfg: TrainConfig) -> int | None:
    """The cores every rank and server shares where the cluster is emulated on this machine, else None."""
    from .launch.resources import cores

    return cores() if cfg.net == "emulated" else None


def _reduce(cfg: TrainConfig, reducer) -> Synchronizer:
    from .sync.reducer import ReduceSync

    return ReduceSync(reducer, cfg.optim, cfg.bucket_mb, cfg.first_bucket_mb, cfg.overlap, cfg.timeout_s,
                      cfg.link_tuning, shared_cores=_shared_cores(cfg))


def _none(cfg: TrainConfig) -> Synchronizer:
    from .sync.none import NoSync

    rank, world, device = _env()
    return NoSync(rank, world, device, cfg.optim)


def _torch_allreduce(pg):
    from .sync.allreduce import TorchAllReduce

    return TorchAllReduce(pg)


def _ring_reducer(pg):
    from .sync.ring import RingAllReduce

    return RingAllReduce(pg)


def _hierarchical_reducer(pg):
    from .sync.hierarchical import HierarchicalAllReduce
    from .topology import local_world

    return HierarchicalAllReduce(pg, local_world())


def _reducing(name: str) -> Callable[[TrainConfig], Synchronizer]:
    """``build`` of a strategy of the reducer family: its reducer on this process's group, in ReduceSync;
    with ``--compress``, wrapped by the codec (``sync.compressed``)."""
    def build(cfg: TrainConfig) -> Synchronizer:
        pg = _group(cfg)
        reducer = REGISTRY[name].reducer(pg)
        if cfg.compress != "none":
            from .sync.compressed import wrap

            reducer = wrap(reducer, pg, cfg.compress, cfg.error_feedback)
        return _reduce(cfg, reducer)
    return build


CODECS = ("fp16", "bf16", "topk", "randomk", "onebit")  # the codecs of compress.codecs.parse
REDUCE_CODECS = CODECS + ("powersgd",)  # and PowerSGD (sync/powersgd.py), for the all-reduce family


def _ddp(cfg: TrainConfig) -> Synchronizer:
    from .sync.ddp import DDPSync

    return DDPSync(_group(cfg), cfg.optim, cfg.bucket_mb, cfg.first_bucket_mb, compress=cfg.compress,
                   broadcast_buffers=cfg.resolved_buffers == "broadcast")


def _ps(cfg: TrainConfig) -> Synchronizer:
    from .costmodel import emulated_links_Bps
    from .sync.ps.synchronizer import make_ps
    from .topology import server_shares
    from .train.torchrun import launched_by_psring

    rank, world, device = _env()
    if not cfg.ps_addrs and cfg.ps_placement == "colocated" and not launched_by_psring():
        from .sync.ps.colocated import colocated_addrs

        cfg.ps_addrs = colocated_addrs(cfg, rank, world)  # torchrun: each node's local rank 0 starts its own
    return make_ps(rank, world, device, cfg.ps_addrs, cfg.optim, cfg.timeout_s, cfg.bucket_mb, cfg.overlap,
                   cfg.frame_kb, design=cfg.ps_design, consistency=cfg.consistency, staleness=cfg.staleness,
                   curve=cfg.curve, window=cfg.ps_window,
                   links_Bps=emulated_links_Bps(cfg.net, cfg.link_rate, cfg.server_link_rate,
                                                cfg.link_tuning),
                   compress=cfg.compress, error_feedback=cfg.error_feedback, credit_mb=cfg.ps_credit_mb,
                   order=cfg.ps_order, link_tuning=cfg.link_tuning,
                   shares=server_shares(cfg.ps_placement, cfg.hosts, cfg.servers),
                   shared_cores=_shared_cores(cfg))


REGISTRY: dict[str, Strategy] = {s.name: s for s in (
    Strategy("ps", "parameter servers: push gradients, pull parameters (ZeroMQ)", "ps", "tab:red", _ps,
             servers=True, cost_model="ps", bench_raw="raw_zmq_echo", bucket_mb=4.0, options=("ps",),
             codecs=CODECS),
    Strategy("allreduce", "torch.distributed all-reduce of gradient buckets, overlapped with backward",
             "all-reduce", "tab:blue", _reducing("allreduce"), process_group=True, cost_model="allreduce",
             bench_raw="raw_allreduce", reducer=_torch_allreduce, codecs=REDUCE_CODECS, bucket_mb=None),
    Strategy("ring", "hand-written ring all-reduce (reduce-scatter + all-gather) on torch.distributed "
             "point-to-point", "ring (hand-written)", "tab:green", _reducing("ring"), process_group=True,
             cost_model="allreduce", bench_raw="raw_allreduce", reducer=_ring_reducer, codecs=REDUCE_CODECS,
             bucket_mb=None),
    Strategy("hierarchical", "reduce-scatter inside each host, all-reduce across hosts, all-gather inside "
             "(--workers-per-host G)", "hierarchical", "tab:olive", _reducing("hierarchical"),
             process_group=True, cost_model="two_level", bench_raw="raw_allreduce",
             reducer=_hierarchical_reducer, codecs=REDUCE_CODECS, bucket_mb=None),
    Strategy("ddp", "torch's DistributedDataParallel, the reference", "DDP", "tab:cyan", _ddp,
             process_group=True, cost_model="allreduce", sync_timed=False, overlaps=("backward",),
             codecs=("fp16", "bf16", "powersgd"), buffers="broadcast"),
    Strategy("none", "no communication: each worker trains alone (N=1: the baseline of every speedup)",
             "no communication", "tab:gray", _none, baseline=True),
)}


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def get(name: str) -> Strategy:
    """The entry of ``name``; ``ValueError`` naming the choices for anything else."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; one of {', '.join(REGISTRY)}") from None


def where(**flags) -> tuple[str, ...]:
    """The names of the strategies whose fields equal ``flags``, e.g. ``where(servers=True)``."""
    return tuple(n for n, s in REGISTRY.items() if all(getattr(s, k) == v for k, v in flags.items()))


def uses_servers(name) -> bool:
    """Whether ``name`` (a strategy name, or anything read back from a table) runs parameter servers."""
    s = REGISTRY.get(name) if isinstance(name, str) else None
    return bool(s and s.servers)


def is_baseline(name) -> bool:
    s = REGISTRY.get(name) if isinstance(name, str) else None
    return bool(s and s.baseline)


def attr(name, field: str, default=None):
    """``get(name).<field>`` for a known strategy, else ``default`` (tables may hold other names)."""
    s = REGISTRY.get(name) if isinstance(name, str) else None
    return getattr(s, field) if s is not None else default


def baseline_name() -> str:
    return where(baseline=True)[0]
