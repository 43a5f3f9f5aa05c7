"""What every figure module shares: a pyplot-free ``Figure``, deterministic saving, colours, units,
and reading a folder's run table (``runs.csv``, or the ``summary.json`` of its run folders)."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import pandas as pd
from matplotlib.figure import Figure

from ..bounds import gradient_bytes, is_num  # noqa: F401 - part of this module's interface
from ..costmodel import Link, load_calibration
from ..results import load_summary
from ..strategies import REGISTRY, attr, is_baseline, names, uses_servers
from ..sweep import BASELINE_FREE, baseline_of, setting_text

FORMATS = ("png", "svg")
PHASE_COLORS = {"data": "tab:gray", "forward": "tab:blue", "backward": "tab:orange", "sync": "tab:red",
                "push": "#f4a6a6", "wait": "tab:red", "pull": "#8b1a1a", "update": "tab:green"}
SERIES_COLORS = {**{name: s.color for name, s in REGISTRY.items()},  # each strategy's registry colour
                 "ps_colocated": "tab:purple"}  # (a cost model's curve)
PS_COLORS = ["tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive"]  # a strategy's lines per S
# Config columns that say which run a row is, not under which settings the sweep ran it.
IDENTITY = {"run_id", "sync", "workers", "servers", "seed", "out", "status", "error", "ps_addrs"}
CONFIG_HINTS = {"model", "dataset", "num_samples", "batch_size", "steps", "augment", "threads", "backend",
                "net", "link_rate", "server_link_rate", "link_delay", "compute", "straggler", "lr",
                "momentum", "weight_decay", "partition"}
HOLLOW_NOTE = "hollow: CPU-saturated (≥ 90% of all cores)"


def load_csv(folder: Path, name: str, columns: tuple[str, ...]) -> pd.DataFrame | None:
    """``folder/name``, or None where it is absent; a file without ``columns`` is a one-line ValueError."""
    path = Path(folder) / name
    if not path.exists():
        return None
    df = pd.read_csv(path)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)} (needs {', '.join(columns)})")
    return df


def new_figure(width: float, height: float, ncols: int = 1, nrows: int = 1, **kw):
    """A ``Figure`` with its own Agg canvas: nothing touches pyplot's global state or backend."""
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def efficiency_axes(ax, title: str) -> None:
    """A panel of scaling efficiency against N: log2 N, efficiency 0 to 1, a grid, ``title``."""
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3, which="both")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("workers N")


