"""Bytes on the wire, counted by the kernel: a network interface's tx/rx counters, read per step.

Used where a worker has an interface of its own (``--net emulated``: ``eth0`` of its namespace, named by
``PSRING_WIRE_IFACE``), so the figure is what really crossed its link, headers included — for every
strategy alike (gloo has no byte counters of its own). On loopback every process shares ``lo``, so no
per-worker figure exists and the fields stay null.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV = "PSRING_WIRE_IFACE"


class WireCounter:
    def __init__(self, iface: str | None = None):
        iface = iface or os.environ.get(ENV)
        self.dir = Path("/sys/class/net") / iface / "statistics" if iface else None
        if self.dir is not None and not (self.dir / "tx_bytes").exists():
            self.dir = None
        self.last = self._read()

    def _read(self) -> tuple[int, int] | None:
        if self.dir is None:
            return None
        return int((self.dir / "tx_bytes").read_text()), int((self.dir / "rx_bytes").read_text())

    def delta(self) -> tuple[int | None, int | None]:
        """(bytes sent, bytes received) since the previous call (or since creation)."""
        now = self._read()
        if now is None or self.last is None:
            return None, None
        tx, rx = now[0] - self.last[0], now[1] - self.last[1]
        self.last = now
        return tx, rx
