"""The server-count curve (BytePS, OSDI'20): PS sync time at one N against the number of servers S,
beside its bound max(M/B, N*M/(S*B)) (pipelined, ``bounds``) and the ring's measured time and bound."""
from __future__ import annotations

import pandas as pd

from ..bounds import with_bounds
from ..costmodel import RING_MODEL, Link
from ..strategies import REGISTRY, get
from .common import new_figure, plot_measured, saturated


def _server_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows of the first strategy with servers (registry order) that ``runs`` holds (ps)."""
    present = [n for n, s in REGISTRY.items() if s.servers and (runs["sync"] == n).any()]
    return runs[runs["sync"] == present[0]] if present else runs.iloc[:0]


def has_server_curve(runs: pd.DataFrame) -> bool:
    """A sweep of ps runs at one N with at least three values of S."""
    ps = _server_rows(runs[runs["status"] == "ok"] if "status" in runs else runs)
    return ps["workers"].nunique() == 1 and ps["servers"].nunique() >= 3


def figure_servers(runs: pd.DataFrame, calibration: Link | None = None):
    """Sync time vs S for the ps runs (measured, and their bound dashed); the ring's as lines."""
    df = with_bounds(runs[runs["status"] == "ok"] if "status" in runs else runs,
                     calibration.alpha_s if calibration else 0.0)
    ps = _server_rows(df).sort_values("servers")
    n = int(ps["workers"].iloc[0])
    fig, axes = new_figure(7, 4.6)
    ax = axes[0][0]
    # the ring: the first strategy (registry order) timed apart whose cost model is the ring's, with runs at N
    rings = [r for name, s in REGISTRY.items() if s.cost_model == RING_MODEL and s.sync_timed
             and len(r := df[(df["sync"] == name) & (df["workers"] == n)])]
    ring = rings[0] if rings else df.iloc[:0]
    name = ps["sync"].iloc[0]
    red = get(name).color
    blue = get(ring["sync"].iloc[0]).color if len(ring) else None
    plot_measured(ax, ps["servers"], ps["sync_s_p50"], saturated(ps), red,
                  f"{name}, measured (median sync time)")
    ax.plot(ps["servers"], ps["bound_s"], color=red, linestyle="--",
            label=f"{name} bound: 2α + max(M/B, N·M/(S·B))·(1 + 1/k)")
    if len(ring):
        ax.axhline(ring["sync_s_p50"].iloc[0], color=blue, label="ring all-reduce, measured")
        ax.axhline(ring["bound_s"].iloc[0], color=blue, linestyle="--", label="ring bound: 2(N−1)α + 2(N−1)/N·M/B")
    ax.set_xscale("log", base=2)
    ticks = [int(s) for s in ps["servers"]]
    ax.set_xticks(ticks, [str(s) for s in ticks])
    ax.set_xlabel(f"PS servers S (N = {n} workers)")
    ax.set_ylabel("sync time per step (s)")
    ax.set_ylim(0, max(ps["sync_s_p50"].max(), ps["bound_s"].max()) * 1.1)
    r = ps.iloc[0]
    ax.set_title(f"Server count at N = {n}, emulated {r.get('link_rate', '')} links")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig
