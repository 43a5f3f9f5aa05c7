"""``ps --ps-design aggregate``: the parameter servers only sum the workers' gradients; every worker runs
the optimizer locally on the sum, exactly as after an all-reduce. So this design is a ``Reducer``
(``sync.reducer``): ``ReduceSync`` owns the buckets, the overlap and the local optimizer, this module
only moves a chunk's gradients to its server and the sum back.

A chunk's reduction is its pushpull: ``launch`` queues it for its server (sent at once, or when the
server has a credit free; ``transport``), and its handle's ``wait`` takes replies off the sockets, in
each server's send order, copying each sum into its chunk's buffer (with ``--compress``, pushes are
encoded: ``encoded``; fp16/bf16 replies hold the mean in that dtype, multiplied back by N here) (the ``.grad`` the optimizer reads;
what it held was pushed), until its own is there. Servers hold the parameters of the start version
only, so every worker starts from their copy and never pulls again (BSP only: ``consistency``).
"""
from __future__ import annotations

import torch
from torch import nn

from ...config import OptimConfig
from ..base import Message
from ..buckets import Bucket, BucketRange, flat_layout
from ..reducer import Handle, Reducer
from . import session
from .client import PSClient
from .consistency import Semantics
from .sharding import credit_chunks, drain_chunks, window_for
from .transport import chunk_ranges


class _ChunkHandle(Handle):
    def __init__(self, reducer: PSAggregate, b: Bucket):
        self.reducer, self.b = reducer, b

    def wait(self) -> None:
        self.reducer.until(self.b)


class PSAggregate(Reducer):
    name = "ps"
    wait_phase = "wait_s"

    def __init__(self, rank: int, world: int, device: torch.device, addrs: list[str], optim: OptimConfig,
                 timeout_s: float, frame_kb: int, semantics: Semantics, curve: str | None = None,
                 window: int | None = None, links_Bps: tuple[float, float] | None = None, compress: str = "none",
                 error_feedback: bool = True, shares: list[float] | None = None, credit_mb: float | None = None,
                 overlap: str = "backward", link_tuning: str = "auto", shared_cores: int | None = None,
                 order: str = "planned"):
        super().__init__(rank, world, device)
        self.compress, self.error_feedback, self.shares = compress, error_feedback, shares
        session.check_addrs(addrs)
        self.addrs, self.optim_cfg, self.timeout_s = addrs, optim, timeout_s
        self.frame_bytes = session.frame_bytes(frame_kb)
        self.semantics, self.curve, self.links_Bps = semantics, curve, links_Bps
        self.window_opt, self.credit_mb, self.overlap, self.link_tuning = window, credit_mb, overlap, link_tuning
        self.order = order
        self.shared_cores = shared_cores
        self.client: PSClient | None = None

    def ranges(self, layout, cap_bytes: int, first_cap_bytes: int) -> list[BucketRange]:
        """The chunks, fitted to the links (measured first where ``--link-tuning`` asks for it)."""
        self.probed, self.links_Bps, self.tuned = session.probed_links(
            self.addrs, self.rank, self.timeout_s, self.frame_bytes, self.curve, self.links_Bps, self.link_tuning)
        known = self.links_Bps is not None
        self.window = window_for(self.window_opt, len(self.addrs), known, self.semantics.consistency,
                                 self.semantics.staleness)
        self.drain = drain_chunks(self.overlap, self.credit_mb, self.links_Bps, self.world, len(self.addrs))
        return chunk_ranges(layout, self.world, len(self.addrs), self.links_Bps, cap_bytes, self.shares,
                            self.drain, self.shared_cores)

    def attach(self, model: nn.Module, buckets: list[Bucket]) -> None:
        self.layout = flat_layout(model.named_parameters())
        self.client, self.tr, self.chan = session.open_worker(
            self.layout, buckets, rank=self.rank, device=self.device, addrs=self.addrs, timeout_s=self.timeout_s,
            frame_bytes=self.frame_bytes, curve=self.curve, window=self.window, optim=self.optim_cfg,
            semantics=self.semantics, resume=self.resume, compress=self.compress, error_feedback=self.error_feedback,
            resume_rank=self.resume_rank, credit_mb=self.credit_mb, overlap=self.overlap,
            client=self.probed, links_Bps=self.links_Bps, order=self.order,
            credit_chunks=credit_chunks(self.links_Bps, self.world, len(self.addrs)))
        self.tuned.update(session.chunk_fit(buckets, self.drain, self.shared_cores))
        # fp16/bf16: servers answer with the mean in that dtype (``store.reply``); ReduceSync wants the sum
        codec = self.tr.codec
        self.scale = self.world if codec is not None and codec.dense else 1
        self.done: set[int] = set()

    def launch(self, bucket: Bucket) -> Handle:
        self.chan.ready(bucket)
        self.chan.wake()  # (a reducer launches one bucket at a time)
        return _ChunkHandle(self, bucket)

    def until(self, b: Bucket) -> None:
        """Use replies as they come (each server's in send order) until ``b``'s sum is in its buffer."""
        while b.index not in self.done:
            got = self.chan.take_any()
            if not got:
                raise RuntimeError(f"chunk {b.index} was waited for but never sent")
            for chunk, t in got:
                t.copy_into(chunk.flat)
                if self.scale != 1:
                    chunk.flat.mul_(self.scale)
                self.done.add(chunk.index)

    def wire_bytes(self, bucket: Bucket) -> tuple[int, int]:
        raise NotImplementedError("the PS counts the bytes of its frames per step (step_bytes)")

    def step_bytes(self, buckets: list[Bucket]) -> tuple[int, int]:
        return self.tr.bytes()

    def end_step(self) -> None:
        self.done.clear()
        self.chan.run(self.tr.end_step)

    def take_messages(self) -> list[Message]:
        return [Message(name, t, dur) for t, name, dur in self.tr.messages]

    def state_dict(self) -> dict:
        """Rank 0: the servers' versions (what resuming checks); other ranks: {}."""
        if self.rank != 0:
            return {}
        return self.chan.run(lambda: session.servers_state(self.client, self.layout,
                                                           [b for mine in self.tr.chunks for b in mine]))

    def rank_state(self) -> dict:
        """This worker's error-feedback residuals (``session.feedback_state``)."""
        return session.feedback_state(self.tr, self.layout, self.compress)

    def close(self) -> None:
        if self.client is not None:
            session.close_worker(self.chan, self.client)
            self.client = None
