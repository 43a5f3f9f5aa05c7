"""Synchronization strategies behind one interface (``base.Synchronizer``), chosen by name from the
registry (``psring.strategies``)."""
from __future__ import annotations

from ..config import TrainConfig
from .base import Synchronizer, SyncStats, make_local_optimizer

__all__ = ["SyncStats", "Synchronizer", "make_local_optimizer", "make_synchronizer"]


def make_synchronizer(cfg: TrainConfig) -> Synchronizer:
    """The synchronizer ``cfg.sync`` for this process; rank and world come from torchrun's environment."""
    from ..strategies import get
    from .process_group import env_rank

    _, world, _ = env_rank()
    if world != cfg.workers:
        raise RuntimeError(f"WORLD_SIZE={world} but the config says --workers {cfg.workers}")
    return get(cfg.sync).build(cfg)
