"""The long chaos run: BSP training with checkpoints and --max-restarts while a random worker or PS
server is SIGKILLed again and again (psring.launch.chaos); does every run finish with the parameters of
an uninterrupted one, and what do the restarts cost?

    python benchmarks/chaos.py [--kills 10] [--steps 100] [--out results/chaos]

For each of ps (N=2, S=2) and allreduce (N=2): an uninterrupted reference run, then the same run with
--checkpoint-every 3 --max-restarts KILLS and --straggler 1:8 (sleeps only, the numbers are unchanged;
it keeps the run long enough for the kills) while KILLS kills land. Writes OUT/chaos.csv, one row per
strategy: kills survived, restarts, steps recomputed, the largest relative difference of any parameter
tensor from the reference, one record per worker per step or not, and wall times.

Not a test: a few minutes of CPU on 2 cores (tests/test_chaos.py is the short version, 3 kills).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import torch

from psring.launch.chaos import Chaos


def train(sync: str, out: Path, steps: int, *extra: str) -> subprocess.Popen:
    servers = ["--servers", "2"] if sync == "ps" else []
    argv = ["train", "--sync", sync, *servers, "--workers", "2", "--model", "cnn", "--batch-size", "8",
            "--num-samples", "256", "--steps", str(steps), "--no-eval", "--log-every", "100000", "--out", str(out),
            *extra]
    return subprocess.Popen([sys.executable, "-m", "psring", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(p: subprocess.Popen, timeout_s: float) -> str:
    try:
        return p.communicate(timeout=timeout_s)[1]
    except subprocess.TimeoutExpired:
        p.kill()  # its children die with it (PR_SET_PDEATHSIG)
        return p.communicate()[1] + f"\n(killed after {timeout_s:.0f} s)"


def max_relative_difference(a: Path, b: Path) -> float:
    x, y = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return max(float((x[k].double() - y[k].double()).norm() / max(x[k].double().norm(), 1e-30)) for k in x)


def one(sync: str, root: Path, kills: int, steps: int, seed: int) -> dict:
    t0 = time.monotonic()
    ref = train(sync, root / f"{sync}-ref", steps)
    ref_err = finish(ref, 300)
    t1 = time.monotonic()
    out = root / f"{sync}-chaos"
    p = train(sync, out, steps, "--checkpoint-every", "3", "--max-restarts", str(kills), "--straggler", "1:8")
    chaos = Chaos(p.pid, out, workers=2, kills=kills, seed=seed, max_delay_s=0.3, timeout_s=600)
    chaos.start()
    err = finish(p, 900)
    chaos.stop()
    row = {"sync": sync, "kills": len(chaos.kills_done), "victims": " ".join(n.replace(" ", "") for n, _ in chaos.kills_done),
           "exit_code": p.returncode, "reference_s": round(t1 - t0, 1), "chaos_s": round(time.monotonic() - t1, 1)}
    if ref.returncode != 0 or p.returncode != 0:
        return {**row, "error": (ref_err if ref.returncode else err).strip().splitlines()[-1]}
    summary = json.loads((out / "summary.json").read_text())
    records = Counter((r["rank"], r["step"]) for r in map(json.loads, (out / "steps.jsonl").read_text().splitlines()))
    return {**row, "restarts": summary["restarts"], "steps_recomputed": summary["steps_recomputed"],
            "steps": summary["steps_completed"],
            "one_record_per_worker_per_step": records == Counter({(r, s): 1 for r in range(2) for s in range(steps)}),
            "max_rel_diff": max_relative_difference(root / f"{sync}-ref" / "model.pt", out / "model.pt")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=10, help="per strategy (default %(default)s)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/chaos")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for i, sync in enumerate(("ps", "allreduce")):
            rows.append(one(sync, Path(d), a.kills, a.steps, a.seed + i))
            print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    df.to_csv(Path(a.out) / "chaos.csv", index=False)
    print(df.to_string(index=False))
    ok = all(r.get("exit_code") == 0 and r.get("kills") == a.kills and r.get("max_rel_diff", 1) <= 1e-6
             and r.get("one_record_per_worker_per_step") for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
