"""What ``psring sweep`` needs to replay a grid (``[sweep] simulate = true``): each run's own simulator
settings, and the guard that keeps replayed and measured runs from overwriting each other."""
from __future__ import annotations

import json
import math
from pathlib import Path

from ..config import ConfigError
from ..results import load_summary
from .checks import DEFAULT_ALPHA_US, parse_jitter
from .profile import NO_JITTER, check_readiness


def sim_settings(run: dict) -> dict:
    """A simulated run's ``jitter``, ``alpha_us`` and ``readiness`` (``psring simulate``'s defaults where unset;
    the default readiness left out, as ``simulate`` leaves it out of the summary)."""
    jitter, alpha = run.get("jitter", NO_JITTER), run.get("alpha_us", DEFAULT_ALPHA_US)
    parse_jitter(str(jitter))  # one line for a bad model
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha < math.inf:
        raise ConfigError(f"alpha_us = {alpha!r}: a number of microseconds >= 0")
    readiness = check_readiness(str(run.get("readiness", "bytes")))
    return {"jitter": jitter, "alpha_us": float(alpha), **({"readiness": readiness} if readiness != "bytes" else {})}


def check_replays(ids: list[str], configs: list) -> None:
    """Every run of a replayed sweep passes the replay's own checks (``checks.check``) before any is replayed: a
    setting the simulator does not replay is one line naming the run, not a failure a run, found run by run."""
    from .checks import check

    for ident, cfg in zip(ids, configs):
        try:
            check(cfg)
        except ConfigError as e:
            raise ConfigError(f"run {ident}: {e}") from None


def other_kind(run_dir: Path, simulated: bool) -> str | None:
    """What ``run_dir`` holds if it is a finished run of the other kind (measured where this sweep replays,
    replayed where it measures): neither may overwrite the other."""
    try:
        done = bool(load_summary(run_dir).get("simulated"))
    except (OSError, json.JSONDecodeError):
        return None
    return None if done == simulated else ("a replayed" if done else "a measured")
