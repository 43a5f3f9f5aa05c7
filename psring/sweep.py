"""``psring sweep FILE.toml``: run every configuration a sweep file lists, each as a fresh set of
processes, and collect one tidy row per run in ``OUT/runs.csv``.

A sweep file has up to three tables (see experiments/)::

    [sweep]            name = "scaling", description = "..."
    [grid]             sync = ["none", "ps"], workers = [1, 2, 4], servers = [1, "N"]   # cross product
    [[runs]]           explicit configurations (each crossed with [grid]; default: one empty run)
    [fixed]            model = "cnn", steps = 30, ...                                     # every run

Keys are ``psring train`` option names with ``_`` (``batch_size``, ``lr``, ...). ``servers = "N"``
means as many servers as workers, ``"N/4"`` a quarter of them; ``servers`` only applies to ``ps`` (other
strategies get one run). ``[sweep] simulate = true``: every run is replayed by ``psring simulate`` instead
(any N, no root), and ``jitter``/``alpha_us``/``readiness`` are settings too.
``epochs = E`` instead of ``steps``: each run trains E epochs of its own global batch (so its baseline, one
worker, runs N times its steps); runs.csv has both ``epochs`` and the ``steps`` they became.
Finished runs (``runs/ID/summary.json`` with the same config) are skipped when the sweep is run again;
a failed run is recorded with its reason and the sweep goes on. ``--only``, ``--rerun`` and ``--list``
choose which runs run (``sweep_select``), and a finished run run again is moved aside, never deleted.

Every run's ``speedup`` is its samples/s over the one of a single worker that trains alone without
communication (``sync = "none"``, ``workers = 1``) with the same settings except those of
``BASELINE_FREE`` (communication, straggler, resume). A sweep that lacks that baseline gets it: one
``none`` N=1 run per distinct combination of the other settings is added to the sweep (run first; it
shows up in the run list like any run), with the ``BASELINE_FREE`` settings left at their defaults. So
an emulated-network sweep's baseline runs on loopback and needs no root: a lone ``none`` worker never
sends a byte, and a network it never used must not slow or name it.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
import time
from functools import partial
from pathlib import Path

import pandas as pd

from . import strategies
from .config import DEFAULT_STEPS, ConfigError, OptimConfig, TrainConfig
from .fileio import out_folder, read_toml
from .results import load_summary
from .sweep_select import comparable_config, is_finished, list_runs, move_aside, parse_only, select

OPTIM_KEYS = {f.name for f in dataclasses.fields(OptimConfig)}
CONFIG_KEYS = ({f.name for f in dataclasses.fields(TrainConfig)} - {"optim", "out", "ps_addrs"}) | OPTIM_KEYS
ID_KEYS = ["sync", "workers", "servers"]  # first in a run's id, the rest alphabetically
# Communication settings: how gradients travel, not what is trained. bucket_mb even defaults per strategy
# (ps 4 MB, allreduce 25), so no run could share it with its baseline.
COMM_KEYS = frozenset({"bucket_mb", "first_bucket_mb", "frame_kb", "overlap", "consistency", "staleness",
                       "ps_design", "ps_window", "curve", "net", "link_rate", "server_link_rate", "link_delay", "backend",
                       "timeout_s", "compress", "error_feedback", "workers_per_host", "ps_placement",
                       "ps_credit_mb", "link_tuning", "link_burst", "link_cc", "link_sample_ms"})
# What a baseline does not share with the runs it is the baseline of: communication; the straggler, one
# slow machine of the N whose cost the speedup is to show (and rank 1 does not exist at N=1); and resume,
# another run's checkpoint. Every other setting (model, data, compute, optimizer, threads, steps, seed,
# ...) must be equal: they change what one worker computes, so they change the baseline.
# ``psring simulate``'s own settings, allowed where ``[sweep] simulate = true`` (the sweep is replayed, not run);
# a simulated baseline keeps its worker's mean compute whatever the jitter, so they are baseline-free too
SIM_KEYS = frozenset({"jitter", "alpha_us", "readiness"})
BASELINE_FREE = COMM_KEYS | {"straggler", "resume"} | SIM_KEYS
MATCHED_KEYS = CONFIG_KEYS - BASELINE_FREE - set(ID_KEYS)


def load_sweep(path: Path) -> tuple[dict, list[dict]]:
    """``(meta, runs)``: the [sweep] table and the list of resolved per-run settings (deduplicated),
    led by the baseline runs the sweep lacks (``missing_baselines``), so every speedup is known early."""
    doc = read_toml(Path(path), "sweep file")
    unknown = set(doc) - {"sweep", "grid", "runs", "fixed"}
    if unknown or not doc:
        raise ConfigError(f"sweep file {path}: " + (f"unknown table(s) {', '.join(sorted(unknown))}" if unknown else
                                                   "no [grid], [[runs]] or [fixed] table: nothing to run"))
    kinds = {"sweep": dict, "grid": dict, "fixed": dict, "runs": list}
    if any(not isinstance(doc[t], kinds[t]) for t in doc) or not all(isinstance(r, dict) for r in doc.get("runs", [])):
        raise ConfigError(f"sweep file {path}: [sweep], [grid] and [fixed] are tables, [[runs]] an array of tables")
    if not all(isinstance(doc.get("sweep", {}).get(k, ""), str) for k in ("name", "description")):
        raise ConfigError(f"sweep file {path}: [sweep] name and description are text")
    grid, fixed, base = doc.get("grid", {}), doc.get("fixed", {}), doc.get("runs", [{}])
    allowed = CONFIG_KEYS | (SIM_KEYS if doc.get("sweep", {}).get("simulate") else set())
    for where, table in [("grid", grid), ("fixed", fixed)] + [("runs", r) for r in base]:
        bad = set(table) - allowed
        if bad:
            raise ConfigError(f"sweep file {path}: unknown key(s) in [{where}]: {', '.join(sorted(bad))}")
        odd = sorted(k for k, v in table.items() if not _plain(v if isinstance(v, list) else [v]))
        if odd:
            raise ConfigError(f"sweep file {path}: [{where}] {', '.join(odd)}: a setting is text, a number, true or "
                              f"false, or a list of them (a TOML date, time or table is none)")
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
    return doc.get("sweep", {}), missing_baselines(runs) + runs


def _plain(values: list) -> bool:
    """Settings' values: text, numbers, true/false, or lists of them (``betas``; a grid lists such values)."""
    return all(isinstance(v, (str, int, float, bool)) or (isinstance(v, list) and _plain(v)) for v in values)


