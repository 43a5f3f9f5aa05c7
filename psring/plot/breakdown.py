"""Where a step's time goes: stacked median phase times per strategy and N, from a run table."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..strategies import attr, uses_servers
from .common import PHASE_COLORS, is_num, new_figure, order_key, setting_key, spread_baselines, varying

PS_PARTS = ["push", "wait", "pull"]
PART_LABELS = {"push": "sync: push (hand to ZeroMQ)", "wait": "sync: wait (transfer, slowest worker, server update)",
               "pull": "sync: pull (copy parameters in)"}


def phase_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Median ms per step of each phase, one row per run (``label`` says which), in plotting order.
    ``sync`` is split into the PS's push/wait/pull where recorded, in proportion to their shares of the
    sync time (the parts of one step add up to its sync time; their medians need not)."""
    runs = runs.copy()
    runs["_order"] = runs["sync"].map(order_key)
    sort = ["_order", "sync", "workers"] + (["servers"] if "servers" in runs else [])
    runs = runs.sort_values(sort, kind="stable")
    rows = []
    for _, r in runs.iterrows():
        row = {p: float(r[f"{p}_s_p50"]) * 1e3 if is_num(r.get(f"{p}_s_p50")) else 0.0
               for p in ("data", "forward", "backward", "sync", "update")}
        shares = [r.get(f"share_{p}") for p in PS_PARTS]
        if all(is_num(x) for x in shares) and is_num(r.get("share_sync")) and r["share_sync"] > 0:
            for p, sh in zip(PS_PARTS, shares):
                row[p] = row["sync"] * float(sh) / float(r["share_sync"])
            row["sync"] = 0.0
        else:
            row.update({p: 0.0 for p in PS_PARTS})
        row["step"] = float(r["step_s_p50"]) * 1e3 if is_num(r.get("step_s_p50")) else float("nan")
        # a strategy whose communication runs inside backward (DDP's) has no sync time of its own
        row["sync_missing"] = not attr(r["sync"], "sync_timed", True) or not is_num(r.get("sync_s_p50"))
        row["label"] = bar_label(r)
        rows.append(row)
    return pd.DataFrame(rows).reset_index(drop=True)


def bar_label(r) -> str:
    s = f"{attr(r['sync'], 'label', r['sync'])}\nN={int(r['workers'])}"
    if uses_servers(r["sync"]) and is_num(r.get("servers")):
        s += f", S={int(r['servers'])}"
    return s


def draw_breakdown(ax, table: pd.DataFrame, legend: bool = True) -> None:
    x = list(range(len(table)))
    bottom = pd.Series(0.0, index=table.index)
    for p in ["data", "forward", "backward", "sync", *PS_PARTS, "update"]:
        if not (table[p] > 0).any():
            continue
        ax.bar(x, table[p], bottom=bottom, width=0.65, color=PHASE_COLORS[p], label=PART_LABELS.get(p, p),
               hatch="//" if p in PS_PARTS else None, edgecolor="white", linewidth=0.5)
        bottom += table[p]
    ax.scatter(x, table["step"], marker="_", s=500, color="black", linewidths=2, zorder=3,
               label="median step time")
    top = max(float(bottom.max()), float(table["step"].max()))
    for i, r in table.iterrows():
        ax.annotate(f"{r['step']:.1f}", (i, max(r["step"], bottom[i])), xytext=(0, 4),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8)
        if r["sync_missing"]:
            ax.annotate("sync inside\nbackward", (i, bottom[i] / 2), ha="center", va="center", fontsize=7,
                        color="white")
    ax.set_xticks(x, list(table["label"]), fontsize=8)
    ax.set_ylabel("median time per step (ms)")
    ax.set_ylim(0, top * 1.15)
    ax.grid(axis="y", alpha=0.3)
    if legend:  # outside, right of the bars, so that it hides none of them
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), reverse=True)


def figure_breakdown(runs: pd.DataFrame, title: str | None = None):
    """Stacked bars per run; one panel per value of any other setting that varies (e.g. link rate), each
    with its runs' baseline (none at N = 1)."""
    runs = spread_baselines(runs)
    vary = varying(runs)
    groups = sorted(runs.groupby(vary), key=lambda kv: [setting_key(v) for v in np.atleast_1d(kv[0])]) \
        if vary else [((), runs)]
    width = max(6.0, 1.2 + 0.85 * max(len(g) for _, g in groups)) + 3.2  # + the legend
    fig, axes = new_figure(width, 5.2 if len(groups) == 1 else 1.0 + 3.6 * len(groups), nrows=len(groups))
    for ax, (key, g) in zip(axes[:, 0], groups):
        draw_breakdown(ax, phase_table(g), legend=ax is axes[0, 0])
        if vary:
            key = key if isinstance(key, tuple) else (key,)
            ax.set_title(", ".join(f"{k} = {v}" for k, v in zip(vary, key)), fontsize=10)
    fig.suptitle(title or "Step-time breakdown per strategy and N: median of each phase, warm-up excluded")
    return fig
