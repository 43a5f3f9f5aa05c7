"""Per-step records: one JSON object per worker per step, appended and flushed line by line, so a run
that dies keeps every step it finished.

``StepLog`` stamps every record with the machine's CPU time as it writes it, i.e. at the end of the step
(``cpu_busy``, ``cpu_total``: jiffies of all cores, ``metrics/cpu.py``; None without /proc/stat). The
sample taken when the log opens goes into the first record as ``cpu_busy0``/``cpu_total0`` rather than a
line of its own, so that every line stays a step: that is where the first step's interval starts."""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .cpu import cpu_times


@dataclass
class StepRecord:
    """One worker's step. Times in seconds; ``sync_s`` is None when the strategy overlaps communication
    with backward so it cannot be timed apart (ddp). Phases add up to ``step_s``."""

    rank: int
    step: int
    loss: float
    step_s: float
    data_s: float
    forward_s: float
    backward_s: float
    sync_s: float | None
    update_s: float
    bytes_sent: int
    bytes_recv: int
    samples: int
    time: float  # wall clock (Unix seconds) at the end of the step
    sync_phases: dict = field(default_factory=dict)  # e.g. push_s/wait_s/pull_s; written as own columns
    messages: list | None = None  # with --trace: [name, start after sync began (s), duration (s)] each
    epoch: int = 0
    test_acc: float | None = None  # held-out accuracy after this step (at the end of an epoch)
    wire_tx_bytes: int | None = None  # bytes the kernel counted on this worker's host link (--net emulated;
    # with G workers per host, local rank 0 counts the shared link and the others none)
    wire_rx_bytes: int | None = None
    # (busy, total) jiffies of all cores at the start and the end of Synchronizer.step: the CPU of the
    # communication phase alone (compute emulated as a wait would dilute a whole step's utilisation)
    cpu_sync: list | None = None
    ready: list | None = None  # with --trace: [bucket, s after sync began] when each gradient bucket was ready

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(d.pop("sync_phases"))
        for key in ("messages", "ready"):  # --trace only
            if d[key] is None:
                del d[key]
        return d


class StepLog:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(path, "w", buffering=1)
        self.opened = cpu_times()  # where the first step's CPU interval starts
        self.first = True

    def write(self, rec: StepRecord) -> None:
        d = rec.to_json()
        if self.first:
            d["cpu_busy0"], d["cpu_total0"] = self.opened or (None, None)
            self.first = False
        d["cpu_busy"], d["cpu_total"] = cpu_times() or (None, None)
        self.f.write(json.dumps(d) + "\n")

    def close(self) -> None:
        self.f.close()

    def __enter__(self) -> StepLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class PhaseClock:
    """Lap timer over a step's phases; on GPU the device is synchronized before each reading, or the
    host clock would time kernel launches instead of kernels."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()
