"""``psring simulate``: ``psring train``'s flags, plus ``--jitter``, ``--alpha-us`` and ``--update-ms``; writes a
run folder.

    psring simulate --sync ring --workers 64 --model resnet18 --net emulated --link-rate 10gbit \\
        --compute emulated:200 --overlap none --steps 20 --jitter lognormal:0.05 --out runs/sim-ring-64
    psring simulate --from results/bandwidth/runs/RUN_ID --out runs/replayed   # a run, its calibration's alpha
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from ..config import ConfigError
from .profile import NO_JITTER  # (not .run: neither building the parser nor the checks import torch)


def calibration_of(run: Path) -> Path | None:
    """The ``calibration.json`` of a run folder: in it, or in the results folder above it (``FOLDER/runs/ID``)."""
    for d in (run, run.parent, run.parent.parent):
        if (d / "calibration.json").is_file():
            return d / "calibration.json"
    return None


def summary_of(run: Path) -> dict:
    """A run folder's ``summary.json`` ({} where it has none or it does not parse)."""
    from ..results import load_summary

    try:
        summary = load_summary(run)
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def replay_of(run: Path, alpha_us: float | None):
    """``--from RUN``: the run's own config and alpha (``--alpha-us``, else its calibration's); one line
    if it is no folder, has no config or no calibration."""
    from .. import costmodel as cm
    from ..config import TrainConfig

    if not run.is_dir():
        what = "a file, not a folder" if run.exists() else "no such folder"
        raise ConfigError(f"--from {run}: {what}; give a run folder psring train or sweep wrote")
    if not (run / "config.json").is_file():
        raise ConfigError(f"--from {run} holds no run (no config.json there); give a run folder psring train or "
                          f"sweep wrote")
    cfg = TrainConfig.load(run / "config.json")
    if cfg.net != "emulated":
        raise ConfigError(f"--from {run}: its run (config.json) ran on --net {cfg.net}, which has no emulated links "
                          f"to replay; give a --net emulated run")
    if alpha_us is None:
        cal = calibration_of(run)
        if cal is None:
            raise ConfigError(f"--from {run}: no calibration.json in it or its results folder; calibrate its link "
                              f"(python -m psring.calibrate --out FOLDER) or pass --alpha-us")
        alpha_us = cm.load_calibration(cal).alpha_s * 1e6
    return cfg, alpha_us


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse the ``--out`` ``psring train`` refuses (``launch.outdir.check_out``), reading it only: one in use
    by a running launcher always; a finished run, or an unfinished one with a checkpoint, unless ``--overwrite``."""
    from ..launch import outdir
    from ..train.checkpoint import FOLDER, last_step

    outdir.check_out(out, overwrite=True)  # in use: refused whatever the flags
    if overwrite:
        return
    if (out / "summary.json").exists():
        raise ConfigError(f"{out} holds a finished run; pass --overwrite to replace it, or another --out")
    step = last_step(out) if (out / FOLDER).is_dir() else None
    if step is not None:
        raise ConfigError(f"{out} holds an unfinished psring train run with a checkpoint after step {step}: "
                          f"continue it with psring train --resume {out}, or give another --out (--overwrite "
                          f"replaces it)")


def write_replay(out: Path, replay):
    """``replay()``'s run folder ``out`` (``check_out`` let it), made (``fileio.out_folder``) before anything is
    written, held (``launch.outdir.RunLock``: no launcher writes it meanwhile) and cleared of what an earlier
    run left there, as ``psring train`` clears it (its rank files would be merged into this run's steps)."""
    from ..fileio import WriteError, out_folder
    from ..launch.outdir import RunLock, prepare_out

    made = not out.exists()
    out_folder(out)
    try:
        with RunLock(out):
            prepare_out(out)  # (tuned.json too: a measured run's link schedule, not the replay's)
            return replay()
    except WriteError as e:
        raise ConfigError(str(e)) from None
    finally:  # a replay refused (or failed) in the folder this made leaves no empty folder behind
        if made and out.is_dir() and not any(out.iterdir()):
            out.rmdir()


def cmd_simulate(a) -> int:
    from ..cli import config_from_args
    from .checks import DEFAULT_ALPHA_US, check, parse_jitter
    from .records import check_update, measured_update_s

    parse_jitter(a.jitter)  # before anything else: one line for a bad model
    if a.alpha_us is not None and not (math.isfinite(a.alpha_us) and a.alpha_us >= 0):
        raise ConfigError(f"--alpha-us must be a number >= 0, got {a.alpha_us}")
    if a.from_run is not None:
        if not a.from_run.strip():  # (Path("") is the current folder)
            raise ConfigError("--from is empty: give a run folder psring train or sweep wrote")
        cfg, alpha_us = replay_of(Path(a.from_run), a.alpha_us)
        a.out = f"runs/sim-{Path(a.from_run).name}" if a.out is None else a.out
        # (a replay writes no checkpoint and starts at step 0, whatever the run did)
        cfg = dataclasses.replace(cfg, out=a.out, resume=None, checkpoint_every=0).validate()
    else:
        a.net = "emulated"  # the cluster simulated is the emulated one: hosts behind shaped links
        a.out = f"runs/sim-{a.sync}-n{a.workers}" if a.out is None else a.out
        cfg, alpha_us = None, DEFAULT_ALPHA_US if a.alpha_us is None else a.alpha_us
    if not str(a.out).strip():
        raise ConfigError("--out is empty: give a folder")
    out = Path(a.out)
    check_out(out, a.overwrite)  # at once: before the config's checks and the replay's imports
    cfg = cfg if cfg is not None else config_from_args(a)
    update_ms = a.update_ms
    if update_ms is None:  # --from: the run's own update (its calibration, as its alpha)
        update_ms = measured_update_s(summary_of(Path(a.from_run)), cfg.sync) * 1000 if a.from_run else 0.0
    check(cfg)  # the replay's own checks before it is imported (with the plans: torch, about 2 s of CPU)
    check_update(cfg, update_ms / 1000)

    def replay() -> dict:  # imported once --out is checked: a refused one fails without torch's import
        from .run import simulate

        return simulate(cfg, out, a.jitter, alpha_us, readiness=a.readiness, update_s=update_ms / 1000)

    s = write_replay(out, replay)

    def fmt(x, spec):  # None: not measured, or not a finite number
        return "n/a" if x is None else format(x, spec)

    print(f"simulated: {s['steps_completed']} steps, step p50 {fmt(s.get('step_s_p50'), '.3f')} s, sync p50 "
          f"{fmt(s.get('sync_s_p50'), '.3f')} s, {fmt(s.get('samples_per_s'), '.1f')} samples/s; results in {out}")
    return 0


def add_simulate_parser(sub) -> None:
    from ..cli import add_train_args
    from .profile import READINESS

    p = sub.add_parser("simulate", help="replay a run's schedule on a flow-level model of the emulated cluster "
                                        "(any N); writes the same run folder as psring train")
    add_train_args(p)
    p.set_defaults(out=None, func=cmd_simulate)
    p.add_argument("--jitter", default=NO_JITTER, help="each worker's compute per step: none, or lognormal:CV "
                                                    "(coefficient of variation)")
    p.add_argument("--readiness", default="bytes", choices=READINESS,
                   help="when backward makes each gradient: bytes (in proportion to the parameters' sizes, as the "
                        "emulation does; default) or flops (to their layers' multiply-adds)")
    p.add_argument("--alpha-us", type=float, default=None,
                   help="per-message latency, us (default: one emulated link's, results/bandwidth's calibration; "
                        "with --from, the run's own calibration)")
    p.add_argument("--update-ms", type=float, default=None,
                   help="the local optimizer's update a step, ms, replayed before each forward (--overlap full: "
                        "each parameter's share at its gate); default 0 (free), with --from the run's own update_s_p50")
    p.add_argument("--from", dest="from_run", metavar="RUN",
                   help="replay this run folder with its own config.json (the other train flags are ignored) and "
                        "the alpha of its calibration.json (in it or its results folder)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a finished run in --out, or an unfinished psring train run with a checkpoint")


__all__ = ["add_simulate_parser", "cmd_simulate"]
