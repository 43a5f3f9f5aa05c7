"""Turn a run's per-step records into ``steps.jsonl`` (merged, sorted) and ``summary.json``.

Warm-up steps (the first ``warmup``) are left out of every figure except ``first_loss``/``final_loss``.
A step's wall time is the slowest worker's ``step_s`` (a synchronous step ends when its last worker does).
``cpu_util`` is the machine's CPU utilisation (all cores) over the timed steps, from rank 0's records:
from the end of the last warm-up step (or the log's opening) to the end of the last timed step.
``cpu_util_sync`` the same during the timed steps' ``Synchronizer.step`` alone (emulated compute is an
idle wait that dilutes the whole step's figure); ``cpu_saturated``: either of them >= 0.9, i.e. the
run's time may be the CPU's rather than the link's. On an emulated network the launcher adds
``cpu_util_comm``, the same over the timed steps' intervals in which a link carried traffic
(``net.links.comm_cpu``), and ``saturated`` weighs it too.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from ..fileio import WriteError, describe, write_atomic
from .cpu import SATURATED, utilisation
from .jsonl import read_jsonl

PHASES = ["data_s", "forward_s", "backward_s", "sync_s", "update_s"]
SYNC_PARTS = ["push_s", "wait_s", "pull_s", "allreduce_wait_s", "buffers_s"]  # buffers_s: --buffers
SERVER_PARTS = ["recv_s", "aggregate_s", "update_s", "send_s", "wait_slowest_s"]


def _num(x):
    """JSON-safe number: NaN/inf (e.g. sync_s of ddp) become None."""
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) or math.isinf(x) else x


def summarize(steps: pd.DataFrame, workers: int, warmup: int, servers: pd.DataFrame | None = None) -> dict:
    if steps.empty:
        return {"steps_completed": 0}
    per_step = steps.groupby("step")
    complete = per_step.size()
    complete = complete[complete == workers].index
    timed_ids = [s for s in complete if s >= warmup] or list(complete[-1:])
    timed = steps[steps["step"].isin(timed_ids)]
    wall = timed.groupby("step")["step_s"].max()
    step_total = timed["step_s"].sum()
    out = {
        "steps_completed": len(complete),
        "warmup_steps": warmup,
        "timed_steps": len(timed_ids),
        "samples_per_s": _num(timed["samples"].sum() / wall.sum()) if wall.sum() > 0 else None,
        "step_s_p50": _num(wall.quantile(0.5)),
        "step_s_p90": _num(wall.quantile(0.9)),
        "step_s_p99": _num(wall.quantile(0.99)),
        "step_s_mean": _num(wall.mean()),
    }
    if "rank" in timed:  # each worker at its own pace: under ASP/SSP faster ones do not wait for the slowest
        own = timed.groupby("rank")[["samples", "step_s"]].sum()
        out["worker_samples_per_s"] = _num((own["samples"] / own["step_s"]).sum()) if (own["step_s"] > 0).all() \
            else None
    for ph in PHASES + [p for p in SYNC_PARTS if p in steps.columns]:
        col = pd.to_numeric(timed[ph], errors="coerce") if ph in timed else None
        ok = col is not None and col.notna().all()
        out[f"{ph}_p50"] = _num(col.median()) if ok else None
        out[f"share_{ph[:-2]}"] = _num(col.sum() / step_total) if ok and step_total > 0 else None
    out["sync_share"] = out["share_sync"]
    out["cpu_util"] = _num(cpu_utilisation(steps, timed_ids))
    out["cpu_util_sync"] = _num(sync_cpu_utilisation(steps, timed_ids))
    out["cpu_saturated"] = saturated(out)
    out["bytes_sent_per_step"] = _num(timed["bytes_sent"].mean())
    out["bytes_recv_per_step"] = _num(timed["bytes_recv"].mean())
    if "buffer_bytes" in timed:  # --buffers broadcast|average: the part of bytes_sent that was buffers
        out["buffer_bytes_per_step"] = _num(pd.to_numeric(timed["buffer_bytes"], errors="coerce").mean())
    # counted by the kernel per host link (--net emulated): by every worker with one per host, by local
    # rank 0 of each host where G workers share one (the others record none)
    for k in ("wire_tx_bytes", "wire_rx_bytes"):
        col = pd.to_numeric(timed[k], errors="coerce") if k in timed else None
        out[f"{k}_per_step"] = _num(col.mean()) if col is not None and col.notna().any() else None
    if servers is not None and not servers.empty:
        st = servers[servers["step"].isin(timed_ids)]
        out["server_bytes_recv_per_step"] = _num(st["bytes_recv"].mean())
        out["server_bytes_sent_per_step"] = _num(st["bytes_sent"].mean())
        for ph in SERVER_PARTS:
            out[f"server_{ph}_p50"] = _num(st[ph].median())
        out["server_errors"] = int(servers["errors"].sum())
        out.update(staleness_summary(servers))
    losses = steps[steps["step"].isin(complete)].groupby("step")["loss"].mean()
    out["first_loss"] = _num(losses.iloc[0]) if len(losses) else None
    out["final_loss"] = _num(losses.iloc[-1]) if len(losses) else None
    # held-out accuracy at epoch ends, as rank 0 measured it (the same everywhere under BSP)
    acc = steps[(steps["rank"] == 0) & steps["test_acc"].notna()] if "test_acc" in steps else steps.iloc[:0]
    out["final_test_acc"] = _num(acc["test_acc"].iloc[-1]) if len(acc) else None
    out["best_test_acc"] = _num(acc["test_acc"].max()) if len(acc) else None
    out["epochs_evaluated"] = len(acc)
    return out


def saturated(summary: dict) -> bool | None:
    """``cpu_saturated``: the largest known of ``cpu_util``, ``cpu_util_sync`` and ``cpu_util_comm`` is at
    least ``SATURATED``; None where none is known."""
    known = [summary.get(k) for k in ("cpu_util", "cpu_util_sync", "cpu_util_comm")]
    known = [u for u in known if u is not None]
    return max(known) >= SATURATED if known else None


def timed_window(records: list[dict], warmup: int) -> tuple[float, float] | None:
    """Rank 0's wall-clock span of the timed steps: from the end of the step before the first timed one (as
    ``cpu_utilisation`` takes it; without warm-up, the first step's start, where that takes the log's opening
    sample) to the end of the last step; None without rank 0's records."""
    r0 = sorted((r for r in records if r.get("rank") == 0 and "time" in r), key=lambda r: r["step"])
    if not r0:
        return None
    before = [r for r in r0 if r["step"] < warmup]
    start = before[-1]["time"] if before else r0[0]["time"] - r0[0].get("step_s", 0.0)
    return start, r0[-1]["time"]


