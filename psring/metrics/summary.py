"""Turn a run's per-step records into ``steps.jsonl`` (merged, sorted) and ``summary.json``.

Warm-up steps (the first ``warmup``) are left out of every figure except ``first_loss``/``final_loss``.
A step's wall time is the slowest worker's ``step_s`` (a synchronous step ends when its last worker does).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from .steps import read_steps


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(records: list[dict], workers: int, warmup: int) -> dict:
    steps = sorted({r["step"] for r in records})
    by_step: dict[int, list[dict]] = {}
    for r in records:
        by_step.setdefault(r["step"], []).append(r)
    complete = [s for s in steps if len(by_step[s]) == workers]
    timed = [s for s in complete if s >= warmup] or complete[-1:]
    wall = [max(r["step_s"] for r in by_step[s]) for s in timed]
    samples = sum(sum(r["samples"] for r in by_step[s]) for s in timed)
    timed_recs = [r for s in timed for r in by_step[s]]
    sync = [r["sync_s"] for r in timed_recs]
    step_total = sum(r["step_s"] for r in timed_recs)
    last, first = complete[-1] if complete else None, complete[0] if complete else None

    def mean_loss(s):
        return None if s is None else statistics.fmean(r["loss"] for r in by_step[s])

    return {
        "steps_completed": len(complete),
        "warmup_steps": warmup,
        "timed_steps": len(timed),
        "samples_per_s": samples / sum(wall) if wall and sum(wall) > 0 else None,
        "step_s_median": statistics.median(wall) if wall else None,
        "step_s_p90": _percentile(wall, 0.9) if wall else None,
        "sync_s_median": statistics.median(sync) if sync and None not in sync else None,
        "sync_share": (sum(sync) / step_total) if sync and None not in sync and step_total > 0 else None,
        "bytes_sent_per_step": statistics.fmean(r["bytes_sent"] for r in timed_recs) if timed_recs else None,
        "bytes_recv_per_step": statistics.fmean(r["bytes_recv"] for r in timed_recs) if timed_recs else None,
        "first_loss": mean_loss(first),
        "final_loss": mean_loss(last),
    }


def finalize_run(out: Path, config: dict) -> dict:
    """Merge ``out/ranks/rank*.jsonl`` into ``out/steps.jsonl`` and write ``out/summary.json``."""
    out = Path(out)
    records = []
    for f in sorted((out / "ranks").glob("rank*.jsonl")):
        records += read_steps(f)
    records.sort(key=lambda r: (r["step"], r["rank"]))
    with open(out / "steps.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    warmup = min(config.get("warmup", 3), max(0, config["steps"] - 1))
    summary = {k: config[k] for k in ("sync", "workers", "servers", "model", "batch_size", "steps")}
    summary.update(summarize(records, config["workers"], warmup))
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.rename(out / "summary.json")
    return summary
