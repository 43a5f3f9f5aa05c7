"""Compute emulation (``--compute emulated[:MS]``): forward and backward replaced by waits, gradients
with the real model's shapes and bytes, so N workers on a small machine behave like N hosts that each
have their own accelerator (a wait costs no CPU; real compute of N workers would share two cores).

What it models: a step's compute time (forward 1/3, backward 2/3 of MS, the usual ratio), and *when*
each gradient becomes ready during backward: parameters' gradients arrive in reverse registration order
(as real backward produces them), each after a share of the backward time proportional to its size, so
bucketed communication overlaps the rest of backward as it would. What it does not model: the values
(every gradient is a fixed tensor, the loss is 0, nothing is learned), memory traffic of real kernels
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

FORWARD_SHARE = 1 / 3


class _GradAfter(torch.autograd.Function):
    """Identity on a parameter whose backward waits ``delay_s`` and then yields a fixed gradient."""

    @staticmethod
    def forward(ctx, p: torch.Tensor, grad: torch.Tensor, delay_s: float) -> torch.Tensor:
        ctx.grad, ctx.delay_s = grad, delay_s
        return p.new_zeros(())

    @staticmethod
    def backward(ctx, _out):
        if ctx.delay_s > 0:
            time.sleep(ctx.delay_s)
        return ctx.grad, None, None


class EmulatedCompute:
    """``loss = emu.forward(factor)`` sleeps the forward share and returns a scalar whose backward sleeps
    the backward share, producing each parameter's gradient in turn (so gradient hooks fire as in real
    backward). ``factor`` stretches both (a straggler)."""

    def __init__(self, model: nn.Module, compute_ms: float, seed: int):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.compute_s = compute_ms / 1000
        total = sum(p.numel() for p in self.params) or 1
        self.shares = [p.numel() / total for p in self.params]
        g = torch.Generator().manual_seed(seed)
        self.grads = [torch.randn(p.shape, generator=g).mul_(1e-3).to(p.device) for p in self.params]

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
                if due - time.perf_counter() > 1e-3:
                    time.sleep(due - time.perf_counter())
            time.sleep(max(0.0, due - time.perf_counter()))
        backward_s = self.compute_s * (1 - FORWARD_SHARE) * factor
        # built in registration order: autograd runs the newest node first, i.e. the last parameters'
        # gradients come first, as in a real backward
        terms = [_GradAfter.apply(p, g, backward_s * share)
                 for p, g, share in zip(self.params, self.grads, self.shares)]
        return torch.stack(terms).sum()


def measure_compute_ms(model_name: str, batch_size: int, threads: int, seed: int = 0, repeats: int = 5) -> float:
    """Median wall time (ms) of forward+backward of ``model_name`` on one batch, one process, ``threads``."""
    from .models import build_model

    old = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        model = build_model(model_name, seed)
        x, y = torch.randn(batch_size, 3, 32, 32), torch.randint(0, 10, (batch_size,))
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


def parse_compute(spec: str) -> float | None:
    """``real`` -> None; ``emulated:MS`` -> MS; ``emulated`` (not yet resolved) -> 0.0."""
    mode, _, ms = spec.partition(":")
    if mode == "real":
        return None
    return float(ms) if ms else 0.0
