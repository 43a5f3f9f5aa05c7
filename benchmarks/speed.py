"""The Speed issue's targets, each a ratio of two figures measured side by side in this one run.

    python benchmarks/speed.py [--out results/speed] [--steps 20] [--iters 80]

P1  PS push+pull of ResNet-18's gradients (1 worker, 1 server, server update included)
    / the best raw ZeroMQ echo of the same bytes (fastest of several frame sizes)      target <= 1.25
P1f (informational) the same echo servers also running the SGD update, no psring code: the floor of
    P1 on this machine; P1p = P1 / P1f, the share of psring's own logic
P2  one flat dist.all_reduce of those bytes / the allreduce synchronizer on ResNet-18's
    gradient set (N=2, gloo): the synchronizer's throughput relative to the raw one     target >= 0.90
P3a training step time at N=2, resnet18_narrow, same batch and threads: allreduce / ddp target <= 1.00
P3b the same: ps (S=2) / allreduce                                                      target <= 1.15

Not a test: timings on a shared 2-core machine vary by 10-20% between runs; read the ratios, and rerun.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import pandas as pd

from psring.bench.runner import run_bench
from psring.config import TrainConfig
from psring.launch.launcher import launch

KB, MB = 1 << 10, 1 << 20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/speed")
    ap.add_argument("--iters", type=int, default=80,
                    help="timed iterations of P1 and P2 (at 20, P2 spread over 0.87-1.10 on one day; at 80, 0.97-0.99)")
    ap.add_argument("--steps", type=int, default=20, help="training steps per P3 run (3 warm-up)")
    ap.add_argument("--batch-size", type=int, default=32)
    a = ap.parse_args()
    out = Path(a.out)
    t0 = time.monotonic()

    ps_bucket = TrainConfig(sync="ps").validate().bucket_mb  # the PS's own default bucket size
    p1 = run_bench(1, [], ["ps"], str(out / "p1"), 5, a.iters, [256 * KB, MB, 4 * MB, 16 * MB], model="resnet18",
                   servers=[1], bucket_mb=ps_bucket, floor=True)
    ps, echo, floor = (p1[p1.strategy == s].iloc[0] for s in ("ps", "raw_zmq_echo", "raw_zmq_echo_sgd"))
    p2 = run_bench(2, [], ["allreduce"], str(out / "p2"), 5, a.iters, model="resnet18")
    ar, raw = (p2[p2.strategy == s].iloc[0] for s in ("allreduce", "raw_allreduce"))

    # each strategy twice, in mirrored order (ddp, allreduce, ps, ps, allreduce, ddp), so a slow spell of
    # the shared machine weighs on all three alike; a strategy's figure is the mean of its two p50s
    runs: dict[str, list[float]] = {}
    order = [("ddp", 1), ("allreduce", 1), ("ps", 2)]
    for i, (sync, servers) in enumerate(order + order[::-1]):
        cfg = TrainConfig(sync=sync, workers=2, servers=servers, model="resnet18_narrow", batch_size=a.batch_size,
                          steps=a.steps, num_samples=2048, log_every=10, out=str(out / "p3" / f"{sync}{i // 3}"))
        # overwrite: each run of this script replaces the previous one's P3 runs
        runs.setdefault(sync, []).append(launch(cfg, echo=False, overwrite=True)["step_s_p50"])
    step = {sync: sum(v) / len(v) for sync, v in runs.items()}

    rows = [
        ("P1", "ps push+pull / best raw zmq echo (ResNet-18 grads, N=1, S=1)", ps.time_s / echo.time_s, "<=", 1.25,
         f"{ps.time_s * 1e3:.1f} ms / {echo.time_s * 1e3:.1f} ms"),
        ("P1f", "(floor) raw zmq echo + SGD update, no psring code / best raw echo", floor.time_s / echo.time_s,
         "info", float("nan"), f"{floor.time_s * 1e3:.1f} ms / {echo.time_s * 1e3:.1f} ms"),
        ("P1p", "(psring's own share) ps push+pull / raw echo + SGD update", ps.time_s / floor.time_s, "info",
         float("nan"), f"{ps.time_s * 1e3:.1f} ms / {floor.time_s * 1e3:.1f} ms"),
        ("P2", "allreduce sync throughput / flat dist.all_reduce (N=2, gloo)", raw.time_s / ar.time_s, ">=", 0.90,
         f"{raw.time_s * 1e3:.1f} ms / {ar.time_s * 1e3:.1f} ms"),
        ("P3a", "step time allreduce / ddp (N=2, resnet18_narrow)", step["allreduce"] / step["ddp"], "<=", 1.00,
         f"{step['allreduce'] * 1e3:.0f} ms / {step['ddp'] * 1e3:.0f} ms"),
        ("P3b", "step time ps S=2 / allreduce (N=2, resnet18_narrow)", step["ps"] / step["allreduce"], "<=", 1.15,
         f"{step['ps'] * 1e3:.0f} ms / {step['allreduce'] * 1e3:.0f} ms"),
    ]
    df = pd.DataFrame(rows, columns=["target", "what", "ratio", "op", "bound", "figures"])
    df["met"] = [(r <= b) if op == "<=" else (r >= b) if op == ">=" else None
                 for r, op, b in zip(df.ratio, df.op, df.bound)]
    df.to_csv(out / "speed.csv", index=False)
    (out / "machine.json").write_text(json.dumps({"cpus": __import__("os").cpu_count(), "machine": platform.machine(),
                                                  "python": platform.python_version()}) + "\n")
    print()
    for r in df.to_dict("records"):
        verdict = ("informational" if r["met"] is None else
                   f"target {r['op']} {r['bound']:.2f}: {'met' if r['met'] else 'NOT met'}")
        print(f"{r['target']:<4} {r['what']:<64} {r['ratio']:6.3f}  ({verdict})  [{r['figures']}]")
    print(f"\n{time.monotonic() - t0:.0f} s; {out / 'speed.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
