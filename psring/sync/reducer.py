"""The per-bucket seam: a ``Reducer`` sums one gradient bucket over all workers; ``ReduceSync`` is the
one synchronizer for "reduce the gradients, then run the local optimizer" that owns everything else.

The shape is DDP's comm hook (``hook(state, bucket) -> Future``), picotron's ``Bucket.sync_gradient()``
/ ``wait()`` and ps-lite's ``Push -> ts`` / ``Wait(ts)``: ``launch(bucket)`` starts the bucket's
reduction and returns a ``Handle``; ``Handle.wait()`` returns once ``bucket.flat`` holds the *sum* of
every worker's gradients for it (the fused optimizer divides by N as it reads them). ``ReduceSync``
launches buckets from the backward hooks in bucket order (or, with ``--no-overlap``, all at once after
backward), waits for them in that order, times it, records one trace message per bucket and resets.

A reduction of several dependent rounds (a ring's 2(N-1) steps, a hierarchy's three stages) would
block backward if it ran inside the hook. Such a reducer runs its rounds on the process's one
``CommThread`` (``self.comm.submit(fn)``), which executes launched buckets in launch order, so every
rank runs the same collectives in the same order while backward goes on.

Adding a strategy of this family is one ``Reducer`` subclass and one registry entry
(``psring.strategies``); see docs/ARCHITECTURE.md, where the hand-written ring is the worked example.
"""
from __future__ import annotations

import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch import nn

from ..config import OptimConfig
from .base import Message, Synchronizer, SyncStats, make_local_optimizer, timed_update
from .buckets import Bucket, BucketRange, GradBuckets, flat_layout, param_ranges


class Handle(ABC):
    """One launched bucket's reduction."""

    @abstractmethod
    def wait(self) -> None:
        """Return once the bucket's buffer holds the sum; raise what the reduction raised."""


class WorkHandle(Handle):
    """A torch.distributed ``Work`` (``async_op=True``)."""

    def __init__(self, work):
        self.work = work

    def wait(self) -> None:
        self.work.wait()


class FutureHandle(Handle):
    """A function run on the ``CommThread``: ``wait`` blocks until it ran, re-raising its exception."""

    def __init__(self, timeout_s: float):
        self.timeout_s, self.done, self.error = timeout_s, threading.Event(), None

    def wait(self) -> None:
        if not self.done.wait(self.timeout_s):
            raise TimeoutError(f"a bucket's reduction did not finish within {self.timeout_s:.0f} s")
        if self.error is not None:
            raise self.error


class CommThread:
    """One background thread per process that runs submitted functions one at a time, in submission
    order (a daemon: a worker that dies is not kept alive by it). After a failure every later function
    fails at once with the same error: the collectives of the ranks no longer line up."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.jobs: queue.Queue = queue.Queue()
        self.failed: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="psring-comm", daemon=True)
        self.thread.start()

    def submit(self, fn: Callable[[], None]) -> FutureHandle:
        h = FutureHandle(self.timeout_s)
        self.jobs.put((fn, h))
        return h

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            fn, h = job
            try:
                if self.failed is not None:
                    raise RuntimeError(f"an earlier bucket's reduction failed: {self.failed}")
                fn()
            except BaseException as e:  # noqa: BLE001 - handed to the waiting trainer thread
                self.failed = self.failed or e
                h.error = e
            h.done.set()

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join(timeout=5)


class Reducer(ABC):
    """Sums one bucket's gradients over the workers. ``launch`` is called from the backward hooks."""

    name = ""
    wait_phase = "reduce_wait_s"  # the steps.jsonl column of ``ReduceSync``'s wait for this reducer

    uses_thread = False  # True: ReduceSync gives this reducer a CommThread (``self.comm``)

    def __init__(self, rank: int, world: int, device: torch.device):
        self.rank, self.world, self.device = rank, world, device
        self.comm: CommThread | None = None  # set by ``ReduceSync`` (``use_comm``) when ``uses_thread``
        self.resume: tuple[dict, int] | None = None  # set by ``ReduceSync`` before ``attach`` when resuming
        self.resume_rank: dict | None = None  # likewise: this rank's ``rank_state`` of the checkpoint

    def use_comm(self, thread: CommThread | None) -> None:
        """Run on ``thread`` (None: it was closed). A reducer that wraps another hands it on."""
        self.comm = thread

    def ranges(self, layout, cap_bytes: int, first_cap_bytes: int) -> list[BucketRange]:
        """How to cut the flat gradient buffers into buckets: by default DDP's (whole parameters)."""
        return param_ranges(layout, cap_bytes, first_cap_bytes)

    def attach(self, model: nn.Module, buckets: list[Bucket]) -> None:
        """After the buckets exist, before the first step (e.g. make every worker start from rank 0's
        parameters)."""

    @abstractmethod
    def launch(self, bucket: Bucket) -> Handle:
        """Start reducing ``bucket.flat`` (a sum, in place); return its handle."""

    @abstractmethod
    def wire_bytes(self, bucket: Bucket) -> tuple[int, int]:
        """(bytes sent, bytes received) by this worker for one reduction of ``bucket``."""

    def step_bytes(self, buckets: list[Bucket]) -> tuple[int, int]:
        """(sent, received) by this worker in the step just waited for; by default ``wire_bytes`` summed
        (a reducer that counts real frames overrides this)."""
        sent = recv = 0
        for b in buckets:
            s, r = self.wire_bytes(b)
            sent, recv = sent + s, recv + r
        return sent, recv

    def end_step(self) -> None:
        """After every bucket of a step was waited for (and its bytes read)."""

    def take_messages(self) -> list[Message]:
        """Finer trace messages than one per bucket (``start_s``: a perf_counter time); emptied."""
        return []

    def state_dict(self) -> dict:
        """What a checkpoint needs from the reducer besides the local optimizer (e.g. the PS servers')."""
        return {}

    def rank_state(self) -> dict:
        """``Synchronizer.rank_state``: what only this rank holds (e.g. a PS worker's residuals)."""
        return {}

    def close(self) -> None:
        """Release what ``attach`` set up."""


