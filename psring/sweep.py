"""``psring sweep FILE.toml``: run every configuration a sweep file lists, each as a fresh set of
processes, and collect one tidy row per run in ``OUT/runs.csv``.

A sweep file has up to three tables (see experiments/)::

    [sweep]            name = "scaling", description = "..."
    [grid]             sync = ["none", "ps"], workers = [1, 2, 4], servers = [1, "N"]   # cross product
    [[runs]]           explicit configurations (each crossed with [grid]; default: one empty run)
    [fixed]            model = "cnn", steps = 30, ...                                     # every run

Keys are ``psring train`` option names with ``_`` (``batch_size``, ``lr``, ...). ``servers = "N"``
means as many servers as workers; ``servers`` only applies to ``ps`` (other strategies get one run).
Finished runs (``runs/ID/summary.json`` with the same config) are skipped when the sweep is run again;
a failed run is recorded with its reason and the sweep goes on.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import time
import tomllib
from pathlib import Path

import pandas as pd

from .config import ConfigError, OptimConfig, TrainConfig

OPTIM_KEYS = {f.name for f in dataclasses.fields(OptimConfig)}
CONFIG_KEYS = ({f.name for f in dataclasses.fields(TrainConfig)} - {"optim", "out", "ps_addrs"}) | OPTIM_KEYS
ID_KEYS = ["sync", "workers", "servers"]  # first in a run's id, the rest alphabetically


def load_sweep(path: Path) -> tuple[dict, list[dict]]:
    """``(meta, runs)``: the [sweep] table and the list of resolved per-run settings (deduplicated)."""
    try:
        doc = tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"cannot read sweep file {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"sweep file {path} is not valid TOML: {e}") from None
    unknown = set(doc) - {"sweep", "grid", "runs", "fixed"}
    if unknown:
        raise ConfigError(f"sweep file {path}: unknown table(s) {', '.join(sorted(unknown))}")
    grid, fixed, base = doc.get("grid", {}), doc.get("fixed", {}), doc.get("runs", [{}])
    for where, table in [("grid", grid), ("fixed", fixed)] + [("runs", r) for r in base]:
        bad = set(table) - CONFIG_KEYS
        if bad:
            raise ConfigError(f"sweep file {path}: unknown key(s) in [{where}]: {', '.join(sorted(bad))}")
    for k, v in grid.items():
        if not isinstance(v, list) or not v:
            raise ConfigError(f"sweep file {path}: [grid] {k} must be a non-empty list")
    runs, seen = [], set()
    keys = list(grid)
    for b in base:
        for values in itertools.product(*(grid[k] for k in keys)):
            run = _resolve_servers({**fixed, **b, **dict(zip(keys, values))})
            ident = json.dumps(run, sort_keys=True)
            if ident not in seen:
                seen.add(ident)
                runs.append(run)
    return doc.get("sweep", {}), runs


def varying_keys(runs: list[dict]) -> list[str]:
    """The settings that name a run: sync, workers, servers, and whatever else differs between runs."""
    keys = {k for r in runs for k in r}
    varying = {k for k in keys if len({json.dumps(r.get(k)) for r in runs}) > 1}
    return [k for k in ID_KEYS] + sorted(varying - set(ID_KEYS))


def _resolve_servers(run: dict) -> dict:
    run = dict(run)
    if run.get("sync", TrainConfig.sync) != "ps":
        run["servers"] = 1
    elif run.get("servers") == "N":
        run["servers"] = run.get("workers", 1)
    return run


def run_id(run: dict, keys: list[str]) -> str:
    d = TrainConfig()
    return "_".join(f"{k}-{run.get(k, getattr(d.optim if k in OPTIM_KEYS else d, k, None))}" for k in keys)


def make_config(run: dict, out: Path) -> TrainConfig:
    optim = OptimConfig(**{k: v for k, v in run.items() if k in OPTIM_KEYS})
    cfg = TrainConfig(**{k: v for k, v in run.items() if k not in OPTIM_KEYS}, optim=optim, out=str(out))
    return cfg.validate()


def _comparable(cfg: dict) -> dict:
    """A config as it reads back from config.json (tuples become lists), without run-specific paths."""
    return json.loads(json.dumps({k: v for k, v in cfg.items() if k not in ("out", "ps_addrs")}))


def is_finished(run_dir: Path, cfg: TrainConfig) -> bool:
    try:
        done = json.loads((run_dir / "config.json").read_text())
        return (run_dir / "summary.json").exists() and _comparable(done) == _comparable(cfg.to_dict())
    except (OSError, json.JSONDecodeError):
        return False


def flat_config(cfg: TrainConfig) -> dict:
    d = _comparable(cfg.to_dict())
    d.update(d.pop("optim"))
    return d


def _key(v) -> str:
    """A setting as comparable text; unset (None, or NaN once read back from CSV) is ''. (pandas 3 keeps
    NaN missing under ``astype(str)``, so NaN never equals NaN there.)"""
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def add_scaling(df: pd.DataFrame) -> pd.DataFrame:
    """speedup = samples/s over the N=1 run of the same sweep with the same other settings (``none`` if
    the sweep has it, else the same strategy); efficiency = speedup / N."""
    # communication settings do not change a run without communication (the none baseline), and some
    # default per strategy (ps buckets are 4 MB, allreduce's 25): they must not keep rows from their base
    comm = {"bucket_mb", "first_bucket_mb", "frame_kb", "overlap", "consistency", "staleness", "ps_design", "curve"}
    cfg_cols = [c for c in df.columns if c in CONFIG_KEYS and c not in {"sync", "workers", "servers", "seed", *comm}]
    df = df.copy()
    df["speedup"] = float("nan")
    ok = df[(df["status"] == "ok") & (df["workers"] == 1)]
    for i, row in df[df["status"] == "ok"].iterrows():
        same = ok
        for c in cfg_cols:
            same = same[same[c].map(_key) == _key(row[c])]
        base = same[same["sync"] == "none"]
        if base.empty:
            base = same[same["sync"] == row["sync"]]
        if not base.empty:
            df.loc[i, "speedup"] = row["samples_per_s"] / base["samples_per_s"].iloc[0]
    df["efficiency"] = df["speedup"] / df["workers"]
    return df


def _fmt_s(s: float) -> str:
    m, s = divmod(int(s), 60)
    return f"{m}m{s:02d}s"


def run_sweep(path: str, out: str | None = None, echo: bool = False) -> pd.DataFrame:
    from .launch.launcher import LaunchError, launch

    meta, runs = load_sweep(Path(path))
    out_dir = Path(out or Path("results") / meta.get("name", Path(path).stem))
    out_dir.mkdir(parents=True, exist_ok=True)
    keys = varying_keys(runs)
    ids = [run_id(r, keys) for r in runs]
    configs = [make_config(r, out_dir / "runs" / i) for r, i in zip(runs, ids)]  # validate all, run none yet
    rows, t0, executed = [], time.monotonic(), 0
    for i, (ident, cfg) in enumerate(zip(ids, configs), 1):
        run_dir = Path(cfg.out)
        row = {"run_id": ident, **flat_config(cfg)}
        if is_finished(run_dir, cfg):
            print(f"[{i}/{len(runs)}] {ident}: finished earlier, skipped", flush=True)
            row.update(status="ok", error="", **json.loads((run_dir / "summary.json").read_text()))
        else:
            elapsed = time.monotonic() - t0
            todo = sum(1 for c in configs[i - 1:] if not is_finished(Path(c.out), c))
            eta = f", about {_fmt_s(elapsed / executed * todo)} left" if executed else ""
            print(f"[{i}/{len(runs)}] {ident}: running (elapsed {_fmt_s(elapsed)}{eta})", flush=True)
            try:
                row.update(status="ok", error="", **launch(cfg, echo=echo))
            except (LaunchError, ConfigError) as e:
                row.update(status="failed", error=str(e))
                print(f"[{i}/{len(runs)}] {ident}: FAILED: {e}", flush=True)
            executed += 1
        rows.append(row)
        write_runs_csv(rows, out_dir)
    print(f"sweep done in {_fmt_s(time.monotonic() - t0)}: {out_dir / 'runs.csv'}", flush=True)
    return write_runs_csv(rows, out_dir)


def write_runs_csv(rows: list[dict], out_dir: Path) -> pd.DataFrame:
    df = add_scaling(pd.DataFrame(rows))
    tmp = out_dir / "runs.csv.tmp"
    df.to_csv(tmp, index=False)
    tmp.rename(out_dir / "runs.csv")
    return df
