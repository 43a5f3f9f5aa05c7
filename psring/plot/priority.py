"""Priority at work in one ``--overlap full`` step (issue #29's timeline): per bucket/chunk of one worker,
when backward made it, when it left, when it was back, against its index.

Indices follow backward (0 = the model's last layer, made first); the next forward needs the highest
index first. In FIFO order each unit would leave as it was made (a diagonal, the first layers last); the
priority schedulers send the newest-made unit nearest the input first, so the highest indices are back
first and the lowest (the last layers, needed last) wait. Read from a ``--trace`` run's ``steps.jsonl``
(``ready`` and ``messages``, seconds after the step's backward ended).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from ..strategies import uses_servers
from .common import new_figure, strategy_color
from .timeline import run_info

UNIT = re.compile(r"(?:chunk|bucket) (\d+)")


def unit_times(record: dict) -> pd.DataFrame:
    """One row per unit of a step record: ``ready``, ``sent`` (a push's start, or a reduction's) and ``back``
    (a reply's arrival, or the reduction's end), seconds after backward ended."""
    rows: dict[int, dict] = {}
    for i, t in record.get("ready") or []:
        rows.setdefault(int(i), {})["ready"] = float(t)
    for name, start, dur in record.get("messages") or []:
        m = UNIT.search(name)
        if not m:
            continue
        row = rows.setdefault(int(m.group(1)), {})
        if name.startswith("push"):
            row["sent"] = float(start)
        elif name.startswith("params"):
            row["back"] = float(start) + float(dur)
        else:  # a reduction: it leaves when it starts and is back when it ends
            row["sent"], row["back"] = float(start), float(start) + float(dur)
    df = pd.DataFrame.from_dict(rows, orient="index").sort_index()
    return df.rename_axis("unit").reset_index()


def pick_step(run_dir: Path, rank: int = 0) -> dict | None:
    """The first timed step (after warm-up) of ``rank`` whose record has messages and readiness."""
    path = Path(run_dir) / "steps.jsonl"
    if not path.is_file():
        return None
    warm = int(run_info(run_dir).get("warmup", 3))
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    ok = [r for r in recs if r.get("rank") == rank and r.get("messages") and r.get("ready")]
    return next((r for r in ok if r["step"] >= warm), ok[-1] if ok else None)


def figure_priority(run_dir: Path, rank: int = 0):
    run_dir = Path(run_dir)
    rec = pick_step(run_dir, rank)
    if rec is None:
        raise ValueError(f"{run_dir}: no traced step with readiness and messages (run with --trace)")
    df = unit_times(rec)
    info = run_info(run_dir)
    fig, axes = new_figure(8, 4.2)
    ax = axes[0][0]
    color = strategy_color(info.get("sync"))
    ax.axvspan(-float(rec.get("backward_s") or 0), 0, color="0.92", label="backward")
    for col, marker, label in (("ready", "|", "made by backward"), ("sent", ".", "left the worker"),
                               ("back", "x", "parameters back")):
        if col in df:
            ax.scatter(df[col], df["unit"], marker=marker, s=14, label=label,
                       color={"ready": "0.4", "sent": color, "back": "k"}[col])
    ax.set_xlabel("s after backward ended (the next forward begins here, first layers = highest index)")
    ax.set_ylabel("bucket / chunk index (0 = last layer)")
    n, s = info.get("workers"), info.get("servers")
    servers = f", S={s}" if s and uses_servers(info.get("sync")) else ""
    ax.set_title(f"{info.get('sync')} N={n}{servers}, "
                 f"--overlap {info.get('overlap')}: step {rec['step']}, rank {rank}")
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(alpha=0.3)
    return fig
