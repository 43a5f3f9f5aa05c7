"""BSP, SSP and ASP at several N (``experiments/scale_consistency.toml``, replayed by ``psring simulate``).

* ``consistency``: scaling efficiency against N, a line per consistency model, a panel per jitter. Throughput
  is ``worker_samples_per_s`` (every worker at its own pace): under ASP/SSP the fast workers do not wait for a
  slow one, which ``samples_per_s`` (each step's slowest worker), and so the speedup figure, would hide.
"""
from __future__ import annotations

import pandas as pd

from ..strategies import is_baseline
from .common import efficiency_axes, new_figure

STYLE = {"bsp": ("tab:red", "o"), "ssp": ("tab:orange", "s"), "asp": ("tab:blue", "^")}


def has_consistency(runs: pd.DataFrame) -> bool:
    """Several consistency models with per-worker throughput and a one-worker baseline to scale against."""
    need = {"consistency", "worker_samples_per_s", "workers", "sync"}
    return need <= set(runs.columns) and runs["consistency"].nunique() > 1 and runs["sync"].map(is_baseline).any()


def consistency_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The communicating runs with ``efficiency``: worker_samples_per_s / (N x the baseline's)."""
    one = runs.loc[runs["sync"].map(is_baseline), "worker_samples_per_s"].iloc[0]
    df = runs[(runs["workers"] > 1) & ~runs["sync"].map(is_baseline)].copy()
    df["efficiency"] = df["worker_samples_per_s"] / (df["workers"] * one)
    df["jitter"] = df["jitter"].fillna("none") if "jitter" in df else "none"
    return df.sort_values(["jitter", "consistency", "workers"])


def figure_consistency(runs: pd.DataFrame):
    df = consistency_table(runs)
    jitters = sorted(df["jitter"].unique())
    fig, axes = new_figure(4.4 * len(jitters), 3.6, ncols=len(jitters), sharey=True)
    for ax, jit in zip(axes[0], jitters):
        for name, g in df[df["jitter"] == jit].groupby("consistency"):
            color, marker = STYLE.get(name, ("tab:gray", "x"))
            ax.plot(g["workers"], g["efficiency"], color=color, marker=marker, label=name.upper())
        efficiency_axes(ax, f"jitter {jit}")
    axes[0][0].set_ylabel("scaling efficiency (each worker at its own pace)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("BSP, SSP and ASP (replayed)", fontsize=11)
    return fig
