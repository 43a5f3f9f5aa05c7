"""The checks of the emulated links' options (``--link-rate``, ``--server-link-rate``, ``--link-burst``,
``--link-delay``), on any ``--net``: a typo is one line before the run, not a value in its config.json. Each
returns None when the value is fine, else the rest of a one-line message (``options.Option.check``); the rate and
burst are read by the same functions that replay them."""
from __future__ import annotations

import re


def link_rate(text: str) -> str | None:
    """A link rate as the cost model and the replay read it (``costmodel.Link.from_rate``: 1gbit, 100mbit,
    2.5GB/s), finite and above 0, checked on any ``--net`` (the emulated links' tc takes the bit units only:
    ``net.emulated.parse_rate`` says so in one line when they are built)."""
    from .costmodel import Link

    try:
        bps = Link.from_rate(text).bandwidth_Bps
    except (ValueError, OverflowError):
        bps = 0.0
    if not (0 < bps < float("inf")):
        return f"must be a number and a unit above 0, e.g. 500kbit, 100mbit, 1gbit, 2.5GB/s, got {text!r}"
    return None


def link_burst(text: str) -> str | None:
    from .simulate.checks import burst_bytes

    try:
        burst_bytes(text)
    except ValueError:
        return f"must be kilobytes or megabytes, e.g. 128kb or 1mb, got {text!r}"
    return None


def link_delay(text: str) -> str | None:
    return None if re.fullmatch(r"\d+(\.\d+)?(us|ms|s)", text) else f"must be a time, e.g. 500us or 1ms, got {text!r}"
