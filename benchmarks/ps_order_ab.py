"""``--ps-order planned`` against ``priority`` at one of issue #29's PS points, in alternating pairs (root: an
emulated cluster):

    python benchmarks/ps_order_ab.py --pairs 4 --out DIR                # N = 4, 1 Gbit, full and backward
    python benchmarks/ps_order_ab.py --pairs 2 --workers 8 --link-rate 100mbit --compute emulated:3739 \
        --steps 8 --warmup 3 --link-tuning probe --modes full --out DIR

ps S = N, ResNet-18, batch 16, compute:comm = 1 (the PS's no-overlap bound M/B: 374 ms at 1 Gbit), every other
setting the default, as ``results/overlap``'s rows; per pair and mode the two arms one after the other, which
first flipped each pair. Writes ``DIR/ps_order_ab.csv``: one row per run (its point, its step p50, its bound,
``bounds.step_bound_s``, their ratio, its CPU) and prints each pair's ratio planned / priority. Run folders go
to a temporary folder and are removed.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from psring.bounds import with_bounds



def point(a) -> list[str]:
    return ["--sync", "ps", "--workers", str(a.workers), "--servers", str(a.workers), "--net", "emulated",
            "--link-rate", a.link_rate, "--model", "resnet18", "--batch-size", "16", "--compute", a.compute,
            "--steps", str(a.steps), "--warmup", str(a.warmup), "--link-tuning", a.link_tuning]


def measured(out: Path) -> tuple[dict, float]:
    """A finished run's summary and its step bound (``bounds.step_bound_s``, as ``psring bounds`` puts it)."""
    config, s = json.loads((out / "config.json").read_text()), json.loads((out / "summary.json").read_text())
    return s, float(with_bounds(pd.DataFrame([{**config, **s}]))["step_bound_s"].iloc[0])


def run(a, mode: str, order: str, out: Path) -> dict:
    cmd = [sys.executable, "-m", "psring", "train", *point(a), "--overlap", mode, "--ps-order", order, "--out", str(out)]
    subprocess.run(cmd, check=True, timeout=600, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    s, bound = measured(out)
    return {"workers": a.workers, "link_rate": a.link_rate, "link_tuning": a.link_tuning, "overlap": mode,
            "ps_order": order, "step_s": s["step_s_p50"], "bound_s": bound,
            "step_over_bound": s["step_s_p50"] / bound, "cpu_util": s["cpu_util"], "chunk_bytes": s.get("chunk_bytes")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--modes", default="full,backward")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--link-rate", default="1gbit")
    ap.add_argument("--compute", default="emulated:374")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--link-tuning", default="auto")
    ap.add_argument("--out", default="results/overlap_floor")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="psring-ps-order-") as tmp:
        for pair in range(a.pairs):
            for mode in a.modes.split(","):
                arms = ("planned", "priority") if pair % 2 == 0 else ("priority", "planned")
                got = {}
                for order in arms:
                    got[order] = {"pair": pair, **run(a, mode, order, Path(tmp) / f"{mode}-{order}-{pair}")}
                    rows.append(got[order])
                print(mode, pair, {k: round(v["step_over_bound"], 3) for k, v in got.items()},
                      "planned / priority", round(got["planned"]["step_s"] / got["priority"]["step_s"], 3), flush=True)
    out = Path(a.out) / "ps_order_ab.csv"
    pd.DataFrame(rows).to_csv(out, index=False)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
