"""Gradient codecs at several N on the ring (``experiments/scale_codecs.toml``, replayed by ``psring simulate``).

* ``scale_codecs``: scaling efficiency against N, a panel per link rate, a colour per codec: an all-gathered
  encoding's bytes grow with N, the ring's do not ((N - 1) x e against 2(N - 1)/N x M: equal at N = 2M/e, 64 for
  1-bit, 100 for top-k 1%); ``behind`` says from which N each codec is slower than none.
"""
from __future__ import annotations

import pandas as pd

from ..compress.spec import NONE
from ..strategies import is_baseline
from .common import efficiency_axes, new_figure
from .scale import scale_table

COLORS = {NONE: "black", "fp16": "tab:blue", "bf16": "tab:cyan", "onebit": "tab:red", "topk": "tab:green",
          "randomk": "tab:olive"}


def has_scale_codecs(runs: pd.DataFrame) -> bool:
    """A replayed sweep over N whose communicating runs differ in ``--compress``."""
    need = {"simulated", "compress", "link_rate", "efficiency", "workers", "sync"}
    if not need <= set(runs.columns):
        return False
    talking = runs[(runs["workers"] > 1) & ~runs["sync"].map(is_baseline)]
    return runs["simulated"].fillna(False).astype(bool).any() and talking["compress"].fillna(NONE).nunique() > 1 \
        and talking["workers"].nunique() >= 3


def behind(df: pd.DataFrame) -> pd.DataFrame:
    """Per rate and codec, the first N at which it is slower than the uncompressed ring (NaN: never here)."""
    rows = []
    for (rate, codec), g in df.groupby(["rate_gbit", "compress"]):
        if codec == NONE:
            continue
        base = df[(df["rate_gbit"] == rate) & (df["compress"] == NONE)].set_index("workers")["efficiency"]
        mine = g.set_index("workers")["efficiency"]
        slower = [n for n in sorted(mine.index) if n in base.index and mine[n] < base[n]]
        rows.append({"rate_gbit": rate, "compress": codec, "behind_from": slower[0] if slower else float("nan")})
    return pd.DataFrame(rows)


def figure_scale_codecs(runs: pd.DataFrame):
    df = scale_table(runs).assign(compress=lambda d: d["compress"].fillna(NONE))
    rates = sorted(df["rate_gbit"].unique())
    fig, axes = new_figure(4.4 * len(rates) + 1.6, 3.8, ncols=len(rates), sharey=True)
    for ax, rate in zip(axes[0], rates):
        cell = df[df["rate_gbit"] == rate]
        for codec, g in sorted(cell.groupby("compress"), key=lambda kv: (kv[0] != NONE, kv[0])):
            color = COLORS.get(codec.partition(":")[0], "tab:gray")
            ax.plot(g["workers"], g["efficiency"], "-", color=color, marker="o", markersize=3, label=codec)
        efficiency_axes(ax, f"ring all-reduce, {rate:g} Gbit/s")
    axes[0][0].set_ylabel("scaling efficiency")
    axes[0][-1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5), title="--compress")
    fig.suptitle("codecs' bytes at scale, replayed (encode and decode free)", fontsize=11)
    return fig
