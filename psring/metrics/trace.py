"""``trace.json``: a run's timeline in the Chrome trace event format (Perfetto, chrome://tracing).

One process track per worker ("worker r") and per PS server ("server i"). Worker slices: one per step,
with its phases (data, forward, backward, sync, update) nested under it and the sync phase split into
its parts (ps: push, wait, pull); a second row ("messages") has a slice per shard message (ps) or
per all-reduce bucket. Server slices per step: waiting for the slowest worker (first push to
last push) and the aggregation + update + replies that follow. Marks on the messages row: when each
gradient bucket was ready (Horovod's readiness marks; a straggler's come late). With ``--net emulated``,
a counter track per host link ("link: worker 0"): MB/s up and down per ``links.jsonl`` sample. Times
are wall clock, microseconds.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..net.links import FILE as LINKS_FILE
from .jsonl import read_jsonl
from .summary import SYNC_PARTS

WORKER_PHASES = ["data_s", "forward_s", "backward_s", "sync_s", "update_s"]


def _slice(name: str, pid: int, ts_s: float, dur_s: float, tid: int = 0, **args) -> dict:
    return {"name": name, "ph": "X", "pid": pid, "tid": tid, "ts": ts_s * 1e6, "dur": max(dur_s, 0) * 1e6,
            "cat": "psring", "args": args}


def _instant(name: str, pid: int, ts_s: float, tid: int = 0, **args) -> dict:
    return {"name": name, "ph": "i", "s": "t", "pid": pid, "tid": tid, "ts": ts_s * 1e6, "cat": "psring",
            "args": args}


def _list(value) -> list:
    """A record's list field, or [] where it is absent (NaN once pandas filled the column)."""
    return value if isinstance(value, list) else []


def _meta(pid: int, name: str, sort: int) -> list[dict]:
    return [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}},
            {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": sort}},
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "phases"}},
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": 1, "args": {"name": "messages"}}]


def worker_events(steps: pd.DataFrame) -> list[dict]:
    events = []
    for rank in sorted(steps["rank"].unique()):
        pid = int(rank)
        events += _meta(pid, f"worker {rank}", pid)
        for r in steps[steps["rank"] == rank].to_dict("records"):
            start = r["time"] - r["step_s"]
            events.append(_slice(f"step {r['step']}", pid, start, r["step_s"], loss=r["loss"]))
            t = start
            for ph in WORKER_PHASES:
                dur = r.get(ph)
                if dur is None or pd.isna(dur):
                    continue
                events.append(_slice(ph[:-2], pid, t, dur, step=r["step"]))
                if ph == "sync_s":
                    for name, offset, mdur in _list(r.get("messages")):  # per shard / bucket, own row
                        events.append(_slice(name, pid, t + offset, mdur, tid=1, step=r["step"]))
                    for bucket, offset in _list(r.get("ready")):  # Horovod's readiness marks
                        events.append(_instant(f"bucket {bucket} ready", pid, t + offset, tid=1, step=r["step"]))
                    tp = t
                    for part in SYNC_PARTS:
                        if part in r and not pd.isna(r[part]):
                            events.append(_slice(part[:-2], pid, tp, r[part], step=r["step"]))
                            tp += r[part]
                t += dur
    return events


def server_events(servers: pd.DataFrame, first_pid: int) -> list[dict]:
    events = []
    for i in sorted(servers["server"].unique()):
        pid = first_pid + int(i)
        events += _meta(pid, f"server {i}", pid)
        for r in servers[servers["server"] == i].to_dict("records"):
            if r.get("t_first_push") and r.get("t_last_push"):
                events.append(_slice("wait for slowest worker", pid, r["t_first_push"],
                                     r["t_last_push"] - r["t_first_push"], step=r["step"]))
                events.append(_slice("update + reply", pid, r["t_last_push"], r["t_done"] - r["t_last_push"],
                                     step=r["step"], update_s=r["update_s"], bytes_sent=r["bytes_sent"]))
    return events


def link_events(out: Path, first_pid: int) -> list[dict]:
    """Perfetto counter tracks of every emulated host's link (``links.jsonl``): MB/s up and down per
    sample interval, one process track per host, named by what runs on it."""
    from ..config import TrainConfig
    from ..launch.placement import host_labels
    from ..net import links

    labels = host_labels(TrainConfig.load(out / "config.json"))
    events = [e for h, label in enumerate(labels)
              for e in _meta(first_pid + h, f"link: {label}", first_pid + h)[:2]]  # (no thread rows)
    for s in links.load(out / links.FILE):
        if s["dt"] <= 0:
            continue
        for h in range(min(len(labels), len(s["up"]))):
            events.append({"name": "MB/s", "ph": "C", "pid": first_pid + h, "ts": (s["time"] - s["dt"]) * 1e6,
                           "args": {"up": s["up"][h] / s["dt"] / 1e6, "down": s["down"][h] / s["dt"] / 1e6}})
    return events


def write_trace(out: Path) -> Path:
    out = Path(out)
    steps = pd.DataFrame(read_jsonl(out / "steps.jsonl"))
    events = worker_events(steps) if not steps.empty else []
    from .summary import load_server_records

    servers = load_server_records(out)
    if not servers.empty:
        events += server_events(servers, first_pid=1000)
    if (out / LINKS_FILE).is_file() and (out / "config.json").is_file():
        events += link_events(out, first_pid=2000)
    path = out / "trace.json"
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return path
