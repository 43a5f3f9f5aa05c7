"""``psring train``: start every PS server and worker of a run on this machine, watch them, clean up.

Workers get torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so the
same worker runs unchanged under torchrun on many hosts. If any process fails, every other one is
stopped and the launcher exits non-zero naming the failed process; Ctrl-C stops everything too.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

from ..config import ConfigError, TrainConfig
from ..metrics.summary import finalize_run
from ..train.checkpoint import CheckpointError, check_compatible, last_step
from ..train.checkpoint import load as load_checkpoint
from .children import Child, Children, describe_exit, last_line
from .placement import Placement

SERVER_START_TIMEOUT_S = 60.0


class LaunchError(RuntimeError):
    """A process of the run failed; the message names it."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare_out(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        for stale in ("ranks", "logs", "servers"):
            shutil.rmtree(out / stale, ignore_errors=True)
        for stale in ("steps.jsonl", "summary.json", "model.pt", "trace.json", "config.json"):
            (out / stale).unlink(missing_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"cannot write to output directory {out}: {e.strerror}") from None


def start_servers(cfg: TrainConfig, out: Path, kids: Children, place: Placement) -> list[str]:
    """Start ``cfg.servers`` PS processes on random ports; return their addresses once all listen."""
    specs = []
    for i in range(cfg.servers):
        pf = out / "servers" / f"server{i}.addr"
        prefix, addr = place.server(i)
        argv = prefix + [sys.executable, "-m", "psring", "server", "--workers", str(cfg.workers), "--port", "0",
                         "--bind", addr, "--port-file", str(pf), "--idle-timeout", str(max(cfg.timeout_s * 2, 60)),
                         "--metrics", str(out / "servers" / f"server{i}.jsonl")]
        if cfg.curve:
            argv += ["--curve", cfg.curve]
        specs.append((f"server {i}", argv, pf, out / "logs" / f"server{i}.log"))
    return start_listeners(kids, specs)


def start_listeners(kids: Children, specs: list[tuple[str, list[str], Path, Path]]) -> list[str]:
    """Start processes that bind a random port and write their address to a port file
    (``(name, argv, port_file, log)`` each); return the addresses once all of them listen."""
    procs = []
    for name, argv, pf, log in specs:
        pf.parent.mkdir(parents=True, exist_ok=True)
        pf.unlink(missing_ok=True)
        procs.append(kids.spawn(name, argv, child_env(threads=1), log))
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while not all(pf.exists() for _, _, pf, _ in specs):
        check_alive(procs)
        if time.monotonic() > deadline:
            raise LaunchError(f"{specs[0][0]} and co. did not start within {SERVER_START_TIMEOUT_S:.0f} s; "
                              f"see {specs[0][3].parent}")
        time.sleep(0.05)
    return [pf.read_text().strip() for _, _, pf, _ in specs]


def child_env(threads: int, **extra) -> dict:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), PSRING_LAUNCHER="1", PYTHONUNBUFFERED="1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def start_workers(cfg: TrainConfig, out: Path, kids: Children, place: Placement, echo: bool = True) -> list[Child]:
    port = free_port()
    master = place.worker(0)[1]  # rank 0 hosts torch.distributed's TCP store
    workers = []
    for r in range(cfg.workers):
        env = child_env(cfg.resolved_threads(), RANK=r, WORLD_SIZE=cfg.workers, LOCAL_RANK=r,
                        LOCAL_WORLD_SIZE=cfg.workers, MASTER_ADDR=master, MASTER_PORT=port, **place.worker_env())
        argv = place.worker(r)[0] + [sys.executable, "-m", "psring", "worker", "--config", str(out / "config.json")]
        workers.append(kids.spawn(f"worker {r}", argv, env, out / "logs" / f"worker{r}.log",
                                  stdout_to_terminal=echo and r == 0))
    return workers


def check_alive(children: list[Child]) -> None:
    """Raise for a failed child. When several have failed by the time we look, name one killed by a
    signal first: its peers then fail with errors of their own (e.g. gloo's "connection reset"), which
    are the consequence, not the cause."""
    failed = [c for c in children if c.returncode not in (None, 0)]
    if failed:
        c = min(failed, key=lambda c: c.returncode >= 0)  # negative returncode: killed by a signal
        detail = last_line(c.log)
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


def _raise_interrupt(signum, _frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def launch(cfg: TrainConfig, echo: bool = True) -> dict:
    """Run a whole training job; returns its summary. Raises ``LaunchError`` naming a failed process.
    ``echo``: show rank 0's progress lines on this terminal (else they go to its log only)."""
    cfg.validate()
    out = Path(cfg.out)
    if cfg.resume:
        check_resume(cfg)
    prepare_out(out)
    resolve_compute(cfg, echo)
    kids = Children()
    old = signal.signal(signal.SIGTERM, _raise_interrupt)
    place = None
    try:
        place = Placement(cfg)
        if echo and place.net is not None:
            print(f"psring: network: {place.describe()}", flush=True)
        servers = []
        if cfg.sync == "ps":
            cfg.ps_addrs = start_servers(cfg, out, kids, place)
            servers = kids.children[:]
        cfg.save(out / "config.json")
        workers = start_workers(cfg, out, kids, place, echo)
        # stall: a step may legitimately take long (slow links, big models); the network timeout bounds it
        try:
            watch(workers, servers, progress=out / "ranks", stall_s=cfg.timeout_s + 30)
        except LaunchError as e:
            step = last_step(out) if cfg.checkpoint_every else None
            if step is None:
                raise
            raise LaunchError(f"{e}; last checkpoint after step {step}: continue with --resume {out}") from None
        deadline = time.monotonic() + 10.0  # servers exit on their own once every worker said done
        while any(s.returncode is None for s in servers) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        kids.stop_all()
        if place is not None:
            place.close()  # after the processes inside it are gone
        signal.signal(signal.SIGTERM, old)
    return finalize_run(out, cfg.to_dict())


def check_resume(cfg: TrainConfig) -> None:
    """A missing, unreadable or incompatible checkpoint is a one-line error before anything starts."""
    try:
        check_compatible(load_checkpoint(cfg.resume), cfg.to_dict(), cfg.resume)
    except CheckpointError as e:
        raise ConfigError(str(e)) from None


def resolve_compute(cfg: TrainConfig, echo: bool) -> None:
    """``--compute emulated`` without MS: measure one worker's forward+backward once, with every core, so
    every emulated worker waits as long as a single real one computes (recorded in config.json)."""
    if cfg.compute != "emulated":
        return
    from ..train.emulation import measure_compute_ms

    ms = measure_compute_ms(cfg.model, cfg.batch_size, os.cpu_count() or 1, cfg.seed)
    cfg.compute = f"emulated:{ms:.1f}"
    if echo:
        print(f"psring: compute emulated: {ms:.1f} ms per step (measured: {cfg.model}, batch {cfg.batch_size})",
              flush=True)
