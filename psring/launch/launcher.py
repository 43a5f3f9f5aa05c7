"""``psring train``: start every PS server and worker of a run on this machine, watch them, clean up.

Workers get torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
MASTER_ADDR, MASTER_PORT; the local ones per host of ``--workers-per-host``), so the
same worker runs unchanged under torchrun on many hosts. If any process fails, every other one is
stopped and the launcher exits non-zero naming the failed process (or, with ``max_restarts`` and a
checkpoint, starts them all again from it); Ctrl-C stops everything too. Before anything starts, the
output folder (``outdir``) and the machine's memory (``resources``) are checked.
"""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import sys
import time
from pathlib import Path

from ..config import ConfigError, TrainConfig
from ..fileio import CAUSES, WriteError, describe, remove_temporaries
from ..metrics.summary import finalize_run, saturated, warmup_of
from ..strategies import uses_servers
from ..train.checkpoint import CheckpointError, check_compatible, last_step, path_of
from ..train.checkpoint import load as load_checkpoint
from ..train.datasets import GENERATED
from .children import Child, Children, raise_interrupt
from .link_sampler import LinkSampler
from .outdir import RunLock, check_out, prepare_out, resumes_in_place, temp_folders
from .placement import Placement
from .resources import check_train, plural
from .restarts import keep_upto, put_back, record_in_summary, restart_point, set_aside_logs
from .watch import LaunchError, check_alive, watch
from .zygote import PRELOAD_DATA_ENV, PRELOAD_ENV

__all__ = ["LaunchError", "check_alive", "child_env", "free_port", "launch", "start_listeners"]

SERVER_START_TIMEOUT_S = 60.0


def ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """The lowest port the kernel hands out to outgoing connections (32768 where it cannot be read)."""
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port for torch.distributed's TCP store, free now and below the kernel's ephemeral range: bind(0) picks
    one inside it, which any outgoing connection (gloo opens dozens a run) may take before rank 0 listens on it,
    and concurrent runs on one host then fail with EADDRINUSE."""
    low = ephemeral_low()
    for _ in range(64):
        port = random.randrange(max(1024, low - 12000), max(1025, low))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    # a worker that builds a torch.optim optimizer (every strategy without servers) imports torch._dynamo there:
    # the zygote imports it once, before it forks them (zygote.PRELOAD_ENV)
    preload = {} if uses_servers(cfg.sync) else {PRELOAD_ENV: "torch._dynamo"}
    preload[PRELOAD_DATA_ENV] = json.dumps({"run": f"{out}@{time.time_ns()}", "sets": worker_datasets(cfg)})
    workers = []
    for r in range(cfg.workers):
        env = child_env(cfg.resolved_threads(), RANK=r, WORLD_SIZE=cfg.workers, MASTER_ADDR=master,
                        MASTER_PORT=port, **place.worker_env(r), **preload)
        argv = place.worker(r)[0] + [sys.executable, "-m", "psring", "worker", "--config", str(out / "config.json")]
        workers.append(kids.spawn(f"worker {r}", argv, env, out / "logs" / f"worker{r}.log",
                                  stdout_to_terminal=echo and r == 0))
    return workers


def worker_datasets(cfg: TrainConfig) -> list[dict]:
    """The data sets every worker builds (``trainer.worker_batches``; the test set where it evaluates), as
    ``datasets.build_dataset``'s keyword arguments: what the zygote builds once for all of them. Only the sets made
    from their arguments alone (``datasets.GENERATED``): a folder, a file or CIFAR-10 is found by the worker's own
    working directory and environment, which the zygote's are not."""
    if cfg.dataset not in GENERATED:
        return []
    common = {"name": cfg.dataset, "seed": cfg.seed, "data_dir": cfg.data_dir, "image_size": cfg.input_size}
    return [{**common, "num_samples": cfg.num_samples, "split": "train"}] + \
        ([{**common, "num_samples": None, "split": "test"}] if cfg.eval else [])


def launch(cfg: TrainConfig, echo: bool = True, *, overwrite: bool = False, force: bool = False,
           max_restarts: int = 0) -> dict:
    """Run a whole training job; returns its summary. Raises ``LaunchError`` naming a failed process, and
    ``ConfigError`` (nothing touched, nothing started) for bad input, an output folder holding a run that
    must not be replaced, or a run this machine cannot hold.
    ``echo``: show rank 0's progress lines on this terminal (else they go to its log only).
    ``overwrite``: replace a finished or unfinished run in ``cfg.out`` (never a running one).
    ``force``: start even what the resource check refuses.
    ``max_restarts``: after a failure, restart from the last checkpoint up to this many times."""
    cfg.validate()
    if max_restarts < 0:
        raise ConfigError(f"--max-restarts must be >= 0, got {max_restarts}")
    if max_restarts and not (cfg.checkpoint_every or cfg.resume):
        raise ConfigError("--max-restarts resumes from the last checkpoint: it needs --checkpoint-every K")
    out = Path(cfg.out)
    in_place = resumes_in_place(out, cfg.resume)
    base = check_resume(cfg) if cfg.resume else -1
    check_out(out, overwrite, in_place)
    check_train(cfg, force, echo)
    old = signal.signal(signal.SIGTERM, raise_interrupt)  # SIGTERM stops everything, as Ctrl-C does
    try:
        with RunLock(out):
            prepare_out(out, in_place)
            if in_place:
                keep_upto(out, base)  # the records up to the checkpoint stay; the resumed run redoes the rest
            resolve_compute(cfg, echo)
            if echo and cfg.epochs:  # validate() made them steps; every worker reads those in config.json
                from ..config_checks import epochs_line

                print(epochs_line(cfg), flush=True)
            # a restart may fall back to the checkpoint resumed from (elsewhere: in place, it is one of out's)
            asked = (base, path_of(cfg.resume)) if cfg.resume and not in_place else None
            return run_with_restarts(cfg, out, echo, max_restarts, base, asked)
    except WriteError as e:  # the launcher's own files (config.json, steps.jsonl, summary.json, ...)
        raise LaunchError(str(e)) from None
    except OSError as e:
        if e.errno not in CAUSES:
            raise
        raise LaunchError(describe(e)) from None
    finally:
        signal.signal(signal.SIGTERM, old)


