"""Topology figures (``experiments/topology.toml``): hosts of G workers behind one link each. Left,
every arrangement's measured sync time beside its α-β bound (flat ring, hierarchical, PS dedicated with
S servers, colocated, mixed); right, BytePS's k-server curve: the PS with a server on every worker host
plus k dedicated ones, measured against ``costmodel.ps_unified`` (k = 0: colocated only; k = H: the
dedicated PS with S = H)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..bounds import gradient_bytes, host_link_bytes, is_num, per_host, with_bounds
from ..bounds import placement_of as placement
from ..costmodel import TCP_GOODPUT, Link, ps_unified
from ..strategies import attr, is_baseline, uses_servers
from ..topology import colocated_servers
from .common import HOLLOW_NOTE, new_figure, saturated


def has_topology(runs: pd.DataFrame) -> bool:
    """A sweep with hosts of several workers (``workers_per_host`` > 1)."""
    return "workers_per_host" in runs and (pd.to_numeric(runs["workers_per_host"], errors="coerce") > 1).any()


def dedicated_servers(row) -> int:
    """k, a PS row's servers on hosts of their own (mixed: S - H; dedicated: S; colocated: 0)."""
    h, s = int(row["workers"]) // per_host(row), int(row["servers"])
    return s - colocated_servers(placement(row), h, s)


def label(row) -> str:
    name = attr(row["sync"], "label", row["sync"])
    if not uses_servers(row["sync"]):
        return name
    return {"dedicated": f"{name} S={int(row['servers'])}", "colocated": f"{name} colocated",
            "mixed": f"{name} colocated + k={dedicated_servers(row)}"}[placement(row)]


def topology_table(runs: pd.DataFrame, alpha_s: float = 0.0) -> pd.DataFrame:
    """The multi-worker rows with ``label``, ``bound_s``, ``over_bound``, ``link_bound`` and, for the PS,
    ``k`` (dedicated servers), ordered by their bound."""
    df = runs[(runs["workers"] > 1) & ~runs["sync"].map(is_baseline)]
    if "status" in df:
        df = df[df["status"] == "ok"]
    df = with_bounds(df, alpha_s)
    df["label"] = [label(r) for _, r in df.iterrows()]
    df["k"] = [dedicated_servers(r) if uses_servers(r["sync"]) else np.nan for _, r in df.iterrows()]
    m = gradient_bytes(df) or float("nan")
    df["link_bytes_model"] = [host_link_bytes(r, m) for _, r in df.iterrows()]
    return df.sort_values("bound_s").reset_index(drop=True)


def figure_topology(runs: pd.DataFrame, calibration: Link | None = None):
    df = topology_table(runs, calibration.alpha_s if calibration else 0.0)
    fig, axes = new_figure(13, 5, ncols=2, width_ratios=[1.6, 1])
    ax = axes[0][0]
    x = np.arange(len(df))
    sat = saturated(df)
    colors = [attr(s, "color", "tab:gray") for s in df["sync"]]
    ax.bar(x, df["sync_s_p50"], color=[c if not s else "none" for c, s in zip(colors, sat)], edgecolor=colors)
    ax.bar([], [], color="lightgray", label="measured (median sync time; colour: strategy)")
    ax.scatter(x, df["bound_s"], color="black", marker="_", s=600, zorder=3, label="α-β bound (cost model)")
    for i, r in df.iterrows():
        if is_num(r["over_bound"]):
            top = max(r["sync_s_p50"], r["bound_s"])
            ax.annotate(f"{r['over_bound']:.2f}×", (i, top), xytext=(0, 3), textcoords="offset points",
                        ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, df["label"], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("sync time per step (s)")
    r0 = df.iloc[0]
    g = per_host(r0)
    ax.set_title(f"N = {int(r0['workers'])} workers on {int(r0['workers']) // g} hosts × {g}, "
                 f"host links {r0.get('link_rate', '')} (measured / bound above each bar)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, title=HOLLOW_NOTE if any(sat) else None, title_fontsize=7)
    _unified_curve(axes[0][1], df, calibration)
    return fig


def _unified_curve(ax, df: pd.DataFrame, calibration: Link | None) -> None:
    """BytePS's curve: sync time against k dedicated servers beside the H colocated ones."""
    dedicated = df.apply(placement, axis=1) == "dedicated"
    ps = df[df["sync"].map(uses_servers) & ~dedicated]
    r0 = df.iloc[0]
    n, g = int(r0["workers"]), per_host(r0)
    h = n // g
    link = Link.from_rate(r0["link_rate"], calibration.alpha_s if calibration else 0.0, TCP_GOODPUT)
    m = gradient_bytes(df) or float("nan")
    ks = np.linspace(0, h, 50)
    ax.plot(ks, [ps_unified(h, k, m, link, g) for k in ks], color="black", linestyle="--",
            label="model: 2α + 2n(n−1)/(n²+kn−2k)·G·M/B (no fill/drain)")
    ded = df[df["sync"].map(uses_servers) & dedicated & (df["servers"] == h)]
    pts = pd.concat([ps, ded]).sort_values("k")
    ax.plot(pts["k"], pts["sync_s_p50"], marker="o", color=attr("ps", "color", "tab:red"),
            label="ps, measured (k = H: dedicated S = H)")
    ax.set_xlabel(f"dedicated server hosts k (+ one server on each of the {h} worker hosts)")
    ax.set_ylabel("sync time per step (s)")
    ax.set_title("BytePS's split: colocated + k dedicated servers")
    ax.set_ylim(0, None)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
