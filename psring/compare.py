"""``psring compare``: the first thing to run. Trains the same small model on the same data three ways —
``none`` at N=1, ``allreduce`` and ``ps`` (S=2) at N=2 — and prints what synchronization costs.
It is the sweep ``experiments/quick.toml`` (shipped inside the package as ``presets/quick.toml``).

On a 2-core CPU the N=2 runs share the cores the N=1 run had to itself, so a speedup below 1 there says
"this machine has no spare compute", not "the strategy is broken"; the sync share is the telling column.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .strategies import uses_servers

QUICK = Path(__file__).parent / "presets" / "quick.toml"


def format_table(df: pd.DataFrame) -> str:
    head = f"{'strategy':<10} {'workers':>7} {'servers':>7} {'samples/s':>10} {'speedup':>8} {'sync share':>10}"
    lines = [head, "-" * len(head)]
    for r in df.to_dict("records"):
        if r["status"] != "ok":
            lines.append(f"{r['sync']:<10} {r['workers']:>7}  failed: {r['error']}")
            continue
        servers = r["servers"] if uses_servers(r["sync"]) else "-"
        speedup = "n/a" if pd.isna(r["speedup"]) else f"{r['speedup']:.2f}x"
        share = "-" if pd.isna(r["sync_share"]) else f"{100 * r['sync_share']:.1f}%"
        lines.append(f"{r['sync']:<10} {r['workers']:>7} {servers:>7} {r['samples_per_s']:>10.1f} "
                     f"{speedup:>8} {share:>10}")
    return "\n".join(lines)


def run_compare(out: str, steps: int | None = None) -> int:
    from .sweep import run_sweep

    sweep = QUICK
    if steps is not None:  # a shorter (or longer) variant of the same sweep, e.g. for tests
        text = QUICK.read_text().replace("steps = 40", f"steps = {steps}")
        sweep = Path(out) / "quick.toml"
        sweep.parent.mkdir(parents=True, exist_ok=True)
        sweep.write_text(text)
    df = run_sweep(str(sweep), out, echo=True)
    print()
    print(format_table(df))
    print(f"\nspeedup = samples/s over none at N=1, one worker without communication (warm-up steps "
          f"excluded); runs in {out}/")
    return 0 if (df["status"] == "ok").all() else 1
