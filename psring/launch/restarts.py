"""Restarting a failed run from its last checkpoint (``--max-restarts K``, torchrun's name and meaning),
and keeping its records whole across restarts.

A restart resumes from the checkpoint after step T: the steps after T that the failed attempt had run
are run again. Its processes open their record files afresh, so before it starts the records of steps
<= T are set aside in ``ranks/earlier/`` and ``servers/earlier/`` and the later ones dropped; when the
run ends, the set-aside records are put back in front of the new ones. ``steps.jsonl`` then holds every
step once per worker, as if the run had never failed. A resume of the run in its own folder
(``--resume DIR`` with ``--out DIR``) keeps its records the same way.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..fileio import write_atomic
from ..metrics.jsonl import read_jsonl
from ..train.checkpoint import saved

EARLIER = "earlier"
RECORDS = {"ranks": "rank*.jsonl", "servers": "server*.jsonl"}  # folder: record files (one per process)


def _lines(records: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def _by_step(records: list[dict]) -> list[dict]:
    """One record per step, the last written winning (a step run again replaces the earlier one)."""
    latest = {r.get("step"): r for r in records}
    return [latest[s] for s in sorted(latest, key=lambda s: (s is None, s or 0))]


def _history(f: Path) -> list[dict]:
    """A record file's set-aside records followed by its current ones."""
    earlier = f.parent / EARLIER / f.name
    return (read_jsonl(earlier) if earlier.exists() else []) + (read_jsonl(f) if f.exists() else [])


def _record_files(out: Path):
    for sub, pattern in RECORDS.items():
        names = {f.name for f in (out / sub).glob(pattern)} | {f.name for f in (out / sub / EARLIER).glob(pattern)}
        yield sub, [out / sub / n for n in sorted(names)]


def keep_upto(out: Path, step: int) -> int:
    """Set aside every record of a step <= ``step`` and drop the later ones; return how many later steps
    had been run (by any worker): the steps a resume from ``step`` runs again."""
    later: set[int] = set()
    for sub, files in _record_files(out):
        for f in files:
            records = _history(f)
            if sub == "ranks":
                later |= {r["step"] for r in records if r.get("step", -1) > step}
            (f.parent / EARLIER).mkdir(exist_ok=True)
            write_atomic(f.parent / EARLIER / f.name, _lines(_by_step([r for r in records if r.get("step", -1) <= step])))
            f.unlink(missing_ok=True)
    return len(later)


def put_back(out: Path) -> None:
    """At the end of a run: every record file gets its set-aside records back in front of its own."""
    for sub, files in _record_files(out):
        for f in files:
            if (f.parent / EARLIER / f.name).exists():
                write_atomic(f, _lines(_by_step(_history(f))))
        shutil.rmtree(out / sub / EARLIER, ignore_errors=True)


def last_logged(out: Path, rank: int) -> int:
    """The last step worker ``rank`` logged in ``out`` (set-aside records included), -1 if none."""
    return max((r.get("step", -1) for r in _history(out / "ranks" / f"rank{rank}.jsonl")), default=-1)


def restart_point(out: Path, workers: int, base: int, asked: tuple[int, Path] | None) -> tuple[int, Path] | None:
    """The checkpoint to restart from: the newest one whose step every worker has logged (rank 0 writes
    it as soon as its own step is done; a worker killed just then has not logged that step and never
    will, so the one before is used). ``base``: the step this run resumed from (-1: from scratch);
    ``asked``: that checkpoint (``--resume`` elsewhere), the last resort."""
    logged = min((max(base, last_logged(out, r)) for r in range(workers)), default=base)
    candidates = saved(out) + ([asked] if asked else [])
    return next(((s, p) for s, p in candidates if s <= logged), None)


def set_aside_logs(out: Path, restart: int) -> None:
    """The failed attempt's logs go to ``logs/restartK/`` (the next attempt writes its own)."""
    logs = out / "logs"
    dest = logs / f"restart{restart}"
    dest.mkdir(parents=True, exist_ok=True)
    for f in logs.glob("*.log"):
        f.rename(dest / f.name)


def record_in_summary(out: Path, fields: dict) -> dict:
    """Add ``fields`` to the run's summary.json (written by ``metrics.summary.finalize_run``)."""
    summary = json.loads((out / "summary.json").read_text())
    summary.update(fields)
    write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary
