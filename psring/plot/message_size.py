"""Sync time and bandwidth vs message size, from a ``psring bench`` output (``bench.csv``)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

from ..bench.cli import FLOOR_OF, RAW_LABELS
from ..costmodel import STRATEGIES, Link
from ..strategies import attr, uses_servers
from .common import fmt_bytes, is_num, new_figure, server_colors, strategy_color, strategy_order


def _bench_rows() -> tuple[list[str], dict[str, str]]:
    """bench.csv's ``strategy`` values in plotting order (each benchable strategy in plot order, then its
    raw transport and that one's floor), and raw transport or floor -> the first strategy it is timed
    beside, whose colour it is drawn in."""
    order, raw_of = [], {}
    for name in strategy_order():
        raw = attr(name, "bench_raw")
        if raw is None:
            continue
        for r in (name, raw, *([FLOOR_OF[raw]] if raw in FLOOR_OF else [])):
            if r not in order:
                order.append(r)
            if r != name:
                raw_of.setdefault(r, name)
    return order, raw_of


def load_bench(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    return pd.read_csv(path / "bench.csv" if path.is_dir() else path)


def bench_series(bench: pd.DataFrame) -> list[tuple[str, dict, pd.DataFrame]]:
    """``(label, style, rows)`` per (strategy, N, S), raw transports dashed in their strategy's colour."""
    many_n = bench["workers"].nunique() > 1
    order, raw_of = _bench_rows()
    with_servers = bench["strategy"].map(lambda s: uses_servers(raw_of.get(s, s))).astype(bool)
    ps_servers = sorted(int(s) for s in bench.loc[with_servers, "servers"].dropna().unique())
    out = []
    keys = bench[["strategy", "workers", "servers"]].drop_duplicates()
    keys = keys.assign(_o=keys["strategy"].map(lambda s: order.index(s) if s in order else 99))
    for _, k in keys.sort_values(["_o", "workers", "servers"]).iterrows():
        strat, n, s = k["strategy"], int(k["workers"]), k["servers"]
        rows = bench[(bench["strategy"] == strat) & (bench["workers"] == n)
                     & (bench["servers"].fillna(-1) == (s if is_num(s) else -1))].sort_values("size_bytes")
        rows = rows.drop_duplicates("size_bytes")  # a raw transport timed beside two strategies: the first
        base = raw_of.get(strat, strat)
        raw = strat in raw_of
        label = RAW_LABELS.get(strat, strat) if raw else f"{strat} (synchronizer)"
        if uses_servers(base) and is_num(s):
            label += f", S={int(s)}"
            colors = server_colors(base)
            color = colors[ps_servers.index(int(s)) % len(colors)]
        else:
            color = strategy_color(base)
        if many_n:
            label += f", N={n}"
        style = {"color": color, "marker": "s" if raw else "o",
                 "linestyle": ":" if strat in FLOOR_OF.values() else "--" if raw else "-",
                 "fillstyle": "none" if raw else "full", "markersize": 5}
        out.append((label, style, rows))
    return out


def model_time(strategy: str, n: int, servers, sizes, link: Link) -> list[float]:
    """The cost model's sync time for the synchronizer ``strategy`` at each size (s): its registry
    ``cost_model``, the PS's sequential formula (one server where ``servers`` is unknown)."""
    model = STRATEGIES[attr(strategy, "cost_model")]
    return [model(n, m, link, servers=int(servers) if is_num(servers) else None) for m in sizes]


