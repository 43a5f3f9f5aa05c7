"""``psring compare``'s picture: sync time per step against N for every series of the emulated
comparison (all-reduce, PS with one server, PS with S = N), each beside its α-β model."""
from __future__ import annotations

import pandas as pd

from ..compress.spec import NONE
from ..strategies import uses_servers
from .common import PS_COLORS, SERIES_COLORS, new_figure
from .topology import has_topology


def has_compare(runs: pd.DataFrame) -> bool:
    """A table of ``psring compare``'s shape: emulated runs at several N over one link rate, with a
    strategy that has servers and one that has not (and no codecs, no hosts of several workers)."""
    if "net" not in runs or "bound_s" not in runs:
        return False
    df = runs[(runs["workers"] > 1) & (runs["net"] == "emulated")]
    if df.empty or df["workers"].nunique() < 2 or df["link_rate"].nunique() != 1:
        return False
    if df.get("compress", pd.Series(dtype=str)).fillna(NONE).nunique() > 1 or has_topology(df):
        return False
    servers = df["sync"].map(uses_servers)
    return bool(servers.any() and (~servers).any())


def figure_compare(runs: pd.DataFrame):
    """``runs``: ``psring compare``'s table with ``bounds.with_bounds``' columns."""
    from ..compare import series

    df = runs[runs["workers"] > 1].assign(series=[series(r) for r in runs[runs["workers"] > 1].to_dict("records")])
    fig, axes = new_figure(6.4, 4.2)
    ax = axes[0, 0]
    ps_lines = 0
    for name, g in df.groupby("series", sort=False):
        g = g.sort_values("workers")
        if uses_servers(g["sync"].iloc[0]):
            color, ps_lines = PS_COLORS[ps_lines % len(PS_COLORS)], ps_lines + 1
        else:
            color = SERIES_COLORS.get(g["sync"].iloc[0], "black")
        ax.plot(g["workers"], 1e3 * g["sync_s_p50"], "o-", color=color, label=f"{name}: measured")
        if g["bound_s"].notna().any():
            ax.plot(g["workers"], 1e3 * g["bound_s"], "--", color=color, alpha=0.7, label=f"{name}: model")
    ax.set_xlabel("workers N")
    ax.set_ylabel("sync time per step (ms, median)")
    ax.set_xticks(sorted(df["workers"].unique()))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    rate = df["link_rate"].iloc[0] if "link_rate" in df else "?"
    ax.set_title(f"one server's link carries N·M; the ring's 2(N−1)/N·M ({rate} links)", fontsize=10)
    return fig
