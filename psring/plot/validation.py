"""Validation figure (``results/simulate``): every committed emulated run that ``psring simulate`` replays,
its simulated sync time against the one it measured (log-log), the ±10% band around equality, one colour
per strategy, hollow where the run was CPU-saturated (the replay models the links, not the cores)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..strategies import attr
from .common import new_figure

# validate.py's link_bound: not CPU-saturated, and the run's own CPU fits both cores at its replayed step
CPU_DECIDED = "hollow: CPU-decided (≥ 90% of all cores, or its CPU\nwould not fit at the pace its links allow)"


def load_validation(folder: Path) -> pd.DataFrame | None:
    """``validation.csv`` of ``folder`` (``python -m psring.simulate.validate``), if it has one."""
    f = Path(folder) / "validation.csv"
    return pd.read_csv(f) if f.exists() else None


def figure_validation(v: pd.DataFrame):
    done = v[v["replayed"] == "yes"]
    fig, axes = new_figure(7, 6)
    ax = axes[0][0]
    lo, hi = done[["sync_s", "sim_sync_s"]].min().min() * 0.8, done[["sync_s", "sim_sync_s"]].max().max() * 1.25
    x = np.geomspace(lo, hi, 50)
    ax.fill_between(x, 0.9 * x, 1.1 * x, color="lightgray", alpha=0.6, label="within ±10%")
    ax.plot(x, x, color="black", linewidth=0.8)
    for sync, g in done.groupby("sync"):
        color = attr(sync, "color", "tab:gray")
        bound = g["link_bound"].astype(bool)
        ax.scatter(g[bound]["sync_s"], g[bound]["sim_sync_s"], color=color, s=22,
                   label=f"{attr(sync, 'label', sync)} ({len(g)})")
        ax.scatter(g[~bound]["sync_s"], g[~bound]["sim_sync_s"], facecolors="none", edgecolors=color, s=22)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured sync time per step (s, median of the run)")
    ax.set_ylabel("simulated sync time per step (s)")
    inside = done[done["link_bound"].astype(bool)]
    ok = int(((inside["sync_ratio"] - 1).abs() <= 0.10).sum())
    ax.set_title(f"psring simulate against {len(done)} committed emulated runs\n"
                 f"{ok} of {len(inside)} link-bound ones within ±10%")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, title=CPU_DECIDED if (~done["link_bound"].astype(bool)).any() else None, title_fontsize=7)
    return fig
