"""The per-bucket seam: a ``Reducer`` sums one gradient bucket over all workers; ``ReduceSync`` is the
one synchronizer for "reduce the gradients, then run the local optimizer" that owns everything else.

The shape is DDP's comm hook (``hook(state, bucket) -> Future``), picotron's ``Bucket.sync_gradient()``
/ ``wait()`` and ps-lite's ``Push -> ts`` / ``Wait(ts)``: ``launch(bucket)`` starts the bucket's
reduction and returns a ``Handle``; ``Handle.wait()`` returns once ``bucket.flat`` holds the *sum* of
every worker's gradients for it (the fused optimizer divides by N as it reads them). ``ReduceSync``
launches buckets from the backward hooks in bucket order (or, with ``--overlap none``, all at once after
backward), waits for them in that order, times it, records one trace message per bucket and resets;
with ``--overlap full`` the next forward waits bucket by bucket instead (``sync.overlap``).

A reduction of several dependent rounds (a ring's 2(N-1) steps, a hierarchy's three stages) would
block backward if it ran inside the hook. Such a reducer runs its rounds on the process's one
``CommThread`` (``self.comm.submit(fn)``), which executes launched buckets in launch order, so every
rank runs the same collectives in the same order while backward goes on.

Adding a strategy of this family is one ``Reducer`` subclass and one registry entry
(``psring.strategies``); see docs/ARCHITECTURE.md, where the hand-written ring is the worked example.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod

import torch
from torch import nn

from ..config import OptimConfig
from ..strategies import during_backward
from .base import Message, Synchronizer, SyncStats, make_local_optimizer, timed_update
from .buckets import (Bucket, BucketRange, GradBuckets, aligned_ranges, flat_layout, layout_bytes, param_ranges,
                      space_sizes)
from .handles import CommThread, FutureHandle, Handle, WorkHandle  # noqa: F401 - imported from here too
from .overlap import Waits, buckets_of, install_gates, update_units


class Reducer(ABC):
    """Sums one bucket's gradients over the workers. ``launch`` is called from the backward hooks."""

    name = ""
    wait_phase = "reduce_wait_s"  # the steps.jsonl column of ``ReduceSync``'s wait for this reducer

    uses_thread = False  # True: ReduceSync gives this reducer a CommThread (``self.comm``)
    overlap_lanes = 1  # reductions run at once under --overlap backward and full (``use_comm``'s ``lanes``)

    def __init__(self, rank: int, world: int, device: torch.device):
        self.rank, self.world, self.device = rank, world, device
        self.comm: CommThread | None = None  # set by ``ReduceSync`` (``use_comm``) when ``uses_thread``
        self.resume: tuple[dict, int] | None = None  # set by ``ReduceSync`` before ``attach`` when resuming
        self.resume_rank: dict | None = None  # likewise: this rank's ``rank_state`` of the checkpoint

    def use_comm(self, thread: CommThread | None, lanes: int = 1) -> None:
        """Run on ``thread`` (None: it was closed), with up to ``lanes`` reductions at once where the reducer
        has lanes (``overlap_lanes``). A reducer that wraps another hands the thread on."""
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


UNTUNED_MB = 25.0  # DDP's bucket_cap_mb: the partition where no link is measured (one host, --link-tuning off)


