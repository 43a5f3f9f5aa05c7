"""``--compress`` specs as text, without torch: the launcher, config validation, sweeps and plots read
them, and none of them should pay for importing torch (about 2.5 s a process on this machine).
``codecs.parse`` turns a checked spec into a ``Codec``.

    NAME            none, fp16, bf16, onebit
    NAME:RATIO      topk:0.01, randomk:0.01       (0 < RATIO <= 1)
    powersgd:RANK   PowerSGD (all-reduce family)  (RANK an integer >= 1)
"""
from __future__ import annotations

NONE = "none"  # the identity's name; also a strategy's, so it is compared only through this constant
POWERSGD = "powersgd"
NAMES = (NONE, "fp16", "bf16", "topk", "randomk", "onebit")
RATIO = ("topk", "randomk")  # codecs that take a ratio
FEEDBACK = ("topk", "randomk", "onebit")  # codecs that carry error feedback (unless told not to)


def ratio(spec: str) -> float:
    """``topk:0.01`` -> 0.01; a one-line ValueError unless 0 < RATIO <= 1."""
    _, colon, text = spec.partition(":")
    if not colon:
        raise ValueError(f"codec {spec!r} needs a ratio, e.g. {spec}:0.01")
    try:
        r = float(text)
    except ValueError:
        r = float("nan")
    if not 0 < r <= 1:
        raise ValueError(f"codec {spec!r}: RATIO must be a number in (0, 1], e.g. topk:0.01")
    return r


def powersgd_rank(spec: str) -> int:
    """``powersgd:RANK`` -> RANK (an integer >= 1); a one-line ValueError otherwise."""
    _, _, rank = spec.partition(":")
    try:
        r = int(rank)
    except ValueError:
        r = 0
    if r < 1:
        raise ValueError(f"codec {spec!r}: PowerSGD needs an integer rank >= 1, e.g. powersgd:1 or powersgd:4")
    return r


def check_spec(spec: str) -> str:
    """The codec's name, or a one-line ValueError unless ``spec`` is one of the forms above."""
    name, colon, _ = spec.partition(":")
    if name == POWERSGD:
        powersgd_rank(spec)
    elif name not in NAMES:
        raise ValueError(f"unknown codec {spec!r}: choose none, fp16, bf16, topk:RATIO, randomk:RATIO, onebit "
                         f"or (all-reduce family) powersgd:RANK")
    elif name in RATIO:
        ratio(spec)
    elif colon:
        raise ValueError(f"codec {name} takes no argument, got {spec!r}")
    return name


def has_feedback(spec: str, error_feedback: bool) -> bool:
    """Whether a run with ``spec`` keeps error-feedback residuals (state a checkpoint must hold)."""
    return error_feedback and check_spec(spec) in FEEDBACK
