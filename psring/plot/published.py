"""A published scaling result beside its replay (``experiments/published_horovod.toml``).

* ``published``: scaling efficiency against N, a panel per model: the replay's lines (a colour per
  ``--readiness``, a line style per alpha) and the published figures as stars, from the folder's
  ``published.csv`` (model, gpus, efficiency, source: what the paper or documentation states).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .common import efficiency_axes, load_csv, new_figure

COLUMNS = ("model", "gpus", "efficiency", "source")
READINESS_COLOR = {"bytes": "tab:gray", "flops": "tab:blue"}
ALPHA_STYLE = ("--", "-.", "-")  # smallest alpha dashed ... largest solid


def load_published(folder: Path) -> pd.DataFrame | None:
    """``folder/published.csv``, or None; a file without its columns is a one-line ValueError."""
    return load_csv(folder, "published.csv", COLUMNS)


def model_name(model: str) -> str:
    """``psring.train.zoo:vgg16`` -> ``vgg16``."""
    return str(model).rpartition(":")[2]


def replay_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The communicating runs with ``name``, ``readiness`` (bytes where unset) and their efficiency."""
    df = runs[(runs["status"] == "ok") & (runs["workers"] > 1)].copy()
    df["name"] = df["model"].map(model_name)
    df["readiness"] = df.get("readiness", pd.Series("bytes", index=df.index)).fillna("bytes")
    return df


def figure_published(runs: pd.DataFrame, published: pd.DataFrame):
    df, pub = replay_table(runs), published.assign(name=published["model"].map(model_name))
    names = sorted(set(df["name"]) & set(pub["name"]))
    alphas = sorted(df["alpha_us"].unique())
    styles = dict(zip(alphas, ALPHA_STYLE[-len(alphas):] if len(alphas) <= len(ALPHA_STYLE) else ["-"] * len(alphas)))
    fig, axes = new_figure(4.6 * len(names) + 2.0, 3.8, ncols=len(names), sharey=True)
    for ax, name in zip(axes[0], names):
        for (ready, alpha), g in df[df["name"] == name].groupby(["readiness", "alpha_us"]):
            g = g.sort_values("workers")
            ax.plot(g["workers"], g["efficiency"], styles[alpha], color=READINESS_COLOR.get(ready, "tab:green"),
                    marker="o", markersize=2.5, label=f"replayed, readiness {ready}, α {alpha:g} µs")
        p = pub[pub["name"] == name]
        ax.plot(p["gpus"], p["efficiency"], "*", color="black", markersize=11, label="published")
        efficiency_axes(ax, name)
    axes[0][0].set_ylabel("scaling efficiency")
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle("a published result (stars) beside its replay (lines)", fontsize=11)
    return fig
