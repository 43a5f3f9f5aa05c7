"""The ``psring`` command. Sub-commands: train, worker, server, compare, sweep (here), bench
(``bench/cli.py``), simulate (``simulate/cli.py``), and calibrate, plot, net cleanup (``tools.py``).

Errors a user can fix (bad flags, unwritable output, a failed process) end with one line on stderr and a
non-zero exit (2 for bad input, 1 for a failed run, 130 for Ctrl-C); details stay in the run's logs/.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .bench.cli import add_bench_parser
from . import strategies
from .config import ConfigError, TrainConfig, section_titles
from .options import OneLineParser, add_arguments, from_namespace


def add_train_args(p: argparse.ArgumentParser, command: str = "train") -> None:
    """The flags of every TrainConfig option ``command`` offers, by section (declared in ``config.py``)."""
    add_arguments(p, TrainConfig, section_titles(), command)


def add_launch_args(p: argparse.ArgumentParser) -> None:
    """How ``psring train`` treats its output folder, the machine, and failures (not part of the run's
    config.json: they do not change what a run computes)."""
    p.set_defaults(out=None)  # a new folder for every run: see cmd_train
    p.add_argument("--overwrite", action="store_true",
                   help="replace the finished or unfinished run in --out (default: refuse, exit 2)")
    p.add_argument("--force", action="store_true",
                   help="start even if the measured memory footprint says this machine cannot hold the run")
    p.add_argument("--max-restarts", type=int, default=0,
                   help="after a worker or server fails, stop all and resume from the last checkpoint, up to "
                        "K times (torchrun's flag; needs --checkpoint-every)")


def config_from_args(a: argparse.Namespace) -> TrainConfig:
    return from_namespace(TrainConfig, a).validate()


def cmd_train(a) -> int:
    from .launch.launcher import launch
    from .launch.outdir import default_out, run_folder_of

    if a.out is None:  # continue the run resumed from in its own folder; else a folder of its own
        a.out = (run_folder_of(a.resume) if a.resume else None) or default_out(a.sync, a.workers)
        print(f"psring: output: {a.out}", flush=True)
    s = launch(config_from_args(a), overwrite=a.overwrite, force=a.force, max_restarts=a.max_restarts)
    def fmt(x, spec):  # None: not measured, or not a finite number (a diverged loss)
        return "n/a" if x is None else format(x, spec)

    print(f"done: {s['steps_completed']} steps, {fmt(s.get('samples_per_s'), '.1f')} samples/s, "
          f"loss {fmt(s.get('first_loss'), '.4f')} -> {fmt(s.get('final_loss'), '.4f')}; results in {a.out}")
    return 0


def cmd_worker(a) -> int:
    from .train.trainer import main_worker

    if a.config:
        cfg = TrainConfig.load(a.config).validate()
    else:
        cfg = config_from_args(a)
        if strategies.uses_servers(cfg.sync) and not cfg.ps_addrs and cfg.ps_placement != "colocated":
            raise ConfigError(f"--sync {cfg.sync} under torchrun needs --ps-addrs tcp://HOST:PORT,... of "
                              f"running servers, or --ps-placement colocated (each node starts its own)")
        if os.environ.get("RANK", "0") == "0":
            Path(cfg.out).mkdir(parents=True, exist_ok=True)
            cfg.save(Path(cfg.out) / "config.json")
    from .allocator import keep_freed_memory
    from .sync.process_group import exit_without_teardown

    keep_freed_memory()
    exit_without_teardown(main_worker(cfg))


def cmd_bench_worker(a) -> int:
    from .bench.worker import main as bench_worker

    bench_worker(["--spec", a.spec])  # (leaves the process itself)
    return 1


def cmd_server(a) -> int:
    from .sync.ps.server_main import run_server

    if a.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {a.workers}")
    if not 0 <= a.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535, got {a.port}")
    if not a.max_message_mb > 0:
        raise ConfigError(f"--max-message-mb must be > 0, got {a.max_message_mb}")
    import zmq

    if a.curve:
        from .auth import AuthError, check_dir

        try:
            check_dir(a.curve, "server")
        except AuthError as e:
            raise ConfigError(str(e)) from None
    try:
        return run_server(a.workers, a.bind, a.port, a.port_file, a.idle_timeout, a.threads, a.metrics,
                          a.frame_kb * 1024 if a.frame_kb > 0 else None, curve=a.curve,
                          max_message_bytes=int(a.max_message_mb * 2**20))
    except zmq.ZMQError as e:  # binding: port in use, address not on this host, ...
        raise ConfigError(f"psring server on tcp://{a.bind}:{a.port}: {e}") from None


def cmd_compare(a) -> int:
    from .compare import run_compare

    return run_compare(a.out, steps=a.steps, net=a.net)


def cmd_sweep(a) -> int:
    from .sweep import run_sweep

    df = run_sweep(a.file, a.out, echo=a.verbose, only=a.only, rerun=a.rerun, listing=a.list)
    if df is None:  # --list
        return 0
    failed = df[df["status"] == "failed"]
    for r in failed.to_dict("records"):
        print(f"psring: run {r['run_id']} failed: {r['error']}", file=sys.stderr)
    return 1 if len(failed) else 0


INTERNAL = ("bench-worker",)  # commands psring starts itself (``psring bench``'s workers); not in --help


def add_sweep_parser(sub) -> None:
    sw = sub.add_parser("sweep", help="run every configuration of a sweep file; writes OUT/runs.csv")
    sw.add_argument("file", help="a sweep file, e.g. experiments/scaling.toml")
    sw.add_argument("--out", help="output directory (default results/NAME)")
    sw.add_argument("--verbose", "-v", action="store_true", help="show each run's progress lines")
    sw.add_argument("--only", action="append", metavar="KEY=VALUE",
                    help="run only the runs whose setting KEY is VALUE (repeatable: values of one key are "
                         "alternatives, keys must all match); runs.csv still lists the others")
    sw.add_argument("--rerun", action="store_true",
                    help="run the selected runs again even where they finished (each finished run is moved "
                         "to OUT/replaced/ first, never deleted)")
    sw.add_argument("--list", action="store_true",
                    help="print the selected runs and what would be done with each; run nothing")
    sw.set_defaults(func=cmd_sweep)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="psring", description="Parameter server vs ring all-reduce.")
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="run servers and workers of one training job on this machine")
    add_train_args(t)
    add_launch_args(t)
    t.set_defaults(func=cmd_train)

    w = sub.add_parser("worker", help="one worker; rank from torchrun's environment (RANK, WORLD_SIZE, ...)")
    add_train_args(w, "worker")
    w.add_argument("--config", help="a resolved config.json (how `psring train` starts its workers)")
    w.set_defaults(func=cmd_worker)

    b = sub.add_parser("bench-worker", description="one `psring bench` worker (how `psring bench` starts them)")
    b.add_argument("--spec", required=True, help="the group's spec (JSON), as `psring bench` writes it")
    b.set_defaults(func=cmd_bench_worker)

    s = sub.add_parser("server", help="one parameter-server process (one shard)")
    s.add_argument("--workers", "-n", type=int, required=True, help="number of workers N it waits for")
    s.add_argument("--bind", default="127.0.0.1", help="address to listen on (default %(default)s)")
    s.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one (default)")
    s.add_argument("--port-file", help="write the bound address here once listening")
    s.add_argument("--idle-timeout", type=float, default=600.0, help="exit if no request for this long (s)")
    s.add_argument("--threads", type=int, default=1)
    s.add_argument("--metrics", help="write the server's per-step figures here (JSON lines)")
    s.add_argument("--curve", help="CurveZMQ key folder (psring keys DIR): accept only its authorized clients")
    s.add_argument("--max-message-mb", type=float, default=1024.0,
                   help="refuse requests larger than this (default %(default)s MB; a resumed Adam shard is ~3x its size)")
    s.add_argument("--frame-kb", type=int, default=0,
                   help="split replied tensors over frames of at most this many KB (default 0: one frame per "
                        "tensor, which CPU workers use in place without a copy)")
    s.set_defaults(func=cmd_server)

    c = sub.add_parser("compare", help="as root: none, allreduce, ps S=1 and ps S=N at N = 2, 4 on an emulated "
                                       "cluster, each beside its model (else on loopback)")
    c.add_argument("--out", default="runs/compare")
    c.add_argument("--steps", type=int, default=None,
                   help="steps per run (default: the preset's, 10 emulated, 40 on loopback)")
    c.add_argument("--net", choices=("emulated", "loopback"), default=None,
                   help="default: emulated when this process can build network namespaces (root), else loopback")
    c.set_defaults(func=cmd_compare)

    add_sweep_parser(sub)

    add_bench_parser(sub)
    from .simulate.cli import add_simulate_parser

    add_simulate_parser(sub)

    from .tools import add_tool_parsers

    add_tool_parsers(sub)  # calibrate, plot, net cleanup
    # the commands --help lists: not INTERNAL ones (added without a help line, so not in its table either)
    sub.metavar = "{" + ",".join(name for name in sub.choices if name not in INTERNAL) + "}"
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plot"]:  # its own parser: argparse's REMAINDER would swallow nothing before a flag
        from .plot_cli import main as plot_main

        return plot_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as e:
        print(f"psring: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("psring: interrupted; all processes stopped", file=sys.stderr)
        return 130
    except Exception as e:
        from .launch.launcher import LaunchError

        if isinstance(e, LaunchError):
            print(f"psring: error: {e}", file=sys.stderr)
            return 1
        raise
