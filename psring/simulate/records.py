"""The trainer's per-step records (``steps.jsonl``'s columns) of a replayed run: one worker's step from when it
began, ended backward and held the result (``record``), and the numpy replays' loop over steps and ranks
(``add_step``, ``vector_records``), and the local optimizer's update: which a replay takes (``check_update``,
``measured_update_s``) and where a step spends it.

A local optimizer's update (``update_s``, ``psring simulate --update-ms``) is replayed as a step's first
phase: the trainer runs it after the sync and before the next forward (under ``--overlap full``, parameter by
parameter in the next forward's gates), so in a steady step it sits between one sync and the next
forward, and it delays both the step and the next backward's gradients."""
from __future__ import annotations

import math

import numpy as np

from .. import strategies
from ..config import ConfigError, TrainConfig


def record(cfg: TrainConfig, r: int, step: int, began: float, backward_end: float, now: float, sent: float,
           recv: float | None = None, update_s: float = 0.0) -> dict:
    """One worker's step, with the trainer's columns (``recv``: where it differs from ``sent``; ``update_s``:
    the local optimizer's update, inside ``began``..``backward_end``)."""
    from ..train.compute_spec import FORWARD_SHARE

    c = backward_end - began - update_s
    return {"rank": r, "step": step, "loss": None, "step_s": now - began, "data_s": 0.0,
            "forward_s": c * FORWARD_SHARE, "backward_s": c * (1 - FORWARD_SHARE), "sync_s": now - backward_end,
            "update_s": update_s, "bytes_sent": sent, "bytes_recv": sent if recv is None else recv, "samples": cfg.batch_size, "time": now,
            "epoch": 0, "test_acc": None}


def add_step(records: list[list[dict]], cfg: TrainConfig, step: int, began, backward_end, end, sent,
             update_s: float = 0.0) -> None:
    """Append one step of every worker (per-rank arrays, or one value for all) to ``records[rank]``: the numpy
    replays' one record loop."""
    n = len(records)
    began, backward_end, end, sent = (np.broadcast_to(np.asarray(x, dtype=np.float64), (n,))
                                      for x in (began, backward_end, end, sent))
    for r in range(n):
        records[r].append(record(cfg, r, step, began[r], backward_end[r], end[r], sent[r], update_s=update_s))


def vector_records(cfg: TrainConfig, compute: np.ndarray, replay, update_s: float = 0.0) -> list[list[dict]]:
    """Every step of every worker on a numpy replay (``step(start) -> (end, sent)``, per rank or common)."""
    records: list[list[dict]] = [[] for _ in range(cfg.workers)]
    t = np.zeros(cfg.workers)
    for step in range(cfg.steps):
        start = t + update_s + compute[step]
        end, sent = replay.step(start)
        add_step(records, cfg, step, t, start, end, sent, update_s)
        t = np.array(np.broadcast_to(end, start.shape), dtype=np.float64)
    return records


def check_update(cfg: TrainConfig, update_s: float) -> None:
    """One line for an update the replay cannot place: negative or not a number, or a PS run's (its workers
    have no local optimizer: its servers update, and the replay leaves their update out)."""
    if not (math.isfinite(update_s) and update_s >= 0):
        raise ConfigError(f"--update-ms must be a number >= 0, got {update_s * 1000:g}")
    if update_s and strategies.uses_servers(cfg.sync):
        raise ConfigError("--update-ms is a local optimizer's update; a PS's workers have none (its servers update, "
                          "which the replay leaves out): drop it")


def measured_update_s(summary: dict, sync: str) -> float:
    """The local optimizer's update a step a run measured (``update_s_p50`` of its summary or runs.csv row), which
    its replay runs before each forward, as ``bounds`` takes it; 0 where it has none (a PS: its workers have none)."""
    value = summary.get("update_s_p50")
    if strategies.uses_servers(sync) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return 0.0
    return float(value)
