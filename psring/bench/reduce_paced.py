"""A raw paced all-reduce worker: the floor of an overlapped reduce-family step on this machine, with none of
psring's logic (``benchmarks/reduce_floor.py`` runs N of them on an emulated network).

It runs the schedule psring's priority scheduler keeps (``sync/schedule.py``: an order fixed for the run,
two reductions in flight) with plain gloo all-reduces, in one thread:

- the parameters are the model's tensors in forward order (``--sizes``), one flat float32 buffer, cut into as
  many partitions as ``--partition`` bytes make of it, as psring cuts them (``buckets.aligned_ranges``: at the
  tensors' boundaries, a large tensor in equal pieces; ``--flat``: slices of ``--partition`` bytes instead);
- forward takes ``F`` seconds and backward ``Bw``, each tensor its share by bytes (as ``--compute emulated``
  and the bound, ``overlap_model``, have it); a partition is ready once backward has made every tensor it
  holds a part of (a tensor's gradient whole at once, the last tensor first);
- a ready partition is launched (``all_reduce(async_op=True)``) while fewer than ``--credits`` are in flight,
  in one order fixed before the run and the same on every rank: the order a serial link would serve them
  in, the front-most ready one first (P3's priority, TicTac's fixed order), from the readiness times and
  each partition's link time (``order``);
- ``--mode backward``: the update runs and the next forward starts once every partition is summed; ``full``:
  right after backward, each tensor's part of the forward waiting only for its own partitions, which are
  updated (an SGD step on their bytes) just before it; ``none``: every partition launched after backward.

What it leaves out, each a cost psring pays and this floor does not: emulated gradients (no buffer zeroed or
filled by autograd), a trainer's thread apart from a scheduler's, buckets of whole parameters, consensus on
the order in the first steps, trace records; and its update is plain SGD (``p -= lr g``). ``--trainer-work``
puts the first and the last in, as psring's trainer does that work on this machine's cores: the gradient
buffer zeroed before each backward (``zero_grad``) and each tensor's fixed gradient added into it when
backward makes it (autograd accumulating into psring's buckets), and the update psring's workers run (torch's
fused momentum SGD with weight decay, ``OptimConfig``'s defaults, dividing the sum by N as it reads it,
``base.make_local_optimizer``), each partition's just before the layers that need it. Completions wake the loop through the works' futures, so
waiting costs no CPU. Each step's start, as ``time.time()``, and the seconds its updates took go to ``--out``
(JSON). Run as ``python -m psring.bench.reduce_paced`` under torchrun's variables (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT).
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ..overlap_model import ready_times
from ..strategies import OVERLAPS
from .paced import check_start_at

MODES = OVERLAPS  # --overlap's modes: none, backward, full
NONE, BACKWARD, FULL = MODES
WAIT_TIMEOUT_S = 60.0  # no completion for this long: a rank is gone
LR = 0.01


def partitions(nbytes: int, partition: int) -> list[tuple[int, int]]:
    """Byte ranges of ``partition`` bytes (a multiple of 4: whole float32s) over ``nbytes``.

    >>> partitions(10, 4)
    [(0, 4), (4, 8), (8, 10)]
    """
    step = max(4, partition // 4 * 4)
    return [(o, min(o + step, nbytes)) for o in range(0, nbytes, step)]


def aligned(sizes: list[int], partition: int) -> list[tuple[int, int]]:
    """psring's partitions (``buckets.aligned_ranges`` over its flat layout, which runs in backward order)
    as byte ranges of the forward-order buffer, front first.

    >>> aligned([4, 40, 8], 16)  # float32 tensors of 1, 10 and 2 elements: four partitions, 13 B each on average
    [(0, 16), (16, 32), (32, 44), (44, 52)]
    """
    from ..sync.buckets import aligned_ranges

    nbytes = sum(sizes)
    ranges = aligned_ranges([[b // 4 for b in sizes[::-1]]], [4], -(-nbytes // partition))
    return sorted((nbytes - 4 * r.end, nbytes - 4 * r.start) for r in ranges)


def partition_ready(sizes: list[int], parts: list[tuple[int, int]], backward_s: float) -> list[float]:
    """When each partition (byte range of the forward-order buffer) is ready in a backward of ``backward_s``:
    once backward made every tensor it holds part of (``overlap_model.ready_times``, a tensor whole at once).

    >>> partition_ready([4, 4, 4], [(0, 6), (6, 12)], 3.0)  # the tensors ready at 3, 2 and 1 s
    [3.0, 2.0]
    """
    ready_of = ready_times(sizes, backward_s)
    starts = [0, *itertools.accumulate(sizes)][:-1]
    return [max(r for r, s, n in zip(ready_of, starts, sizes) if s < hi and s + n > lo) for lo, hi in parts]


def order(sizes: list[int], parts: list[tuple[int, int]], backward_s: float, link_s_per_byte: float) -> list[int]:
    """The order a serial link serves the partitions in, the front-most ready one whenever it is free
    (``sync.serving_order``, as psring's scheduler plans it, there from its timing): readiness from
    ``overlap_model.ready_times`` (a partition is ready with its front-most tensor), each partition's link
    time its bytes' share.

    >>> order([4, 4, 4], [(0, 4), (4, 8), (8, 12)], 3.0, 0.5)  # ready at 3, 2, 1 s; 2 s of link each
    [2, 0, 1]
    """
    from ..sync.serving_order import serving_order

    ready = partition_ready(sizes, parts, backward_s)
    cost = [(hi - lo) * link_s_per_byte for lo, hi in parts]
    last = len(parts) - 1  # serving_order's indices run back to front
    return [last - k for k in serving_order(ready[::-1], cost[::-1])]


class PacedReducer:
    def __init__(self, sizes: list[int], partition: int, credits: int, forward_s: float, backward_s: float,
                 mode: str, link_s_per_byte: float, flat: bool = False, trainer_work: bool = False, world: int = 1):
        nbytes = sum(sizes)
        ends = list(itertools.accumulate(sizes))
        self.tensors = list(zip([0, *ends[:-1]], ends))  # each parameter tensor's bytes, in forward order
        self.parts = partitions(nbytes, partition) if flat else aligned(sizes, partition)
        self.parts_of = [[k for k, (a, b) in enumerate(self.parts) if a < hi and b > lo] for lo, hi in self.tensors]
        self.order = order(sizes, self.parts, backward_s, link_s_per_byte)
        self.grads = torch.zeros(nbytes // 4)  # summed in place (zeros stay zeros)
        self.params = torch.zeros(nbytes // 4)
        # --trainer-work: the fixed gradient autograd adds into the buffer, and psring's update of each partition
        self.fixed = torch.randn(nbytes // 4, generator=torch.Generator().manual_seed(world)).mul_(1e-3) \
            if trainer_work else None
        self.sgd = trainer_update(nbytes // 4, world) if trainer_work else None
        self.credits, self.mode = credits, mode
        self.fwd_per_byte, self.bwd_per_byte = forward_s / nbytes, backward_s / nbytes
        self.cond = threading.Condition()
        self.ready = [False] * len(self.parts)  # made by this step's backward, not yet launched
        self.done = [True] * len(self.parts)  # summed: the last step's, until this step's backward begins
        self.updated = [True] * len(self.parts)
        self.next, self.inflight, self.update_s, self.error = 0, 0, 0.0, None

    def _finished(self, k: int):
        def cb(fut) -> None:
            try:
                fut.value()
            except Exception as e:  # noqa: BLE001 - raised by pump in the main thread
                self.error = self.error or e
            with self.cond:
                self.done[k] = True
                self.inflight -= 1
                self.cond.notify()
        return cb

    def _launch(self) -> None:
        while self.next < len(self.order) and self.ready[self.order[self.next]] and self.inflight < self.credits:
            k = self.order[self.next]
            self.next += 1
            lo, hi = self.parts[k]
            with self.cond:
                self.inflight += 1
            work = dist.all_reduce(self.grads[lo // 4:hi // 4], async_op=True)
            work.get_future().add_done_callback(self._finished(k))

    def pump(self, until_s: float | None = None, until=None) -> None:
        """Launch what may leave, and wait for completions, until the clock reaches ``until_s`` or ``until()``."""
        deadline = time.monotonic() + WAIT_TIMEOUT_S
        while True:
            self._launch()
            now = time.perf_counter()
            if self.error is not None:
                raise RuntimeError(f"an all-reduce failed: {self.error}")
            with self.cond:
                if (until_s is not None and now >= until_s) or (until is not None and until()):
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no all-reduce finished within {WAIT_TIMEOUT_S:.0f} s: is a rank gone?")
                self.cond.wait(until_s - now if until_s is not None else 0.05)

    def _update(self, ks) -> None:
        t0 = time.perf_counter()
        for k in ks:
            if not self.updated[k]:
                lo, hi = self.parts[k]
                if self.sgd is not None:
                    self.sgd(self.params, self.grads, lo // 4, hi // 4)
                else:
                    self.params[lo // 4:hi // 4].add_(self.grads[lo // 4:hi // 4], alpha=-LR)
                self.updated[k] = True
        self.update_s += time.perf_counter() - t0

    def step(self, clock: float) -> float:
        """One step from ``clock`` (the compute's own time, perf_counter); returns the clock at its end."""
        full = self.mode == FULL
        for j, (lo, hi) in enumerate(self.tensors):  # forward, front first
            if full:
                ks = self.parts_of[j]
                self.pump(until=lambda ks=ks: all(self.done[k] for k in ks))
                self._update(ks)
                clock = max(clock, time.perf_counter())
            clock += (hi - lo) * self.fwd_per_byte
            self.pump(until_s=clock)
        with self.cond:  # every partition of the last step is summed: the forward waited for each
            self.done = [False] * len(self.parts)  # this step's, until its own all-reduce is
        self.next, self.updated, self.ready = 0, [False] * len(self.parts), [False] * len(self.parts)
        made = len(self.parts)  # partitions from here on are made
        if self.fixed is not None:  # the trainer's zero_grad
            self.grads.zero_()
        for j in reversed(range(len(self.tensors))):  # backward, back first
            lo, hi = self.tensors[j]
            clock += (hi - lo) * self.bwd_per_byte
            self.pump(until_s=clock)
            if self.fixed is not None:  # autograd accumulating the tensor's gradient into its bucket
                self.grads[lo // 4:hi // 4].add_(self.fixed[lo // 4:hi // 4])
            while self.mode != NONE and made and self.parts[made - 1][0] >= lo:
                made -= 1
                self.ready[made] = True
        self.ready = [True] * len(self.parts)  # (``none``: every partition, after backward)
        if not full:
            self.pump(until=lambda: self.next == len(self.order) and all(self.done))
            self._update(range(len(self.parts)))
            clock = max(clock, time.perf_counter())
        return clock

    def run(self, steps: int, start_at: float) -> tuple[list[float], list[float]]:
        """``steps`` steps from the wall clock's ``start_at``: each step's start (and the last's end) as
        ``time.time()``, and each step's update seconds."""
        time.sleep(max(0.0, start_at - time.time()))
        offset = time.time() - time.perf_counter()
        clock, starts, updates = time.perf_counter(), [], []
        for _ in range(steps):
            starts.append(clock + offset)
            before = self.update_s
            clock = self.step(clock)
            updates.append(self.update_s - before)
        self.pump(until=lambda: self.next == len(self.order) and all(self.done))
        starts.append(max(clock, time.perf_counter()) + offset)
        return starts, updates


def trainer_update(numel: int, world: int):
    """``update(params, grads, lo, hi)``: psring's workers' update of elements lo..hi (torch's fused momentum
    SGD with weight decay, ``OptimConfig``'s defaults, the sum divided by ``world`` as the kernel reads it, as
    ``base.make_local_optimizer`` has it), momentum kept here."""
    from torch.optim.sgd import sgd

    from ..config import OptimConfig

    cfg, moms, scale = OptimConfig(), torch.zeros(numel), torch.tensor(float(world))

    def update(params: torch.Tensor, grads: torch.Tensor, lo: int, hi: int) -> None:
        sgd([params[lo:hi]], [grads[lo:hi]], [moms[lo:hi]], fused=True, grad_scale=scale, weight_decay=cfg.weight_decay,
            momentum=cfg.momentum, lr=cfg.lr, dampening=0.0, nesterov=False, maximize=False)

    return update


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", required=True, help="JSON file: the parameter tensors' bytes, in forward order")
    ap.add_argument("--partition", type=int, required=True, help="bytes a partition")
    ap.add_argument("--flat", action="store_true", help="equal-size slices of the buffer, not psring's cut")
    ap.add_argument("--credits", type=int, default=2, help="reductions in flight at most")
    ap.add_argument("--forward", type=float, default=0.0)
    ap.add_argument("--backward", type=float, default=0.0)
    ap.add_argument("--link-Bps", type=float, required=True, help="one worker's payload rate (for the order)")
    ap.add_argument("--mode", choices=MODES, default=FULL)
    ap.add_argument("--trainer-work", action="store_true", help="the trainer's zero_grad, accumulation and update, "
                                                                "as psring's (the docstring)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--start-at", type=float, required=True, help="time.time() to start at (all ranks alike)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    check_start_at(ap, a.start_at)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=WAIT_TIMEOUT_S))
    ring = 2 * (world - 1) / world  # bytes on one worker's link per byte reduced
    w = PacedReducer(json.loads(Path(a.sizes).read_text()), a.partition, a.credits, a.forward, a.backward, a.mode,
                     ring / a.link_Bps, a.flat, a.trainer_work, world)
    dist.barrier()
    starts, updates = w.run(a.steps, a.start_at)
    dist.barrier()
    Path(a.out).write_text(json.dumps({"starts": starts, "update_s": updates}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
