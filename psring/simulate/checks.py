"""What ``psring simulate`` checks before it replays anything, torch-free (``cli`` runs them before importing the
replay, which imports the synchronizers' plans and with them torch): the jitter model, the config's compute,
overlap, codec, rates and burst; and the default alpha."""
from __future__ import annotations

import math

from .. import costmodel as cm
from .. import strategies
from ..compress.spec import NONE
from ..config import ConfigError, TrainConfig
from ..strategies import during_backward
from .profile import NO_JITTER

DEFAULT_ALPHA_US = 205.0  # one emulated 1 Gbit link's alpha, as results/bandwidth/calibration.json measured it


def parse_jitter(spec: str) -> tuple[str, float]:
    """``none`` or ``lognormal:CV`` (CV >= 0, the coefficient of variation of a worker's compute time)."""
    kind, _, cv = spec.partition(":")
    if kind == NO_JITTER and not cv:
        return NO_JITTER, 0.0
    try:
        value = float(cv)
    except ValueError:
        value = -1.0
    if kind != "lognormal" or not math.isfinite(value) or value < 0:
        raise ConfigError(f"--jitter {spec!r}: none or lognormal:CV with CV >= 0, e.g. lognormal:0.05")
    return kind, value


def check(cfg: TrainConfig) -> float:
    """The run's compute (s); one-line ``ConfigError`` for what the simulator does not replay."""
    from ..compress.spec import POWERSGD
    from ..train.compute_spec import parse_compute

    ms = parse_compute(cfg.compute)
    if not ms:
        raise ConfigError(f"psring simulate needs --compute emulated:MS (got {cfg.compute}): it replays time")
    model = strategies.attr(cfg.sync, "cost_model") if strategies.attr(cfg.sync, "reducer") else None
    ring = model == cm.RING_MODEL or model == cm.HIERARCHICAL_MODEL and cfg.overlap == "backward"
    if overlapped(cfg) and not (ring or strategies.uses_servers(cfg.sync) and cfg.consistency == "bsp"):
        raise ConfigError(f"psring simulate replays --overlap {cfg.overlap} for the flat ring's strategies, "
                          f"hierarchical's backward and the BSP PS only so far (got {cfg.sync}, --consistency "
                          f"{cfg.consistency})")
    if cfg.compress != NONE and (overlapped(cfg) or cfg.compress.partition(":")[0] == POWERSGD):
        raise ConfigError(f"psring simulate replays the codecs (fp16, bf16, top-k, random-k, 1-bit) with --overlap "
                          f"none only so far (got --compress {cfg.compress}, --overlap {cfg.overlap})")
    for flag, rate in (("--link-rate", cfg.link_rate), ("--server-link-rate", cfg.server_link_rate)):
        check_rate(flag, rate)
    if cfg.link_delay is not None:  # nothing in the replay reads it: refused rather than left out unsaid
        raise ConfigError(f"psring simulate does not replay --link-delay (got {cfg.link_delay!r}): its links have "
                          f"no propagation delay; drop it, or add it to the per-message --alpha-us")
    for flag, value in (("--resume", cfg.resume), ("--checkpoint-every", cfg.checkpoint_every)):
        if value:  # likewise: a replay starts at step 0 and writes no checkpoint
            raise ConfigError(f"psring simulate neither resumes nor writes checkpoints (got {flag} {value}): a replay "
                              f"starts at step 0; drop {flag}")
    burst_bytes(cfg.link_burst)
    return ms / 1000


def check_rate(flag: str, rate) -> None:
    """A link's rate (None: unset) as tc writes it, a finite number of bits or bytes a second above 0."""
    if rate is None:
        return
    try:
        bps = cm.Link.from_rate(rate).bandwidth_Bps
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{flag}: {e}") from None
    if not (math.isfinite(bps) and bps > 0):
        raise ConfigError(f"{flag} {rate!r}: a finite rate above 0, e.g. 1gbit, 100mbit, 2.5GB/s")


def overlapped(cfg: TrainConfig) -> bool:
    """Whether the run's communication overlaps compute (``--overlap backward|full``, N > 1, a strategy
    that communicates): ``overlapped.OverlapReplay`` replays it."""
    return during_backward(cfg.overlap) and cfg.workers > 1 and not strategies.is_baseline(cfg.sync)


def burst_bytes(burst: str) -> int:
    """tbf's burst (``--link-burst``, e.g. 1mb, 128kb) in bytes; one-line ``ConfigError`` else."""
    unit = {"kb": 1024, "mb": 2**20}.get(burst[-2:].lower())
    if unit is None or not burst[:-2].isdigit():
        raise ConfigError(f"--link-burst {burst!r}: kilobytes or megabytes, e.g. 128kb or 1mb")
    return int(burst[:-2]) * unit
