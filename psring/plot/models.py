"""Models figure (``experiments/models.toml``): the same strategies on the same emulated cluster for
several models. Left, each strategy's median sync time per model beside its α-β bound (log scale: ViT's
M is 7.7 times ResNet-18's); right, the same times over each model's M/B, the link time of one model's
gradients: where every model's bar has the same height, the strategy's cost is its bytes alone, and what
sticks out is what the model's tensors add (per-message costs of many small tensors, bucket counts)."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.patches import Patch

from ..bounds import gradient_bytes, is_num, per_host, with_bounds
from ..costmodel import TCP_GOODPUT, Link
from ..strategies import attr, is_baseline, uses_servers
from .common import HOLLOW_NOTE, new_figure, order_key, saturated


def has_models(runs: pd.DataFrame) -> bool:
    """A sweep that ran several models (``model`` varies among its runs) on an emulated cluster, whose link
    rate gives each run its bound (results/gpu's several models ran on loopback: no link to bound them)."""
    emulated = "net" not in runs or (runs["net"] == "emulated").any()  # (a loopback baseline may sit beside)
    return "model" in runs and runs["model"].nunique() > 1 and emulated


def label(row) -> str:
    name = attr(row["sync"], "label", row["sync"])
    g = per_host(row)
    if uses_servers(row["sync"]):
        return f"{name} S={int(row['servers'])}"
    return f"{name} ({int(row['workers']) // g} hosts × {g})" if g > 1 else name


def models_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs that communicate, with ``label``, ``bound_s``, ``over_bound``, ``m_bytes`` (each model's M,
    from the run's own bytes: ``bounds.gradient_bytes`` per model) and ``sync_over_link`` (sync time over
    that M's time on one link, M/B)."""
    df = runs[(runs["workers"] > 1) & ~runs["sync"].map(is_baseline)]
    if "status" in df:
        df = df[df["status"] == "ok"]
    df = with_bounds(df)
    df["label"] = [label(r) for _, r in df.iterrows()]
    df["m_bytes"] = df["model"].map({k: gradient_bytes(g) or np.nan for k, g in df.groupby("model")})
    b = [Link.from_rate(r["link_rate"], 0.0, TCP_GOODPUT).bandwidth_Bps for _, r in df.iterrows()]
    df["sync_over_link"] = df["sync_s_p50"] / (df["m_bytes"] / b)
    df["order"] = [order_key(s) * 100 + (int(r["servers"]) if uses_servers(s) else 0) + per_host(r) * 10
                   for s, (_, r) in zip(df["sync"], df.iterrows())]
    return df.sort_values(["order", "m_bytes"]).reset_index(drop=True)


def figure_models(runs: pd.DataFrame):
    df = models_table(runs)
    models = list(dict.fromkeys(df.sort_values("m_bytes")["model"]))
    labels = list(dict.fromkeys(df["label"]))
    fig, axes = new_figure(14, 5, ncols=2)
    width = 0.8 / len(models)
    handles: list = []
    shades = [1.0, 0.65, 0.35]  # one per model, lightest the largest: the bar's colour is its strategy's
    for k, (col, ax, ylabel) in enumerate([("sync_s_p50", axes[0][0], "sync time per step (s, log)"),
                                            ("sync_over_link", axes[0][1], "sync time / (M/B)")]):
        for j, m in enumerate(models):
            rows = df[df["model"] == m].set_index("label").reindex(labels)
            x = np.arange(len(labels)) + (j - (len(models) - 1) / 2) * width
            colors = [attr(s, "color", "tab:gray") if isinstance(s, str) else "none" for s in rows["sync"]]
            sat = saturated(rows.fillna({"cpu_saturated": False}))
            shade = shades[j % len(shades)]
            ax.bar(x, rows[col], width, color=[c if not s else "none" for c, s in zip(colors, sat)],
                   edgecolor=colors, alpha=shade)
            if k == 0:
                handles.append(Patch(color="dimgray", alpha=shade,
                                     label=f"{m} (M = {rows['m_bytes'].dropna().iloc[0] / 1e6:.1f} MB)"))
            bound = rows["bound_s"] if col == "sync_s_p50" else rows["bound_s"] / rows["sync_s_p50"] * rows[col]
            mark = ax.scatter(x, bound, color="black", marker="_", s=120, zorder=3, label="α-β bound")
            if k == 1:
                for xi, r in zip(x, rows.itertuples()):
                    if is_num(r.over_bound):
                        ax.annotate(f"{r.over_bound:.2f}", (xi, max(r.sync_over_link, r.sync_over_link / r.over_bound)),
                                    xytext=(0, 2), textcoords="offset points", ha="center", fontsize=6, rotation=90)
        ax.set_xticks(np.arange(len(labels)), labels, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_yscale("log")
    r0 = df.iloc[0]
    axes[0][0].set_title(f"N = {int(r0['workers'])}, emulated {r0['link_rate']} links: measured beside the bound")
    axes[0][1].set_title("over each model's M/B (measured / bound above the bars)")
    axes[0][0].legend(handles=[mark, *handles], fontsize=7, title=HOLLOW_NOTE if any(saturated(df)) else None,
                      title_fontsize=7)
    return fig
