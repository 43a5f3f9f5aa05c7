"""Synchronization strategies behind one interface (``base.Synchronizer``), chosen by name."""
from __future__ import annotations

from ..config import TrainConfig
from .base import Synchronizer, SyncStats, make_local_optimizer

__all__ = ["SyncStats", "Synchronizer", "make_local_optimizer", "make_synchronizer"]


def make_synchronizer(cfg: TrainConfig) -> Synchronizer:
    """The synchronizer ``cfg.sync`` for this process; rank and world come from torchrun's environment."""
    from .process_group import env_rank, init_process_group, local_device

    rank, world, local = env_rank()
    if world != cfg.workers:
        raise RuntimeError(f"WORLD_SIZE={world} but the config says --workers {cfg.workers}")
    if cfg.sync in ("allreduce", "ddp"):
        pg = init_process_group(cfg.backend, cfg.timeout_s)
        if cfg.sync == "allreduce":
            from .allreduce import AllReduceSync
            return AllReduceSync(pg, cfg.optim, cfg.bucket_mb, cfg.first_bucket_mb, cfg.overlap)
        from .ddp import DDPSync
        return DDPSync(pg, cfg.optim)
    if cfg.sync == "ps":
        from .ps.synchronizer import PSSync
        return PSSync(rank, world, local_device(local), cfg.ps_addrs, cfg.optim, cfg.timeout_s,
                      cfg.bucket_mb, cfg.overlap, cfg.frame_kb,
                      design=cfg.ps_design, consistency=cfg.consistency, staleness=cfg.staleness,
                      curve=cfg.curve, window=cfg.ps_window, links_Bps=links_Bps(cfg))
    if cfg.sync == "none":
        from .none import NoSync
        return NoSync(rank, world, local_device(local), cfg.optim)
    raise ValueError(f"unknown --sync {cfg.sync!r}")


def links_Bps(cfg: TrainConfig) -> tuple[float, float] | None:
    """(worker, server) link rates in bytes/s where psring knows them (an emulated network), else None."""
    from ..costmodel import emulated_links_Bps

    return emulated_links_Bps(cfg.net, cfg.link_rate, cfg.server_link_rate)
