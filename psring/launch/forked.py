"""The launcher's end of the zygote (``zygote.py``): ``fork_child`` starts ``python -m psring
worker|server|bench-worker`` as a fork of a process that imported torch once, and returns what ``subprocess.Popen``
would have for it (``ForkedProc``: ``pid``, ``returncode``, ``poll``, ``wait``, ``send_signal``, ``terminate``,
``kill``).

One zygote per launching process, started at the first such child and kept for the next runs (a sweep, a test
session); it ends with the process. ``PSRING_ZYGOTE=PATH`` makes it a fork of the shared zygote listening there
(``python -m psring.launch.zygote --listen PATH``: one import for many launching processes, e.g. a test suite's
``psring`` commands) instead; where none listens, the process starts its own. ``PSRING_FORK=0`` in the environment
starts every child afresh instead; so does anything the zygote cannot do (its start failed, a command line of
another shape).
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from .zygote import PRELOAD_DATA_ENV, PRELOAD_ENV

READY_TIMEOUT_S = 120.0  # the zygote's imports, on a loaded machine
REPLY_TIMEOUT_S = 30.0  # a fork's pid
FORKED = ("worker", "server", "bench-worker")  # the sub-commands the zygote forks (it imported torch for them)
SHARED_ENV = "PSRING_ZYGOTE"  # the Unix socket of a shared zygote (``zygote.serve_shared``) to fork from
CONNECT_TIMEOUT_S = 5.0


def forkable(argv: list[str]) -> tuple[str | None, list[str]] | None:
    """(network namespace or None, psring's arguments) of ``[ip netns exec NS] python -m psring FORKED ...`` with
    this interpreter; None for any other command line."""
    netns = None
    if len(argv) > 4 and os.path.basename(argv[0]) == "ip" and argv[1:3] == ["netns", "exec"]:
        netns, argv = argv[3], argv[4:]
    if argv[:3] != [sys.executable, "-m", "psring"] or len(argv) < 4 or argv[3] not in FORKED:
        return None
    return netns, argv[3:]


class ForkedProc:
    """The part of ``subprocess.Popen`` the launcher uses, for a child of the zygote (not of this process: its
    exit code comes over the zygote's socket)."""

    def __init__(self, zygote: Zygote, pid: int, args: list[str]):
        self.zygote, self.pid, self.args, self.returncode = zygote, pid, args, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.zygote.collect(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.zygote.collect(left)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Shared:
    """The ``proc`` of a zygote forked by the shared one: not this process's child (its end shows as the socket's)."""

    def __init__(self, pid: int):
        self.pid = pid

    def poll(self) -> None:
        return None

    def kill(self) -> None:
        if self.pid <= 0:  # (not yet known: os.kill(0) would signal this process's own group)
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self, timeout: float | None = None) -> None:
        return None


class Zygote:
    """A zygote process and the launcher's end of its socket (one request or reply per packet): one of its own, or
    the fork the shared zygote at ``shared`` (a Unix socket's path) makes for it."""

    def __init__(self, shared: str | None = None):
        self.gone = False  # the zygote's end closed
        if shared:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self.sock.settimeout(CONNECT_TIMEOUT_S)
            try:
                self.sock.connect(shared)
            except OSError:
                self.sock.close()
                raise
            self.sock.settimeout(None)
            self.proc = _Shared(0)
        else:
            self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                self.proc = subprocess.Popen([sys.executable, "-m", "psring.launch.zygote", str(theirs.fileno())],
                                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
                                             start_new_session=True)
            finally:
                theirs.close()
        self.lock = threading.Lock()
        self.pids: list[int] = []  # forks not yet handed out
        self.procs: dict[int, ForkedProc] = {}
        self.exits: dict[int, int] = {}  # exit codes that came before their pid was handed out
        self.preloads: set[str] = set()  # what requests asked the zygote to import or build before their fork
        with self.lock:
            ready = self._wait_for(lambda m: "ready" in m or "error" in m, READY_TIMEOUT_S)
        self.ready = bool(ready) and "ready" in ready
        if self.ready and shared:
            self.proc.pid = ready["ready"]
        if not self.ready:  # (slow or failed: the launcher starts its children afresh)
            self.proc.kill()

    def alive(self) -> bool:
        return self.ready and not self.gone and self.proc.poll() is None

    def spawn(self, args: list[str], env: dict, log: Path, terminal: bool, netns: str | None) -> ForkedProc:
        req = json.dumps({"args": args, "env": env, "cwd": os.getcwd(), "netns": netns}).encode()
        with open(log, "w") as f, self.lock:
            fds = [f.fileno()] + ([1] if terminal else [])  # Popen(stdout=None): the launcher's fd 1 as it is now
            socket.send_fds(self.sock, [req], fds)
            # the first request to ask for an import or a data set waits for the zygote's import or build too
            preload = env.get(PRELOAD_ENV, "") + env.get(PRELOAD_DATA_ENV, "")
            timeout = READY_TIMEOUT_S if preload and preload not in self.preloads else REPLY_TIMEOUT_S
            self.preloads.add(preload)
            if self._wait_for(lambda _: bool(self.pids), timeout) is None:
                # no fork it could still make behind the launcher's back (a second worker of one rank): the zygote
                # goes, its children with it; the caller starts this child afresh and watches the others fail
                self.ready = False
                self.proc.kill()
                raise OSError(f"the zygote forked no child within {REPLY_TIMEOUT_S:.0f} s")
            proc = ForkedProc(self, self.pids.pop(0), args)
            self.procs[proc.pid] = proc
            proc.returncode = self.exits.pop(proc.pid, None)
            return proc

    def collect(self, timeout: float) -> None:
        with self.lock:
            self._read(timeout)

    def _wait_for(self, done, timeout: float) -> dict | None:
        """The first message ``done`` accepts (``{}``: what arrived before already did), or None at the timeout
        or once the zygote is gone."""
        deadline = time.monotonic() + timeout
        while not done({}):
            for msg in self._read(min(0.1, max(0.0, deadline - time.monotonic()))):
                if done(msg):
                    return msg
            if time.monotonic() >= deadline or self.gone or self.proc.poll() is not None:
                return None
        return {}

    def _read(self, timeout: float) -> list[dict]:
        """The replies that arrived within ``timeout``, applied (pids queued, exit codes set)."""
        msgs = []
        while select.select([self.sock], [], [], timeout)[0]:
            timeout = 0.0
            packet = self.sock.recv(1 << 16)
            if not packet:  # the zygote is gone: its children went with it (PR_SET_PDEATHSIG)
                self.gone = True
                for p in self.procs.values():
                    p.returncode = -signal.SIGKILL if p.returncode is None else p.returncode
                break
            msg = json.loads(packet)
            msgs.append(msg)
            if "pid" in msg:
                self.pids.append(msg["pid"])
            elif "exit" in msg and msg["exit"] in self.procs:
                self.procs.pop(msg["exit"]).returncode = msg["rc"]
            elif "exit" in msg:
                self.exits[msg["exit"]] = msg["rc"]
        return msgs

    def close(self) -> None:
        self.sock.close()  # the zygote's EOF
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_zygote: Zygote | bool | None = None  # False: it could not start
_start_lock = threading.Lock()


def _connect(shared: str | None) -> Zygote | None:
    """The zygote the shared one at ``shared`` forks for this process; None where there is none or it cannot serve."""
    if not shared:
        return None
    try:
        z = Zygote(shared)
    except OSError:
        return None
    if not z.ready:
        z.sock.close()
        return None
    return z


def fork_child(argv: list[str], env: dict, log: Path, terminal: bool) -> ForkedProc | None:
    """``argv`` forked from the zygote, or None where it cannot be (the caller starts it afresh)."""
    global _zygote
    shape = forkable(argv)
    if shape is None or os.environ.get("PSRING_FORK", "1") == "0" or not sys.platform.startswith("linux"):
        return None  # (the zygote's child needs Linux: prctl, setns, SOCK_SEQPACKET)
    with _start_lock:
        if _zygote is None:
            try:
                _zygote = _connect(os.environ.get(SHARED_ENV)) or Zygote()
            except OSError:  # no socket pair, no process: start afresh, now and later
                _zygote = False
                return None
            atexit.register(_zygote.close)
        if not _zygote or not _zygote.alive():
            return None
    netns, args = shape
    try:
        return _zygote.spawn(args, env, log, terminal, netns)
    except (OSError, ValueError):
        return None
