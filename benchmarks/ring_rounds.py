"""Where the hand-written ring's `--no-overlap` sync time goes beyond its replay, round by round (root: an emulated
cluster):

    python benchmarks/ring_rounds.py --out DIR [--workers 2,4,8] [--codecs none,fp16] [--link-rate 1gbit]

Each point is results/compression_sync's setting (``psring train --sync ring --net emulated --model resnet18
--batch-size 32 --compute emulated:200 --no-overlap --compress CODEC``; here 8 steps of which 2 warm-up, with
``--trace``), then ``psring simulate --from`` the run (alpha 205 us, the run's own update). The trace has every round
of every bucket as each rank saw it (``ring.Transfer``); per timed step and rank the step's sync time splits into:

- ``first_bucket_s``: bucket 0's 2(N - 1) rounds, from its first post to its last completion: the first bucket is
  capped at 1 MB (DDP's), which holds ResNet-18's classifier and last batch norm (24.6 kB, 12.3 kB in fp16), so
  its rounds carry 1.5-12 kB each and cost what a round costs beyond its bytes;
- ``rounds_s`` and ``link_s``: the other buckets' rounds, summed, against their bytes at the link's payload rate
  (rate x 1448/1514): the share the replay prices;
- ``between_s``: the time between those rounds (a reduce-scatter round's add, the next round's post);
- ``outside_s``: sync time before the first round and after the last (the codec's casts: fp16's 2-byte copy of a
  bucket before its rounds, its sum back into the gradients after them).

Writes ``DIR/ring_rounds.csv``: one row per point, the medians over its timed steps and ranks, beside the measured
and replayed sync time and the run's CPU. Run folders go to ``DIR/runs`` (the traces are large: remove them after).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pandas as pd

TCP_PAYLOAD = 1448 / 1514
RATES = {"100mbit": 100e6, "1gbit": 1e9}


def shares(run: Path, rate_bps: float) -> dict:
    """Medians over the timed steps and ranks of the split above (seconds)."""
    warmup = json.loads((run / "config.json").read_text())["warmup"]
    parts = []
    for line in (run / "steps.jsonl").read_text().splitlines():
        rec = json.loads(line)
        rounds = [m for m in rec.get("messages") or [] if " chunk " in m[0]]
        if rec["step"] < warmup or not rounds:
            continue
        first = [m for m in rounds if m[0].startswith("ring b0 ")]
        rest = [m for m in rounds if not m[0].startswith("ring b0 ")]
        nbytes = sum(float(m[0].rsplit("(", 1)[1].split(" kB")[0]) * 1e3 for m in rest)
        begin, end = min(m[1] for m in rounds), max(m[1] + m[2] for m in rounds)
        first_s = max(m[1] + m[2] for m in first) - min(m[1] for m in first) if first else 0.0
        rounds_s = sum(m[2] for m in rest)
        parts.append({"first_bucket_s": first_s, "rounds_s": rounds_s, "link_s": nbytes * 8 / (rate_bps * TCP_PAYLOAD),
                      "between_s": end - begin - first_s - rounds_s, "outside_s": begin + max(0.0, rec["sync_s"] - end)})
    return {k: statistics.median(p[k] for p in parts) for k in parts[0]}


def point(workers: int, codec: str, a, runs: Path) -> dict:
    run, sim = runs / f"ring_n{workers}_{codec}", runs / f"sim_n{workers}_{codec}"
    psring = [sys.executable, "-m", "psring"]
    subprocess.run([*psring, "train", "--sync", "ring", "--workers", str(workers), "--model", "resnet18",
                    "--batch-size", "32", "--steps", str(a.steps), "--warmup", str(a.warmup), "--net", "emulated",
                    "--link-rate", a.link_rate, "--compute", "emulated:200", "--no-overlap", "--compress", codec,
                    "--trace", "--no-eval", "--out", str(run), "--overwrite"], check=True, timeout=900,
                   stdout=subprocess.DEVNULL)
    subprocess.run([*psring, "simulate", "--from", str(run), "--alpha-us", "205", "--out", str(sim), "--overwrite"],
                   check=True, timeout=600, stdout=subprocess.DEVNULL)
    m, s = (json.loads((d / "summary.json").read_text()) for d in (run, sim))
    row = {"workers": workers, "compress": codec, "link_rate": a.link_rate, "sync_s": m["sync_s_p50"],
           "sim_sync_s": s["sync_s_p50"], "sync_ratio": s["sync_s_p50"] / m["sync_s_p50"],
           "step_ratio": s["step_s_p50"] / m["step_s_p50"], "cpu_util": m["cpu_util"],
           "cpu_util_sync": m["cpu_util_sync"], **shares(run, RATES[a.link_rate])}
    print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="2,4,8")
    ap.add_argument("--codecs", default="none,fp16")
    ap.add_argument("--link-rate", default="1gbit", choices=sorted(RATES))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out = Path(a.out)
    rows = [point(int(n), codec, a, out / "runs") for codec in a.codecs.split(",") for n in a.workers.split(",")]
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out / "ring_rounds.csv", index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
