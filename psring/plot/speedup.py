"""Speedup vs number of workers N: measured (a sweep's ``runs.csv``), ideal linear, and the alpha-beta
cost model's prediction; and the median sync time per step next to the model's sync time. Every speedup
is over one worker without communication (``none`` at N = 1); a run whose machine's CPU was saturated
(``cpu_saturated``) is drawn as a hollow marker."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..costmodel import PS_MODEL, STRATEGIES, TCP_GOODPUT, Link, predicted_speedup
from ..bounds import ps_chunks_per_server
from ..strategies import attr, baseline_name, names, uses_servers
from ..sweep import baseline_of
from .common import (
    fmt_bytes,
    gradient_bytes,
    is_num,
    new_figure,
    note_hollow,
    order_key,
    plot_measured,
    saturated,
    server_colors,
    setting_key,
    spread_baselines,
    strategy_color,
    strategy_order,
    varying,
)

ORDER = strategy_order()  # the registry's, for plots (the functions here ask the registry themselves)
MODEL_OF = {n: attr(n, "cost_model") for n in ORDER if attr(n, "cost_model")}  # sync -> costmodel.STRATEGIES


def model_curve(ns, compute_s: float, m_bytes: float, link: Link, strategy: str,
                servers: int | str | None = None, server_link: Link | None = None,
                overlap: float = 0.0, chunks=None) -> pd.DataFrame:
    """The cost model at each N of ``ns``: columns ``workers``, ``sync_s`` (``STRATEGIES[strategy]``
    with ``servers`` = an int, ``"N"`` for S = N, or None) and ``speedup`` (``predicted_speedup``: N
    workers of ``compute_s`` each against one that does not synchronize). ``chunks(n, s)``: ps's
    chunks per server at N = n, S = s, for its pipelined bound (None: the sequential formula)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown cost model {strategy!r}; one of {sorted(STRATEGIES)}")
    rows = []
    for n in ns:
        n = int(n)
        s = n if servers == "N" else servers
        extra = {"chunks_per_server": chunks(n, s or 1)} if chunks is not None else {}
        sync_s = STRATEGIES[strategy](n, m_bytes, link, servers=s, server_link=server_link, **extra)
        rows.append({"workers": n, "sync_s": sync_s,
                     "speedup": predicted_speedup(n, compute_s, sync_s, overlap)})
    return pd.DataFrame(rows)


@dataclass
class Series:
    label: str
    sync: str
    servers: int | str | None  # a strategy with servers: an int or "N"
    rows: pd.DataFrame
    settings: dict = field(default_factory=dict)  # the values of the sweep's varying settings


def split_series(runs: pd.DataFrame) -> list[Series]:
    """One line per strategy (and per value of any other setting that varies); one with servers (ps)
    splits by S = 1, S = N or another fixed S, the N = 1, S = 1 run belonging to each."""
    vary = varying(runs)
    groups = runs.groupby(vary, dropna=False, sort=True) if vary else [((), runs)]
    out = []
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        settings = dict(zip(vary, key))
        extra = "".join(f", {k}={v}" for k, v in settings.items())
        syncs = sorted(g["sync"].unique(), key=lambda s: (order_key(s), s))
        for sync in syncs:
            rows = g[g["sync"] == sync].sort_values("workers")
            if not uses_servers(sync):
                out.append(Series(f"{attr(sync, 'label', sync)}{extra}", sync, None, rows, settings))
                continue
            multi = rows[rows["workers"] > 1]
            kinds = sorted({"N" if s == n else int(s) for n, s in zip(multi["workers"], multi["servers"])},
                           key=lambda k: (k == "N", k if k != "N" else 0))
            for kind in kinds or [int(rows["servers"].iloc[0])]:
                if kind == "N":
                    sel = rows[rows["servers"] == rows["workers"]]
                else:
                    sel = rows[rows["servers"] == kind]
                out.append(Series(f"{attr(sync, 'label', sync)}, S={kind}{extra}", sync, kind, sel, settings))
    return out


def compute_time(runs: pd.DataFrame, series: Series) -> float | None:
    """Compute per step: forward + backward + update medians of the series' baseline in ``runs`` (``none``
    at N = 1 with the same settings but communication ones, ``sweep.baseline_of``), what one worker does
    without synchronizing; None without one (never the series' own N = 1 run, which may synchronize)."""
    if series.rows.empty:
        return None
    b = baseline_of(runs).get(series.rows.index[0])
    if b is None:
        return None
    parts = [runs.loc[b].get(c) for c in ("forward_s_p50", "backward_s_p50", "update_s_p50")]
    return float(sum(parts)) if all(is_num(p) for p in parts) else None


def series_link(series: Series, calibration: Link | None) -> tuple[Link | None, Link | None]:
    """(worker link, server link) of a series: an emulated network's configured rates, as TCP's payload
    gets them (``costmodel.TCP_GOODPUT``; alpha from the calibration, else 0), else the calibration."""
    r = series.rows.iloc[0]
    if r.get("net") == "emulated" and isinstance(r.get("link_rate"), str):
        alpha = calibration.alpha_s if calibration else 0.0
        link = Link.from_rate(r["link_rate"], alpha, TCP_GOODPUT)
        srv = r.get("server_link_rate")
        return link, (Link.from_rate(srv, alpha, TCP_GOODPUT) if isinstance(srv, str) and srv else None)
    return calibration, None


def ps_chunks(series: Series, m_bytes: float):
    """(n, s) -> the chunks per server a PS run of this series used at N = n, S = s (``bounds``)."""
    r = series.rows.iloc[0]
    return lambda n, s: ps_chunks_per_server(r, n, s, m_bytes)


