"""``--compute``'s spec and the emulated step's split, torch-free: the launcher, ``bounds``, the plots and
``psring simulate``'s checks read them without importing torch (``emulation`` runs them)."""
from __future__ import annotations

FORWARD_SHARE = 1 / 3  # of an emulated step's compute; backward the rest (the usual ratio)


def parse_compute(spec: str) -> float | None:
    """``real`` -> None; ``emulated:MS`` -> MS; ``emulated`` (not yet resolved) -> 0.0."""
    mode, _, ms = spec.partition(":")
    if mode == "real":
        return None
    return float(ms) if ms else 0.0
