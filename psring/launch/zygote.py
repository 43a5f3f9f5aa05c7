"""The zygote: one process that imports torch and psring's worker and server code once, then forks each
``python -m psring worker|server|bench-worker`` the launcher starts, instead of every child paying the import itself.

``import torch`` costs 1.3-2 s of CPU. A run of N workers and S servers on an emulated cluster paid it N + S times,
all at once on the machine's cores (16 processes: 11 s of start-up on 2 cores, before a single step); forked from the
zygote, a child starts in tens of milliseconds. The zygote only imports (no tensor op, no CUDA, no ZeroMQ context, no
thread pool), so a fork of it is as safe as a DataLoader's worker; each child then sets up its own session,
namespace, log, environment and threads as ``subprocess.Popen`` of ``children.py`` did.

Protocol (``forked.Zygote`` is the launcher's end), over a Unix socket pair (the zygote's end is the fd its one
argument names): a request is one JSON packet ``{"args", "env", "cwd", "netns"}`` carrying the child's log file and,
where its stdout is the launcher's, the launcher's stdout (``SCM_RIGHTS``); the zygote answers ``{"pid"}`` for each
fork and ``{"exit": pid, "rc"}`` when a child ends (``rc`` as ``Popen.returncode``: the exit code, or minus the
signal). The zygote ends when the launcher's end closes (the launcher gone); its children, each with
``PR_SET_PDEATHSIG``, go with it. ``--listen PATH`` (``serve_shared``) starts one that many launchers share.
"""
from __future__ import annotations

import ctypes
import gc
import json
import os
import select
import signal
import socket
import sys

PRELOAD = ("setproctitle", "torch", "torch.distributed", "zmq", "psring.cli", "psring.train.trainer",
           "psring.sync.ps.server_main", "psring.sync.ps.synchronizer", "psring.sync.ring", "psring.sync.allreduce",
           "psring.sync.hierarchical", "psring.sync.ddp", "psring.bench.worker")
CLONE_NEWNET, CLONE_NEWNS = 0x40000000, 0x00020000
MS_SLAVE, MS_REC, MNT_DETACH = 1 << 19, 1 << 14, 2
PR_SET_PDEATHSIG = 1
REAP_EVERY_S = 0.05
MAX_REQUEST_BYTES = 1 << 20  # a request: the child's command line and environment
# Modules the child's environment asks the zygote to import before forking it. ``launcher.start_workers`` asks for
# torch._dynamo for workers that build a torch.optim optimizer: its __init__ is wrapped in torch._compile's
# _disable_dynamo, which imports torch._dynamo at a process's first optimizer (1.3 s of CPU alone, 85% of a short
# run's worker CPU on 2 shared cores, py-spy; it starts no thread). PS workers build none: their runs would pay it
# for nothing.
PRELOAD_ENV = "PSRING_PRELOAD"
# The data sets a worker's environment asks the zygote to build before forking it (JSON: ``{"run": a token of the
# launch, "sets": [datasets.build_dataset's keyword arguments, ...]}``; ``datasets.prebuild``):
# ``launcher.start_workers`` asks for the run's training set (and its test set where the run evaluates), so that the
# run's N workers share one instead of each generating or reading its own (synthetic's 10,000 images: 0.5 s of CPU
# each, N of them at once); the next run's workers get sets built for them
PRELOAD_DATA_ENV = "PSRING_PRELOAD_DATA"
RANK_TITLE = " (rank {})"  # after a forked worker's command line (``chaos.role_of`` reads it back)
STARTED_IN = os.getcwd()  # the zygote's working directory, where ``python -m`` pointed sys.path[0]


def _libc():
    return ctypes.CDLL("libc.so.6", use_errno=True)


