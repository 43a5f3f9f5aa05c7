"""Load psring outputs into pandas, for notebooks and users.

Example::

    from psring import results
    runs = results.load_runs("results/scaling")            # one row per run of the sweep
    steps = results.load_steps("results/scaling/runs/sync-ps_workers-2_servers-2")
    steps.groupby("rank")["sync_s"].median()
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .metrics.jsonl import read_jsonl
from .metrics.summary import load_server_records


def load_runs(sweep_dir: str | Path) -> pd.DataFrame:
    """A sweep's ``runs.csv``: config columns, status/error, every summary metric, speedup, efficiency."""
    path = Path(sweep_dir)
    path = path if path.suffix == ".csv" else path / "runs.csv"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found; run `psring sweep` first")
    return pd.read_csv(path)


def load_steps(run_dir: str | Path) -> pd.DataFrame:
    """A run's ``steps.jsonl``: one row per worker per step (see README, "Measures")."""
    return pd.DataFrame(read_jsonl(Path(run_dir) / "steps.jsonl"))


def load_servers(run_dir: str | Path) -> pd.DataFrame:
    """A ps run's per-server per-step figures (``servers/server*.jsonl``), with a ``server`` column."""
    return load_server_records(Path(run_dir))


def load_summary(run_dir: str | Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def load_config(run_dir: str | Path) -> dict:
    return json.loads((Path(run_dir) / "config.json").read_text())


def run_dirs(sweep_dir: str | Path) -> dict[str, Path]:
    """``{run_id: directory}`` of a sweep's runs."""
    return {p.name: p for p in sorted((Path(sweep_dir) / "runs").iterdir()) if p.is_dir()}