class ReduceSync(Synchronizer):
    """Reduce every bucket with ``reducer``, then run the local optimizer (gradients divided by N)."""

    def __init__(self, reducer: Reducer, optim: OptimConfig, bucket_mb: float = 25.0, first_bucket_mb: float = 1.0,
                 overlap: bool = True, timeout_s: float = 120.0):
        super().__init__(reducer.rank, reducer.world, reducer.device)
        self.reducer, self.optim_cfg, self.overlap = reducer, optim, overlap
        self.name = reducer.name
        self.cap, self.first_cap = int(bucket_mb * 2**20), int(first_bucket_mb * 2**20)
        if reducer.uses_thread:
            reducer.use_comm(CommThread(timeout_s))

    def attach(self, model: nn.Module) -> nn.Module:
        layout = flat_layout(model.named_parameters())
        self.buckets = GradBuckets(layout, self.reducer.ranges(layout, self.cap, self.first_cap), self._on_ready,
                                   self.device)
        self.inflight: list[tuple[Bucket, float, Handle]] = []
        self.deferred: list[Bucket] = []
        self.reducer.resume, self.reducer.resume_rank = self.resume, self.resume_rank
        self.reducer.attach(model, self.buckets.buckets)
        self.optimizer = make_local_optimizer([p for p in model.parameters() if p.requires_grad], self.optim_cfg,
                                              grad_divisor=self.world)
        self._restore_optimizer()
        return model

    def _on_ready(self, b: Bucket) -> None:
        if self.overlap:
            self._launch(b)
        else:
            self.deferred.append(b)

    def _launch(self, b: Bucket) -> None:
        self.inflight.append((b, time.perf_counter(), self.reducer.launch(b)))

    def step(self, step: int) -> SyncStats:
        t0 = self.clock.now()
        p0 = time.perf_counter()
        self.buckets.flush()
        for b in self.deferred:
            self._launch(b)
        self.deferred.clear()
        messages = []
        for b, launched, handle in self.inflight:
            handle.wait()
            messages.append(Message(f"{self.name} bucket {b.index} ({b.nbytes / 2**20:.1f} MB)", launched - p0,
                                    time.perf_counter() - launched))
        sent, recv = self.reducer.step_bytes(self.buckets.buckets)
        messages += [Message(name, t - p0, dur) for name, t, dur in self.reducer.take_messages()]
        self.reducer.end_step()
        self.inflight.clear()
        ready = self.buckets.ready_offsets(p0)
        self.buckets.reset()
        t1 = self.clock.now()
        update_s = timed_update(self.optimizer, self.device)
        return SyncStats(t1 - t0, update_s, sent, recv, {self.reducer.wait_phase: t1 - t0}, messages=messages,
                         ready=ready)

    def state_dict(self) -> dict:
        if self.inflight or self.deferred:
            raise RuntimeError(f"{self.name}: state_dict between steps only (gradients are on their way)")
        return {**self.reducer.state_dict(), **super().state_dict()}

    def rank_state(self) -> dict:
        return self.reducer.rank_state()

    def close(self) -> None:
        if self.reducer.comm is not None:
            self.reducer.comm.close()
            self.reducer.use_comm(None)
        self.reducer.close()