def plain_log_y(ax) -> None:
    """Log y axis labelled 1, 2, 5, 10 ... instead of 10^0, 2x10^0."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def figure_one_size(bench: pd.DataFrame, title: str | None = None):
    """A bench of a single message size (e.g. a model's gradient set): bars of time, algbw and busbw."""
    fig, axes = new_figure(13, 4.6, ncols=3)
    series = bench_series(bench)
    x = list(range(len(series)))
    for ax, col, scale, ylabel in zip(axes[0], ["time_s", "algbw_GBps", "busbw_GBps"], [1e3, 1, 1],
                                      ["time per sync, median (ms)", "algbw = M / time (GB/s)", "busbw (GB/s)"]):
        vals = [float(rows[col].iloc[0]) * scale for _, _, rows in series]
        ax.bar(x, vals, color=[st["color"] for _, st, _ in series],
               hatch=None, alpha=0.9, edgecolor="black", linewidth=0.5)
        for i, ((_, st, _), v) in enumerate(zip(series, vals)):
            if st["linestyle"] == "--":
                ax.patches[i].set_hatch("//")
                ax.patches[i].set_facecolor("white")
                ax.patches[i].set_edgecolor(st["color"])
            ax.annotate(f"{v:.3g}", (i, v), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8)
        ax.set_xticks(x, [label.replace(" (synchronizer)", "\n(synchronizer)") for label, _, _ in series],
                      fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, max(vals) * 1.15)
        ax.grid(axis="y", alpha=0.3)
    size = int(bench["size_bytes"].iloc[0])
    n = ", ".join(str(int(v)) for v in sorted(bench["workers"].unique()))
    fig.suptitle(title or f"Synchronizer vs raw transport at one message size: M = {fmt_bytes(size)} "
                 f"({size:,d} B), N = {n} (raw transports hatched)")
    return fig


def figure_message_size(bench: pd.DataFrame, calibration: Link | None = None, title: str | None = None,
                        calibration_note: str = ""):
    """Three panels over message size (log axes): time per sync, algbw, busbw. A bench of one size
    gives bars instead (``figure_one_size``)."""
    if bench["size_bytes"].nunique() == 1:
        return figure_one_size(bench, title)
    fig, axes = new_figure(15, 4.8, ncols=3)
    ax_t, ax_a, ax_b = axes[0]
    for label, style, rows in bench_series(bench):
        x = rows["size_bytes"]
        ax_t.plot(x, rows["time_s"] * 1e3, label=label, **style)
        if "time_p90" in rows and rows["time_p90"].map(is_num).all():
            ax_t.fill_between(x, rows["time_s"] * 1e3, rows["time_p90"] * 1e3, color=style["color"], alpha=0.12,
                              linewidth=0)
        ax_a.plot(x, rows["algbw_GBps"], label=label, **style)
        ax_b.plot(x, rows["busbw_GBps"], label=label, **style)
        strat = rows["strategy"].iloc[0]
        if calibration is not None and attr(strat, "cost_model"):  # a strategy's rows, not a raw transport's
            sizes = sorted(x)
            t = model_time(strat, int(rows["workers"].iloc[0]), rows["servers"].iloc[0], sizes, calibration)
            ax_t.plot(sizes, [v * 1e3 for v in t], color=style["color"], linestyle=":", linewidth=1.5,
                      label=f"cost model: {label.replace(' (synchronizer)', '')}")
    if calibration is not None and calibration_note:
        ax_t.plot([], [], " ", label=calibration_note)
    sizes = sorted(bench["size_bytes"].unique())
    for a in (ax_t, ax_a, ax_b):
        a.set_xscale("log")
        plain_log_y(a)
        a.xaxis.set_major_locator(FixedLocator(sizes))
        a.xaxis.set_minor_locator(NullLocator())
        a.set_xticklabels([fmt_bytes(s) for s in sizes], rotation=45, ha="right", fontsize=8)
        a.set_xlabel("message size M per worker (bytes)")
        a.grid(alpha=0.3, which="both")
    n = ", ".join(str(int(v)) for v in sorted(bench["workers"].unique()))
    ax_t.set_ylabel("time per sync, median (ms; band to p90)")
    ax_t.set_title("Time to synchronize M bytes")
    ax_a.set_ylabel("algbw = M / time (GB/s)")
    ax_a.set_title("Algorithm bandwidth")
    ax_b.set_ylabel("busbw (GB/s)")
    ax_b.set_title("Bus bandwidth: algbw·2(N−1)/N (ring), algbw·max(1, N/S) (PS)", fontsize=10)
    ax_t.legend(fontsize=7, loc="upper left")
    fig.suptitle(title or f"Synchronizers vs raw transports by message size (N = {n} workers; "
                 f"{int(bench['iters'].max()) if 'iters' in bench else ''} timed iterations per point)")
    return fig
