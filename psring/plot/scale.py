"""Scale figures (``experiments/scale.toml``, replayed by ``psring simulate``): how each arrangement scales
from 8 to 1,024 workers.

* ``scale``: scaling efficiency (samples/s over N times one worker's, the same baseline for all) against N,
  one panel per model and link rate, a line per arrangement; alpha 20 us solid, 205 us dashed, no jitter;
* ``scale_jitter``: what 5% jitter in each worker's compute costs BSP (step time with it over without) against
  N, beside the slowest of N draws over the mean (the whole cost were there no communication);
* ``crossovers`` (a table, for the README and the notebook): the fastest arrangement at each N, and where that
  changes.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..bounds import is_num, per_host
from ..costmodel import Link
from ..strategies import is_baseline, uses_servers
from .common import new_figure

NO_JITTER = "none"
ALPHAS = {20.0: "-", 205.0: "--"}  # alpha_us: line style
STYLE = {"ps S=1": ("tab:red", "v"), "ps S=N/4": ("tab:orange", "s"), "ps S=N": ("tab:brown", "o"),
         "all-reduce": ("tab:blue", "^"), "hierarchical G=8": ("tab:green", "D")}


def _order(name: str) -> int:
    return list(STYLE).index(name) if name in STYLE else len(STYLE)


def has_scale(runs: pd.DataFrame) -> bool:
    """A replayed sweep over many N with the settings these figures split on (``experiments/scale.toml``): some
    runs without jitter (the curves), all BSP (``results/scale_consistency`` compares consistency models)."""
    need = {"simulated", "jitter", "alpha_us", "link_rate", "model", "efficiency"}
    bsp = runs["consistency"].fillna("bsp").eq("bsp").all() if "consistency" in runs else True
    return need <= set(runs.columns) and runs["simulated"].fillna(False).astype(bool).any() and \
        runs["workers"].nunique() >= 4 and runs["jitter"].eq("none").any() and bsp


def arrangement(row) -> str:
    """``ps S=1`` / ``ps S=N/4`` / ``ps S=N`` (servers relative to N), ``all-reduce``, ``hierarchical G=8``."""
    if uses_servers(row["sync"]):
        n, s = int(row["workers"]), int(row["servers"])
        return "ps S=N" if s == n else "ps S=1" if s == 1 else f"ps S=N/{n // s}"
    return f"hierarchical G={per_host(row)}" if per_host(row) > 1 else "all-reduce"


def scale_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The communicating runs that finished, with ``arrangement``, ``rate_gbit`` and ``alpha_us``."""
    df = runs[(runs["workers"] > 1) & ~runs["sync"].map(is_baseline)]
    df = df[df["status"] == "ok"].copy() if "status" in df else df.copy()
    df["arrangement"] = [arrangement(r) for _, r in df.iterrows()]
    df["rate_gbit"] = [Link.from_rate(r, 0.0).bandwidth_Bps * 8 / 1e9 for r in df["link_rate"]]
    df["alpha_us"] = df["alpha_us"].astype(float)
    return df.sort_values(["model", "rate_gbit", "workers"]).reset_index(drop=True)


def figure_scale(runs: pd.DataFrame):
    df = scale_table(runs)
    df = df[df["jitter"] == NO_JITTER]
    models, rates = sorted(df["model"].unique()), sorted(df["rate_gbit"].unique())
    fig, axes = new_figure(4.2 * len(rates), 3.6 * len(models), ncols=len(rates), nrows=len(models),
                           sharex=True, sharey=True)
    for i, m in enumerate(models):
        for j, rate in enumerate(rates):
            ax = axes[i][j]
            cell = df[(df["model"] == m) & (df["rate_gbit"] == rate)]
            for (name, alpha), g in sorted(cell.groupby(["arrangement", "alpha_us"]),
                                           key=lambda kv: (_order(kv[0][0]), kv[0][1])):
                color, marker = STYLE.get(name, ("tab:gray", "x"))
                ax.plot(g["workers"], g["efficiency"], ALPHAS.get(alpha, ":"), color=color, marker=marker,
                        markersize=3, label=name if alpha == min(ALPHAS) else None)
            ax.set_xscale("log", base=2)
            ax.set_ylim(0, 1.05)
            ax.grid(alpha=0.3, which="both")
            ax.set_title(f"{m}, {rate:g} Gbit/s", fontsize=10)
            if i == len(models) - 1:
                ax.set_xlabel("workers N")
            if j == 0:
                ax.set_ylabel("scaling efficiency (speedup / N)")
    axes[0][0].legend(fontsize=7, title="solid: alpha 20 us; dashed: 205 us", title_fontsize=7)
    fig.suptitle("Replayed (psring simulate): BSP, communication after backward, no jitter; every worker and "
                 "PS server a host of its own (hierarchical: 8 workers a host)")
    return fig


