"""A run's timeline: a Gantt chart of each worker's phases and each PS server's work for a few steps.

Read from ``trace.json`` when the run has one, else from its step records (``steps.jsonl``, or
``ranks/rank*.jsonl`` before they were merged) and ``servers/server*.jsonl``. All are wall-clock times
of one host, so workers and servers line up.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..metrics.jsonl import read_jsonl
from ..strategies import REGISTRY, uses_servers
from .common import PHASE_COLORS, is_num, new_figure

WORKER_PHASES = ["data", "forward", "backward", "sync", "update"]
PS_PARTS = ["push", "wait", "pull"]
SERVER_COLORS = {"wait for slowest worker": "#d9d9d9", "update + reply": "tab:olive"}
LABELS = {"wait": "sync: wait (ps: for servers and the slowest worker)", "push": "sync: push",
          "pull": "sync: pull", "sync": "sync (allreduce: waiting for the ring)",
          "wait for slowest worker": "server: wait for the slowest worker's push",
          "update + reply": "server: update + reply",
          "ready": "gradient bucket ready (a tick per bucket: late ticks, a straggler)"}


def timeline_strategies() -> tuple[str, ...]:
    """The strategies whose runs get a timeline, in registry order: those that communicate (a cost model)
    and whose sync is timed apart from backward (``sync_timed``; DDP's is not)."""
    return tuple(n for n, s in REGISTRY.items() if s.sync_timed and s.cost_model is not None)


def run_info(run_dir: Path) -> dict:
    for name in ("config.json", "summary.json"):
        if (Path(run_dir) / name).is_file():
            return json.loads((Path(run_dir) / name).read_text())
    return {}


def step_records(run_dir: Path) -> pd.DataFrame:
    if (run_dir / "steps.jsonl").is_file():
        return pd.DataFrame(read_jsonl(run_dir / "steps.jsonl"))
    recs = [r for f in sorted((run_dir / "ranks").glob("rank*.jsonl")) for r in read_jsonl(f)]
    return pd.DataFrame(recs)


def sync_start(r: dict) -> float:
    """Wall-clock time a step record's sync began (``time`` is the step's end): the origin of its
    ``messages`` and ``ready`` offsets."""
    return r["time"] - r["step_s"] + sum(r[f"{p}_s"] for p in WORKER_PHASES[:3] if is_num(r.get(f"{p}_s")))


def ready_marks(run_dir: Path) -> pd.DataFrame:
    """Rows ``row, step, bucket, t`` (wall-clock s): when each gradient bucket of a worker became ready,
    from the step records' ``ready`` (``--trace``; empty when no record has it)."""
    marks = []
    for r in step_records(Path(run_dir)).to_dict("records"):
        if isinstance(r.get("ready"), list):
            t0 = sync_start(r)
            marks += [(f"worker {r['rank']}", r["step"], int(b), t0 + off) for b, off in r["ready"]]
    return pd.DataFrame(marks, columns=["row", "step", "bucket", "t"])


def server_records(run_dir: Path) -> pd.DataFrame:
    """``servers/serverI.jsonl`` with a ``server`` column (as ``psring.results.load_servers``)."""
    frames = [pd.DataFrame(recs).assign(server=int(f.stem.removeprefix("server")))
              for f in sorted((run_dir / "servers").glob("server*.jsonl")) if (recs := read_jsonl(f))]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def segments_from_records(steps: pd.DataFrame, servers: pd.DataFrame) -> pd.DataFrame:
    """Rows ``row, name, step, start, dur`` (wall-clock s) from step and server records."""
    segs = []
    for r in steps.to_dict("records"):
        t = r["time"] - r["step_s"]
        for ph in WORKER_PHASES:
            dur = r.get(f"{ph}_s")
            if not is_num(dur):
                continue
            parts = [p for p in PS_PARTS if is_num(r.get(f"{p}_s"))] if ph == "sync" else []
            if parts:
                tp = t
                for p in parts:
                    segs.append((f"worker {r['rank']}", p, r["step"], tp, r[f"{p}_s"]))
                    tp += r[f"{p}_s"]
            else:
                segs.append((f"worker {r['rank']}", ph, r["step"], t, dur))
            t += dur
    for r in servers.to_dict("records") if not servers.empty else []:
        if is_num(r.get("t_first_push")) and is_num(r.get("t_last_push")) and is_num(r.get("t_done")):
            row = f"server {r['server']}"
            segs.append((row, "wait for slowest worker", r["step"], r["t_first_push"],
                         r["t_last_push"] - r["t_first_push"]))
            segs.append((row, "update + reply", r["step"], r["t_last_push"], r["t_done"] - r["t_last_push"]))
    return pd.DataFrame(segs, columns=["row", "name", "step", "start", "dur"])


def segments_from_trace(path: Path) -> pd.DataFrame:
    """The same rows from a Chrome trace written by ``psring.metrics.trace`` (phase rows only)."""
    events = json.loads(Path(path).read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    segs = []
    for e in events:
        if e.get("ph") != "X" or e.get("tid", 0) != 0 or e["name"].startswith("step "):
            continue
        segs.append((names.get(e["pid"], str(e["pid"])), e["name"], e.get("args", {}).get("step"),
                     e["ts"] / 1e6, e["dur"] / 1e6))
    df = pd.DataFrame(segs, columns=["row", "name", "step", "start", "dur"])
    split = df[df["name"].isin(PS_PARTS)][["row", "step"]].drop_duplicates()  # sync drawn as its parts
    keys = set(map(tuple, split.values))
    has_parts = pd.Series([(r, s) in keys for r, s in zip(df["row"], df["step"])], index=df.index, dtype=bool)
    return df[~((df["name"] == "sync") & has_parts)].reset_index(drop=True)


def load_segments(run_dir: str | Path) -> pd.DataFrame:
    run_dir = Path(run_dir)
    if (run_dir / "trace.json").is_file():
        return segments_from_trace(run_dir / "trace.json")
    return segments_from_records(step_records(run_dir), server_records(run_dir))


def pick_steps(segs: pd.DataFrame, warmup: int, count: int) -> list[int]:
    """``count`` consecutive steps from the first timed one (or the last ones of a short run)."""
    steps = sorted(int(s) for s in segs["step"].dropna().unique())
    timed = [s for s in steps if s >= warmup] or steps
    return timed[:count]


def run_title(run_dir: Path, info: dict) -> str:
    sync, n = info.get("sync", "?"), info.get("workers", "?")
    s = f", S={info['servers']}" if uses_servers(sync) else ""
    run_dir = Path(run_dir)
    name = run_dir.name if run_dir.name != sync else f"{run_dir.parent.name}/{run_dir.name}"
    return f"{sync}, N={n}{s} ({name})"


def draw_timeline(ax, run_dir: str | Path, count: int = 3, first: int | None = None) -> list[int]:
    """Draw ``count`` steps of a run on ``ax`` (ms from the first step's start); return the steps."""
    run_dir = Path(run_dir)
    info = run_info(run_dir)
    segs = load_segments(run_dir)
    if segs.empty:
        raise ValueError(f"{run_dir} has no step records to draw")
    steps = ([first + i for i in range(count)] if first is not None
             else pick_steps(segs, int(info.get("warmup", 3)), count))
    segs = segs[segs["step"].isin(steps)]
    t0 = segs[segs["row"].str.startswith("worker")]["start"].min()
    rows = sorted(segs["row"].unique(), key=lambda r: (not r.startswith("worker"), int(r.split()[-1])))
    y = {r: len(rows) - 1 - i for i, r in enumerate(rows)}
    seen = set()
    for (row, name), g in segs.groupby(["row", "name"], sort=False):
        color = PHASE_COLORS.get(name) or SERVER_COLORS.get(name, "0.5")
        label = None if name in seen else LABELS.get(name, name)
        seen.add(name)
        ax.broken_barh([((s - t0) * 1e3, d * 1e3) for s, d in zip(g["start"], g["dur"])], (y[row] - 0.38, 0.76),
                       facecolors=color, edgecolor="white", linewidth=0.4, label=label,
                       hatch="//" if name == "wait for slowest worker" else None)
    _draw_ready(ax, ready_marks(run_dir), steps, y, t0)
    workers = segs[segs["row"].str.startswith("worker")]
    for step, g in workers.groupby("step"):
        end = ((g["start"] + g["dur"]).max() - t0) * 1e3
        ax.axvline(end, color="black", linestyle=":", linewidth=0.8)
        ax.annotate(f"end of step {int(step)}", (end, len(rows) - 0.5), fontsize=7, ha="right", va="bottom",
                    rotation=0)
    ax.set_yticks([y[r] for r in rows], rows)
    ax.set_ylim(-0.6, len(rows) - 0.1 + 0.4)
    ax.set_xlim(0, None)
    ax.set_xlabel("wall-clock time from the start of the first step shown (ms)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(f"{run_title(run_dir, info)}: steps {steps[0]}–{steps[-1]}")
    return steps


def _draw_ready(ax, marks: pd.DataFrame, steps: list[int], y: dict, t0: float) -> None:
    """A tick per gradient bucket on its worker's row, where the bar's top edge is, when it was ready."""
    marks = marks[marks["step"].isin(steps) & marks["row"].isin(list(y))]
    if not marks.empty:
        ax.plot((marks["t"] - t0) * 1e3, [y[r] + 0.38 for r in marks["row"]], linestyle="none", marker="|",
                markersize=7, markeredgewidth=1.2, color="black", label=LABELS["ready"])


def figure_timeline(run_dirs: list[str | Path], count: int = 3, title: str | None = None):
    """One panel per run, stacked; a shared legend of phases below."""
    heights = [1.2 + 0.45 * len(load_segments(d)["row"].unique()) for d in run_dirs]
    fig, axes = new_figure(11, sum(heights) + 1.2, nrows=len(run_dirs),
                           gridspec_kw={"height_ratios": heights})
    handles = {}
    for ax, d in zip(axes[:, 0], run_dirs):
        draw_timeline(ax, d, count)
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    order = [LABELS.get(k, k) for k in [*WORKER_PHASES[:3], "sync", *PS_PARTS, "update", *SERVER_COLORS, "ready"]]
    labs = [lab for lab in order if lab in handles]
    fig.legend([handles[lab] for lab in labs], labs, loc="outside lower center", ncols=3, fontsize=8)
    fig.suptitle(title or "Timeline: each worker's phases and each server's work, per step")
    return fig
