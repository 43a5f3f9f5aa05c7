"""``ps``: workers push gradients to S parameter servers and pull the updated parameters back.

This module is the default design (``server-optimizer``): each server runs the optimizer (SGD or Adam)
for its chunks and the worker runs none, so it is a synchronizer of its own. The ``aggregate`` design,
where servers only sum and workers run the optimizer, is a ``Reducer`` (``aggregate``); ``make_ps``
picks one. How chunks are cut and sent is ``transport``'s, the servers' start and checkpoints
``session``'s. The consistency model (BSP, SSP with bound k, ASP; see ``consistency``) is the servers' business: it only
decides when a pushpull is answered. Rank 0 initialises the servers with its (seeded) initial weights,
the optimizer settings, the design and the consistency model; every worker then pulls version 0, so
all start from the servers' copy.

Overlap: a chunk is pushed from inside backward as soon as every gradient it covers is accumulated, as
a ``pushpull``: the server answers it with the chunk's updated parameters as soon as every worker's
gradients for it arrived and the update ran. So servers aggregate and update while backward still
runs, and new parameters stream back chunk by chunk while later ones are still on their way in. On
CPU, a parameter that lies wholly in one chunk becomes a view of the reply's frame (no copy); one split
over chunks is copied into, part by part.

Checkpoints: ``state_dict`` (rank 0, between steps) fetches every server's chunks' optimizer state and
version with the ``state`` op and reassembles the state per parameter; resuming (``resume_from`` before
``attach``) has rank 0 init every server with the model's parameters (loaded from the checkpoint), the
saved optimizer state cut into its chunks, and the version of the step to continue at, and every worker
pulls that version. State is kept by parameter name, so the number of servers (and the chunking) may
differ from the checkpointed run's.
"""
from __future__ import annotations

import time

import torch
from torch import nn

from ...config import OptimConfig
from ...strategies import during_backward
from ..base import Message, Synchronizer, SyncStats
from ..buckets import Bucket, GradBuckets, flat_layout
from ..overlap import Waits, buckets_of, install_gates
from . import session
from .client import PSClient
from .consistency import Semantics, check_semantics
from .sharding import credit_chunks, drain_chunks, window_for
from .transport import chunk_ranges


