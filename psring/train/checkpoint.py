"""Checkpoints (``--checkpoint-every K``) and resuming (``--resume DIR``).

Rank 0 writes ``OUT/checkpoint/checkpoint.pt`` after every K-th step: the step, the model's state
(parameters and buffers), the synchronizer's state (a local optimizer's, or every PS server's shard and
optimizer state, fetched from the servers) and the run's settings. It is written to a temporary file
and renamed over the previous one, so a run killed at any moment leaves either the old or the new
checkpoint, never half of one. The one before it stays as ``previous.pt``: rank 0 writes a checkpoint
as soon as its own step is done, so another worker killed at that moment may not have logged that step
yet; the launcher's restart (``--max-restarts``) then resumes from the previous one, and the run's
records still hold every step once per worker.

What only one rank holds (a PS worker's error-feedback residuals: ``Synchronizer.rank_state``) is
written by that rank beside it, ``checkpoint/rankR.pt`` (and ``rankR.previous.pt``), each rank before it
logs the step, so the checkpoint the launcher restarts from (one whose step every worker logged) has
every rank's file. Loading uses ``torch.load(weights_only=True)``: tensors
and plain values only, no pickled code.

Resuming a BSP run continues bit for bit: the data order and augmentation are functions of the step,
and the optimizer state is restored with the parameters. (Under SSP/ASP, a checkpoint is the servers'
state at that moment, which is all that exists; the run continues from it, not identically.)
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..fileio import torch_save_atomic

if TYPE_CHECKING:
    import torch

FOLDER, FILE, PREVIOUS = "checkpoint", "checkpoint.pt", "previous.pt"
MUST_MATCH = ("sync", "workers", "servers", "model", "ps_design", "consistency")


class CheckpointError(ValueError):
    """No usable checkpoint where one was asked for; one line."""


def path_of(where: str | Path) -> Path:
    """``where`` may be a run folder, its ``checkpoint/`` folder, or the file itself."""
    p = Path(where)
    # previous.pt alone: a run killed between the two renames of a save (the newest is then still a .tmp)
    for cand in (p, p / FILE, p / FOLDER / FILE, p / PREVIOUS, p / FOLDER / PREVIOUS):
        if cand.is_file():
            return cand
    raise CheckpointError(f"no checkpoint in {where} (runs write one with --checkpoint-every K)")


def save(out: Path, step: int, model: torch.nn.Module, sync_state: dict, config: dict) -> Path:
    """Raises ``fileio.WriteError`` (a full disk, ...) with the earlier checkpoints intact."""
    folder = Path(out) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    state = {"step": step, "time": time.time(), "model": model.state_dict(), "sync": sync_state,
             "config": {k: config.get(k) for k in MUST_MATCH}}
    return torch_save_atomic(state, folder / FILE, keep_previous=folder / PREVIOUS)


def rank_files(rank: int) -> tuple[str, str]:
    return f"rank{rank}.pt", f"rank{rank}.previous.pt"


def save_rank(out: Path, step: int, rank: int, state: dict) -> Path:
    """This rank's own part of the checkpoint after ``step`` (``load_rank`` finds it by step)."""
    folder = Path(out) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    cur, prev = rank_files(rank)
    return torch_save_atomic({"step": step, "rank": rank, "state": state}, folder / cur, keep_previous=folder / prev)


def load_rank(where: str | Path, rank: int, step: int) -> dict | None:
    """What rank ``rank`` saved after ``step`` beside the checkpoint in ``where``; None if it saved none
    (the synchronizer that needs one says so)."""
    import torch

    folder = path_of(where).parent
    for name in rank_files(rank):
        f = folder / name
        if not f.is_file():
            continue
        try:
            d = torch.load(f, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - torn or foreign: one line
            raise CheckpointError(f"cannot read {f}: {type(e).__name__}: {e}") from None
        if isinstance(d, dict) and d.get("step") == step and d.get("rank") == rank:
            return d["state"]
    return None


def load(where: str | Path) -> dict:
    import torch  # here, not at the top: the launcher reads checkpoints' steps and should not pay for torch

    path = path_of(where)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - a torn or foreign file: say which, in one line
        first = (str(e).splitlines() or [""])[0][:120]  # torch's unpickling errors run to several lines
        raise CheckpointError(f"cannot read checkpoint {path}: not a file torch.save wrote whole "
                              f"({type(e).__name__}: {first})") from None
    if not (isinstance(ckpt, dict) and {"step", "model", "sync", "config"} <= set(ckpt)):
        raise CheckpointError(f"{path} is not a psring checkpoint")
    return ckpt


def check_compatible(ckpt: dict, config: dict, where: str) -> None:
    for k in MUST_MATCH:
        if ckpt["config"].get(k) != config.get(k):
            raise CheckpointError(f"checkpoint in {where} was written with {k}={ckpt['config'].get(k)!r}, "
                                  f"this run has {k}={config.get(k)!r}")
    if ckpt["step"] + 1 >= config["steps"]:  # --epochs E: the steps they became (config.resolve_steps)
        asked = f"--epochs {config['epochs']} (= {config['steps']} steps)" if config.get("epochs") else \
            f"--steps {config['steps']}"
        raise CheckpointError(f"checkpoint in {where} is after step {ckpt['step']}: nothing left of {asked}")


def last_step(out: Path) -> int | None:
    """The step of the checkpoint in run folder ``out``, if there is a readable one (for messages)."""
    try:
        return int(load(out)["step"])
    except CheckpointError:
        return None


def saved(out: Path) -> list[tuple[int, Path]]:
    """``(step, file)`` of every readable checkpoint in run folder ``out``, the newest first."""
    found = []
    for f in (Path(out) / FOLDER / FILE, Path(out) / FOLDER / PREVIOUS):
        if f.is_file():
            try:
                found.append((int(load(f)["step"]), f))
            except CheckpointError:
                continue  # torn by something other than psring: the other one may still do
    return sorted(found, reverse=True)