def run_with_restarts(cfg: TrainConfig, out: Path, echo: bool, max_restarts: int, base: int,
                      asked: tuple[int, Path] | None) -> dict:
    """Run, and after a failure resume from the newest usable checkpoint, up to ``max_restarts`` times."""
    resume, restarts, recomputed = cfg.resume, 0, 0
    try:
        while True:
            try:
                links_check = run_once(cfg, out, echo)
                break
            except LaunchError as e:
                point = restart_point(out, cfg.workers, base, asked) if restarts < max_restarts else None
                if point is None:
                    raise LaunchError(failure(e, out, cfg, restarts)) from None
                restarts += 1
                n = keep_upto(out, point[0])
                recomputed += n
                set_aside_logs(out, restarts)
                print(f"psring: restart {restarts}/{max_restarts} from the checkpoint after step {point[0]} "
                      f"({plural(n, 'step')} to run again): {e}", file=sys.stderr, flush=True)
                cfg.resume = str(point[1])
    finally:
        cfg.resume = resume  # config.json says what was asked; summary.json counts the restarts
    put_back(out)
    cfg.save(out / "config.json")
    summary = finalize_run(out, cfg.to_dict())
    fields = {"restarts": restarts, "steps_recomputed": recomputed, **links_check}
    fields["cpu_saturated"] = saturated({**summary, **fields})  # with the CPU while communicating
    return record_in_summary(out, fields)


def failure(e: LaunchError, out: Path, cfg: TrainConfig, restarts: int) -> str:
    """The one line of a run that failed for good: what failed, and where it can continue from."""
    gave_up = f" (after {plural(restarts, 'restart')})" if restarts else ""
    step = last_step(out) if cfg.checkpoint_every else None
    if step is None:
        return f"{e}{gave_up}"
    return f"{e}{gave_up}; last checkpoint after step {step}: continue with --resume {out}"


def run_once(cfg: TrainConfig, out: Path, echo: bool) -> dict:
    """One attempt: start the servers and workers, watch them until the workers are done, stop all;
    returns the link sampler's check (``LinkSampler.stop``; {} without one) and, on emulated hosts, their TCP
    congestion control (``link_cc``)."""
    kids = Children()
    place = None
    try:
        place = Placement(cfg)
        if echo and place.net is not None:
            print(f"psring: network: {place.describe()}", flush=True)
        sampler = LinkSampler(place.net, out, cfg.link_sample_ms, kids, child_env(threads=1),
                              warmup_of(cfg.to_dict()))
        servers = []
        if uses_servers(cfg.sync):
            cfg.ps_addrs = start_servers(cfg, out, kids, place)
            servers = kids.children[:]
        cfg.save(out / "config.json")
        workers = start_workers(cfg, out, kids, place, echo)
        # stall: a step may legitimately take long (slow links, big models); the network timeout bounds it
        watch(workers, servers, progress=out / "ranks", stall_s=cfg.timeout_s + 30)
        deadline = time.monotonic() + 10.0  # servers exit on their own once every worker said done
        while any(s.returncode is None for s in servers) and time.monotonic() < deadline:
            time.sleep(0.05)
        # while the namespaces, and so their counters, are still there
        return {**sampler.stop(), **({"link_cc": place.net.cc} if place.net is not None else {})}
    finally:
        kids.stop_all()
        remove_temporaries(temp_folders(out), {c.proc.pid for c in kids.children})  # theirs, killed mid-write
        if place is not None:
            place.close()  # after the processes inside it are gone


def check_resume(cfg: TrainConfig) -> int:
    """A missing, unreadable or incompatible checkpoint is a one-line error before anything starts;
    returns the checkpoint's step."""
    try:
        ckpt = load_checkpoint(cfg.resume)
        check_compatible(ckpt, cfg.to_dict(), cfg.resume)
    except CheckpointError as e:
        raise ConfigError(str(e)) from None
    return int(ckpt["step"])


def resolve_compute(cfg: TrainConfig, echo: bool) -> None:
    """``--compute emulated`` without MS: measure one worker's forward+backward once, with every core, so
    every emulated worker waits as long as a single real one computes (recorded in config.json)."""
    if cfg.compute != "emulated":
        return
    from ..train.emulation import measure_compute_ms

    ms = measure_compute_ms(cfg, os.cpu_count() or 1)
    cfg.compute = f"emulated:{ms:.1f}"
    if echo:
        print(f"psring: compute emulated: {ms:.1f} ms per step (measured: {cfg.model}, batch {cfg.batch_size}, "
              f"{cfg.input_size}x{cfg.input_size})", flush=True)