def warmup_of(config: dict) -> int:
    """The warm-up steps a run's figures leave out (at most all but the last step)."""
    return min(config.get("warmup", 3), max(0, config["steps"] - 1))


def cpu_utilisation(steps: pd.DataFrame, timed_ids: list) -> float | None:
    """Rank 0's Δbusy / Δtotal from the end of the step before the first timed one (the log's opening
    sample where there is none) to the end of the last timed step; None without the samples."""
    if "cpu_busy" not in steps or not timed_ids:
        return None
    r0 = steps[steps["rank"] == 0].set_index("step").sort_index()
    before = r0[r0.index < min(timed_ids)]
    if len(before):
        start = before.iloc[-1][["cpu_busy", "cpu_total"]]
    elif "cpu_busy0" in r0 and len(r0):
        start = r0.iloc[0][["cpu_busy0", "cpu_total0"]]
    else:
        return None
    if max(timed_ids) not in r0.index:
        return None
    end = r0.loc[max(timed_ids), ["cpu_busy", "cpu_total"]]
    pairs = [tuple(pd.to_numeric(x, errors="coerce")) for x in (start, end)]
    return None if any(pd.isna(v) for p in pairs for v in p) else utilisation(*pairs)


MIN_SYNC_JIFFIES = 50  # below this (0.25 s of 2 cores) the sync phase is too short to tell


def sync_cpu_utilisation(steps: pd.DataFrame, timed_ids: list) -> float | None:
    """Rank 0's CPU utilisation during ``Synchronizer.step`` over the timed steps: Σ Δbusy / Σ Δtotal
    of its ``cpu_sync`` samples. None without them or when the phases add up to too few ticks."""
    if "cpu_sync" not in steps:
        return None
    r0 = steps[(steps["rank"] == 0) & steps["step"].isin(timed_ids)]
    samples = [s for s in r0["cpu_sync"] if isinstance(s, list) and len(s) == 4]
    if not samples or len(samples) < len(r0):
        return None
    busy, total = sum(s[2] - s[0] for s in samples), sum(s[3] - s[1] for s in samples)
    return busy / total if total >= MIN_SYNC_JIFFIES else None


def staleness_summary(servers: pd.DataFrame) -> dict:
    """Over every applied push of the run (SSP/ASP; 0 under BSP): the largest and the mean staleness
    (clock units: how many steps behind the slowest clock the pushed gradient's parameters were)."""
    if "staleness" not in servers:
        return {}
    hist: dict[int, int] = {}
    for h in servers["staleness"].dropna():
        for value, count in h.items():
            hist[int(value)] = hist.get(int(value), 0) + int(count)
    total = sum(hist.values())
    return {"server_staleness_max": max(hist) if hist else None,
            "server_staleness_mean": _num(sum(v * c for v, c in hist.items()) / total) if total else None,
            "server_staleness_hist": {str(k): hist[k] for k in sorted(hist)}}


def load_server_records(out: Path) -> pd.DataFrame:
    frames = []
    for f in sorted((Path(out) / "servers").glob("server*.jsonl")):
        recs = read_jsonl(f)
        if recs:
            frames.append(pd.DataFrame(recs).assign(server=int(f.stem.removeprefix("server"))))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def finalize_run(out: Path, config: dict) -> dict:
    """Merge ``out/ranks/rank*.jsonl`` into ``out/steps.jsonl`` and write ``out/summary.json``."""
    out = Path(out)
    records = []
    for f in sorted((out / "ranks").glob("rank*.jsonl")):
        records += read_jsonl(f)
    records.sort(key=lambda r: (r["step"], r["rank"]))
    # whole or not at all (a full disk: WriteError naming it; an earlier steps.jsonl stays as it was)
    write_atomic(out / "steps.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    warmup = warmup_of(config)
    summary = {k: config[k] for k in ("sync", "workers", "servers", "model", "batch_size", "steps")}
    summary["epochs"] = config.get("epochs")  # --epochs E (None: --steps), which became ``steps``
    summary.update(summarize(pd.DataFrame(records), config["workers"], warmup, load_server_records(out)))
    if (out / "tuned.json").exists():  # the link schedule attach chose (probe rate, partition, chunk)
        summary.update(json.loads((out / "tuned.json").read_text()))
    write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    if config.get("trace"):
        from .trace import write_trace

        try:
            write_trace(out)
        except OSError as e:
            (out / "trace.json").unlink(missing_ok=True)  # not half a trace
            raise WriteError(describe(e, out / "trace.json")) from None
    return summary
