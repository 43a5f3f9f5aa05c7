"""``ps``: workers push gradients to S parameter servers and pull the updated parameters back (BSP).

Each server owns whole parameters (``sharding.assign_shards``, balanced by bytes) and runs the SGD
update for them; the worker runs no optimizer. Rank 0 initialises the servers with its (seeded) initial
weights; every worker then pulls version 0, so all start from the servers' copy.
"""
from __future__ import annotations

import time

import torch
from torch import nn

from ...config import OptimConfig
from ..base import Synchronizer, SyncStats
from .client import PSClient
from .sharding import assign_shards


class PSSync(Synchronizer):
    name = "ps"

    def __init__(self, rank: int, world: int, device: torch.device, addrs: list[str], optim: OptimConfig,
                 timeout_s: float):
        super().__init__(rank, world, device)
        if not addrs:
            raise ValueError("--sync ps needs server addresses (--ps-addrs), or start it with `psring train`")
        self.addrs, self.optim_cfg, self.timeout_s = addrs, optim, timeout_s
        self.client = None

    def attach(self, model: nn.Module) -> nn.Module:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        owner = assign_shards([p.numel() * p.element_size() for _, p in named], len(self.addrs))
        self.shards: list[list[tuple[str, nn.Parameter]]] = [[] for _ in self.addrs]
        for (n, p), s in zip(named, owner):
            self.shards[s].append((n, p))
            p.grad = torch.zeros_like(p)
        self.client = PSClient(self.addrs, self.rank, self.timeout_s)
        if self.rank == 0:
            optim = {"lr": self.optim_cfg.lr, "momentum": self.optim_cfg.momentum,
                     "weight_decay": self.optim_cfg.weight_decay}
            reqs = [self.client.send(s, {"op": "init", "optim": optim}, self._host(shard, grads=False))
                    for s, shard in enumerate(self.shards)]
            for s, req in enumerate(reqs):
                self.client.recv(s, req)
        self._pull(version=0)
        return model

    def _host(self, shard, grads: bool) -> list[tuple[str, torch.Tensor]]:
        # On GPU this is a device-to-host copy; on CPU ``.cpu()`` returns the tensor itself (no copy).
        return [(n, (p.grad if grads else p.detach()).cpu().contiguous()) for n, p in shard]

    def _pull(self, version: int) -> None:
        reqs = [self.client.send(s, {"op": "pull", "version": version}) for s in range(len(self.shards))]
        for s, req in enumerate(reqs):
            self._load(s, *self.client.recv(s, req))

    def _load(self, s: int, header: dict, named: list) -> None:
        params = dict(self.shards[s])
        if len(named) != len(params):
            raise RuntimeError(f"PS server {s} returned {len(named)} tensors, this worker expects {len(params)}")
        with torch.no_grad():
            for key, t in named:
                if key not in params:
                    raise RuntimeError(f"PS server {s} returned key {key!r} that this worker's model lacks")
                params[key].copy_(t)

    def step(self, step: int) -> SyncStats:
        """Push every shard's gradients and ask for version step+1, pipelined over all servers; then
        wait for the replies. push_s: handing the messages to ZeroMQ (plus device-to-host copies);
        wait_s: until the replies arrived (transfer, aggregation, the slowest worker, the update);
        pull_s: copying the new parameters into the model."""
        t0 = self._clock()
        sent0, recv0 = self.client.bytes_sent, self.client.bytes_recv
        pushes, pulls, sent_at = [], [], []
        for s, shard in enumerate(self.shards):
            sent_at.append(time.perf_counter())
            pushes.append(self.client.send(s, {"op": "push", "step": step}, self._host(shard, grads=True)))
            pulls.append(self.client.send(s, {"op": "pull", "version": step + 1}))
        t1 = self._clock()
        wait_s = pull_s = 0.0
        messages = []  # one per shard: from handing its push to ZeroMQ until its parameters arrived
        for s in range(len(self.shards)):
            ta = time.perf_counter()
            self.client.recv(s, pushes[s])
            reply = self.client.recv(s, pulls[s])
            tb = time.perf_counter()
            self._load(s, *reply)
            tc = self._clock()
            wait_s += tb - ta
            pull_s += tc - tb
            messages.append([f"push+pull shard {s}", sent_at[s] - t0, tb - sent_at[s]])
        t2 = self._clock()
        return SyncStats(sync_s=t2 - t0, update_s=0.0, bytes_sent=self.client.bytes_sent - sent0,
                         bytes_recv=self.client.bytes_recv - recv0,
                         phases={"push_s": t1 - t0, "wait_s": wait_s, "pull_s": pull_s}, messages=messages)

    def _clock(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def close(self) -> None:
        """Tell every server this worker is done (best effort, 5 s at most), then close the sockets."""
        if self.client is None:
            return
        self.client.timeout_ms = min(self.client.timeout_ms, 5000)
        try:
            reqs = [self.client.send(s, {"op": "done"}) for s in range(len(self.addrs))]
            for s, req in enumerate(reqs):
                self.client.recv(s, req)
        except Exception:  # noqa: BLE001 - a server already gone is the launcher's to report, not ours
            pass
        finally:
            self.client.close()
            self.client = None
