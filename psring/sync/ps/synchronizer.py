"""``ps``: workers push gradients to S parameter servers and pull the updated parameters back.

Each server owns whole parameters (``sharding.assign_shards``, balanced by bytes). With the default
design (``server-optimizer``) it runs the optimizer (SGD or Adam) for them and the worker runs none;
with ``aggregate`` it only sums the workers' gradients and the workers run the optimizer locally on the
sum (divided by N as the fused kernel reads it, as after an all-reduce). The consistency model (BSP,
SSP with bound k, ASP; see ``consistency``) is the servers' business: it only decides when a pushpull is
answered. Rank 0 initialises the servers with its (seeded) initial weights, the optimizer settings, the
design and the consistency model; every worker then pulls version 0, so all start from the servers' copy.

Overlap: gradients live in per-server bucket buffers (``buckets.GradBuckets``; ``.grad`` are views
into them). A bucket is pushed from inside backward as soon as its last gradient is accumulated, as a
``pushpull``: the server answers it with the bucket's updated parameters as soon as every worker's
gradients for them arrived and the update ran. So servers aggregate and update while backward still
runs, and new parameters stream back bucket by bucket while later buckets are still on their way in.
Frames go to ZeroMQ without copies: the bucket's own memory (on GPU, a pinned host copy made
asynchronously, then waited for).

Checkpoints: ``state_dict`` (rank 0, between steps) fetches every server's shard, optimizer state and
version with the ``state`` op; resuming (``resume_from`` before ``attach``) has rank 0 init every server
with the model's parameters (loaded from the checkpoint), the saved optimizer state of its keys and the
version of the step to continue at, and every worker pulls that version. Optimizer state is matched by
parameter name, so the number of servers may differ from the checkpointed run's.
"""
from __future__ import annotations

import time

import torch
from torch import nn

from ...config import OptimConfig
from ..base import Synchronizer, SyncStats, make_local_optimizer, timed_update
from ..buckets import Bucket, GradBuckets
from .client import PSClient
from .consistency import check_semantics
from .optimizers import optim_header
from .protocol import Pieces
from .sharding import assign_shards


