"""Held-out accuracy over steps and over wall time, one line per run, and the staleness of applied PS
updates (``experiments/convergence.toml``: BSP, SSP, ASP and all-reduce, with and without a straggler).
Accuracy is measured at the end of every epoch (``test_acc`` in ``steps.jsonl``, rank 0)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..strategies import attr, is_baseline, uses_servers
from ..compress.spec import NONE
from ..results import load_summary
from .common import new_figure, strategy_color
from .compression import by_label, codec_color, mean_curve, run_label

CONSISTENCY_COLORS = {"bsp": "tab:red", "ssp": "tab:purple", "asp": "tab:olive"}


def label(cfg: dict) -> str:
    sync = cfg["sync"]  # a strategy with servers runs under a consistency model (BSP, SSP, ASP)
    own = attr(sync, "label", sync)
    name = f"{own} {cfg.get('consistency', 'bsp').upper()}" if uses_servers(sync) else own
    if cfg.get("consistency") == "ssp":
        name += f"(k={cfg.get('staleness')})"
    slow = cfg.get("straggler")
    factor = float(slow.split(":")[1]) if slow else 1.0
    return name + (f", worker {slow.split(':')[0]} {factor:g}x slower" if factor > 1 else "")


def accuracy_runs(folder: Path) -> list[tuple[dict, pd.DataFrame, dict]]:
    """(config, rank 0's evaluated steps [step, wall_s, test_acc], summary) of every run with accuracy
    (where some ran with N > 1, less the sweep's one-worker ``none`` baselines)."""
    found = []
    for d in sorted(Path(folder).glob("runs/*")):
        steps, cfg_file = d / "steps.jsonl", d / "config.json"
        if not (steps.exists() and cfg_file.exists()):
            continue
        df = pd.read_json(steps, lines=True)
        if "test_acc" not in df or df["test_acc"].isna().all():
            continue
        r0 = df[df["rank"] == 0].sort_values("step")
        start = r0["time"].iloc[0] - r0["step_s"].iloc[0]
        ev = r0[r0["test_acc"].notna()].assign(wall_s=lambda x: x["time"] - start)[["step", "wall_s", "test_acc"]]
        summary = load_summary(d) if (d / "summary.json").exists() else {}
        found.append((json.loads(cfg_file.read_text()), ev, summary))
    if any(c.get("workers", 1) > 1 for c, _, _ in found):  # a sweep's speedup baseline (none, N=1, batch B)
        found = [f for f in found if not (is_baseline(f[0].get("sync")) and f[0].get("workers", 1) == 1)]
        # trains on a global batch N times smaller: another run, not a point of this comparison
    return found


def figure_convergence(folder: Path, runs: list[tuple[dict, pd.DataFrame, dict]] | None = None):
    """``runs``: ``accuracy_runs(folder)`` when the caller already read them."""
    runs = accuracy_runs(folder) if runs is None else runs
    if not runs:
        raise ValueError(f"{folder}: no run with test accuracy (test_acc) in its steps.jsonl")
    fig, axes = new_figure(15, 4.6, ncols=3)
    ax_step, ax_wall, ax_stale = axes[0]
    codecs = len({c.get("compress", NONE) for c, _, _ in runs}) > 1  # compression.toml: a line per codec
    if codecs:  # ... and per setting, the mean over its seeds
        runs = [(g[0][0], mean_curve(g), g[0][2]) for g in by_label(runs).values()]
    for cfg, ev, _ in runs:
        color = CONSISTENCY_COLORS.get(cfg.get("consistency"), attr(cfg["sync"], "color")) \
            if uses_servers(cfg["sync"]) else strategy_color(cfg["sync"], "tab:blue")
        slow = bool(cfg.get("straggler")) and float(cfg["straggler"].split(":")[1]) > 1
        name = label(cfg)
        if codecs:
            color, name = codec_color(cfg.get("compress", NONE)), f"{name}, {run_label(cfg)}"
            slow = slow or "," in run_label(cfg)  # a setting changed from the defaults: dashed
        style = dict(color=color, linestyle="--" if slow else "-", marker="o", markersize=3, label=name)
        ax_step.plot(ev["step"] + 1, 100 * ev["test_acc"], **style)
        ax_wall.plot(ev["wall_s"], 100 * ev["test_acc"], **style)
    for ax, xl in ((ax_step, "training steps"), (ax_wall, "wall time since the first step (s)")):
        ax.set_xlabel(xl)
        ax.set_ylabel("held-out accuracy (%)")
        ax.grid(alpha=0.3)
    ax_step.set_title("accuracy per step (end of each epoch)")
    ax_wall.set_title("accuracy over wall time: waiting costs time")
    ax_wall.legend(fontsize=7, loc="lower right")

    if codecs:
        _bytes_panel(ax_stale, runs)
        return fig
    stale = [(label(c), s["server_staleness_hist"]) for c, _, s in runs if s.get("server_staleness_hist")
             and c.get("consistency") in ("ssp", "asp")]
    width = 0.8 / max(1, len(stale))
    for i, (name, hist) in enumerate(stale):
        values = sorted(int(k) for k in hist)
        total = sum(hist.values())
        ax_stale.bar([v + i * width for v in values], [100 * hist[str(v)] / total for v in values], width,
                     label=name)
    ax_stale.set_xlabel("staleness (steps behind the slowest worker)")
    ax_stale.set_ylabel("share of updates (%)")
    ax_stale.set_title("staleness under SSP and ASP (BSP: always 0)")
    if stale:
        ax_stale.legend(fontsize=7)
    ax_stale.grid(alpha=0.3, axis="y")
    return fig


def _bytes_panel(ax, runs) -> None:
    """Per setting: the bytes a worker sent and received per step (a codec sweep's third panel)."""
    names = [run_label(c) for c, _, _ in runs]
    ys = range(len(runs))
    sent = [s.get("bytes_sent_per_step", 0) / 2**10 for _, _, s in runs]
    recv = [s.get("bytes_recv_per_step", 0) / 2**10 for _, _, s in runs]
    ax.barh([y - 0.2 for y in ys], sent, 0.4, color=[codec_color(c.get("compress", NONE)) for c, _, _ in runs],
            label="sent (pushes)")
    ax.barh([y + 0.2 for y in ys], recv, 0.4, color="0.6", label="received (replies)")
    ax.set_yticks(list(ys), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("KiB per worker and step")
    ax.set_title("bytes per step")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="x")
