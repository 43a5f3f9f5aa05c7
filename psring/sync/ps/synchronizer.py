"""``ps``: workers push gradients to S parameter servers and pull the updated parameters back.

The model's parameters, as one flat vector in backward order, are cut into equal chunks spread
round-robin over the servers (``sharding.plan_chunks``: a large tensor is split over several servers,
so every server owns the same bytes). With the default
design (``server-optimizer``) each server runs the optimizer (SGD or Adam) for its chunks and the
worker runs none; with ``aggregate`` it only sums the workers' gradients and the workers run the
optimizer locally on the sum (divided by N as the fused kernel reads it, as after an all-reduce). The
consistency model (BSP, SSP with bound k, ASP; see ``consistency``) is the servers' business: it only
decides when a pushpull is answered. Rank 0 initialises the servers with its (seeded) initial weights,
the optimizer settings, the design and the consistency model; every worker then pulls version 0, so
all start from the servers' copy.

Overlap: the chunks are the buckets (``buckets.GradBuckets`` over one flat gradient buffer; ``.grad``
are views into it). A chunk is pushed from inside backward as soon as every gradient it covers is
accumulated, as a ``pushpull``: the server answers it with the chunk's updated parameters as soon as
every worker's gradients for it arrived and the update ran. So servers aggregate and update while
backward still runs, and new parameters stream back chunk by chunk while later ones are still on their
way in. Frames go to ZeroMQ without copies: the chunk's own memory (on GPU, a pinned host copy made
asynchronously, then waited for). On CPU, a parameter that lies wholly in one chunk becomes a view of
the reply's frame (no copy); one split over chunks is copied into, part by part.

Checkpoints: ``state_dict`` (rank 0, between steps) fetches every server's chunks' optimizer state and
version with the ``state`` op and reassembles the state per parameter; resuming (``resume_from`` before
``attach``) has rank 0 init every server with the model's parameters (loaded from the checkpoint), the
saved optimizer state cut into its chunks, and the version of the step to continue at, and every worker
pulls that version. State is kept by parameter name, so the number of servers (and the chunking) may
differ from the checkpointed run's.
"""
from __future__ import annotations

import time
from collections import deque

import torch
from torch import nn

from ...config import OptimConfig
from ..base import Synchronizer, SyncStats, make_local_optimizer, timed_update
from ..buckets import Bucket, GradBuckets, flat_layout, space_sizes
from .client import PSClient
from .consistency import check_semantics
from .optimizers import optim_header
from .protocol import Pieces
from .sharding import chunk_bytes, default_window, plan_chunks


def chunk_key(b: Bucket) -> str:
    """A chunk's key on its server (the protocol's tensor name)."""
    return f"c{b.index}"


