"""Step time against compute:comm, one line per ``--overlap`` mode beside its bound (issue #29's figure).

compute:comm is the run's emulated forward+backward over its strategy's own no-overlap communication
bound (``bounds.bound_s``), so the PS and the ring sit at the same x although their compute differs.
One panel per strategy (and N, S) that was run at more than one ratio; a dashed line of the mode's colour
is its bound (``overlap_model.step_bound``), a hollow marker a CPU-saturated run.
"""
from __future__ import annotations

import pandas as pd

from ..bounds import with_bounds
from ..strategies import OVERLAPS, attr, uses_servers
from ..train.compute_spec import parse_compute
from .common import is_num, new_figure, note_hollow, order_key, plot_measured, saturated

MODE_COLORS = dict(zip(OVERLAPS, ("tab:gray", "tab:blue", "tab:red")))  # none, backward, full


def overlap_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs with an emulated compute and a bound, with ``ratio`` (compute:comm) and ``panel``."""
    df = with_bounds(runs) if "step_bound_s" not in runs else runs.copy()
    df = df[df["step_bound_s"].map(is_num) & df["bound_s"].map(is_num) & df["step_s_p50"].map(is_num)]
    if "status" in df:
        df = df[df["status"] == "ok"]
    if "link_tuning" in df:  # the PS's told-link runs (its probed ones are a table's rows, not a line here)
        hidden = (df["link_tuning"].fillna("auto") == "probe") & df["sync"].map(uses_servers)
        df = df[~hidden]
    df = df.copy()
    df["ratio"] = [parse_compute(c) / 1000 / b for c, b in zip(df["compute"], df["bound_s"])]
    df["panel"] = [panel_label(r) for _, r in df.iterrows()]
    return df


def panel_label(r) -> str:
    s = f"{attr(r['sync'], 'label', r['sync'])}, N={int(r['workers'])}"
    if uses_servers(r["sync"]):
        s += f", S={int(r['servers'])}"
    return s + (f", {r['link_rate']}" if isinstance(r.get("link_rate"), str) else "")


def grid_panels(df: pd.DataFrame) -> list[str]:
    """The panels of an ``overlap_table`` run at more than one compute:comm (to 2 decimals: a run's own chunk
    moves its comm bound a little), in strategy order."""
    panels = [p for p, g in df.groupby("panel") if g["ratio"].round(2).nunique() > 1]
    return sorted(panels, key=lambda p: order_key(df[df["panel"] == p]["sync"].iloc[0]))


def has_overlap_grid(runs: pd.DataFrame) -> bool:
    """Whether a run table holds some strategy's modes at more than one compute:comm."""
    if not {"overlap", "compute", "step_s_p50", "net"} <= set(runs.columns) or runs["overlap"].nunique() < 2:
        return False
    return bool(grid_panels(overlap_table(runs)))


def figure_overlap(runs: pd.DataFrame):
    df = overlap_table(runs)
    panels = grid_panels(df)
    fig, axes = new_figure(5.2 * len(panels), 4.2, ncols=len(panels), sharey=False)
    for ax, p in zip(axes[0], panels):
        g = df[df["panel"] == p]
        for mode, color in MODE_COLORS.items():
            m = g[g["overlap"] == mode].sort_values("ratio")
            if m.empty:
                continue
            plot_measured(ax, m["ratio"], m["step_s_p50"], saturated(m), color, f"--overlap {mode}")
            ax.plot(m["ratio"], m["step_bound_s"], linestyle="--", color=color, alpha=0.7,
                    label=f"{mode}: bound")
        ax.set_title(p)
        ax.set_xlabel("compute : comm (over its own no-overlap comm bound)")
        ax.set_ylabel("median step time (s)")
        ax.grid(alpha=0.3)
    if any(saturated(df)):
        note_hollow(axes[0][0])
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Step time by overlap mode: measured (solid) against each mode's bound (dashed)")
    return fig
