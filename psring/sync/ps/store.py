"""A server's shard: its parameters, their optimizer state and the BSP gradient aggregation.

Pure torch, no sockets, so the rules are testable on their own. BSP rule: gradients for step t are
accepted only while the shard is at version t (t updates applied); each key is updated as soon as all
N workers' gradients for it arrived (aggregation starts on arrival: the sum is accumulated in place),
and the shard's version becomes t+1 when every key was updated. A rejected push changes nothing.
"""
from __future__ import annotations

import time

import torch
from torch.optim.sgd import sgd

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
        self.key_version = dict.fromkeys(self.params, 0)  # updates applied per key (pushpull replies wait on it)
        self.sgd = cfg
        # momentum buffers start at zero rather than as a copy of the first gradient: 0.9 * 0 + g is g
        self.momentum_buf = {k: torch.zeros_like(p) for k, p in self.params.items()} if cfg.momentum else {}
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
        """Accumulate a worker's gradients; True when this push completed the step (version advanced).

        Keys whose last gradient this was are updated at once, all in one fused SGD call. With one
        worker nothing is accumulated: the update reads the gradient straight from the received frames."""
        self.check_push(worker, step, named)
        t0 = time.perf_counter()
        ready: list[tuple] = []  # (param, gradient, momentum buffer or None) regions to update now
        done = []
        for key, g in named:
            p = self.params[key]
            self.pushed[key].add(worker)
            self.count[key] += 1
            if self.workers == 1:
                regions = g.regions(p) if isinstance(g, Pieces) else [(0, g.reshape(-1))]
                flat, buf = p.view(-1), self.momentum_buf.get(key)
                ready += [(flat[o:o + r.numel()], r, None if buf is None else buf.view(-1)[o:o + r.numel()])
                          for o, r in regions]
                done.append(key)
                continue
            first = self.count[key] == 1
            if isinstance(g, Pieces):  # arrived in several frames: use each where it belongs
                if first:
                    g.copy_into(p.grad)
                else:
                    g.add_into(p.grad)
            elif first:  # the first push copies, so the buffer never needs a zeroing pass
                p.grad.copy_(g)
            else:
                p.grad.add_(g)
            if self.count[key] == self.workers:
                p.grad.div_(self.workers)  # mean of the workers' gradients = gradient of the global batch
                buf = self.momentum_buf.get(key)
                ready.append((p.view(-1), p.grad.view(-1), None if buf is None else buf.view(-1)))
                done.append(key)
        t1 = time.perf_counter()
        self.aggregate_s += t1 - t0
        if ready:
            self._update(ready)
            self.update_s += time.perf_counter() - t1
        for key in done:
            self.count[key] = 0
            self.key_version[key] += 1
            self.pushed[key].clear()
            self.updated.add(key)
        if len(self.updated) == len(self.params):
            self.updated.clear()
            self.version += 1
            return True
        return False

    def _update(self, ready: list[tuple]) -> None:
        """SGD with momentum and weight decay, in place, on every (param, grad, momentum) region at once.

        torch's own fused kernel (``torch.optim.SGD(fused=True)``): one pass over the memory instead of
        four, and bit for bit what ``torch.optim.SGD`` computes (dampening 0, no Nesterov; tested)."""
        cfg = self.sgd
        params, grads, bufs = (list(x) for x in zip(*ready))
        sgd(params, grads, bufs, fused=True,
            weight_decay=cfg.weight_decay, momentum=cfg.momentum, lr=cfg.lr, dampening=0.0, nesterov=False,
            maximize=False)

    def updated_past(self, keys: list[str], step: int) -> bool:
        """Whether every key in ``keys`` has had step ``step``'s update applied."""
        return all(self.key_version[k] > step for k in keys)

    def snapshot(self, keys: list[str] | None = None) -> list[tuple[str, torch.Tensor]]:
        if keys is None:
            return list(self.params.items())
        missing = [k for k in keys if k not in self.params]
        if missing:
            raise ProtocolError(f"unknown key {missing[0]!r} (not in this server's shard)")
        return [(k, self.params[k]) for k in keys]
