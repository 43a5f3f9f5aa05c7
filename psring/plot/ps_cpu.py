"""Where a PS step's CPU goes, thread by thread (``benchmarks/ps_cpu.py``).

* ``ps_cpu``: CPU milliseconds a step per process for each role and thread (worker and server: the main
  loop, the other Python threads, ZeroMQ's I/O threads), a bar per label (e.g. before and after a change;
  each the median of its repeats, its whiskers their range), and the machine's core-milliseconds a step in a
  panel of its own.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .common import load_csv, new_figure

COLUMNS = ("label", "repeat", "role", "thread", "ms_per_step")
MACHINE = "machine"


def load_ps_cpu(folder: Path) -> pd.DataFrame | None:
    """``folder/ps_cpu.csv``, or None; a file without its columns is a one-line ValueError."""
    df = load_csv(folder, "ps_cpu.csv", COLUMNS)
    return None if df is None else df.assign(label=df["label"].fillna("").astype(str))


def figure_ps_cpu(df: pd.DataFrame):
    labels = list(dict.fromkeys(df["label"]))
    fig, axes = new_figure(8.4, 3.6, ncols=2, width_ratios=[4, 1])
    for ax, part in zip(axes[0], (df[df["role"] != MACHINE], df[df["role"] == MACHINE])):
        g = part.groupby(["role", "thread", "label"], sort=False)["ms_per_step"].agg(["median", "min", "max"])
        groups = list(dict.fromkeys((r, t) for r, t, _ in g.index))
        width = 0.8 / max(len(labels), 1)
        for j, label in enumerate(labels):
            rows = [g.loc[(r, t, label)] if (r, t, label) in g.index else None for r, t in groups]
            x = [i + (j - (len(labels) - 1) / 2) * width for i in range(len(groups))]
            med = [row["median"] if row is not None else 0.0 for row in rows]
            err = [[m - row["min"] if row is not None else 0.0 for m, row in zip(med, rows)],
                   [row["max"] - m if row is not None else 0.0 for m, row in zip(med, rows)]]
            ax.bar(x, med, width, yerr=err, capsize=2, label=label or "run")
        ax.set_xticks(range(len(groups)), [f"{r}\n{t}" for r, t in groups], fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("CPU ms a step, per process")
    axes[0][1].set_ylabel("core-ms a step, all cores")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("the PS's CPU a step, thread by thread (loopback: every cost is the CPU's)", fontsize=9)
    return fig