class ReduceSync(Synchronizer):
    """Reduce every bucket with ``reducer``, then run the local optimizer (gradients divided by N).
    ``overlap``: none (launch every bucket after backward), backward (from the backward hooks) or full
    (``sync.overlap``: step() only launches; each module's forward waits for its own buckets and runs
    their update, one fused optimizer call per bucket's unit of whole parameters)."""

    def __init__(self, reducer: Reducer, optim: OptimConfig, bucket_mb: float | None = 25.0,
                 first_bucket_mb: float = 1.0, overlap: str = "backward", timeout_s: float = 120.0,
                 link_tuning: str = "off", shared_cores: int | None = None):
        """``bucket_mb`` None: partitions cut to the link measured at start where ``link_tuning`` asks for
        a probe (``link_probe``), else ``UNTUNED_MB``; ``shared_cores``: the cores every rank shares (an
        emulated cluster), which keep the partitions as large as their CPU needs."""
        super().__init__(reducer.rank, reducer.world, reducer.device)
        self.reducer, self.optim_cfg, self.overlap = reducer, optim, overlap
        self.full, self.pending = overlap == "full", False  # pending: a full-overlap step not yet drained
        self.sched, self.timeout_s = None, timeout_s  # the priority scheduler (--overlap full, collectives)
        self.scheduled = self.full and getattr(reducer, "pg", None) is not None and self.world > 1
        self.name = reducer.name
        self.cap = None if bucket_mb is None else int(bucket_mb * 2**20)
        self.first_cap, self.link_tuning, self.tuned = int(first_bucket_mb * 2**20), link_tuning, {}
        self.shared_cores = shared_cores
        if reducer.uses_thread:
            reducer.use_comm(CommThread(timeout_s), reducer.overlap_lanes if overlap in ("backward", "full") else 1)

    def attach(self, model: nn.Module) -> nn.Module:
        layout = flat_layout(model.named_parameters())
        if self.cap is None:
            self.cap = self._tuned_cap(layout_bytes(layout))
        self.buckets = GradBuckets(layout, self._ranges(layout), self._on_ready, self.device)
        self.inflight: list[tuple[Bucket, float, Handle]] = []
        self.deferred: list[Bucket] = []
        self.messages: list[Message] = []
        self.reducer.resume, self.reducer.resume_rank = self.resume, self.resume_rank
        self.reducer.attach(model, self.buckets.buckets)
        self.tuned = {**self.tuned, **getattr(self.reducer, "tuned", {})}
        self.optimizer = make_local_optimizer([p for p in model.parameters() if p.requires_grad], self.optim_cfg,
                                              grad_divisor=self.world)
        self._restore_optimizer()
        if self.full:
            self._attach_full(model)
        return model

    def _tuned_cap(self, m_bytes: int) -> int:
        """The partition ``link_probe.reduce_partition_bytes`` cuts for the link measured now (every rank
        probes together and gets the same), or ``UNTUNED_MB`` where there is nothing to measure, and with
        ``--overlap none``, where every bucket leaves after backward: no tail to shorten, only calls to count.
        On shared cores, at least ``link_probe.cores_partition_bytes``."""
        from .link_probe import cores_partition_bytes, probe_collective, reduce_partition_bytes, wants_probe

        pg = getattr(self.reducer, "pg", None)
        deferred = not during_backward(self.overlap)
        if pg is None or self.world < 2 or deferred or not wants_probe(self.link_tuning, False):
            return int(UNTUNED_MB * 2**20)
        plain = type(self.reducer).ranges is Reducer.ranges  # a codec keeps per-bucket state: probe without it
        probe = probe_collective(pg.group, self.world, self.device, self.reducer if plain else None)
        cap = reduce_partition_bytes(m_bytes, self.world, probe)
        aligned = self.scheduled and plain  # ``_ranges`` cuts them at the parameters' boundaries
        floor = (cores_partition_bytes(m_bytes, self.world, probe, self.shared_cores, full=aligned)
                 if self.shared_cores else 0)
        self.tuned = {"link_tuning": "probe", **probe.as_dict(), "partition_bytes": max(cap, floor)}
        if floor:
            self.tuned.update(link_partition_bytes=cap, cores_partition_bytes=floor)
        return max(cap, floor)

    def _ranges(self, layout) -> list[BucketRange]:
        """The reducer's buckets; for the priority scheduler (``--overlap full`` over collectives) as many
        partitions as ``--bucket-mb`` makes of the model, cut at the parameters' boundaries and a large one
        in equal pieces (``buckets.aligned_ranges``), so that a bucket the next forward needs first never waits
        behind a 9.4 MB tensor, nor for the next tensor's gradient (a reducer with buckets of its own, e.g. a
        codec's, keeps them)."""
        if not (self.scheduled and type(self.reducer).ranges is Reducer.ranges):
            return self.reducer.ranges(layout, self.cap, self.first_cap)
        return aligned_ranges(*space_sizes(layout), -(-layout_bytes(layout) // self.cap))

    def _attach_full(self, model: nn.Module) -> None:
        """One optimizer per bucket's unit (``overlap.update_units``), sharing the main one's state, so a
        checkpoint still holds one ``optimizer`` and every parameter gets exactly the update it would."""
        bs = self.buckets.buckets
        self.units = update_units(bs)
        self.unit_opts = {i: make_local_optimizer(ps, self.optim_cfg, grad_divisor=self.world)
                          for i, ps in self.units.items()}
        self.unit_of = {id(p): i for i, ps in self.units.items() for p in ps}
        self.covering = buckets_of(bs)
        self.waited: set[int] = set()
        self.updated: set[int] = set()
        self.waits, self.p0 = Waits(), 0.0
        install_gates(model, self.wait_params)
        if self.scheduled:  # collectives (not the PS): the ranks agree on a priority order
            from .schedule import PriorityScheduler, consensus_group

            self.sched = PriorityScheduler(self.reducer, consensus_group(self.world, self.timeout_s), len(bs),
                                           self.timeout_s)

    def _on_ready(self, b: Bucket) -> None:
        if during_backward(self.overlap):  # launched from backward's hooks, not after it
            self._launch(b)
        else:
            self.deferred.append(b)

    def _launch(self, b: Bucket) -> None:
        launch = self.sched.submit if self.sched is not None else self.reducer.launch
        self.inflight.append((b, time.perf_counter(), launch(b)))

    def _wait(self, b: Bucket, launched: float, handle: Handle, p0: float) -> None:
        handle.wait()
        self.messages.append(Message(f"{self.name} bucket {b.index} ({b.nbytes / 2**20:.1f} MB)", launched - p0,
                                     time.perf_counter() - launched))

    def _finish(self, p0: float) -> SyncStats:
        """After every bucket was waited for: the step's bytes, messages, readiness; ready for the next."""
        sent, recv = self.reducer.step_bytes(self.buckets.buckets)
        messages = self.messages + [Message(name, t - p0, dur) for name, t, dur in self.reducer.take_messages()]
        self.reducer.end_step()
        self.inflight.clear()
        self.messages = []
        ready = self.buckets.ready_offsets(p0)
        self.buckets.reset()
        return SyncStats(0.0, 0.0, sent, recv, messages=messages, ready=ready)

    def step(self, step: int) -> SyncStats:
        t0 = self.clock.now()
        p0 = time.perf_counter()
        self.buckets.flush()
        for b in self.deferred:
            self._launch(b)
        self.deferred.clear()
        if self.full:  # the next forward's gates and drain() wait
            self.pending, self.p0 = True, p0
            self.launched = {b.index: (b, launched, h) for b, launched, h in self.inflight}
            launch_s = self.clock.now() - t0
            return SyncStats(launch_s, phases={self.reducer.wait_phase: launch_s})
        for b, launched, handle in self.inflight:
            self._wait(b, launched, handle, p0)
        stats = self._finish(p0)
        t1 = self.clock.now()
        stats.sync_s, stats.phases = t1 - t0, {self.reducer.wait_phase: t1 - t0}
        stats.update_s = timed_update(self.optimizer, self.device)
        return stats

    # --- --overlap full --------------------------------------------------------------------------------
    def wait_params(self, params) -> None:
        if not self.pending:
            return
        t0 = time.perf_counter()
        for p in params:
            unit = self.unit_of.get(id(p))
            if unit is not None and unit not in self.updated:
                self._update_unit(unit)
        self.waits.gate(t0)

    def _wait_once(self, index: int) -> None:
        if index not in self.waited:
            self._wait(*self.launched[index], self.p0)
            self.waited.add(index)

    def _update_unit(self, unit: int) -> None:
        for p in self.units[unit]:
            for i in self.covering[id(p)]:
                self._wait_once(i)
        opt = self.unit_opts[unit]
        opt.state = self.optimizer.state  # shared (load_state_dict replaces the main one's)
        self.waits.update_s += timed_update(opt, self.device)
        self.updated.add(unit)

    def drain(self) -> SyncStats | None:
        if not self.pending:
            return None
        for b, _, _ in self.inflight:  # in launch order
            self._wait_once(b.index)
        for unit in sorted(self.units):
            if unit not in self.updated:
                self._update_unit(unit)
        self.waited.clear()
        self.updated.clear()
        self.pending = False
        return self._finish(self.p0)

    def take_waits(self) -> tuple[float, float]:
        return self.waits.take() if self.full else (0.0, 0.0)

    def state_dict(self) -> dict:
        if self.inflight or self.deferred:
            raise RuntimeError(f"{self.name}: state_dict between steps only (gradients are on their way)")
        return {**self.reducer.state_dict(), **super().state_dict()}

    def rank_state(self) -> dict:
        return self.reducer.rank_state()

    def close(self) -> None:
        if self.sched is not None:
            self.sched.close()
            self.sched = None
        if self.reducer.comm is not None:
            self.reducer.comm.close()
            self.reducer.use_comm(None)
        self.reducer.close()
