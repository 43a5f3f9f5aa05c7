"""Traffic on every link over time: a host × time heatmap of each direction's utilisation, from the
``links.jsonl`` an emulated run's launcher sampled (``psring.net.links``).

Each cell is the bytes a host's link carried in one sample interval over what its rate allows in that
interval (1 = saturated). With one PS server the server's download is saturated while every worker's
link idles half the step; with a ring every link carries the same share at once; with S = N servers
the load spreads over every server's link. Dashed lines: the ends of rank 0's steps. Below, where the
samples carry it (``cpu``), the machine's CPU over the same bins: on 2 shared cores the links can only be as
busy as the processes that feed them, and a CPU at the top while the links run says who sets the pace.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..config import TrainConfig
from ..launch.placement import host_labels, server_host
from ..metrics.cpu import SATURATED
from ..metrics.jsonl import read_jsonl
from ..net import links, parse_rate
from ..strategies import uses_servers
from .common import new_figure

BIN_S = 0.1  # drawn bins: 20 ms samples of a tbf link flicker with its bursts
SHOWN_STEPS = 3  # steps drawn: enough to see the pattern repeat, few enough to see inside one
DIRECTIONS = (("up", "upload (host → switch)"), ("down", "download (switch → host)"))


def has_links(run_dir: Path) -> bool:
    return (Path(run_dir) / links.FILE).is_file() and (Path(run_dir) / "config.json").is_file()


def link_runs(folder: Path) -> list[Path]:
    """``folder`` itself or its run folders (``runs/*``, ``*``) that have sampled links."""
    folder = Path(folder)
    candidates = [folder, *sorted(folder.glob("runs/*")), *sorted(folder.glob("*"))]
    return [d for d in candidates if d.is_dir() and has_links(d)]


def host_rates(cfg: TrainConfig) -> list[float]:
    """Each emulated host's link rate in bytes/s (dedicated PS servers' own ``--server-link-rate``)."""
    labels = host_labels(cfg)
    rates = [parse_rate(cfg.link_rate) / 8] * len(labels)
    if cfg.server_link_rate and uses_servers(cfg.sync):
        for i in range(cfg.servers):
            h = server_host(cfg, i)
            if h >= cfg.hosts:  # a host of its own
                rates[h] = parse_rate(cfg.server_link_rate) / 8
    return rates


def step_window(run_dir: Path, shown: int = SHOWN_STEPS) -> tuple[float, float, list[float]]:
    """(start, end, step ends) in wall-clock s of ``shown`` timed steps (after warm-up) of rank 0."""
    recs = [r for r in read_jsonl(Path(run_dir) / "steps.jsonl") if r.get("rank") == 0] \
        if (Path(run_dir) / "steps.jsonl").is_file() else []
    if not recs:
        return -np.inf, np.inf, []
    cfg = json.loads((Path(run_dir) / "config.json").read_text())
    first = min(int(cfg.get("warmup") or 0), max(len(recs) - shown, 0))
    chosen = sorted(recs, key=lambda r: r["step"])[first:first + shown]
    return chosen[0]["time"] - chosen[0]["step_s"], chosen[-1]["time"], [r["time"] for r in chosen]


def utilisation(run_dir: Path, start: float = -np.inf, end: float = np.inf,
                samples: list[dict] | None = None) -> pd.DataFrame:
    """Tidy rows ``time, dt, host, label, direction, bytes, utilisation`` of the samples in [start, end]
    (``samples``: the run's ``links.jsonl`` already loaded, else read here)."""
    cfg = TrainConfig.load(Path(run_dir) / "config.json")
    labels, rates = host_labels(cfg), host_rates(cfg)
    rows = []
    for s in links.load(Path(run_dir) / links.FILE) if samples is None else samples:
        if not start <= s["time"] <= end or s["dt"] <= 0:
            continue
        for direction, _ in DIRECTIONS:
            for h, b in enumerate(s[direction]):
                rows.append((s["time"], s["dt"], h, labels[h] if h < len(labels) else f"host {h}", direction, b,
                             b / (rates[min(h, len(rates) - 1)] * s["dt"])))
    return pd.DataFrame(rows, columns=["time", "dt", "host", "label", "direction", "bytes", "utilisation"])


def figure_links(run_dir: Path, shown: int = SHOWN_STEPS, bin_s: float = BIN_S):
    """The heatmap of one run: upload and download panels, a row per host, ``shown`` steps wide, in bins
    of ``bin_s`` (the samples' bytes summed over a bin, over what the rate allows in it), and beneath them the
    machine's CPU over the same bins where the samples carry it (``cpu_bins``)."""
    run_dir = Path(run_dir)
    start, end, ends = step_window(run_dir, shown)
    samples = links.load(run_dir / links.FILE)
    df = utilisation(run_dir, start, end, samples)
    if df.empty:
        raise ValueError(f"{run_dir}: no link samples inside the steps drawn")
    cfg = TrainConfig.load(run_dir / "config.json")
    labels, rates = host_labels(cfg), host_rates(cfg)
    t0 = start if np.isfinite(start) else df["time"].min() - df["dt"].iloc[0]
    t1 = end if np.isfinite(end) else df["time"].max()
    bins = int(np.ceil((t1 - t0) / bin_s))
    cpu = cpu_bins(samples, t0, t1, bin_s, bins)
    panels = [len(labels), len(labels)] + ([max(1.5, len(labels) / 3)] if cpu is not None else [])
    fig, axes = new_figure(9, 1.2 + 0.42 * sum(panels), nrows=len(panels), sharex=True,
                           gridspec_kw={"height_ratios": panels})
    for ax, (direction, title) in zip(axes[:2, 0], DIRECTIONS):
        grid = np.zeros((len(labels), bins))
        d = df[df["direction"] == direction]
        idx = np.clip(((d["time"] - t0) // bin_s).astype(int).to_numpy(), 0, bins - 1)
        np.add.at(grid, (d["host"].to_numpy(), idx), d["bytes"].to_numpy())
        seen = np.zeros(bins)
        np.add.at(seen, idx[d["host"].to_numpy() == 0], d["dt"].to_numpy()[d["host"].to_numpy() == 0])
        grid /= np.outer(rates, np.where(seen > 0, seen, np.nan))
        mesh = ax.pcolormesh(np.arange(bins + 1) * bin_s, np.arange(len(labels) + 1) - 0.5, grid, cmap="magma",
                             vmin=0, vmax=1, shading="flat", rasterized=True)  # an image in an SVG, not 5,000 cells
        ax.set_yticks(range(len(labels)), labels)
        ax.set_ylim(len(labels) - 0.5, -0.5)
        for e in ends:
            ax.axvline(e - t0, color="white", lw=0.8, ls="--")
        ax.set_title(title, fontsize=10, loc="left")
    if cpu is not None:
        draw_cpu(axes[2, 0], cpu, bin_s, ends, t0)
    axes[-1, 0].set_xlim(0, t1 - t0)
    axes[-1, 0].set_xlabel("time (s)")
    fig.colorbar(mesh, ax=axes[:2, 0], label="link utilisation (bytes / rate · time)", shrink=0.9)
    servers = f", S={cfg.servers}" if uses_servers(cfg.sync) else ""
    fig.suptitle(f"{cfg.sync} N={cfg.workers}{servers}: every link at {cfg.link_rate}, sampled every "
                 f"{1e3 * df['dt'].median():.0f} ms, drawn in {1e3 * bin_s:.0f} ms bins "
                 f"({len(ends)} steps; dashed: step ends)", fontsize=10)
    return fig


def cpu_bins(samples: list[dict], t0: float, t1: float, bin_s: float, bins: int) -> np.ndarray | None:
    """The machine's CPU utilisation per drawn bin (the samples' ``cpu``, weighted by their lengths); None
    where the samples carry none (files written before the sampler read it)."""
    got = [(s["time"], s["dt"], s["cpu"]) for s in samples
           if t0 <= s["time"] <= t1 and s["dt"] > 0 and s.get("cpu") is not None]
    if not got:
        return None
    t, dt, u = (np.array(x, dtype=float) for x in zip(*got))
    idx = np.clip(((t - t0) // bin_s).astype(int), 0, bins - 1)
    busy, seen = np.zeros(bins), np.zeros(bins)
    np.add.at(busy, idx, u * dt)
    np.add.at(seen, idx, dt)
    return busy / np.where(seen > 0, seen, np.nan)


def draw_cpu(ax, cpu: np.ndarray, bin_s: float, ends: list[float], t0: float) -> None:
    x = np.arange(len(cpu) + 1) * bin_s
    ax.stairs(cpu, x, fill=True, color="tab:gray", alpha=0.6)
    ax.axhline(SATURATED, color="tab:red", lw=0.8, ls=":")
    for e in ends:
        ax.axvline(e - t0, color="0.3", lw=0.8, ls="--")
    ax.set_ylim(0, 1)
    ax.set_ylabel("CPU")
    ax.set_title(f"the machine's CPU (all cores), over the same bins (dotted: {SATURATED:.0%}, CPU-saturated)",
                 fontsize=10, loc="left")