class PSSync(Synchronizer):
    name = "ps"

    def __init__(self, rank: int, world: int, device: torch.device, addrs: list[str], optim: OptimConfig,
                 timeout_s: float, bucket_mb: float = 25.0, first_bucket_mb: float = 1.0, overlap: bool = True,
                 frame_kb: int = 1024, design: str = "server-optimizer", consistency: str = "bsp",
                 staleness: int = 2, curve: str | None = None):
        super().__init__(rank, world, device)
        self.curve = curve
        if not addrs:
            raise ValueError("--sync ps needs server addresses (--ps-addrs), or start it with `psring train`")
        self.semantics = check_semantics(design, consistency, staleness)
        self.aggregate = design == "aggregate"
        self.addrs, self.optim_cfg, self.timeout_s, self.overlap = addrs, optim, timeout_s, overlap
        self.cap, self.first_cap = int(bucket_mb * 2**20), int(first_bucket_mb * 2**20)
        self.frame_bytes = frame_kb * 1024 if frame_kb > 0 else None
        self.client = None

    def attach(self, model: nn.Module) -> nn.Module:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        owner = assign_shards([p.numel() * p.element_size() for _, p in named], len(self.addrs))
        self.shards: list[list[tuple[str, nn.Parameter]]] = [[] for _ in self.addrs]
        for (n, p), s in zip(named, owner):
            self.shards[s].append((n, p))
        self.buckets = GradBuckets(named, self.cap, self.first_cap, self._on_ready, self.device,
                                   groups=[[n for n, _ in shard] for shard in self.shards])
        for b in self.buckets.buckets:
            b.extra["host"] = b.flat if self.device.type == "cpu" else torch.empty(
                b.flat.shape, dtype=b.flat.dtype, pin_memory=True)
        self.optimizer = make_local_optimizer([p for _, p in named], self.optim_cfg, grad_divisor=self.world) \
            if self.aggregate else None
        self.client = PSClient(self.addrs, self.rank, self.timeout_s, self.frame_bytes, self.curve)
        start, opt_state = self._resume_point()
        if self.rank == 0:
            init = {"op": "init", "optim": optim_header(self.optim_cfg), **self.semantics.header(),
                    "version": start}
            reqs = [self.client.send(s, init, [(n, p.detach().cpu().contiguous()) for n, p in shard],
                                     [(f"{kind}/{n}", t) for n, _ in shard for kind, t in opt_state.get(n, [])])
                    for s, shard in enumerate(self.shards)]
            for s, req in enumerate(reqs):
                self.client.recv(s, req)
        reqs = [self.client.send(s, {"op": "pull", "version": start}) for s in range(len(self.addrs))]
        for s, req in enumerate(reqs):
            self._load(s, self.client.recv(s, req)[1], [n for n, _ in self.shards[s]])
        self.cur = start
        if self.optimizer is not None:
            self._restore_optimizer()
        self._new_step()
        return model

    def _resume_point(self) -> tuple[int, dict[str, list[tuple[str, torch.Tensor]]]]:
        """(first step, {parameter: [(kind, tensor)]} of saved server optimizer state) from ``self.resume``;
        (0, {}) for a fresh run."""
        if self.resume is None:
            return 0, {}
        state, step = self.resume
        servers = state.get("servers") if self.rank == 0 else []  # only rank 0 inits the servers
        if servers is None and not self.aggregate:
            raise ValueError("the checkpoint holds no PS server state (state_dict()['servers']): cannot resume "
                             "the servers' optimizer")
        by_param: dict[str, list] = {}
        for srv in servers or []:
            if self.semantics.consistency == "bsp" and srv["version"] != step:
                raise ValueError(f"the checkpoint's servers are at step {srv['version']}, not at {step}, "
                                 f"the step to resume at")
            for name, t in srv["opt_state"].items():
                kind, _, param = name.partition("/")
                by_param.setdefault(param, []).append((kind, t.contiguous()))
        return step, by_param

    def state_dict(self) -> dict:
        """Rank 0, between steps: ``{"servers": [per server: {"version", "clocks", "optim", "semantics",
        "params": {key: tensor}, "opt_state": {"KIND/KEY": tensor}}], "optimizer": ...}`` (the local
        optimizer's, design aggregate only), CPU tensors and plain values. Other ranks: {}."""
        if self.rank != 0:
            return {}
        if any(self.inflight) or self.deferred:
            raise RuntimeError("PSSync.state_dict between steps only (this step's gradients are on their way)")
        reqs = [self.client.send(s, {"op": "state"}) for s in range(len(self.addrs))]
        servers = []
        for s, req in enumerate(reqs):
            header, named = self.client.recv(s, req)
            own = {k: t.join() if isinstance(t, Pieces) else t.clone() for k, t in named}
            opt = {k: t.join() if isinstance(t, Pieces) else t.clone() for k, t in header["opt_state"]}
            servers.append({"version": header["version"], "clocks": header["clocks"], "optim": header["optim"],
                            "semantics": {k: header[k] for k in ("design", "consistency", "staleness")},
                            "params": own, "opt_state": opt})
        return {"servers": servers, **super().state_dict()}

    def _new_step(self) -> None:
        self.inflight: list[list[tuple[int, Bucket, list]]] = [[] for _ in self.addrs]  # (req, bucket, trace)
        self.deferred: list[Bucket] = []
        self.messages = []
        # bytes are counted from the end of the previous step: with overlap, pushes leave during backward
        self.sent0, self.recv0 = self.client.bytes_sent, self.client.bytes_recv

    def _on_ready(self, b: Bucket) -> None:
        if self.overlap:
            self._push(b)
        else:
            self.deferred.append(b)

    def _push(self, b: Bucket) -> None:
        s, host = b.extra["group"], b.extra["host"]
        t = time.perf_counter()
        if host is not b.flat:  # GPU: device-to-host into pinned memory, asynchronous, then waited for
            host.copy_(b.flat, non_blocking=True)
            torch.cuda.current_stream(self.device).synchronize()
        req = self.client.send(s, {"op": "pushpull", "step": self.cur}, b.views(host))
        sent = time.perf_counter()
        reply = [sent, f"params of bucket {b.index} from server {s}", None]  # duration set on arrival
        self.messages += [[t, f"push bucket {b.index} to server {s} ({b.nbytes / 2**20:.1f} MB)", sent - t], reply]
        self.inflight[s].append((req, b, reply))

    def _load_grads(self, s: int, named: list, b: Bucket) -> None:
        """aggregate: the bucket's gradient sums, into the bucket's buffer (the ``.grad`` the optimizer
        reads; its pushed contents are no longer needed, the server has received them)."""
        got = [k for k, _ in named]
        if got != b.names:
            raise RuntimeError(f"PS server {s} returned keys {got[:3]}..., expected {b.names[:3]}...")
        for (_, view), (_, t) in zip(b.views(), named):
            if isinstance(t, Pieces):
                t.copy_into(view)
            else:
                view.copy_(t)

    def _load(self, s: int, named: list, names: list[str]) -> None:
        got = [k for k, _ in named]
        if got != names:
            raise RuntimeError(f"PS server {s} returned keys {got[:3]}..., expected {names[:3]}...")
        params = dict(self.shards[s])
        with torch.no_grad():
            for key, t in named:
                if isinstance(t, Pieces):
                    t.copy_into(params[key])
                elif self.device.type == "cpu" and not self.aggregate and t.data_ptr() % t.element_size() == 0:
                    # Zero-copy: the parameter becomes a view of the received frame (kept alive by the
                    # tensor). Nothing on a PS worker writes parameters (the server runs the optimizer),
                    # and the next step's reply replaces the view. A frame not aligned to its element
                    # size (ZeroMQ packs small messages into a shared buffer) is copied instead. With the
                    # aggregate design the local optimizer writes them: the initial values are copied.
                    params[key].data = t
                else:
                    params[key].copy_(t)

    def step(self, step: int) -> SyncStats:
        """push_s: pushing what backward did not (all of it without overlap); wait_s: until the replies
        arrived (transfer, aggregation, the slowest worker, the update); pull_s: copying the new
        parameters (aggregate: the gradient sums) into the model, bucket by bucket, while later ones are
        still on the wire. update_s: the local optimizer (aggregate only; 0 when the servers update)."""
        if step != self.cur:
            raise RuntimeError(f"PS worker is at step {self.cur} but was asked to synchronize step {step}")
        t0 = self.clock.now()
        self.buckets.flush()
        for b in self.deferred:
            self._push(b)
        t1 = self.clock.now()
        wait_s = pull_s = 0.0
        lap = t1  # laps of one clock, so push_s + wait_s + pull_s is exactly sync_s
        for s, inflight in enumerate(self.inflight):
            for req, b, trace in inflight:
                _, named = self.client.recv(s, req)
                tb = time.perf_counter()
                trace[2] = tb - trace[0]
                if self.aggregate:
                    self._load_grads(s, named, b)
                else:
                    self._load(s, named, b.names)
                tc = self.clock.now()
                wait_s += tb - lap
                pull_s += tc - tb
                lap = tc
        update_s = timed_update(self.optimizer, self.device) if self.aggregate else 0.0
        stats = SyncStats(sync_s=lap - t0, update_s=update_s, bytes_sent=self.client.bytes_sent - self.sent0,
                          bytes_recv=self.client.bytes_recv - self.recv0,
                          phases={"push_s": t1 - t0, "wait_s": wait_s, "pull_s": pull_s},
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
