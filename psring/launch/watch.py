"""Watching a running job's processes: a failure, a stopped process or a stalled run ends the run
with a ``LaunchError`` naming the process (see docs/ARCHITECTURE.md, "Processes")."""
from __future__ import annotations

import time
from pathlib import Path

from ..fileio import disk_full
from .children import Child, describe_exit, last_line


class LaunchError(RuntimeError):
    """A process of the run failed; the message names it."""


def check_alive(children: list[Child]) -> None:
    """Raise for a failed child. When several have failed by the time we look, name one killed by a
    signal first: its peers then fail with errors of their own (e.g. gloo's "connection reset"), which
    are the consequence, not the cause."""
    failed = [c for c in children if c.returncode not in (None, 0)]
    if failed:
        c = min(failed, key=lambda c: c.returncode >= 0)  # negative returncode: killed by a signal
        detail = last_line(c.log)
        if not detail and disk_full(c.log):  # it could not even write its error: say why it is missing
            detail = f"no space left on device writing {c.log.parent.parent} (the log is empty: the disk is full)"
        raise LaunchError(f"{c.name} (pid {c.proc.pid}) failed: {describe_exit(c.returncode)}"
                          + (f": {detail}" if detail else "") + f" (log: {c.log})")


def watch(workers: list[Child], servers: list[Child], poll_s: float = 0.1, progress: Path | None = None,
          stall_s: float | None = None) -> None:
    """Return when every worker exited 0; raise ``LaunchError`` as soon as any process fails, is stopped
    (SIGSTOP: it would hold every other worker at its next synchronization), or, with ``progress`` (the
    run's ranks/ folder) and ``stall_s``, when no worker finished a step for ``stall_s``."""
    stopped_since: dict[int, float] = {}
    stall = StallWatch(workers, progress, stall_s) if progress is not None and stall_s else None
    while True:
        check_alive(workers + servers)
        check_not_stopped(workers + servers, stopped_since)
        if stall is not None:
            stall.check()
        if all(w.returncode == 0 for w in workers):
            return
        for s in servers:
            if s.returncode == 0:  # a server only exits 0 once all workers said done
                pending = [w for w in workers if w.returncode is None]
                if pending and _wait_any_exit(pending, 30.0) is None:
                    raise LaunchError(f"{s.name} exited while {pending[0].name} was still running")
        time.sleep(poll_s)


STOPPED_GRACE_S = 2.0  # a stop this long is not a shell's job control blip


def check_not_stopped(children: list[Child], since: dict[int, float]) -> None:
    now = time.monotonic()
    for c in children:
        if c.returncode is not None or proc_state(c.proc.pid) not in ("T", "t"):
            since.pop(c.proc.pid, None)
            continue
        t0 = since.setdefault(c.proc.pid, now)
        if now - t0 >= STOPPED_GRACE_S:
            raise LaunchError(f"{c.name} (pid {c.proc.pid}) is stopped (SIGSTOP?) and holds up the run "
                              f"(log: {c.log})")


def proc_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (R, S, D, T stopped, Z zombie, ...), '' if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


class StallWatch:
    """Fails the run when no worker has logged a step for ``stall_s``, naming the worker(s) furthest
    behind: with synchronous training the others are waiting for them."""

    def __init__(self, workers: list[Child], ranks: Path, stall_s: float):
        self.workers, self.ranks, self.stall_s = workers, ranks, stall_s
        self.sizes = [-1] * len(workers)
        self.last = time.monotonic()

    def check(self) -> None:
        sizes = [_size(self.ranks / f"rank{r}.jsonl") for r in range(len(self.workers))]
        if sizes != self.sizes:
            self.sizes, self.last = sizes, time.monotonic()
            return
        if time.monotonic() - self.last > self.stall_s:
            steps = [_lines(self.ranks / f"rank{r}.jsonl") for r in range(len(self.workers))]
            behind = [w.name for w, n in zip(self.workers, steps) if n == min(steps)]
            raise LaunchError(f"no progress for {self.stall_s:.0f} s: {', '.join(behind)} at step {min(steps)} "
                              f"(others at up to {max(steps)}); see {self.ranks.parent / 'logs'}")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _lines(path: Path) -> int:
    try:
        return len(path.read_text().splitlines())
    except OSError:
        return 0


def _wait_any_exit(children: list[Child], timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for c in children:
            if c.returncode is not None:
                return c
        time.sleep(0.1)
    return None
