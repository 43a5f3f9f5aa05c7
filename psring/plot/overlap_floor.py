"""The floor of an overlapped step beside psring's own run: the PS's (``benchmarks/overlap_floor.py``) and the
reduce family's (``benchmarks/reduce_floor.py``).

* ``overlap_floor``: step time over its bound, a panel per ``--overlap`` mode: psring's run, the echo floor
  and the BSP floor at each chunk size (each bar the median of the repeats, its whiskers their range), with
  1.0 (the bound) and issue #29's 1.10 drawn across.
* ``reduce_floor``: the same for psring's all-reduce (or ring) and raw gloo all-reduces at each partition.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .common import load_csv, fmt_bytes, new_figure

COLUMNS = ("kind", "mode", "repeat", "chunk_bytes", "step_s_p50", "bound_s")
REDUCE_COLUMNS = ("kind", "mode", "repeat", "partition_bytes", "step_s_p50", "bound_s")
KIND_COLOR = {"psring": "tab:red", "echo": "tab:gray", "bsp": "tab:blue", "floor": "tab:blue"}
KIND_LABEL = {"psring": "psring", "echo": "echo floor", "bsp": "BSP floor", "floor": "raw floor"}
TARGET = 1.10  # issue #29's step / bound


def load_overlap_floor(folder: Path) -> pd.DataFrame | None:
    """``folder/overlap_floor.csv``, or None; a file without its columns is a one-line ValueError."""
    return load_csv(folder, "overlap_floor.csv", COLUMNS)


def load_reduce_floor(folder: Path) -> pd.DataFrame | None:
    """``folder/reduce_floor.csv``, or None; a file without its columns is a one-line ValueError."""
    return load_csv(folder, "reduce_floor.csv", REDUCE_COLUMNS)


def figure_reduce_floor(df: pd.DataFrame):
    return figure_overlap_floor(df.rename(columns={"partition_bytes": "chunk_bytes"}),
                                "all-reduce's overlapped step: psring against raw gloo floors")


def figure_overlap_floor(df: pd.DataFrame,
                         title: str = "the PS's overlapped step: psring against raw floors of the same schedule"):
    df = df.assign(over=df["step_s_p50"] / df["bound_s"])
    modes = list(dict.fromkeys(df["mode"]))
    bars = max(df[df["mode"] == m].groupby(["kind", "chunk_bytes"]).ngroups for m in modes)
    fig, axes = new_figure(max(4.2, 0.55 * bars) * len(modes) + 0.6, 3.6, ncols=len(modes), sharey=True)
    for ax, mode in zip(axes[0], modes):
        g = df[df["mode"] == mode].groupby(["kind", "chunk_bytes"])["over"].agg(["median", "min", "max"])
        g = g.reindex(sorted(g.index, key=lambda k: (list(KIND_COLOR).index(k[0]), k[1])))
        x = range(len(g))
        ax.bar(x, g["median"], color=[KIND_COLOR.get(k, "k") for k, _ in g.index],
               yerr=[g["median"] - g["min"], g["max"] - g["median"]], capsize=3)
        ax.set_xticks(list(x), [f"{KIND_LABEL.get(k, k)}\n{fmt_bytes(c)}" for k, c in g.index], fontsize=7)
        for y, style, text in ((1.0, "-", "bound"), (TARGET, "--", f"{TARGET:.2f}x")):
            ax.axhline(y, color="k", linestyle=style, linewidth=0.8)
            ax.text(len(g) - 0.5, y, text, fontsize=7, ha="right", va="bottom")
        ax.set_title(f"--overlap {mode}")
        ax.set_ylim(0.9, max(1.35, float(g["max"].max()) + 0.03))
    axes[0][0].set_ylabel("step time / its bound")
    fig.suptitle(title, fontsize=9)
    return fig
