"""Child processes that cannot outlive their launcher.

Every child gets its own session (so the launcher, not the terminal, decides how it stops) and
``PR_SET_PDEATHSIG=SIGKILL`` (so the kernel kills it if the launcher itself is killed). ``stop_all``
sends SIGTERM to each child's process group, waits, then SIGKILLs what is left. psring's own workers and servers
are forks of the zygote (``forked.py``: torch imported once, not once a child), with the same session, death
signal (the zygote's, which ends with the launcher) and log; ``PSRING_FORK=0`` starts them afresh.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .forked import ForkedProc, fork_child

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:  # in the child between fork and exec (``preexec_fn``)
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    except OSError:
        pass  # not Linux: stop_all and the children's own timeouts still apply


def raise_interrupt(signum, _frame):
    """A SIGTERM handler (``signal.signal(signal.SIGTERM, raise_interrupt)``): stop as Ctrl-C stops, through
    every ``finally`` that stops a child."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


@dataclass
class Child:
    name: str
    proc: subprocess.Popen | ForkedProc
    log: Path

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()


def describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


def last_line(path: Path) -> str:
    """The last non-empty line of a child's log: its one-line error when it failed cleanly."""
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


class Children:
    def __init__(self):
        self.children: list[Child] = []

    def spawn(self, name: str, argv: list[str], env: dict, log: Path, stdout_to_terminal: bool = False) -> Child:
        log.parent.mkdir(parents=True, exist_ok=True)
        proc = fork_child(argv, env, log, stdout_to_terminal)  # psring's workers and servers: torch imported once
        if proc is None:
            with open(log, "w") as f:
                proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                        stdout=None if stdout_to_terminal else f, stderr=f,
                                        start_new_session=True, preexec_fn=die_with_parent)
        child = Child(name, proc, log)
        self.children.append(child)
        return child

    def stop_all(self, grace_s: float = 5.0) -> None:
        alive = [c for c in self.children if c.proc.poll() is None]
        for c in alive:
            _signal_group(c.proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for c in alive:
            try:
                c.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for c in self.children:  # SIGKILL the group even if the leader exited: its own children may not have
            _signal_group(c.proc, signal.SIGKILL)
            try:
                c.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass


def _signal_group(proc: subprocess.Popen | ForkedProc, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
