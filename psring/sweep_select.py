"""Which runs of a sweep this ``psring sweep`` runs, and what happens to a finished run it runs again.

- A run is finished when its folder holds a ``summary.json`` under the same settings (``is_finished``);
  a sweep run again skips it.

- ``--only KEY=VALUE`` (repeatable): only the runs whose setting KEY is VALUE; several values of one key
  select any of them, several keys all of them (``--only sync=ps --only link_rate=1gbit --only workers=4
  --only workers=8``). The other runs are not started: runs.csv still lists them, finished ones with their
  summaries (so every speedup keeps its baseline), the others as ``not run``.
- ``--rerun``: the selected runs are run again even where they finished.
- ``--list``: print each selected run and what this sweep would do with it; run nothing, write nothing.

A finished run is never deleted: one that is run again (``--rerun``, or a sweep file whose settings for it
changed) is first moved to ``OUT/replaced/ID.UTC-TIME``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from . import strategies
from .config import RAN_BEFORE, ConfigError, TrainConfig
from .fileio import out_folder
from .results import load_config, load_summary

REPLACED = "replaced"  # beside OUT/runs: finished runs this sweep ran again, each kept whole


def comparable_config(cfg: dict) -> dict:
    """A config as it reads back from config.json (tuples become lists), without run-specific paths; an
    ``overlap`` written as a bool before ``--overlap MODE`` as the mode it was."""
    out = json.loads(json.dumps({k: v for k, v in cfg.items() if k not in ("out", "ps_addrs")}))
    if "overlap" in out:
        out["overlap"] = strategies.overlap_mode(out["overlap"])
    return out


def is_finished(run_dir: Path, cfg: TrainConfig, sim: dict | None = None) -> bool:
    """Whether ``run_dir`` holds this config's finished run (a simulated one: with the same ``sim_settings``)."""
    try:
        done = load_config(run_dir)
        if sim is not None:
            summary = load_summary(run_dir)
            if {k: summary.get(k) for k in sim} != sim:
                return False
        now = comparable_config(cfg.to_dict())
        # an option added after the run was made counts as the same when this run leaves it at its default
        # or at the value the run ran with (``config.RAN_BEFORE``): a moved default replaces no finished run
        defaults = comparable_config(TrainConfig().to_dict())
        for k in set(now) - set(done):
            if now[k] in (defaults.get(k), RAN_BEFORE.get(k, defaults.get(k))):
                del now[k]
        return (run_dir / "summary.json").exists() and comparable_config(done) == now
    except (OSError, json.JSONDecodeError):
        return False


def parse_only(items: list[str] | None, allowed: set[str]) -> dict[str, set[str]]:
    """``--only`` items as {key: values}; a malformed item or a key no run can have is one line."""
    only: dict[str, set[str]] = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not key or not value.strip():
            raise ConfigError(f"--only {item!r}: give KEY=VALUE, e.g. --only sync=ps")
        if key not in allowed:
            raise ConfigError(f"--only {item!r}: {key!r} is not a setting of a sweep's runs "
                              f"(one of the keys of its [grid], [[runs]] and [fixed] tables)")
        only.setdefault(key, set()).add(value.strip().lower())
    return only


def text(v) -> str:
    """A setting as ``--only`` compares it: its text, lower case (True: ``true``, 1gbit, 0.1)."""
    return str(v).lower()


def select(runs: list[dict], only: dict[str, set[str]], setting) -> list[bool]:
    """For each run, whether ``only`` selects it (``setting(run, key)``: the run's value, else the
    default); a key whose values select no run is one line naming the values the sweep has."""
    for key, values in only.items():
        have = {text(setting(r, key)) for r in runs}
        if values - have:  # a typo among several values would drop its runs unsaid
            raise ConfigError(f"--only {key}={'/'.join(sorted(values - have))} selects no run of this sweep "
                              f"({key} takes {', '.join(sorted(have))})")
    chosen = [all(text(setting(r, k)) in vs for k, vs in only.items()) for r in runs]
    if not any(chosen):
        raise ConfigError(f"--only {' '.join(f'{k}={v}' for k, vs in only.items() for v in sorted(vs))} select no "
                          f"run together: each key's values select runs, but no run has them all")
    return chosen


def move_aside(run_dir: Path, out_dir: Path) -> Path:
    """Move a finished run out of the sweep's way, to ``out_dir/replaced/ID.UTC-TIME``; returns where."""
    from .launch.outdir import running_pid

    pid = running_pid(run_dir)
    if pid is not None:
        raise ConfigError(f"{run_dir} is in use by a running psring (pid {pid}); wait for it, or stop it")
    dest = out_dir / REPLACED / f"{run_dir.name}.{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    out_folder(dest.parent, "the replaced runs' folder")
    n = 1
    while dest.exists():  # two replacements within a second
        n += 1
        dest = dest.with_name(f"{dest.name.split('~')[0]}~{n}")
    try:
        run_dir.rename(dest)
    except OSError as e:
        raise ConfigError(f"cannot move the finished run {run_dir} aside to {dest}: {e.strerror}") from None
    return dest


def list_runs(ids: list[str], chosen: list[bool], done: list[bool], todo: list[bool], finished: list[bool]) -> None:
    """``--list``: each selected run and what the sweep would do with it; then how many of each."""
    for i, (ident, c, d, t, f) in enumerate(zip(ids, chosen, done, todo, finished), 1):
        if c:
            what = ("run again (its finished run moved aside first)" if d else
                    "run (a finished run under other settings moved aside first)" if f else "run") if t else \
                "finished earlier, skip"
            print(f"[{i}/{len(ids)}] {ident}: {what}")
    print(f"{sum(chosen)} of {len(ids)} runs selected: {sum(todo)} to run, "
          f"{sum(c and not t for c, t in zip(chosen, todo))} finished earlier")
