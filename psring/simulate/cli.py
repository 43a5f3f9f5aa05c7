"""``psring simulate``: ``psring train``'s flags, plus ``--jitter`` and ``--alpha-us``; writes a run folder.

    psring simulate --sync ring --workers 64 --model resnet18 --net emulated --link-rate 10gbit \\
        --compute emulated:200 --overlap none --steps 20 --jitter lognormal:0.05 --out runs/sim-ring-64
"""
from __future__ import annotations

import math
from pathlib import Path

from ..config import ConfigError
from .run import NO_JITTER


def cmd_simulate(a) -> int:
    from ..cli import config_from_args
    from .run import parse_jitter, simulate

    parse_jitter(a.jitter)  # before anything else: one line for a bad model
    if not (math.isfinite(a.alpha_us) and a.alpha_us >= 0):
        raise ConfigError(f"--alpha-us must be a number >= 0, got {a.alpha_us}")
    a.net = "emulated"  # the cluster simulated is the emulated one: hosts behind shaped links
    if a.out is None:
        a.out = f"runs/sim-{a.sync}-n{a.workers}"
    out = Path(a.out)
    if (out / "summary.json").exists() and not a.overwrite:
        raise ConfigError(f"{out} holds a finished run; pass --overwrite to replace it, or another --out")
    s = simulate(config_from_args(a), out, a.jitter, a.alpha_us)
    print(f"simulated: {s['steps_completed']} steps, step p50 {s['step_s_p50']:.3f} s, sync p50 "
          f"{s['sync_s_p50']:.3f} s, {s['samples_per_s']:.1f} samples/s; results in {out}")
    return 0


def add_simulate_parser(sub) -> None:
    from ..cli import add_train_args

    p = sub.add_parser("simulate", help="replay a run's schedule on a flow-level model of the emulated cluster "
                                        "(any N); writes the same run folder as psring train")
    add_train_args(p)
    p.set_defaults(out=None, func=cmd_simulate)
    p.add_argument("--jitter", default=NO_JITTER, help="each worker's compute per step: none, or lognormal:CV "
                                                    "(coefficient of variation)")
    p.add_argument("--alpha-us", type=float, default=205.0,
                   help="per-message latency, us (default: one emulated link's, results/bandwidth's calibration)")
    p.add_argument("--overwrite", action="store_true", help="replace a finished run in --out")


__all__ = ["add_simulate_parser", "cmd_simulate"]