def save(fig: Figure, out_dir: Path, stem: str, formats: tuple[str, ...] = FORMATS) -> list[Path]:
    """Write ``out_dir/stem.<fmt>`` for each format, without dates or version strings, so that the
    same data give the same files. The layout is computed for the first format and kept for the others
    (constrained layout is about a third of a save, and a second pass moves the axes by about a point)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths, engine = [], fig.get_layout_engine()
    try:
        for i, fmt in enumerate(formats):
            if i == 1:
                fig.set_layout_engine("none")
            path = out_dir / f"{stem}.{fmt}"
            meta = {"svg": {"Date": None, "Creator": None}, "png": {"Software": None},
                    "pdf": {"CreationDate": None, "Creator": None, "Producer": None}}.get(fmt)
            with matplotlib.rc_context({"svg.hashsalt": "psring", "svg.fonttype": "none"}):
                fig.savefig(path, format=fmt, dpi=120, metadata=meta)
            paths.append(path)
    finally:  # (a figure changed and saved again is laid out again)
        fig.set_layout_engine(engine)
    return paths


def save_gif(fig: Figure, draw_frame, frames: int, out_dir: Path, stem: str, fps: float = 1.0,
             dpi: int = 60) -> Path:
    """Write ``out_dir/stem.gif``: ``draw_frame(i)`` redraws ``fig`` for frame i of ``frames`` (Pillow,
    which matplotlib brings; no dates in a GIF, so the same data give the same file)."""
    from matplotlib.animation import PillowWriter

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem}.gif"
    writer = PillowWriter(fps=fps)
    with writer.saving(fig, path, dpi):
        for i in range(frames):
            draw_frame(i)
            writer.grab_frame()
    return path


def png_bytes(fig: Figure, dpi: int = 100) -> bytes:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()


def show(fig: Figure, dpi: int = 100) -> None:
    """Display a figure of this package in a notebook (they are made outside pyplot), as a PNG."""
    from IPython.display import Image, display

    display(Image(png_bytes(fig, dpi)))


def fmt_bytes(n: float) -> str:
    """4096 -> '4 KiB', 2.18e6 -> '2.1 MiB' (binary units, as the bench's power-of-two sizes)."""
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            v = n / (1 << k)
            return f"{v:.0f} {unit}" if abs(v - round(v)) < 0.05 else f"{v:.1f} {unit}"
    return f"{n:.0f} B"


def strategy_order() -> list[str]:
    """The registry's strategies in plotting order: the baseline, then those without servers, then those
    with, each in registry order (none, allreduce, ddp, ps)."""
    reg = names()
    return sorted(reg, key=lambda n: (not is_baseline(n), uses_servers(n), reg.index(n)))


def order_key(sync) -> int:
    """A ``sync`` value's place in ``strategy_order()`` (names not in the registry last)."""
    order = strategy_order()
    return order.index(sync) if sync in order else 99


def strategy_color(sync, default: str = "k") -> str:
    """A strategy's registry colour (``default`` for a name not in the registry)."""
    return attr(sync, "color", default)


def server_colors(sync) -> list[str]:
    """Colours of the lines of a strategy with servers, one per server count: its registry colour first,
    then those of ``PS_COLORS`` that differ from it (for ps: ``PS_COLORS`` itself)."""
    own = attr(sync, "color", PS_COLORS[0])
    return [own, *(c for c in PS_COLORS if c != own)]


def is_baseline_run(runs: pd.DataFrame) -> pd.Series:
    """Per row: a run of the baseline strategy (``strategies.is_baseline``) with one worker."""
    return runs["sync"].map(is_baseline).astype(bool) & (runs["workers"] == 1)


def run_folders(folder: Path, max_depth: int = 3) -> list[Path]:
    """Run folders under ``folder`` (ones with ``steps.jsonl``, ``ranks/`` or ``trace.json``), sorted."""
    found = []

    def walk(d: Path, depth: int) -> None:
        if (d / "steps.jsonl").is_file() or (d / "ranks").is_dir() or (d / "trace.json").is_file():
            found.append(d)
            return
        if depth < max_depth:
            for sub in sorted(p for p in d.iterdir() if p.is_dir() and p.name != "figures"):
                walk(sub, depth + 1)

    walk(folder, 0)
    return found


def run_table(folder: Path) -> pd.DataFrame | None:
    """``runs.csv`` of a sweep (ok runs only), or a table built from the ``summary.json`` files of the
    folder's runs (with their configs' settings); None if neither exists."""
    csv = folder / "runs.csv"
    if csv.is_file():
        df = pd.read_csv(csv)
        return df[df["status"] == "ok"].reset_index(drop=True) if "status" in df else df
    rows = []
    for d in run_folders(folder):
        if not (d / "summary.json").is_file():
            continue
        row = load_summary(d)
        cfg_file = d / "config.json"
        cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
        row.update({k: v for k, v in cfg.items() if k in CONFIG_HINTS and k not in row})
        row["run_id"] = d.relative_to(folder).as_posix()
        rows.append(row)
    return pd.DataFrame(rows) if rows else None


def setting_key(v):
    """Sort key for a setting's values: rates ("100mbit", "1gbit") by their bandwidth, numbers by value."""
    if isinstance(v, str):
        try:
            return (0, Link.from_rate(v).bandwidth_Bps, "")
        except ValueError:
            return (1, 0.0, v)
    return (0, float(v), "") if is_num(v) else (1, 0.0, str(v))


def varying(df: pd.DataFrame) -> list[str]:
    """Settings columns (not sync/workers/servers) whose values differ between rows."""
    cols = [c for c in df.columns if c in CONFIG_HINTS and c not in IDENTITY]
    return [c for c in cols if df[c].astype(str).nunique() > 1]


def find_calibration(folder: Path, given: str | Path | None = None) -> tuple[Link | None, str]:
    """The ``Link`` of ``given`` or of ``folder/calibration.json``, and where it came from."""
    path = Path(given) if given else folder / "calibration.json"
    if path.is_file():
        return load_calibration(path), str(path)
    if given:
        raise FileNotFoundError(f"calibration file {given} not found")
    return None, ""


def spread_baselines(runs: pd.DataFrame) -> pd.DataFrame:
    """The run table with each baseline (``none`` at N = 1, see ``sweep.baseline_of``) in every panel of
    the runs it is the baseline of: a copy per combination of their BASELINE_FREE settings that panels
    split on (e.g. link_rate), carrying them, since a lone ``none`` worker is the same run under any.
    Otherwise an added baseline (on loopback, default link rate) would open a panel of its own. Baseline
    rows that are someone's baseline give way to their copies; the others stay as they are."""
    free = [c for c in runs.columns if c in BASELINE_FREE and c in CONFIG_HINTS]
    base_of = baseline_of(runs)
    is_base = is_baseline_run(runs)
    copies, seen = [], set()
    for i, b in base_of[~is_base].items():
        key = (b, tuple(setting_text(runs.at[i, c]) for c in free))
        if b is None or key in seen:
            continue
        seen.add(key)
        copy = runs.loc[[b]].copy()  # a one-row frame keeps the columns' dtypes
        copy[free] = runs.loc[[i], free].to_numpy()
        copies.append(copy)
    used = {b for b, _ in seen}
    kept = runs[~(is_base & base_of.map(lambda b: b in used))]
    return pd.concat([kept, *copies], ignore_index=True) if copies else runs


def saturated(rows: pd.DataFrame) -> list[bool]:
    """Per row: did the run saturate the machine's CPU (``cpu_saturated``; False where not recorded)?"""
    if "cpu_saturated" not in rows:
        return [False] * len(rows)
    return [str(v).lower() in ("true", "1", "1.0") for v in rows["cpu_saturated"]]  # bool, or CSV text


def plot_measured(ax, x, y, sat: list[bool], color, label: str) -> None:
    """A measured line with a marker per run: filled, or hollow (same edge colour) where ``sat``."""
    x, y = list(x), list(y)
    if not any(sat):
        ax.plot(x, y, marker="o", color=color, label=label)
        return
    ax.plot(x, y, marker="o", color=color, label=label, markevery=[not s for s in sat])
    ax.plot([a for a, s in zip(x, sat) if s], [b for b, s in zip(y, sat) if s], linestyle="none",
            marker="o", markerfacecolor="none", markeredgecolor=color)


def note_hollow(ax) -> None:
    ax.plot([], [], linestyle="none", marker="o", markerfacecolor="none", markeredgecolor="0.3",
            label=HOLLOW_NOTE)
