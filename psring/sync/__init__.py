"""Synchronization strategies behind one interface (``base.Synchronizer``), chosen by name from the
registry (``psring.strategies``)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..config import TrainConfig

if TYPE_CHECKING:
    from .base import Synchronizer, SyncStats, make_local_optimizer

__all__ = ["SyncStats", "Synchronizer", "make_local_optimizer", "make_synchronizer"]
_FROM_BASE = ("SyncStats", "Synchronizer", "make_local_optimizer")


def __getattr__(name: str):
    """``base``'s names, imported on first use: the package's torch-free modules (``ranges``, ``ps.sharding``,
    ``ps.consistency``) serve the launcher's config checks without importing torch (3-4 s of CPU)."""
    if name in _FROM_BASE:
        from . import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_synchronizer(cfg: TrainConfig) -> Synchronizer:
    """The synchronizer ``cfg.sync`` for this process; rank and world come from torchrun's environment."""
    from ..strategies import get
    from .process_group import env_rank

    _, world, _ = env_rank()
    if world != cfg.workers:
        raise RuntimeError(f"WORLD_SIZE={world} but the config says --workers {cfg.workers}")
    return get(cfg.sync).build(cfg)