class PSSync(Synchronizer):
    name = "ps"

    def __init__(self, rank: int, world: int, device: torch.device, addrs: list[str], optim: OptimConfig,
                 timeout_s: float, bucket_mb: float = 4.0, overlap: str = "backward", frame_kb: int = 1024,
                 consistency: str = "bsp", staleness: int = 2, curve: str | None = None, window: int | None = None,
                 links_Bps: tuple[float, float] | None = None, compress: str = "none", error_feedback: bool = True,
                 shares: list[float] | None = None, credit_mb: float | None = None, link_tuning: str = "auto",
                 shared_cores: int | None = None, order: str = "planned"):
        """``compress``/``error_feedback``: the codec pushes are encoded with (``encoded``).
        ``bucket_mb``: the largest chunk (the chunks are equal, at most this, a multiple of S of them).
        ``links_Bps``: (worker, server) link bandwidths, bytes/s, when known (an emulated network): the
        chunks are then fitted to them (``sharding.fitted_chunk_bytes``, at most ``bucket_mb``; with
        one server too, splitting tensors) and sent under a window of credits.
        ``window``: the most pushpulls of this worker unanswered at one server; 0: no limit; None:
        ``sharding.window_for`` (no limit where the links are unknown). ``shared_cores``: the cores
        every worker and server share (an emulated cluster), which cap how small the chunks get. ``order``:
        ``--ps-order`` (``transport.push_order``)."""
        super().__init__(rank, world, device)
        session.check_addrs(addrs)
        self.semantics = check_semantics("server-optimizer", consistency, staleness)
        self.addrs, self.optim_cfg, self.timeout_s, self.overlap, self.curve = addrs, optim, timeout_s, overlap, curve
        self.full, self.pending = overlap == "full", False  # pending: a full-overlap step not yet drained
        self.cap = int(bucket_mb * 2**20)
        self.frame_bytes = session.frame_bytes(frame_kb)
        self.client: PSClient | None = None
        self.links_Bps, self.compress, self.error_feedback, self.shares = links_Bps, compress, error_feedback, shares
        self.window_opt, self.credit_mb, self.link_tuning, self.shared_cores = window, credit_mb, link_tuning, shared_cores
        self.order = order

    def attach(self, model: nn.Module) -> nn.Module:
        self.layout = flat_layout([(n, p) for n, p in model.named_parameters() if p.requires_grad])
        probed, self.links_Bps, self.tuned = session.probed_links(
            self.addrs, self.rank, self.timeout_s, self.frame_bytes, self.curve, self.links_Bps, self.link_tuning)
        known = self.links_Bps is not None
        self.window = window_for(self.window_opt, len(self.addrs), known, self.semantics.consistency,
                                 self.semantics.staleness)
        drain = drain_chunks(self.overlap, self.credit_mb, self.links_Bps, self.world, len(self.addrs))
        ranges = chunk_ranges(self.layout, self.world, len(self.addrs), self.links_Bps, self.cap, self.shares,
                              drain, self.shared_cores)
        self.buckets = GradBuckets(self.layout, ranges, self._on_ready, self.device, after_launch=self._launched)
        self.client, self.tr, self.chan = session.open_worker(
            self.layout, self.buckets.buckets, rank=self.rank, device=self.device, addrs=self.addrs,
            timeout_s=self.timeout_s, frame_bytes=self.frame_bytes, curve=self.curve, window=self.window,
            optim=self.optim_cfg, semantics=self.semantics, resume=self.resume, compress=self.compress,
            error_feedback=self.error_feedback, resume_rank=self.resume_rank, credit_mb=self.credit_mb,
            overlap=self.overlap, client=probed, links_Bps=self.links_Bps, order=self.order,
            credit_chunks=credit_chunks(self.links_Bps, self.world, len(self.addrs)))
        self.tuned.update(session.chunk_fit(self.buckets.buckets, drain, self.shared_cores))
        self.deferred: list[Bucket] = []
        if self.full:
            self.covering, self.waits = buckets_of(self.buckets.buckets), Waits()
            install_gates(model, self.wait_params)
        return model

    @property
    def cur(self) -> int:
        """The step this worker synchronizes next."""
        return self.tr.step

    def state_dict(self) -> dict:
        """Rank 0, between steps: ``{"servers": [per server: {"version", "clocks", "optim", "semantics"}],
        "opt_state": {"KIND/PARAMETER": tensor}}`` (the servers' optimizer state put back together per
        parameter), CPU tensors and plain values. Other ranks: {}."""
        if self.rank != 0:
            return {}
        if self.tr.inflight or self.deferred:
            raise RuntimeError("PSSync.state_dict between steps only (this step's gradients are on their way)")
        return self.chan.run(lambda: session.servers_state(self.client, self.layout, self.buckets.buckets))

    def rank_state(self) -> dict:
        """This worker's error-feedback residuals (``session.feedback_state``; {} without a codec that keeps them)."""
        return session.feedback_state(self.tr, self.layout, self.compress)

    def _on_ready(self, b: Bucket) -> None:
        if during_backward(self.overlap):  # launched from backward's hooks, not after it
            self.chan.ready(b)
        else:
            self.deferred.append(b)

    def _launched(self) -> None:
        if during_backward(self.overlap):
            self.chan.wake()

    def step(self, step: int) -> SyncStats:
        """push_s: pushing what backward did not (all of it without overlap); wait_s: until the replies
        arrived (transfer, aggregation, the slowest worker, the update); pull_s: making the new
        parameters the model's, chunk by chunk, while later ones are still on the wire. With ``--overlap
        full`` this only pushes; the next forward's gates and ``drain`` take the replies."""
        tr = self.tr
        if step != tr.step:
            raise RuntimeError(f"PS worker is at step {tr.step} but was asked to synchronize step {step}")
        t0 = self.clock.now()
        self.buckets.flush()
        for b in self.deferred:
            self.chan.ready(b)
        self.deferred.clear()
        self.chan.flush()
        t1 = self.clock.now()
        self.t0, self.lap, self.loaded = t0, t1, set()  # laps of one clock: push + wait + pull = sync
        self.phases = {"push_s": t1 - t0, "wait_s": 0.0, "pull_s": 0.0}
        if self.full:
            self.pending = True
            return SyncStats(sync_s=t1 - t0, phases={"push_s": t1 - t0})
        self._use_replies(self._all_loaded)
        stats = self._finish()
        stats.sync_s = self.lap - t0
        return stats

    def _use_replies(self, done) -> None:
        """Make replied chunks the model's parameters until ``done()``; the laps go to wait_s (until
        replies were here, less the pushes their credits let out: push_s) and pull_s."""
        ph, chan = self.phases, self.chan
        while not done():
            pushed = getattr(chan, "pump_s", 0.0)
            got = chan.take_any()
            tb = self.clock.now()
            pushed = getattr(chan, "pump_s", 0.0) - pushed
            ph["wait_s"], ph["push_s"] = ph["wait_s"] + tb - self.lap - pushed, ph["push_s"] + pushed
            for b, t in got:
                session.load_params(t, b, alias=True)
                self.loaded.add(b.index)
            tc = self.clock.now()
            ph["pull_s"], self.lap = ph["pull_s"] + tc - tb, tc
            if not got:  # nothing on its way
                return

    def _all_loaded(self) -> bool:
        return len(self.loaded) == len(self.buckets.buckets)

    def _finish(self) -> SyncStats:
        """The step's bytes and trace from the channel's thread; the hand-off there and back (two thread
        switches) is a lap of wait_s, so that push + wait + pull still cover the whole of ``step``."""
        def transport():  # on the channel's thread
            tr = self.tr
            sent, recv = tr.bytes()
            messages = [Message(name, t - self.t0, dur) for t, name, dur in tr.messages]
            tr.end_step()
            return sent, recv, messages
        sent, recv, messages = self.chan.run(transport)
        t = self.clock.now()
        self.phases["wait_s"], self.lap = self.phases["wait_s"] + t - self.lap, t
        stats = SyncStats(bytes_sent=sent, bytes_recv=recv, phases=self.phases, messages=messages,
                          ready=self.buckets.ready_offsets(self.t0))
        self.buckets.reset()
        return stats

    # --- --overlap full (``sync.overlap``) ------------------------------------------------------------
    def wait_params(self, params) -> None:
        if not self.pending:
            return
        t0 = time.perf_counter()
        need = {i for p in params for i in self.covering.get(id(p), ())}
        self._use_replies(lambda: need <= self.loaded)
        self.waits.gate(t0)

    def drain(self) -> SyncStats | None:
        if not self.pending:
            return None
        self._use_replies(self._all_loaded)
        self.pending = False
        return self._finish()

    def take_waits(self) -> tuple[float, float]:
        return self.waits.take() if self.full else (0.0, 0.0)

    def close(self) -> None:
        """Tell every server this worker is done (best effort, 5 s at most), then close the sockets."""
        if self.client is not None:
            session.close_worker(self.chan, self.client)
            self.client = None


