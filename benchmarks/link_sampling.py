"""What sampling every link costs the workers: the same emulated run with the launcher's link sampler on
(``--link-sample-ms 20``, the default) and off (0), interleaved, several times each.

    python benchmarks/link_sampling.py [--repeats 3] [--steps 12] [--out results/link_sampling]   (root)

Each pair of runs is one configuration (4 workers; ring and ps S=1 on 50 Mbit links with compute emulated,
and the ring with real compute on 1 Gbit links, which saturates 2 cores) with
sampling on, then off, then on..., so drift on the machine lands on both alike. Writes OUT/link_sampling.csv (one
row per run: median step and sync time, CPU utilisation, the sampler's own CPU seconds and the links'
sums against the kernel's counters) and OUT/summary.json: per configuration the median step time with
over without sampling, beside the spread of the runs of one setting (what "within noise" is measured
against). Not a test: a few minutes of runs; run it alone on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import pandas as pd

from psring.config import TrainConfig
from psring.launch.launcher import launch

# the third with real compute on 1 Gbit links: 4 workers' forward and backward then saturate the 2 cores,
# where the sampler's own CPU could show (at 50 Mbit the ring's sync still dominates and the cores idle)
CONFIGS = {"ring N=4": dict(sync="ring", workers=4), "ps N=4 S=1": dict(sync="ps", workers=4, servers=1),
           "ring N=4, real compute, 1 Gbit": dict(sync="ring", workers=4, compute="real", link_rate="1gbit")}
FIXED = dict(net="emulated", link_rate="50mbit", compute="emulated:100", model="cnn", batch_size=32, warmup=2,
             overlap=False, eval=False, num_samples=4096)
KEEP = ["step_s_p50", "sync_s_p50", "cpu_util", "links_samples", "links_up_vs_kernel", "links_down_vs_kernel",
        "links_worst_host_error", "links_sampler_cpu_s"]


def one_run(name: str, sample_ms: int, rep: int, steps: int, out: Path) -> dict:
    slug = "".join(c if c.isalnum() else "_" for c in name)
    cfg = TrainConfig(**{**FIXED, **CONFIGS[name]}, steps=steps, link_sample_ms=sample_ms,
                      out=str(out / "runs" / f"{slug}_{sample_ms}ms_{rep}"))
    t0 = time.monotonic()
    s = launch(cfg, echo=False, overwrite=True)
    wall = time.monotonic() - t0
    row = {"config": name, "link_sample_ms": sample_ms, "repeat": rep, "wall_s": wall, **{k: s.get(k) for k in KEEP}}
    print(f"{name:12} sampling {sample_ms:>2} ms  rep {rep}: step {1e3 * row['step_s_p50']:.1f} ms, "
          f"sync {1e3 * row['sync_s_p50']:.1f} ms, cpu {row['cpu_util']:.2f}", flush=True)
    return row


def summarize(df: pd.DataFrame) -> dict:
    out = {}
    for name, g in df.groupby("config"):
        on, off = g[g["link_sample_ms"] > 0]["step_s_p50"], g[g["link_sample_ms"] == 0]["step_s_p50"]
        spread = max((s.max() - s.min()) / s.median() for s in (on, off))
        sampled = g[g["link_sample_ms"] > 0]
        out[name] = {"step_s_on": on.median(), "step_s_off": off.median(), "on_over_off": on.median() / off.median(),
                     "spread_within_a_setting": spread,
                     "sampler_cpu_share_of_one_core": (sampled["links_sampler_cpu_s"] / sampled["wall_s"]).median(),
                     "worst_host_error_vs_kernel": sampled["links_worst_host_error"].max()}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--out", default="results/link_sampling")
    a = ap.parse_args()
    out = Path(a.out)
    rows = [one_run(name, ms, rep, a.steps, out) for rep in range(a.repeats) for name in CONFIGS for ms in (20, 0)]
    df = pd.DataFrame(rows)
    df.to_csv(out / "link_sampling.csv", index=False)
    summary = {"machine": f"{platform.node()}: {platform.processor() or platform.machine()}, "
                          f"{__import__('os').cpu_count()} cores", "date": time.strftime("%Y-%m-%d"),
               "repeats": a.repeats, "steps": a.steps, "configs": summarize(df)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary["configs"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