def enter_netns(name: str) -> None:
    """What ``ip netns exec NAME`` does before it runs a command (iproute2's ``netns_switch``): join the network
    namespace, then in a mount namespace of one's own, mount a /sys that shows its interfaces (``metrics.wire``
    reads a link's counters there)."""
    libc = _libc()
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        _check(libc.setns(fd, CLONE_NEWNET), f"setns into network namespace {name}")
    finally:
        os.close(fd)
    _check(libc.unshare(CLONE_NEWNS), "unshare the mount namespace")
    _check(libc.mount(b"", b"/", b"none", MS_SLAVE | MS_REC, None), "make / a slave mount")
    libc.umount2(b"/sys", MNT_DETACH)  # (none mounted: fine, as for ip)
    _check(libc.mount(name.encode(), b"/sys", b"sysfs", 0, None), "mount the namespace's /sys")


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _redirect(log: int, terminal: int | None) -> None:
    """stdin from /dev/null, stderr to ``log``, stdout to the launcher's stdout (``terminal``) or ``log``: the
    descriptors the launcher sent; both streams line-buffered, as ``PYTHONUNBUFFERED`` left them in a fresh child."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(terminal if terminal is not None else log, 1)
    os.dup2(log, 2)
    for fd in {log, terminal} - {None, 0, 1, 2}:
        os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115 - the process's
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115 - own streams


def _child(req: dict, fds: list[int], sock: socket.socket) -> None:
    """In the forked child: become what ``Popen(argv, env=..., start_new_session=True)`` started; never returns."""
    rc = 1
    try:
        os.setsid()
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as a fresh interpreter has them
        for sig in (signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        sock.close()
        _redirect(fds[0], fds[1] if len(fds) > 1 else None)  # first: what fails below is in the child's log
        if req.get("netns"):
            enter_netns(req["netns"])
        os.chdir(req["cwd"])
        _title(req)  # (before the environment changes: setproctitle finds argv's memory beside the environment's)
        os.environ.clear()
        os.environ.update(req["env"])
        if sys.path and sys.path[0] == STARTED_IN:  # ``-m``'s first entry: the working directory, the child's own
            sys.path[0] = req["cwd"]
        extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
        sys.path[:0] = extra
        sys.argv = ["psring", *req["args"]]
        from psring.cli import main

        rc = main(req["args"])
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - as an interpreter would: the traceback in the log, exit code 1
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(rc if isinstance(rc, int) else 1)


def _title(req: dict) -> None:
    """The command line ``ps`` and ``/proc/PID/cmdline`` show: the one the child would have been started with, and
    a worker's rank (its environment is the zygote's there, not the ``RANK`` it was given)."""
    from setproctitle import setproctitle

    rank = RANK_TITLE.format(req["env"]["RANK"]) if req["args"][0] == "worker" and "RANK" in req["env"] else ""
    setproctitle(" ".join([sys.executable, "-m", "psring", *req["args"]]) + rank)


def _reap(children: set[int], sock: socket.socket | None) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        if sock is not None:
            _reply(sock, {"exit": pid, "rc": os.waitstatus_to_exitcode(status)})


def _reply(sock: socket.socket, msg: dict) -> None:
    sock.send(json.dumps(msg).encode())


def _preload(names: str) -> None:
    """Import what a request asks for before its fork (``PRELOAD_ENV``, comma-separated; at most once each), so
    that its child and the next inherit it; a module that fails to import is left to the child. Only in a torch
    built without CUDA or ROCm: an import there cannot initialise a GPU context no fork could use."""
    import importlib

    import torch

    if torch.version.cuda or getattr(torch.version, "hip", None):
        return
    fresh = [n for n in names.split(",") if n and n not in sys.modules]
    for name in fresh:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112 - the child imports it itself and reports what fails
            continue
    if fresh:
        gc.freeze()


def _prebuild(req: dict) -> None:
    """Build the data sets a request asks for (``PRELOAD_DATA_ENV``) before its fork, once for all the requests of
    its launch; numpy only, so in any torch build. What fails is left to the child. (The zygote's environment is
    left as it is: a child's title, ``setproctitle``, takes the room of the environment the zygote started with.)"""
    specs = req["env"].get(PRELOAD_DATA_ENV, "")
    if not specs:
        return
    from psring.train import datasets

    try:
        asked = json.loads(specs)
        datasets.prebuild(asked["sets"], asked["run"])
    except (ValueError, TypeError, KeyError):  # (not what the launcher writes: the child does without)
        return
    gc.freeze()


def _import_all() -> str | None:
    """Import ``PRELOAD`` and freeze it; the error, in one line, if the zygote cannot serve."""
    import importlib

    try:
        for name in PRELOAD:
            importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - the launcher starts its children afresh instead
        return f"{type(e).__name__}: {e}"
    import torch

    if torch.cuda.is_initialized():  # a fork of a process with a CUDA context cannot use CUDA: start afresh
        return "CUDA was initialised while importing; workers start afresh"
    gc.freeze()  # the imports' objects: no child's collection traverses them, so none copies their pages
    return None


def serve(fd: int) -> int:
    """Import, say so, then fork a child per request until the launcher's end of the socket closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher stops the children; the zygote ends at EOF
    sock = socket.socket(fileno=fd)
    error = _import_all()
    if error:
        _reply(sock, {"error": error})
        return 1
    _reply(sock, {"ready": os.getpid()})
    return _serve_requests(sock)


def _serve_requests(sock: socket.socket) -> int:
    children: set[int] = set()
    while True:
        if select.select([sock], [], [], REAP_EVERY_S)[0]:
            msg, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST_BYTES, 2)
            if not msg:
                return 0
            req = json.loads(msg)
            _preload(req["env"].get(PRELOAD_ENV, ""))
            _prebuild(req)
            pid = os.fork()
            if pid == 0:
                _child(req, fds, sock)
            for f in fds:
                os.close(f)
            children.add(pid)
            _reply(sock, {"pid": pid})
        _reap(children, sock)


def serve_shared(path: str) -> int:
    """The zygote many launchers share (``forked.SHARED_ENV``): bind the Unix socket ``path`` (first, so that a
    launcher can connect while it imports), import once (torch._dynamo too, in a build without a GPU), then fork, for
    each launcher that connects, a zygote of its own that serves it as ``serve`` does and ends with its connection.
    Ends on SIGTERM, or when the process that started it ends, removing ``path``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    _libc().prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        listener.bind(path)
    except OSError as e:
        print(f"psring zygote: cannot listen on {path}: {e.strerror}", file=sys.stderr)
        return 2
    zygotes: set[int] = set()
    try:
        listener.listen(64)
        error = _import_all()
        if error:
            print(f"psring zygote: {error}", file=sys.stderr)
            return 1
        _preload("torch._dynamo")
        while os.getppid() != 1:  # (its starter gone before the death signal was set)
            if select.select([listener], [], [], 1.0)[0]:
                conn, _ = listener.accept()
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # (until the fork has its own handler)
                pid = os.fork()
                if pid == 0:
                    _zygote_of_one(conn, listener)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
                conn.close()
                zygotes.add(pid)
            _reap(zygotes, None)
        return 0
    finally:
        listener.close()
        os.unlink(path)


def _zygote_of_one(conn: socket.socket, listener: socket.socket) -> None:
    """In a fork of the shared zygote: the zygote of the one launcher at ``conn``; never returns."""
    rc = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the shared zygote gone: this one and its children too
        listener.close()
        _reply(conn, {"ready": os.getpid()})
        rc = _serve_requests(conn)
    finally:
        os._exit(rc)


if __name__ == "__main__":
    raise SystemExit(serve_shared(sys.argv[2]) if sys.argv[1] == "--listen" else serve(int(sys.argv[1])))
