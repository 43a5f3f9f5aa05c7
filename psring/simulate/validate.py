"""Every committed emulated run the simulator replays, simulated with its own settings and held against
what it measured: ``python -m psring.simulate.validate [--out results/simulate]`` writes
``OUT/validation.csv`` (one row per run: measured and simulated sync and step time, their ratios, whether
the run was link-bound) and, for the runs it does not replay, the reason.

A run's own ``config.json`` is simulated as it is (its strategy, N, S, G, links, burst, model, buckets,
chunks, window, compute, overlap, steps and warm-up), with alpha = the emulated link's calibrated 205 us;
an overlapped run with the partitions or chunks it cut (``partition_bytes``, ``chunk_bytes``: its probe, its
cores); and a local optimizer's update as the run measured it (``update_s_p50``, ``records.measured_update_s``).

Link-bound (``link_bound``): the run was not CPU-saturated (``cpu_saturated``: the largest of ``cpu_util``,
``cpu_util_sync`` and, where recorded, ``cpu_util_comm`` below 0.9), and the CPU it measured per step would fit in the machine's cores at its replayed
step (``cpu_at_replay`` = ``cpu_util`` x measured step / replayed step < ``CPU_FITS``, the share
``bounds.cpu_at_bound`` reads at a run's bound): a run whose own CPU needs more than the cores during the step the
links would allow is decided by the CPU, whatever its mean utilisation says (a codec's encode and decode at a few
ranks at a time, sleeps between). The replayed step is this judgement's own denominator: a run the replay
underestimates reads higher; ``results/simulate/README.md`` gives the count without it too.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

from ..config import ConfigError, TrainConfig
from ..metrics.cpu import SATURATED
from .checks import check, overlapped
from .records import measured_update_s
from .run import simulate

FOLDERS = ("bandwidth", "servers", "topology", "ring", "models", "overlap", "compression_sync", "visible",
           "compare_emulated", "bandwidth_hidden", "bandwidth_repeats", "consistency_emulated")
COLUMNS = ["folder", "run_id", "sync", "workers", "servers", "workers_per_host", "link_rate", "model", "overlap", "compress",
           "sync_s", "sim_sync_s", "sync_ratio", "step_s", "sim_step_s", "step_ratio", "update_s", "cpu_at_replay", "link_bound",
           "replayed"]
CPU_FITS = SATURATED  # as cpu_saturated's threshold: above it the cores, not the links, set the pace


def runs_of(results: Path) -> list[tuple[str, Path, dict]]:
    """(folder, run folder, its runs.csv row) of every emulated multi-worker run under ``results``."""
    out = []
    for name in FOLDERS:
        table = results / name / "runs.csv"
        if not table.exists():
            continue
        df = pd.read_csv(table)
        for row in df.to_dict("records"):
            run = results / name / "runs" / str(row["run_id"])
            if row.get("net") == "emulated" and int(row["workers"]) > 1 and row.get("status") == "ok" \
                    and (run / "config.json").exists():
                out.append((name, run, row))
    return out


def validate_one(folder: str, run: Path, row: dict, scratch: Path) -> dict:
    cfg = TrainConfig.load(run / "config.json")
    base = {"folder": folder, "run_id": row["run_id"], "sync": row["sync"], "workers": int(row["workers"]),
            "servers": int(row["servers"]), "workers_per_host": cfg.per_host, "link_rate": row.get("link_rate"),
            "model": row["model"], "overlap": cfg.overlap, "compress": cfg.compress, "sync_s": row.get("sync_s_p50"), "step_s": row.get("step_s_p50"),
            "link_bound": not (pd.notna(row.get("cpu_saturated")) and bool(row.get("cpu_saturated")))}
    try:
        check(cfg)  # what the replay does not model: one line, kept as the reason
    except ConfigError as e:
        return {**base, "replayed": f"no: {str(e).split(':')[0][:80]}"}
    tuned = {k: float(row[k]) for k in ("partition_bytes", "chunk_bytes") if pd.notna(row.get(k))}
    update = measured_update_s(row, cfg.sync)
    s = simulate(cfg, scratch / str(row["run_id"]).replace(":", "_"), tuned=tuned if overlapped(cfg) else None,
                 update_s=update)
    sim = {"sim_sync_s": s["sync_s_p50"], "sim_step_s": s["step_s_p50"], "update_s": update, "replayed": "yes"}
    sim["sync_ratio"] = sim["sim_sync_s"] / base["sync_s"] if base["sync_s"] else None
    sim["step_ratio"] = sim["sim_step_s"] / base["step_s"] if base["step_s"] else None
    cpu = row.get("cpu_util")
    if pd.notna(cpu) and base["step_s"] and sim["sim_step_s"]:
        sim["cpu_at_replay"] = float(cpu) * base["step_s"] / sim["sim_step_s"]
        base["link_bound"] = base["link_bound"] and sim["cpu_at_replay"] < CPU_FITS
    return {**base, **sim}


def validation_table(results: Path, echo: bool = False) -> pd.DataFrame:
    rows = []
    with tempfile.TemporaryDirectory(prefix="psring-validate-") as tmp:
        for folder, run, row in runs_of(results):
            rows.append(validate_one(folder, run, row, Path(tmp)))
            if echo:
                r = rows[-1]
                ratio = f"{r['sync_ratio']:.3f}" if r.get("sync_ratio") else r["replayed"]
                print(f"{folder:>16} {r['sync']:>12} N={r['workers']:<2} S={r['servers']:<2} {ratio}", flush=True)
    return pd.DataFrame(rows, columns=COLUMNS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m psring.simulate.validate", description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="results")
    ap.add_argument("--out", default="results/simulate")
    a = ap.parse_args(argv)
    if not Path(a.results).is_dir():
        print(f"psring simulate validate: error: {a.results} is not a folder", file=sys.stderr)
        return 2
    df = validation_table(Path(a.results), echo=True)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    df.to_csv(Path(a.out) / "validation.csv", index=False)
    print(f"{len(df)} runs, {int((df['replayed'] == 'yes').sum())} replayed: {Path(a.out) / 'validation.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
