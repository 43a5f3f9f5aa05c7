"""PS against the ring at several N with communication overlapped (``experiments/scale_overlap.toml``, replayed
by ``psring simulate``).

* ``scale_overlap``: scaling efficiency against N, a panel per link rate, a colour per arrangement (``scale``'s)
  and a line style per ``--overlap`` mode: how much of each design's communication the overlap hides as N grows.
"""
from __future__ import annotations

import pandas as pd

from ..strategies import OVERLAPS, is_baseline
from .common import efficiency_axes, new_figure
from .scale import STYLE, _order, scale_table

MODES = dict(zip(OVERLAPS, (":", "--", "-")))  # none dotted, backward dashed, full solid


def has_scale_overlap(runs: pd.DataFrame) -> bool:
    """A replayed sweep over N whose communicating runs differ in ``--overlap`` mode."""
    need = {"simulated", "overlap", "link_rate", "efficiency", "workers", "sync"}
    if not need <= set(runs.columns):
        return False
    talking = runs[(runs["workers"] > 1) & ~runs["sync"].map(is_baseline)]
    return runs["simulated"].fillna(False).astype(bool).any() and talking["overlap"].nunique() > 1 and \
        runs["workers"].nunique() >= 3


def figure_scale_overlap(runs: pd.DataFrame):
    df = scale_table(runs)
    rates = sorted(df["rate_gbit"].unique())
    fig, axes = new_figure(4.4 * len(rates) + 1.8, 3.8, ncols=len(rates), sharey=True)
    for ax, rate in zip(axes[0], rates):
        cell = df[df["rate_gbit"] == rate]
        for (name, mode), g in sorted(cell.groupby(["arrangement", "overlap"]),
                                      key=lambda kv: (_order(kv[0][0]), list(MODES).index(kv[0][1]))):
            color, marker = STYLE.get(name, ("tab:gray", "x"))
            ax.plot(g["workers"], g["efficiency"], MODES.get(mode, "-."), color=color, marker=marker,
                    markersize=3, label=f"{name}, {mode}")
        efficiency_axes(ax, f"{rate:g} Gbit/s")
    axes[0][0].set_ylabel("scaling efficiency")
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle("--overlap none (dotted), backward (dashed), full (solid), replayed", fontsize=11)
    return fig
