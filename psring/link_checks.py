"""The checks of the emulated links' options (``--link-rate``, ``--server-link-rate``, ``--link-burst``,
``--link-delay``), on any ``--net``: a typo is one line before the run, not a value in its config.json. Each
returns None when the value is fine, else the rest of a one-line message (``options.Option.check``); the rate and
burst are read by the same functions that build the links and replay them."""
from __future__ import annotations

import re


def link_rate(text: str) -> str | None:
    """A link rate as ``tc`` and the emulated network take it (``net.emulated.parse_rate``), checked on any
    ``--net``: a typo stays out of config.json."""
    from .net.emulated import NetError, parse_rate

    try:
        parse_rate(text)
    except NetError:
        return f"must be a number and a unit, e.g. 500kbit, 100mbit, 1gbit (at least 1kbit), got {text!r}"
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
