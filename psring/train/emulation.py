"""Compute emulation (``--compute emulated[:MS]``): forward and backward replaced by waits, gradients
with the real model's shapes and bytes, so N workers on a small machine behave like N hosts that each
have their own accelerator (a wait costs no CPU; real compute of N workers would share two cores).

What it models: a step's compute time (forward 1/3, backward 2/3 of MS, the usual ratio), and *when*
each gradient becomes ready during backward: parameters' gradients arrive in reverse registration order
(as real backward produces them), each after a share of the backward time proportional to its size, so
bucketed communication overlaps the rest of backward as it would. What it does not model: the values
(every gradient is a fixed tensor, a view of one random pool, the loss is 0, nothing is learned), memory traffic of real kernels
competing with communication, and variation between steps beyond a straggler's factor. With ``--overlap
full`` forward runs parameter by parameter, each's share of the forward time proportional to its size
(a real network's early layers cost more per parameter: this is the emulation's simplification).

The default MS is measured once, before the workers start: the median of a few forward+backward passes
of the chosen model and batch by a single process with every core (``measure_compute_ms``).
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from .compute_spec import FORWARD_SHARE


class _Deadlines:
    """One backward's clock: it starts when the first gradient node runs; node i yields its gradient at
    ``start + due[i]``, the end of its byte share of the backward time. Sleeping to a deadline, not for a
    duration, keeps what runs between the nodes (autograd accumulating a 9.4 MB gradient into ``.grad``
    right after a sleep, with a cold cache and a thread pool to wake: 4-7 ms; the synchronizer's hooks)
    inside the backward time instead of on top of it (+4% with one thread, +19% with two at 561 ms)."""

    def __init__(self):
        self.start: float | None = None

    def wait(self, due_s: float) -> None:
        now = time.perf_counter()
        if self.start is None:
            self.start = now
        left = self.start + due_s - now
        if left > 0:
            time.sleep(left)


class _GradAfter(torch.autograd.Function):
    """Identity on a parameter whose backward waits until ``due_s`` into the backward pass and then
    yields a fixed gradient."""

    @staticmethod
    def forward(ctx, p: torch.Tensor, grad: torch.Tensor, clock: _Deadlines, due_s: float) -> torch.Tensor:
        ctx.grad, ctx.clock, ctx.due_s = grad, clock, due_s
        return p.new_zeros(())

    @staticmethod
    def backward(ctx, _out):
        ctx.clock.wait(ctx.due_s)
        return ctx.grad, None, None, None


class EmulatedCompute:
    """``loss = emu.forward(factor)`` sleeps the forward share and returns a scalar whose backward sleeps
    the backward share, producing each parameter's gradient in turn (so gradient hooks fire as in real
    backward). ``factor`` stretches both (a straggler)."""

    def __init__(self, model: nn.Module, compute_ms: float, seed: int):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.compute_s = compute_ms / 1000
        total = sum(p.numel() for p in self.params) or 1
        self.shares = [p.numel() / total for p in self.params]
        # every gradient a view of one random pool as large as the largest parameter: no second copy of the model's
        # gradients in memory (ViT-B/16: 346 MB a worker) and no random draw of its size (1 s of CPU a worker)
        g = torch.Generator().manual_seed(seed)
        device = self.params[0].device if self.params else torch.device("cpu")
        pool = torch.randn(max((p.numel() for p in self.params), default=0), generator=g).mul_(1e-3).to(device)
        self.grads = [pool[:p.numel()].view(p.shape) for p in self.params]

    def forward(self, factor: float = 1.0, gate=None) -> torch.Tensor:
        """``gate`` (``--overlap full``: ``Synchronizer.wait_params``): forward runs layer by layer in
        registration order, each parameter's share of the forward time (proportional to its size) after
        ``gate([p])`` returned, so a layer whose parameters are still on the wire waits for them."""
        forward_s = self.compute_s * FORWARD_SHARE * factor
        if gate is None:
            time.sleep(forward_s)
        else:
            due = time.perf_counter()  # when the layers so far are done: one sleep per ms, not per layer
            for p, share in zip(self.params, self.shares):
                gate([p])
                due = max(due, time.perf_counter()) + forward_s * share
                if (left := due - time.perf_counter()) > 1e-3:  # (one reading: a second could be past due)
                    time.sleep(left)
            time.sleep(max(0.0, due - time.perf_counter()))
        backward_s = self.compute_s * (1 - FORWARD_SHARE) * factor
        # built in registration order: autograd runs the newest node first, i.e. the last parameters'
        # gradients come first, as in a real backward; each is due once backward did it and all after it
        clock, due, dues = _Deadlines(), 0.0, []
        for share in reversed(self.shares):
            due += backward_s * share
            dues.append(due)
        terms = [_GradAfter.apply(p, g, clock, d)
                 for p, g, d in zip(self.params, self.grads, reversed(dues))]
        return torch.stack(terms).sum()


def measure_compute_ms(cfg, threads: int, repeats: int = 5) -> float:
    """Median wall time (ms) of forward+backward of ``cfg``'s model on one batch of its input size, one
    process, ``threads``."""
    from .models import model_of

    old = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        model, s = model_of(cfg), cfg.input_size
        x, y = torch.randn(cfg.batch_size, 3, s, s), torch.randint(0, cfg.classes, (cfg.batch_size,))
        times = []
        for i in range(repeats + 2):  # two warm-up passes (allocator, kernels' first-call costs)
            t0 = time.perf_counter()
            model.zero_grad(set_to_none=False)
            F.cross_entropy(model(x), y).backward()
            if i >= 2:
                times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1000
    finally:
        torch.set_num_threads(old)
