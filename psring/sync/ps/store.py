"""A server's shard: its parameters, their optimizer state and the BSP gradient aggregation.

Pure torch, no sockets, so the rules are testable on their own. BSP rule: gradients for step t are
accepted only while the shard is at version t (t updates applied); each key is updated as soon as all
N workers' gradients for it arrived (aggregation starts on arrival: the sum is accumulated in place),
and the shard's version becomes t+1 when every key was updated. A rejected push changes nothing.
"""
from __future__ import annotations

import time

import torch

from ...config import OptimConfig
from .protocol import Pieces, ProtocolError


class ShardStore:
    def __init__(self, workers: int):
        if workers < 1:
            raise ValueError(f"a server needs at least one worker, got {workers}")
        self.workers = workers
        self.version = -1  # -1 until rank 0's init arrives; then the number of updates applied
        self.params: dict[str, torch.Tensor] = {}
        self.update_s = 0.0  # running totals for the server's own metrics
        self.aggregate_s = 0.0

    @property
    def initialized(self) -> bool:
        return self.version >= 0

    def init(self, named: list[tuple[str, torch.Tensor]], optim: dict) -> None:
        if self.initialized:
            raise ProtocolError("shard already initialised (a second init arrived)")
        if not named:
            raise ProtocolError("init carries no tensors")
        try:
            cfg = OptimConfig(**optim)
            cfg.validate()
        except Exception as e:
            raise ProtocolError(f"bad optimizer settings in init: {e}") from None
        keys = [k for k, _ in named]
        if len(set(keys)) != len(keys):
            raise ProtocolError("init lists a key twice")
        named = [(k, t.join() if isinstance(t, Pieces) else t) for k, t in named]
        for key, t in named:  # check everything first: a rejected init must leave no trace
            if not t.is_floating_point():
                raise ProtocolError(f"init: parameter {key!r} has non-float dtype {t.dtype}")
        for key, t in named:
            p = t.clone()
            p.grad = torch.zeros_like(p)
            self.params[key] = p
        self.sgd = cfg
        self.momentum_buf: dict[str, torch.Tensor] = {}
        self.count = dict.fromkeys(self.params, 0)
        self.pushed: dict[str, set[int]] = {k: set() for k in self.params}
        self.updated: set[str] = set()  # keys already updated in the current step
        self.version = 0

    def check_push(self, worker: int, step: int, named: list[tuple[str, torch.Tensor]]) -> None:
        """Raise ``ProtocolError`` unless the whole push is acceptable (so a bad push changes nothing)."""
        if not self.initialized:
            raise ProtocolError("push before init")
        if not (type(worker) is int and 0 <= worker < self.workers):
            raise ProtocolError(f"worker id {worker!r} outside 0..{self.workers - 1}")
        if type(step) is not int or step != self.version:
            raise ProtocolError(f"push for step {step!r} but this shard is at step {self.version} (BSP)")
        seen = set()
        for key, g in named:
            p = self.params.get(key)
            if p is None:
                raise ProtocolError(f"unknown key {key!r} (not in this server's shard)")
            if key in seen or worker in self.pushed[key] or key in self.updated:
                raise ProtocolError(f"key {key!r} pushed twice by worker {worker} for step {step}")
            if g.dtype != p.dtype or g.shape != p.shape:
                raise ProtocolError(f"key {key!r}: got {g.dtype} {tuple(g.shape)}, "
                                    f"expected {p.dtype} {tuple(p.shape)}")
            seen.add(key)

    def push(self, worker: int, step: int, named: list[tuple[str, torch.Tensor]]) -> bool:
        """Accumulate a worker's gradients; True when this push completed the step (version advanced)."""
        self.check_push(worker, step, named)
        for key, g in named:
            p = self.params[key]
            t0 = time.perf_counter()
            if isinstance(g, Pieces):  # arrived in several frames: add each where it belongs
                g.add_into(p.grad)
            else:
                p.grad.add_(g)
            self.aggregate_s += time.perf_counter() - t0
            self.pushed[key].add(worker)
            self.count[key] += 1
            if self.count[key] == self.workers:
                self._update(key)
        if len(self.updated) == len(self.params):
            self.updated.clear()
            self.version += 1
            return True
        return False

    def _update(self, key: str) -> None:
        """SGD with momentum and weight decay on one key, the moment its last gradient arrived.

        The same arithmetic as ``torch.optim.SGD`` (dampening 0, no Nesterov), bit for bit, but in
        place: the summed gradient buffer is ours, so weight decay is added into it instead of into a
        fresh tensor (torch's version allocates one per parameter and step)."""
        t0 = time.perf_counter()
        p, cfg = self.params[key], self.sgd
        g = p.grad.div_(self.workers)  # mean of the workers' gradients = gradient of the global batch
        if cfg.weight_decay:
            g.add_(p, alpha=cfg.weight_decay)
        if cfg.momentum:
            buf = self.momentum_buf.get(key)
            if buf is None:
                self.momentum_buf[key] = buf = g.clone()
            else:
                buf.mul_(cfg.momentum).add_(g)
            g = buf
        p.add_(g, alpha=-cfg.lr)
        p.grad.zero_()
        self.count[key] = 0
        self.pushed[key].clear()
        self.updated.add(key)
        self.update_s += time.perf_counter() - t0

    def snapshot(self, keys: list[str] | None = None) -> list[tuple[str, torch.Tensor]]:
        if keys is None:
            return list(self.params.items())
        missing = [k for k in keys if k not in self.params]
        if missing:
            raise ProtocolError(f"unknown key {missing[0]!r} (not in this server's shard)")
        return [(k, self.params[k]) for k in keys]