def _setting(run: dict, k: str):
    """A run's value of setting ``k``: as the sweep gives it, else TrainConfig's default."""
    if k in run:
        return run[k]
    if k == "steps" and run.get("epochs") is None:  # None until validate(), which may count --epochs
        return DEFAULT_STEPS
    d = TrainConfig()
    return getattr(d.optim if k in OPTIM_KEYS else d, k, None)


def is_baseline(run: dict) -> bool:
    """A run of the registry's baseline strategy (``none``) with one worker."""
    return strategies.is_baseline(_setting(run, "sync")) and _setting(run, "workers") == 1


def missing_baselines(runs: list[dict]) -> list[dict]:
    """The ``none`` N=1 runs that ``runs`` lack: one per combination of the MATCHED_KEYS settings that
    no baseline among ``runs`` has, with the BASELINE_FREE settings dropped (their defaults apply)."""
    def matched(run: dict) -> str:
        return json.dumps({k: _setting(run, k) for k in sorted(MATCHED_KEYS)})

    have = {matched(r) for r in runs if is_baseline(r)}
    added = []
    for r in runs:
        if matched(r) not in have:
            have.add(matched(r))
            added.append({**{k: v for k, v in r.items() if k in MATCHED_KEYS},
                          "sync": strategies.baseline_name(), "workers": 1, "servers": 1})
    return added