def make_ps(rank: int, world: int, device: torch.device, addrs: list[str], optim: OptimConfig, timeout_s: float,
            bucket_mb: float = 4.0, overlap: str = "backward", frame_kb: int = 1024, design: str = "server-optimizer",
            consistency: str = "bsp", staleness: int = 2, curve: str | None = None, window: int | None = None,
            links_Bps: tuple[float, float] | None = None, compress: str = "none",
            error_feedback: bool = True, shares: list[float] | None = None,
            credit_mb: float | None = None, link_tuning: str = "auto",
            shared_cores: int | None = None, order: str = "planned") -> Synchronizer:
    """The ``ps`` synchronizer of ``design``: ``PSSync`` (servers run the optimizer), or ``ReduceSync``
    over ``PSAggregate`` (servers sum, workers run the optimizer). ``shares``: the servers' unequal
    shares of the parameters (``topology.server_shares``), None for equal ones."""
    semantics: Semantics = check_semantics(design, consistency, staleness)
    if design != "aggregate":
        return PSSync(rank, world, device, addrs, optim, timeout_s, bucket_mb, overlap, frame_kb, consistency,
                      staleness, curve, window, links_Bps, compress, error_feedback, shares, credit_mb, link_tuning,
                      shared_cores, order)
    from ..reducer import ReduceSync
    from .aggregate import PSAggregate

    reducer = PSAggregate(rank, world, device, addrs, optim, timeout_s, frame_kb, semantics, curve, window, links_Bps,
                          compress, error_feedback, shares, credit_mb, overlap, link_tuning, shared_cores, order)
    return ReduceSync(reducer, optim, bucket_mb, bucket_mb, overlap, timeout_s)
