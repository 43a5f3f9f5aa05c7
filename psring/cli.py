"""The ``psring`` command. Sub-commands: train, worker, server, compare, sweep (here), bench
(``bench/cli.py``), and calibrate, plot, net cleanup (``tools.py``).

Errors a user can fix (bad flags, unwritable output, a failed process) end with one line on stderr and a
non-zero exit (2 for bad input, 1 for a failed run, 130 for Ctrl-C); details stay in the run's logs/.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .bench.cli import add_bench_parser
from .config import ConfigError, OptimConfig, TrainConfig


def add_train_args(p: argparse.ArgumentParser) -> None:
    d = TrainConfig()
    p.add_argument("--sync", default=d.sync, help="ps | allreduce | ddp | none (default %(default)s)")
    p.add_argument("--workers", "-n", type=int, default=d.workers, help="number of workers N")
    p.add_argument("--servers", "-s", type=int, default=d.servers, help="PS server processes S (--sync ps)")
    p.add_argument("--model", default=d.model, help="cnn | resnet18 | resnet18_narrow (default %(default)s)")
    p.add_argument("--dataset", default=d.dataset, help="synthetic (default) | cifar10 | digits")
    p.add_argument("--num-samples", type=int, default=d.num_samples,
                   help="training samples (default: the whole set; synthetic generates 10,000)")
    p.add_argument("--data-dir", default=d.data_dir, help="cifar10: folder of the binary files "
                   "(default $PSRING_DATA or ~/.cache/psring)")
    p.add_argument("--partition", default=d.partition, help="uniform | stratified | random (default %(default)s)")
    p.add_argument("--no-eval", action="store_false", dest="eval",
                   help="skip the test-set accuracy at the end of every epoch and of the run")
    p.add_argument("--batch-size", "-b", type=int, default=d.batch_size, help="per-worker batch size B")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--lr", type=float, default=d.optim.lr)
    p.add_argument("--momentum", type=float, default=d.optim.momentum)
    p.add_argument("--weight-decay", type=float, default=d.optim.weight_decay)
    p.add_argument("--optimizer", default=d.optim.name, help="sgd | adam (default %(default)s)")
    p.add_argument("--consistency", default=d.consistency,
                   help="ps: bsp | ssp | asp (default %(default)s); see --staleness")
    p.add_argument("--staleness", type=int, default=d.staleness, help="ps: SSP's bound k (default %(default)s)")
    p.add_argument("--ps-design", default=d.ps_design,
                   help="ps: server-optimizer (servers update) | aggregate (servers sum, workers update)")
    p.add_argument("--straggler", default=d.straggler, help="RANK:FACTOR: slow one worker's compute FACTOR times")
    p.add_argument("--curve", default=d.curve, help="ps: CurveZMQ key folder from `psring keys DIR` (encrypted; "
                   "servers accept only authorized workers)")
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every,
                   help="write an atomic checkpoint (model, optimizer, PS shards) every K steps")
    p.add_argument("--resume", default=d.resume, help="continue from the checkpoint in this run folder")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--augment", action="store_true", help="random crop + horizontal flip")
    p.add_argument("--threads", type=int, default=d.threads, help="torch threads per worker (0 = cores/N)")
    p.add_argument("--backend", default=d.backend, help="auto | gloo | nccl for allreduce/ddp")
    p.add_argument("--timeout", type=float, default=d.timeout_s, dest="timeout_s",
                   help="seconds any network wait may take before the run fails (default %(default)s)")
    p.add_argument("--warmup", type=int, default=d.warmup, help="steps left out of the summary")
    p.add_argument("--log-every", type=int, default=d.log_every)
    p.add_argument("--bucket-mb", type=float, default=d.bucket_mb, help="gradient bucket size in MB (default 25; ps: largest chunk, 4)")
    p.add_argument("--first-bucket-mb", type=float, default=d.first_bucket_mb, help="first all-reduce bucket, MB (default 1)")
    p.add_argument("--frame-kb", type=int, default=d.frame_kb, help="ps: largest ZeroMQ frame of a push, KB (0 = one per tensor)")
    p.add_argument("--ps-window", type=int, default=d.ps_window,
                   help="ps: most pushpulls unanswered per server (default ceil(4/S) on --net emulated, "
                        "else no limit; 0 = no limit)")
    p.add_argument("--no-overlap", action="store_false", dest="overlap",
                   help="communicate only after backward (default: each bucket as soon as it is ready)")
    p.add_argument("--trace", action="store_true", help="write trace.json (open in Perfetto/chrome://tracing)")
    p.add_argument("--net", default=d.net, help="loopback (default) | emulated: every worker and server in its "
                   "own network namespace behind a rate-limited link (root)")
    p.add_argument("--link-rate", default=d.link_rate, help="--net emulated: each host's link, e.g. 100mbit, "
                   "1gbit, 10gbit (default %(default)s)")
    p.add_argument("--server-link-rate", default=d.server_link_rate, help="--net emulated: PS servers' links")
    p.add_argument("--link-delay", default=d.link_delay, help="--net emulated: one-way delay, e.g. 1ms (netem)")
    p.add_argument("--compute", default=d.compute, help="real (default) | emulated | emulated:MS: replace "
                   "forward+backward by a wait (default: the measured single-worker time)")
    p.add_argument("--out", default=d.out, help="output directory (psring train: default a new "
                   "runs/DATE-TIME-SYNC-nN, or the run folder of --resume; psring worker: %(default)s)")


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
    cfg = TrainConfig(sync=a.sync, workers=a.workers, servers=a.servers, model=a.model, dataset=a.dataset,
                      num_samples=a.num_samples, batch_size=a.batch_size, steps=a.steps, seed=a.seed,
                      augment=a.augment, threads=a.threads, backend=a.backend, timeout_s=a.timeout_s,
                      warmup=a.warmup, log_every=a.log_every, out=a.out or TrainConfig.out, trace=a.trace,
                      bucket_mb=a.bucket_mb, first_bucket_mb=a.first_bucket_mb, overlap=a.overlap, frame_kb=a.frame_kb, ps_window=a.ps_window,
                      data_dir=a.data_dir, partition=a.partition, eval=a.eval, consistency=a.consistency,
                      staleness=a.staleness, ps_design=a.ps_design, straggler=a.straggler, net=a.net,
                      link_rate=a.link_rate, server_link_rate=a.server_link_rate, link_delay=a.link_delay,
                      compute=a.compute, curve=a.curve, checkpoint_every=a.checkpoint_every, resume=a.resume,
                      optim=OptimConfig(lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay, name=a.optimizer))
    return cfg.validate()


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
        cfg.ps_addrs = [x for x in (a.ps_addrs or "").split(",") if x]
        if cfg.sync == "ps" and not cfg.ps_addrs:
            raise ConfigError("--sync ps under torchrun needs --ps-addrs tcp://HOST:PORT,... of running servers")
        if os.environ.get("RANK", "0") == "0":
            Path(cfg.out).mkdir(parents=True, exist_ok=True)
            cfg.save(Path(cfg.out) / "config.json")
    from .allocator import keep_freed_memory
    from .sync.process_group import exit_without_teardown

    keep_freed_memory()
    exit_without_teardown(main_worker(cfg))


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

    return run_compare(a.out, steps=a.steps)


def cmd_sweep(a) -> int:
    from .sweep import run_sweep

    df = run_sweep(a.file, a.out, echo=a.verbose)
    failed = df[df["status"] != "ok"]
    for r in failed.to_dict("records"):
        print(f"psring: run {r['run_id']} failed: {r['error']}", file=sys.stderr)
    return 1 if len(failed) else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="psring", description="Parameter server vs ring all-reduce.")
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="run servers and workers of one training job on this machine")
    add_train_args(t)
    add_launch_args(t)
    t.set_defaults(func=cmd_train)

    w = sub.add_parser("worker", help="one worker; rank from torchrun's environment (RANK, WORLD_SIZE, ...)")
    add_train_args(w)
    w.add_argument("--config", help="a resolved config.json (how `psring train` starts its workers)")
    w.add_argument("--ps-addrs", help="comma-separated tcp://HOST:PORT of `psring server`s, for --sync ps")
    w.set_defaults(func=cmd_worker)

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

    c = sub.add_parser("compare", help="none at N=1, allreduce and ps at N=2: a table of speedups")
    c.add_argument("--out", default="runs/compare")
    c.add_argument("--steps", type=int, default=None, help="steps per run (default: as in quick.toml, 40)")
    c.set_defaults(func=cmd_compare)

    sw = sub.add_parser("sweep", help="run every configuration of a sweep file; writes OUT/runs.csv")
    sw.add_argument("file", help="a sweep file, e.g. experiments/scaling.toml")
    sw.add_argument("--out", help="output directory (default results/NAME)")
    sw.add_argument("--verbose", "-v", action="store_true", help="show each run's progress lines")
    sw.set_defaults(func=cmd_sweep)

    add_bench_parser(sub)

    from .tools import add_tool_parsers

    add_tool_parsers(sub)  # calibrate, plot, net cleanup
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plot"]:  # its own parser: argparse's REMAINDER would swallow nothing before a flag
        from .plot import main as plot_main

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
