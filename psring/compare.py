"""``psring compare``: the first thing to run. Trains the same small model on the same data three ways —
``none`` at N=1, ``allreduce`` and ``ps`` at N=2 — and prints what synchronization costs.

On a 2-core CPU the N=2 runs share the cores the N=1 run had to itself, so a speedup below 1 there says
"this machine has no spare compute", not "the strategy is broken"; the sync share is the telling column.
"""
from __future__ import annotations

from pathlib import Path

from .config import TrainConfig
from .launch.launcher import launch

RUNS = [("none", 1, 1), ("allreduce", 2, 1), ("ps", 2, 2)]


def compare_configs(out: str, steps: int) -> list[TrainConfig]:
    return [TrainConfig(sync=sync, workers=n, servers=s, model="cnn", batch_size=32, steps=steps,
                        num_samples=4096, log_every=max(1, steps // 2), out=str(Path(out) / f"{sync}-n{n}"))
            for sync, n, s in RUNS]


def format_table(summaries: list[dict]) -> str:
    base = next((s["samples_per_s"] for s in summaries if s["workers"] == 1), None)
    head = f"{'strategy':<10} {'workers':>7} {'servers':>7} {'samples/s':>10} {'speedup':>8} {'sync share':>10}"
    lines = [head, "-" * len(head)]
    for s in summaries:
        servers = s["servers"] if s["sync"] == "ps" else "-"
        speedup = f"{s['samples_per_s'] / base:.2f}x" if base else "n/a"
        share = "-" if s["sync_share"] is None else f"{100 * s['sync_share']:.1f}%"
        lines.append(f"{s['sync']:<10} {s['workers']:>7} {servers:>7} {s['samples_per_s']:>10.1f} "
                     f"{speedup:>8} {share:>10}")
    return "\n".join(lines)


def run_compare(out: str, steps: int = 40) -> int:
    summaries = []
    for cfg in compare_configs(out, steps):
        print(f"== {cfg.sync}, N={cfg.workers}" + (f", S={cfg.servers}" if cfg.sync == "ps" else ""), flush=True)
        summaries.append(launch(cfg))
    print()
    print(format_table(summaries))
    print(f"\nspeedup = samples/s relative to N=1 (warm-up steps excluded); runs in {out}/")
    return 0
