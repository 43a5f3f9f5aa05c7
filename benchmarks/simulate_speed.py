"""How fast ``psring simulate`` replays: wall time per simulated step against N, and issue #27's target,
100 steps of 1,024 workers (ring, ResNet-18's buckets) in at most 60 s on 2 cores.

    python benchmarks/simulate_speed.py [--sizes 8,64,256,1024] [--steps 100] [--out results/simulate]

Each size is one ``simulate`` call as ``psring simulate --sync ring --model resnet18 --link-rate 10gbit
--compute emulated:200 --overlap none --jitter lognormal:0.05`` runs it (run folder written, summary included),
timed whole; the flat ring takes the vectorized replay (``simulate/vector.py``). Writes ``OUT/speed.json``.
Not a test: run it alone on a quiet machine.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import tempfile
import time
from pathlib import Path

TARGET_S = 60.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,64,256,1024")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--out", default="results/simulate")
    a = ap.parse_args(argv)

    from psring.config import TrainConfig
    from psring.simulate.run import simulate

    rows = []
    for n in [int(x) for x in a.sizes.split(",")]:
        cfg = TrainConfig(sync="ring", workers=n, model="resnet18", net="emulated", link_rate="10gbit",
                          compute="emulated:200", overlap="none", steps=a.steps, warmup=1,
                          num_samples=max(10_000, 32 * n)).validate()
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            s = simulate(cfg, Path(tmp) / "run", "lognormal:0.05")
            wall = time.perf_counter() - t0
        rows.append({"workers": n, "steps": a.steps, "wall_s": round(wall, 2),
                     "ms_per_simulated_step": round(1000 * wall / a.steps, 1),
                     "simulated_step_s_p50": round(s["step_s_p50"], 4)})
        print(f"N = {n:5d}: {wall:7.2f} s for {a.steps} steps ({1000 * wall / a.steps:7.1f} ms a step); "
              f"simulated step p50 {s['step_s_p50']:.3f} s", flush=True)
    big = next((r for r in rows if r["workers"] == 1024), None)
    doc = {"command": "python benchmarks/simulate_speed.py " + " ".join(argv or []),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores", "target_s": TARGET_S, "rows": rows,
           "target_met": None if big is None or a.steps != 100 else big["wall_s"] <= TARGET_S}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "speed.json").write_text(json.dumps(doc, indent=2) + "\n")
    if doc["target_met"] is not None:
        print(f"1,024 workers x 100 steps: {big['wall_s']:.1f} s against {TARGET_S:.0f} s: "
              f"{'met' if doc['target_met'] else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