def color_of(series: Series, i_ps: int) -> str:
    """Its strategy's registry colour; for the ``i_ps``-th line of a strategy with servers (one per S),
    the ``i_ps``-th of ``server_colors``."""
    if uses_servers(series.sync):
        colors = server_colors(series.sync)
        return colors[i_ps % len(colors)]
    return strategy_color(series.sync)


def draw_speedup(ax, ax2, runs: pd.DataFrame, calibration: Link | None = None,
                 calibration_note: str = "") -> None:
    """Speedup vs N on ``ax`` (measured, ideal, model) and median sync time vs N on ``ax2``."""
    m_bytes = gradient_bytes(runs)
    ns = sorted(int(n) for n in runs["workers"].unique())
    grid = list(range(1, max(ns) + 1))
    ax.plot(grid, grid, color="black", linestyle=":", linewidth=1, label="ideal (linear, speedup = N)")
    any_model, any_sequential, i_ps = False, False, 0
    for s in split_series(runs):
        color = color_of(s, i_ps)
        i_ps += uses_servers(s.sync)
        model = attr(s.sync, "cost_model")
        sat = saturated(s.rows)
        plot_measured(ax, s.rows["workers"], s.rows["speedup"], sat, color, f"{s.label} (measured)")
        if model is not None or s.sync not in names():  # a strategy that moves no bytes (none): no sync time
            ms = s.rows["sync_s_p50"].astype(float) * 1e3
            plot_measured(ax2, s.rows["workers"], ms, sat, color, f"{s.label} (measured)")
        link, server_link = series_link(s, calibration)
        c = compute_time(runs, s)
        if model is not None and link is not None and c and m_bytes:
            chunks = ps_chunks(s, m_bytes) if model == PS_MODEL else None  # the PS model's pipelined bound
            mc = model_curve(grid, c, m_bytes, link, model, s.servers, server_link, chunks=chunks)
            ax.plot(mc["workers"], mc["speedup"], color=color, linestyle="--", linewidth=1.2)
            ax2.plot(mc["workers"], mc["sync_s"] * 1e3, color=color, linestyle="--", linewidth=1.2)
            if chunks is not None:  # the sequential formula beside the bound, to show what pipelining buys
                seq = model_curve(grid, c, m_bytes, link, model, s.servers, server_link)
                ax2.plot(seq["workers"], seq["sync_s"] * 1e3, color=color, linestyle=":", linewidth=1)
                any_sequential = True
            any_model = True
    if any_model:
        for a in (ax, ax2):
            a.plot([], [], color="0.4", linestyle="--", label="cost model, no overlap (dashed, colour as line; "
                                                              "ps: pipelined bound)")
        if any_sequential:
            ax2.plot([], [], color="0.4", linestyle=":", label="ps without pipelining (push, then pull)")
        r = runs.iloc[0]
        if r.get("net") == "emulated" and isinstance(r.get("link_rate"), str):
            alpha = f"α = {calibration.alpha_s * 1e6:.0f} µs (calibration)" if calibration else "α = 0 (no calibration)"
            ax.plot([], [], " ", label=f"model: B = the emulated link rate × TCP's payload share, {alpha}")
        elif calibration_note:
            ax.plot([], [], " ", label=calibration_note)
    else:
        why = "no calibration.json" if calibration is None else "M or compute time unknown"
        ax.plot([], [], " ", label=f"cost model omitted: {why}")
    if any(saturated(runs)):
        note_hollow(ax)
    for a in (ax, ax2):
        a.set_xlabel("workers N")
        a.set_xticks(ns)
        a.grid(alpha=0.3)
    ax.set_ylabel(f"speedup over one worker without communication ({baseline_name()}, N=1)")
    ax.set_ylim(0, max(max(ns), float(runs["speedup"].max()) * 1.1) * 1.05)
    ax.legend(fontsize=8, loc="upper left")
    ax2.set_ylabel("sync time per step, median (ms)")
    ax2.set_ylim(0, ax2.get_ylim()[1] * 1.1)
    if ax2.lines:
        ax2.legend(fontsize=8, loc="upper left")


def figure_speedup(runs: pd.DataFrame, calibration: Link | None = None, title: str | None = None,
                   calibration_note: str = ""):
    """Speedup and sync time vs N side by side; one row of panels per value of any other setting that
    varies in the sweep (e.g. the link rate), each with its runs' baseline."""
    runs = spread_baselines(runs)
    vary = varying(runs)
    groups = sorted(runs.groupby(vary), key=lambda kv: [setting_key(v) for v in np.atleast_1d(kv[0])]) \
        if vary else [((), runs)]
    fig, axes = new_figure(12, 0.6 + 4.4 * len(groups), ncols=2, nrows=len(groups))
    for (ax, ax2), (key, g) in zip(axes, groups):
        draw_speedup(ax, ax2, g, calibration, calibration_note)
        where = ""
        if vary:
            key = key if isinstance(key, tuple) else (key,)
            where = " (" + ", ".join(f"{k} = {v}" for k, v in zip(vary, key)) + ")"
        ax.set_title(f"Throughput speedup vs N{where}")
        ax2.set_title(f"Synchronization time per step vs N{where}")
    m_bytes = gradient_bytes(runs)
    r = runs.iloc[0]
    setup = ", ".join(x for x in (
        str(r["model"]) if "model" in runs else "",
        f"batch {int(r['batch_size'])} per worker" if "batch_size" in runs else "",
        f"M = {fmt_bytes(m_bytes)} of gradients" if m_bytes else "") if x)
    fig.suptitle(title or f"Speedup and sync time vs workers N ({setup})")
    return fig
