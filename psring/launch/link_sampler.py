"""The launcher's link sampler: ``psring.net.links`` in the switch namespace of an emulated run, started
before the first server and stopped after the last worker, so ``links.jsonl`` covers the whole run.

It is one more child of the launcher (stopped with the others on every exit path); it does not touch
the workers. ``stop`` ends it with SIGTERM (it writes a last sample), then holds the samples' sums
against the kernel's counters of every host's interface: summary.json's ``links_*`` fields; and, over
rank 0's timed steps, the machine's CPU while a link carried traffic: ``cpu_util_comm``.
"""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from ..metrics.jsonl import read_jsonl
from ..metrics.summary import timed_window
from ..net import links
from .children import Children

STOP_TIMEOUT_S = 5.0


class LinkSampler:
    def __init__(self, net, out: Path, interval_ms: int, kids: Children, env: dict, warmup: int = 0):
        self.net, self.path, self.child, self.warmup = net, Path(out) / links.FILE, None, warmup
        self.ranks = Path(out) / "ranks" / "rank0.jsonl"
        self.cpu_file = Path(out) / "logs" / "links.cpu"
        if net is None or interval_ms <= 0:
            return
        argv = net.switch_prefix() + [sys.executable, "-m", "psring.net.links", "--ports", str(len(net.hosts)),
                                      "--out", str(self.path), "--interval-ms", str(interval_ms),
                                      "--cpu-file", str(self.cpu_file)]
        self.child = kids.spawn("link sampler", argv, env, Path(out) / "logs" / "links.log")

    def stop(self) -> dict:
        """End the sampler (a last sample first) and return the ``links_*`` check, or {} without one."""
        if self.child is None:
            return {}
        proc, self.child = self.child.proc, None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT_S)
        if not self.path.is_file():
            return {}
        rows = links.load(self.path)
        out = links.check(rows, self.net.host_counters(), self.cpu_file)
        window = timed_window(read_jsonl(self.ranks), self.warmup) if self.ranks.is_file() else None
        if window is not None:
            out["cpu_util_comm"] = links.comm_cpu(rows, [h.rate_bps for h in self.net.hosts], *window)
        return out
