"""A run's output folder, and the promise that nothing a user finished is lost without being asked.

- ``psring train`` without ``--out`` writes to a folder of its own, ``runs/DATE-TIME-SYNC-nN``.
- A folder holding a finished run (``summary.json``) or an unfinished one with a checkpoint is refused
  unless the caller says ``overwrite`` (``--overwrite``), or resumes that very run (``--resume DIR``).
- A folder in use by a running launcher (its lock, ``.psring.lock``, held) is always refused: two runs
  writing the same records would ruin both, whatever the flags.
- The launcher only calls ``prepare_out`` (the first change to the folder) once the configuration is
  valid and the resources are checked, and holds the lock from there to the end of the run.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import time
from pathlib import Path

from ..config import ConfigError
from ..fileio import remove_temporaries
from ..train.checkpoint import FILE, FOLDER, PREVIOUS, CheckpointError, last_step, path_of
from .restarts import EARLIER

LOCK = ".psring.lock"
# what a run writes; a fresh run in a used folder removes all of it, its checkpoints too (a restart must
# never resume another run's), but only psring's files there: checkpoint/ is a common name
OUTPUT_DIRS = ("ranks", "logs", "servers")
OUTPUT_FILES = ("steps.jsonl", "summary.json", "model.pt", "trace.json", "config.json", "tuned.json", "links.jsonl",
                f"{FOLDER}/{FILE}", f"{FOLDER}/{PREVIOUS}")  # (tuned.json: summary.json takes in whatever it finds)


def default_out(sync: str, workers: int, root: str | Path = "runs", now: float | None = None) -> str:
    """``runs/20261201-143005-ps-n2``; ``-2``, ``-3``, ... when a run of the same second has it."""
    base = Path(root) / f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}-{sync}-n{workers}"
    cand, i = base, 1
    while cand.exists():
        i += 1
        cand = base.with_name(f"{base.name}-{i}")
    return str(cand)


def run_folder_of(resume: str) -> str | None:
    """The run folder a ``--resume`` argument's checkpoint belongs to (``DIR/checkpoint/*.pt``)."""
    try:
        ckpt = path_of(resume)
    except CheckpointError:
        return None
    return str(ckpt.parent.parent) if ckpt.parent.name == "checkpoint" else None


def resumes_in_place(out: str | Path, resume: str | None) -> bool:
    """Whether ``--resume`` continues the run in ``out`` itself (rather than one elsewhere)."""
    folder = run_folder_of(resume) if resume else None
    return folder is not None and Path(folder).resolve() == Path(out).resolve()


def running_pid(out: Path) -> int | None:
    """The pid of a launcher that holds ``out``'s lock (0 if it wrote none), or None if no run holds it."""
    try:
        fd = os.open(out / LOCK, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        text = os.read(fd, 32).decode(errors="replace").strip()
        return int(text) if text.isdigit() else 0
    finally:
        os.close(fd)  # also drops the shared lock, if we got it
    return None


def _in_use(out: Path, pid: int) -> ConfigError:
    who = f" (launcher pid {pid})" if pid else ""
    return ConfigError(f"{out} is in use by a running psring train{who}: choose another --out, or wait "
                       f"for that run to end")


def check_out(out: Path, overwrite: bool = False, in_place: bool = False) -> None:
    """Refuse a folder whose run must not be replaced; reads the folder, changes nothing."""
    pid = running_pid(out)
    if pid is not None:
        raise _in_use(out, pid)
    if overwrite or in_place:
        return
    if (out / "summary.json").exists():
        raise ConfigError(f"{out} holds a finished run: choose another --out, or --overwrite to replace it")
    step = last_step(out) if (out / "checkpoint").is_dir() else None
    if step is not None:
        raise ConfigError(f"{out} holds an unfinished run with a checkpoint after step {step}: continue it "
                          f"with --resume {out}, or --overwrite to replace it")


def refuse_results(out: str | Path, names: tuple[str, ...], what: str, overwrite: bool = False) -> None:
    """Refuse an ``--out`` holding any of the result files ``names`` (a bench's ``bench.csv``, a
    ``calibration.json``) unless ``overwrite``; reads, changes nothing (an empty ``out``: the caller's to refuse)."""
    done = [f for f in names if str(out).strip() and (Path(out) / f).exists()]
    if done and not overwrite:
        raise ConfigError(f"{out} holds {what} ({', '.join(done)}): choose another --out, or --overwrite to replace it")


class RunLock:
    """``with RunLock(out):`` the folder is this launcher's (an exclusive ``flock`` on ``out/.psring.lock``,
    released by the kernel even if the launcher is SIGKILLed); another launcher is refused meanwhile."""

    def __init__(self, out: Path):
        self.out, self.fd = Path(out), None

    def __enter__(self) -> RunLock:
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(f"cannot write to output directory {self.out}: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _in_use(self.out, running_pid(self.out) or 0) from None
        self.fd = fd
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError:
            pass  # a full disk: the lock holds without the pid, and prepare_out says what is wrong
        return self

    def __exit__(self, *exc) -> None:
        (self.out / LOCK).unlink(missing_ok=True)  # while still holding it: no one else removes a live lock
        os.close(self.fd)


def prepare_out(out: Path, in_place: bool = False) -> None:
    """Clear what an earlier run left in ``out`` (called with the lock held). ``in_place`` (resuming the
    run in ``out``): its checkpoints and records stay, and its summary.json, steps.jsonl and model.pt
    until the resumed run replaces them; only what would no longer match goes."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        remove_temporaries(temp_folders(out))  # of writers killed mid-write: nothing else writes here now
        dirs, files = (("logs",), ("trace.json",)) if in_place else (OUTPUT_DIRS, OUTPUT_FILES)
        for d in dirs:
            shutil.rmtree(out / d, ignore_errors=True)
        for f in files:
            (out / f).unlink(missing_ok=True)
        if (out / FOLDER).is_dir() and not any((out / FOLDER).iterdir()):
            (out / FOLDER).rmdir()
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"cannot write to output directory {out}: {e.strerror}") from None


def temp_folders(out: Path) -> list[Path]:
    """Where a run's processes write files through a ``.tmpPID`` and a rename."""
    return [out, out / FOLDER, out / "servers", out / "ranks" / EARLIER, out / "servers" / EARLIER]