class PSSync(Synchronizer):
    name = "ps"

    def __init__(self, rank: int, world: int, device: torch.device, addrs: list[str], optim: OptimConfig,
                 timeout_s: float, bucket_mb: float = 4.0, overlap: bool = True, frame_kb: int = 1024,
                 design: str = "server-optimizer", consistency: str = "bsp", staleness: int = 2,
                 curve: str | None = None, window: int | None = None, links_Bps: tuple[float, float] | None = None):
        """``bucket_mb``: the largest chunk (the chunks are equal, at most this, a multiple of S of them).
        ``links_Bps``: (worker, server) link bandwidths, bytes/s, when known (an emulated network): the
        chunks are then fitted to them (``sharding.fitted_chunk_bytes``, at most ``bucket_mb``; with
        one server too, splitting tensors) and sent under a window of credits.
        ``window``: the most pushpulls of this worker unanswered at one server; 0: no limit; None:
        ``sharding.default_window`` (no limit where the links are unknown)."""
        super().__init__(rank, world, device)
        self.curve = curve
        if not addrs:
            raise ValueError("--sync ps needs server addresses (--ps-addrs), or start it with `psring train`")
        self.semantics = check_semantics(design, consistency, staleness)
        self.aggregate = design == "aggregate"
        self.addrs, self.optim_cfg, self.timeout_s, self.overlap = addrs, optim, timeout_s, overlap
        self.cap = int(bucket_mb * 2**20)
        self.frame_bytes = frame_kb * 1024 if frame_kb > 0 else None
        self.client = None
        self.links_Bps = links_Bps
        self.window = default_window(len(addrs), links_Bps is not None) if window is None else window

    def attach(self, model: nn.Module) -> nn.Module:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.layout = flat_layout(named)
        sizes, itemsizes = space_sizes(self.layout)
        m_bytes = sum(n * i for sp, i in zip(sizes, itemsizes) for n in sp)
        cap = chunk_bytes(m_bytes, self.world, len(self.addrs), self.links_Bps, self.cap)
        chunks = plan_chunks(sizes, itemsizes, len(self.addrs), cap, split=self.links_Bps is not None)
        self.buckets = GradBuckets(self.layout, chunks, self._on_ready, self.device)
        self.chunks: list[list[Bucket]] = [[] for _ in self.addrs]  # per server, in launch order
        # per chunk, the memory its push leaves from: the gradient buffer itself, or on GPU a pinned copy
        self.host = {b.index: b.flat if self.device.type == "cpu" else torch.empty(
            b.flat.shape, dtype=b.flat.dtype, pin_memory=True) for b in self.buckets.buckets}
        for b in self.buckets.buckets:
            self.chunks[b.group].append(b)
        self.optimizer = make_local_optimizer([p for _, p in named], self.optim_cfg, grad_divisor=self.world) \
            if self.aggregate else None
        self.client = PSClient(self.addrs, self.rank, self.timeout_s, self.frame_bytes, self.curve)
        start, opt_state = self._resume_point()
        if self.rank == 0:
            values = [torch.cat([p.detach().reshape(-1).cpu() for _, p, _ in sp.members]) for sp in self.layout]
            init = {"op": "init", "optim": optim_header(self.optim_cfg), **self.semantics.header(),
                    "version": start}
            reqs = [self.client.send(s, init, [(chunk_key(b), values[b.space][b.start:b.end]) for b in chunks],
                                     [kt for b in chunks for kt in self._chunk_state(b, opt_state)])
                    for s, chunks in enumerate(self.chunks)]
            for s, req in enumerate(reqs):
                self.client.recv(s, req)
            del values
        reqs = [self.client.send(s, {"op": "pull", "version": start}) for s in range(len(self.addrs))]
        for s, req in enumerate(reqs):
            named_reply = self.client.recv(s, req)[1]
            keys = [k for k, _ in named_reply]
            if keys != [chunk_key(b) for b in self.chunks[s]]:
                raise RuntimeError(f"PS server {s} holds chunks {keys[:3]}..., expected "
                                   f"{[chunk_key(b) for b in self.chunks[s]][:3]}... (another run's server?)")
            for (_, t), b in zip(named_reply, self.chunks[s]):
                self._load_params(t, b, alias=not self.aggregate)
        self.cur = start
        if self.optimizer is not None:
            self._restore_optimizer()
        self._new_step()
        return model

    @staticmethod
    def _chunk_state(b: Bucket, by_param: dict[str, dict[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        """A chunk's slice of the saved per-parameter optimizer state, named ``KIND/KEY`` as init takes it
        (Adam's ``step`` is per tensor: the chunk's first parameter's, the same for all of them)."""
        if not by_param:
            return []
        key, first = chunk_key(b), by_param[b.members[0].name]
        return [(f"{kind}/{key}", first[kind] if kind == "step" else
                 torch.cat([m.in_param(by_param[m.name][kind].contiguous()) for m in b.members]))
                for kind in first]

    def _resume_point(self) -> tuple[int, dict[str, dict[str, torch.Tensor]]]:
        """(first step, {parameter: {kind: tensor}} of saved server optimizer state) from ``self.resume``;
        (0, {}) for a fresh run."""
        if self.resume is None:
            return 0, {}
        state, step = self.resume
        if self.rank != 0:  # only rank 0 inits the servers
            return step, {}
        if state.get("servers") is None and not self.aggregate:
            raise ValueError("the checkpoint holds no PS server state (state_dict()['servers']): cannot resume "
                             "the servers' optimizer")
        for srv in state.get("servers") or []:
            if self.semantics.consistency == "bsp" and srv["version"] != step:
                raise ValueError(f"the checkpoint's servers are at step {srv['version']}, not at {step}, "
                                 f"the step to resume at")
        by_param: dict[str, dict[str, torch.Tensor]] = {}
        for name, t in (state.get("opt_state") or {}).items():
            kind, _, param = name.partition("/")
            by_param.setdefault(param, {})[kind] = t
        return step, by_param

    def state_dict(self) -> dict:
        """Rank 0, between steps: ``{"servers": [per server: {"version", "clocks", "optim", "semantics"}],
        "opt_state": {"KIND/PARAMETER": tensor}, "optimizer": ...}`` (the servers' optimizer state put back
        together per parameter; ``optimizer``: the local optimizer's, design aggregate only), CPU tensors
        and plain values. Other ranks: {}."""
        if self.rank != 0:
            return {}
        if self.inflight or self.deferred:
            raise RuntimeError("PSSync.state_dict between steps only (this step's gradients are on their way)")
        reqs = [self.client.send(s, {"op": "state"}) for s in range(len(self.addrs))]
        servers, chunk_state = [], {}
        for s, req in enumerate(reqs):
            header, _ = self.client.recv(s, req)
            for name, t in header["opt_state"]:
                chunk_state[name] = t.join() if isinstance(t, Pieces) else t
            servers.append({"version": header["version"], "clocks": header["clocks"], "optim": header["optim"],
                            "semantics": {k: header[k] for k in ("design", "consistency", "staleness")}})
        opt_state = {}
        kinds = sorted({name.partition("/")[0] for name in chunk_state})
        for sp in self.layout:
            for pname, p, _ in sp.members:
                for kind in kinds:
                    opt_state[f"{kind}/{pname}"] = torch.empty(() if kind == "step" else p.shape,
                                                               dtype=torch.float32 if kind == "step" else p.dtype)
        for b in self.buckets.buckets:
            for kind in kinds:
                t = chunk_state[f"{kind}/{chunk_key(b)}"]
                for m in b.members:
                    dst = opt_state[f"{kind}/{m.name}"]
                    if kind == "step":
                        dst.copy_(t)
                    else:
                        m.in_param(dst).copy_(m.in_bucket(t.reshape(-1)))
        return {"servers": servers, "opt_state": opt_state, **super().state_dict()}

    def _new_step(self) -> None:
        # per server: pushpulls sent whose replies were not used yet (req, chunk, trace), in send order,
        # and chunks ready but held back until the server has a credit free
        self.sent: list[deque] = [deque() for _ in self.addrs]
        self.queued: list[deque] = [deque() for _ in self.addrs]
        self.deferred: list[Bucket] = []
        self.messages = []
        # bytes are counted from the end of the previous step: with overlap, pushes leave during backward
        self.sent0, self.recv0 = self.client.bytes_sent, self.client.bytes_recv

    @property
    def inflight(self) -> bool:
        return any(self.sent) or any(self.queued)

    def _on_ready(self, b: Bucket) -> None:
        if self.overlap:
            self.queued[b.group].append(b)
            self._pump(b.group)
        else:
            self.deferred.append(b)

    def _pump(self, s: int) -> None:
        """Send server ``s``'s queued chunks while it has credits: at most ``window`` of this worker's
        pushpulls unanswered per server. Every worker sends its chunks in the same order, so with the
        window the N copies of a chunk reach its server together and its reply leaves while later
        chunks still arrive, instead of a fast TCP flow running ahead and the slowest flow's chunks all
        completing at the end (ByteScheduler's credits, SOSP'19). Replies already here are taken off
        the socket first (not used: that waits for ``step``), so this may run from inside backward."""
        if not self.queued[s]:
            return
        if self.window:
            self.client.collect(s)
            busy = sum(1 for req, _, _ in self.sent[s] if not self.client.arrived(s, req))
        else:
            busy = -len(self.queued[s])  # no window: everything at once
        while self.queued[s] and (not self.window or busy < self.window):
            self._push(self.queued[s].popleft())
            busy += 1

    def _push(self, b: Bucket) -> None:
        s, host = b.group, self.host[b.index]
        t = time.perf_counter()
        if host is not b.flat:  # GPU: device-to-host into pinned memory, asynchronous, then waited for
            host.copy_(b.flat, non_blocking=True)
            torch.cuda.current_stream(self.device).synchronize()
        req = self.client.send(s, {"op": "pushpull", "step": self.cur}, [(chunk_key(b), host)])
        sent = time.perf_counter()
        reply = [sent, f"params of chunk {b.index} from server {s}", None]  # duration set on arrival
        self.messages += [[t, f"push chunk {b.index} to server {s} ({b.nbytes / 2**20:.1f} MB)", sent - t], reply]
        self.sent[s].append((req, b, reply))

    def _load_params(self, t, b: Bucket, alias: bool) -> None:
        """A chunk's values (a tensor viewing a received frame, or ``Pieces``) into the parameters it
        covers. ``alias`` (CPU, server-optimizer): a parameter wholly in the chunk becomes a view of the
        frame, kept alive by the tensor; nothing on such a worker writes parameters (the servers run the
        optimizer) and the next reply replaces the view. Parameters split over chunks, and frames not
        aligned to their element size (ZeroMQ packs small messages into a shared buffer), are copied."""
        if isinstance(t, Pieces):
            t = t.join()  # a server started with --frame-kb: joined once, then used like one frame
        alias = alias and self.device.type == "cpu" and t.data_ptr() % t.element_size() == 0
        with torch.no_grad():
            for m in b.members:
                src = m.in_bucket(t)
                if alias and m.whole:
                    m.param.data = src.view(m.param.shape)
                else:
                    m.in_param(m.param.data).copy_(src)

    def _reply(self, s: int, named: list, b: Bucket) -> None:
        """A pushpull's reply: the chunk's new values into the parameters, or (aggregate) the gradient
        sum into the chunk's buffer (the ``.grad`` the local optimizer reads; what it held was pushed)."""
        if [k for k, _ in named] != [chunk_key(b)]:
            raise RuntimeError(f"PS server {s} answered with {[k for k, _ in named][:3]}, expected "
                               f"[{chunk_key(b)!r}]")
        t = named[0][1]
        if not self.aggregate:
            self._load_params(t, b, alias=True)
        elif isinstance(t, Pieces):
            t.copy_into(b.flat)
        else:
            b.flat.copy_(t)

    def step(self, step: int) -> SyncStats:
        """push_s: pushing what backward did not (all of it without overlap); wait_s: until the replies
        arrived (transfer, aggregation, the slowest worker, the update); pull_s: copying the new
        parameters (aggregate: the gradient sums) into the model, chunk by chunk, while later ones are
        still on the wire. update_s: the local optimizer (aggregate only; 0 when the servers update)."""
        if step != self.cur:
            raise RuntimeError(f"PS worker is at step {self.cur} but was asked to synchronize step {step}")
        t0 = self.clock.now()
        self.buckets.flush()
        for b in self.deferred:
            self.queued[b.group].append(b)
        for s in range(len(self.addrs)):
            self._pump(s)
        t1 = self.clock.now()
        push_s, wait_s, pull_s = t1 - t0, 0.0, 0.0
        lap = t1  # laps of one clock, so push_s + wait_s + pull_s is exactly sync_s
        while self.inflight:
            used = False
            for s in range(len(self.addrs)):  # a server's replies are used in the order it was sent
                while self.sent[s] and self.client.arrived(s, self.sent[s][0][0]):
                    req, b, trace = self.sent[s].popleft()
                    _, named = self.client.recv(s, req)
                    trace[2] = time.perf_counter() - trace[0]
                    self._reply(s, named, b)
                    tb = self.clock.now()
                    self._pump(s)
                    tc = self.clock.now()
                    pull_s, push_s, lap, used = pull_s + tb - lap, push_s + tc - tb, tc, True
            if not used and self.inflight:
                self.client.wait_any([s for s in range(len(self.addrs)) if self.sent[s]])
                tb = self.clock.now()
                wait_s, lap = wait_s + tb - lap, tb
        update_s = timed_update(self.optimizer, self.device) if self.aggregate else 0.0
        stats = SyncStats(sync_s=lap - t0, update_s=update_s, bytes_sent=self.client.bytes_sent - self.sent0,
                          bytes_recv=self.client.bytes_recv - self.recv0,
                          phases={"push_s": push_s, "wait_s": wait_s, "pull_s": pull_s},
                          messages=[[name, t - t0, dur] for t, name, dur in self.messages])
        self.buckets.reset()
        self.cur += 1
        self._new_step()
        return stats

    def close(self) -> None:
        """Tell every server this worker is done (best effort, 5 s at most), then close the sockets."""
        if self.client is None:
            return
        self.client.timeout_ms = min(self.client.timeout_ms, 5000)
        try:
            reqs = [self.client.send(s, {"op": "done"}) for s in range(len(self.addrs))]
            for s, req in enumerate(reqs):
                self.client.recv(s, req)
        except Exception:  # noqa: BLE001, S110 - a server already gone is the launcher's to report, not ours
            pass
        finally:
            self.client.close()
            self.client = None