def varying_keys(runs: list[dict]) -> list[str]:
    """The settings that name a run: sync, workers, servers, and whatever else differs between runs. A
    baseline's BASELINE_FREE settings do not count: they leave it unchanged, and a sweep that gets a
    baseline added keeps the run ids it had (so finished runs are still found)."""
    def counts(k: str, r: dict) -> bool:
        return k not in BASELINE_FREE or not is_baseline(r)

    keys = {k for r in runs for k in r}
    varying = {k for k in keys if len({json.dumps(r.get(k)) for r in runs if counts(k, r)}) > 1}
    return [k for k in ID_KEYS] + sorted(varying - set(ID_KEYS))


def _resolve_servers(run: dict) -> dict:
    """``servers = "N"`` (as many as workers) or ``"N/K"`` (a K-th of them, at least one) made a number."""
    run = dict(run)
    v = run.get("servers")
    if not strategies.uses_servers(run.get("sync", TrainConfig.sync)):
        run["servers"] = 1
    elif isinstance(v, str):
        k = re.fullmatch(r"N(?:/([1-9][0-9]*))?", v)
        if k is None:
            raise ConfigError(f'servers = "{v}": a number, "N" (as many as workers) or "N/K" (a K-th of them)')
        w = run.get("workers", 1)  # (a workers that is no number: the run's type check says so)
        run["servers"] = max(1, w // int(k.group(1) or 1)) if isinstance(w, int) else v
    return run


def run_id(run: dict, keys: list[str]) -> str:
    # a baseline is not named after a BASELINE_FREE setting it does not set (e.g. link_rate-1gbit for a
    # run on loopback); one that sets it keeps it, so baselines that differ only there stay apart
    keys = [k for k in keys if k in run or k not in BASELINE_FREE or not is_baseline(run)]
    return "_".join(f"{k}-{_setting(run, k)}" for k in keys)


def make_configs(runs: list[dict], ids: list[str], out_dir: Path, path) -> list[TrainConfig]:
    """Every run's validated config; the first bad one is one line naming the sweep file and the run."""
    try:
        return [make_config(r, out_dir / "runs" / (ident := i)) for r, i in zip(runs, ids)]
    except ConfigError as e:
        raise ConfigError(f"sweep file {path}, run {ident}: {e}") from None


def make_config(run: dict, out: Path) -> TrainConfig:
    optim = OptimConfig(**{k: v for k, v in run.items() if k in OPTIM_KEYS})
    cfg = TrainConfig(**{k: v for k, v in run.items() if k not in OPTIM_KEYS | SIM_KEYS}, optim=optim,
                      out=str(out))
    return cfg.validate()


def flat_config(cfg: TrainConfig) -> dict:
    d = comparable_config(cfg.to_dict())
    d.update(d.pop("optim"))
    return d


def setting_text(v) -> str:
    """A setting as comparable text; unset (None, or NaN once read back from CSV) is ''. (pandas 3 keeps
    NaN missing under ``astype(str)``, so NaN never equals NaN there.)"""
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def baseline_of(df: pd.DataFrame) -> pd.Series:
    """For every row of a run table, the index label of its baseline row: the first ``ok`` run of ``none``
    with one worker whose MATCHED_KEYS columns (those the table has) equal the row's; None where none do."""
    if df.empty:
        return pd.Series(None, index=df.index, dtype=object)
    cols = [c for c in df.columns if c in MATCHED_KEYS]
    key = df[cols].apply(lambda r: json.dumps([setting_text(v) for v in r]), axis=1) if cols else \
        pd.Series("", index=df.index)
    ok = df["status"] == "ok" if "status" in df else pd.Series(True, index=df.index)
    base = key[ok & df["sync"].map(strategies.is_baseline) & (df["workers"] == 1)]
    first = {k: i for i, k in reversed(list(base.items()))}  # reversed: the first row wins
    return pd.Series([first.get(k) for k in key], index=df.index, dtype=object)  # object: labels stay labels


def add_scaling(df: pd.DataFrame) -> pd.DataFrame:
    """speedup = samples/s over the run's baseline (``baseline_of``: ``none`` at N=1, same settings but
    for BASELINE_FREE), the same reference for every strategy; NaN without one, never another run;
    efficiency = speedup / N."""
    df = df.copy()
    sps = pd.to_numeric(df["samples_per_s"], errors="coerce") if "samples_per_s" in df else \
        pd.Series(float("nan"), index=df.index)
    base = pd.Series([float("nan") if i is None else sps.loc[i] for i in baseline_of(df)], index=df.index)
    df["speedup"] = (sps / base).where(df["status"] == "ok")
    df["efficiency"] = df["speedup"] / df["workers"]
    return df


def _fmt_s(s: float) -> str:
    m, s = divmod(int(s), 60)
    return f"{m}m{s:02d}s"


def run_sweep(path: str, out: str | None = None, echo: bool = False, only: list[str] | None = None,
              rerun: bool = False, listing: bool = False) -> pd.DataFrame | None:
    """Run the sweep file's runs into ``out`` (``sweep_select``: ``only``, ``rerun``, ``listing``); returns
    runs.csv's table (None when ``listing``)."""
    meta, runs = load_sweep(Path(path))  # before the imports below (torch, 2 s): a bad file fails at once
    simulated = bool(meta.get("simulate"))
    if simulated:  # the cluster simulated is the emulated one, as psring simulate's
        runs = [{**r, "net": "emulated"} for r in runs]
    chosen = select(runs, parse_only(only, CONFIG_KEYS | (SIM_KEYS if simulated else set())), _setting)
    from .launch.launcher import LaunchError, launch
    from .simulate.cli import write_replay  # (held and cleared as psring simulate's --out)
    from .simulate.run import simulate
    from .simulate.sweep_runs import check_replays, other_kind, sim_settings

    out_dir = Path(out or Path("results") / meta.get("name", Path(path).stem))
    keys = varying_keys(runs)
    ids = [run_id(r, keys) for r in runs]
    configs = make_configs(runs, ids, out_dir, path)  # validate all, run none yet
    sims = [sim_settings(r) if simulated else None for r in runs]
    if simulated:
        check_replays(ids, configs)
    other = next(((i, k) for i, c in zip(ids, configs) if (k := other_kind(Path(c.out), simulated))), None)
    if other:  # before anything is written: runs.csv and its rows stay the other sweep's
        raise ConfigError(f"{out_dir} holds {other[1]} run ({other[0]}); give this sweep another --out")
    done = [is_finished(Path(c.out), c, m) for c, m in zip(configs, sims)]
    todo = [c and (rerun or not d) for c, d in zip(chosen, done)]
    if listing:
        return list_runs(ids, chosen, done, todo, [(Path(c.out) / "summary.json").exists() for c in configs])
    out_folder(out_dir)
    rows, t0, executed = [], time.monotonic(), 0
    for i, (ident, cfg, sim) in enumerate(zip(ids, configs, sims), 1):
        run_dir, where = Path(cfg.out), f"[{i}/{len(runs)}] {ident}"
        row = {"run_id": ident, **flat_config(cfg)}
        if not todo[i - 1]:
            print(f"{where}: {'finished earlier, skipped' if done[i - 1] else 'not selected'}", flush=True)
            row.update(status="ok", error="", **load_summary(run_dir)) if done[i - 1] else \
                row.update(status="not run", error="not selected (--only)")
        else:
            elapsed, left = time.monotonic() - t0, sum(todo[i - 1:])
            eta = f", about {_fmt_s(elapsed / executed * left)} left" if executed else ""
            print(f"{where}: running (elapsed {_fmt_s(elapsed)}{eta})", flush=True)
            try:
                if (run_dir / "summary.json").exists():  # finished: run again, or under another config
                    print(f"{where}: its finished run moved to {move_aside(run_dir, out_dir)}", flush=True)
                # overwrite: only a run this sweep itself left unfinished
                row.update(status="ok", error="", **(write_replay(run_dir, partial(simulate, cfg, run_dir, **sim))
                                                      if simulated else launch(cfg, echo=echo, overwrite=True)))
            except (LaunchError, ConfigError) as e:
                row.update(status="failed", error=str(e))
                print(f"{where}: FAILED: {e}", flush=True)
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