def expected_max_ratio(n: int, cv: float) -> float:
    """E[max of n lognormal draws with mean 1 and coefficient of variation cv] (numerically: the integral
    of 1 - F(x)^n over x, on a fine grid)."""
    sigma = math.sqrt(math.log1p(cv * cv))
    x = np.linspace(0.0, math.exp(8 * sigma), 20001)
    z = (np.log(np.maximum(x, 1e-300)) + sigma * sigma / 2) / sigma
    cdf = 0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
    return float(np.trapezoid(1 - cdf ** n, x))


def jitter_cost(runs: pd.DataFrame) -> pd.DataFrame:
    """Per arrangement, model, rate, alpha and N: ``cost`` = step p50 with jitter over without."""
    df = scale_table(runs)
    keys = ["arrangement", "model", "rate_gbit", "alpha_us", "workers"]
    base = df[df["jitter"] == NO_JITTER].set_index(keys)["step_s_p50"]
    jit = df[df["jitter"] != NO_JITTER]
    out = jit[keys + ["jitter"]].copy()
    out["cost"] = jit["step_s_p50"].to_numpy() / base.reindex(pd.MultiIndex.from_frame(jit[keys])).to_numpy()
    return out.reset_index(drop=True)


def figure_scale_jitter(runs: pd.DataFrame, rate_gbit: float = 25.0, alpha_us: float = 20.0):
    cost = jitter_cost(runs)
    cost = cost[(cost["rate_gbit"] == rate_gbit) & (cost["alpha_us"] == alpha_us)]
    models = sorted(cost["model"].unique())
    fig, axes = new_figure(5.5 * len(models), 4, ncols=len(models), sharey=True)
    for j, m in enumerate(models):
        ax = axes[0][j]
        for name, g in sorted(cost[cost["model"] == m].groupby("arrangement"), key=lambda kv: _order(kv[0])):
            color, marker = STYLE.get(name, ("tab:gray", "x"))
            ax.plot(g["workers"], g["cost"], color=color, marker=marker, markersize=3, label=name)
        ns = sorted(cost["workers"].unique())
        cv = float(str(cost["jitter"].iloc[0]).split(":")[1]) if len(cost) else 0.05
        ax.plot(ns, [expected_max_ratio(n, cv) for n in ns], "k:", label=f"E[max of N]/mean, CV {cv:g}")
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3, which="both")
        ax.set_xlabel("workers N")
        ax.set_title(f"{m}, {rate_gbit:g} Gbit/s, alpha {alpha_us:g} us", fontsize=10)
    axes[0][0].set_ylabel("BSP step time, jitter / none")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("What 5% jitter in compute costs bulk-synchronous training (replayed; medians of 6 steps)")
    return fig


def crossovers(runs: pd.DataFrame) -> pd.DataFrame:
    """Per model, rate, alpha and jitter: the fastest arrangement at each N (highest samples/s) and the
    runner-up's margin; rows where the fastest differs from the one at the N before mark a crossover."""
    df = scale_table(runs)
    rows, every = [], df["arrangement"].nunique()
    for key, g in df.groupby(["model", "rate_gbit", "alpha_us", "jitter", "workers"]):
        if g["arrangement"].nunique() < every:  # an N not every arrangement finished at
            continue
        g = g.sort_values("samples_per_s", ascending=False)
        best, second = g.iloc[0], g.iloc[1] if len(g) > 1 else None
        rows.append(dict(zip(["model", "rate_gbit", "alpha_us", "jitter", "workers"], key),
                         fastest=best["arrangement"], efficiency=best["efficiency"],
                         margin=best["samples_per_s"] / second["samples_per_s"] if second is not None
                         and is_num(second["samples_per_s"]) else math.nan))
    out = pd.DataFrame(rows)
    prev = out.groupby(["model", "rate_gbit", "alpha_us", "jitter"])["fastest"].shift()
    out["crossover"] = prev.notna() & (prev != out["fastest"])
    return out


__all__ = ["arrangement", "crossovers", "expected_max_ratio", "figure_scale", "figure_scale_jitter", "overtakes",
           "has_scale", "jitter_cost", "scale_table"]


def overtakes(runs: pd.DataFrame, first: str, then: str) -> pd.DataFrame:
    """Per model, rate, alpha and jitter: the smallest N from which arrangement ``then`` trains faster
    (samples/s) than ``first`` at every larger N of the grid; NaN where it never does, ``first``'s smallest N
    where it always does."""
    df = scale_table(runs)
    keys = ["model", "rate_gbit", "alpha_us", "jitter"]
    rows = []
    for key, g in df[df["arrangement"].isin([first, then])].groupby(keys):
        t = g.pivot_table(index="workers", columns="arrangement", values="samples_per_s")
        ahead = (t[then] > t[first]).to_numpy()
        behind = [i for i, a in enumerate(ahead) if not a]
        start = 0 if not behind else behind[-1] + 1
        rows.append({**dict(zip(keys, key)), "from_workers": t.index[start] if start < len(t) else math.nan})
    return pd.DataFrame(rows)
