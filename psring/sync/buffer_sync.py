"""Model buffers across workers (``--buffers``): BatchNorm's running mean and variance.

In training mode BatchNorm normalises with each batch's own statistics, so gradients never depend on the
running statistics and every strategy trains the same with any mode; the buffers only decide what a
worker's model evaluates with, and what ``model.pt`` (rank 0's) holds:

* ``local``: each worker keeps the statistics of its own batches (Horovod and BytePS leave them so);
* ``broadcast``: rank 0's on every worker after every step (DDP's ``broadcast_buffers``, its default,
  which the ``ddp`` strategy gets from torch itself);
* ``average``: the mean over the workers after every step. The running mean and variance are linear in
  the batches' statistics, so this equals the mean of what the workers would have kept locally.

Float buffers only: integer ones (``num_batches_tracked``) count steps, equal on every worker. The
buffers travel as one flat float32 tensor in one all-reduce of the gloo group they get to themselves (a
gradient reduction may be in flight on the strategy's own group: ``--overlap full``), a broadcast being
the all-reduce of rank 0's values with zeros, exact. Bytes a worker sends and receives: 2(N-1)/N of
the buffers' (the ring's count, as for the gradients).

Example::

    psring train --sync allreduce --workers 4 --model resnet18 --buffers average
"""
from __future__ import annotations

import datetime
import os
import time

import torch
import torch.distributed as dist
from torch import nn

MODES = ("local", "broadcast", "average")


def float_buffers(model: nn.Module) -> list[torch.Tensor]:
    """The buffers ``--buffers`` synchronizes: floating-point ones, each once (shared ones are not repeated)."""
    seen, out = set(), []
    for b in model.buffers():
        if b.is_floating_point() and id(b) not in seen:
            seen.add(id(b))
            out.append(b)
    return out


def buffer_group(timeout_s: float):
    """A gloo group of every rank for the buffers (every rank calls this, in the same order): a new group
    where torch.distributed runs already, else the default group, set up from torchrun's variables (the PS
    has no collective of its own)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        for var in ("MASTER_ADDR", "MASTER_PORT"):
            if var not in os.environ:
                raise RuntimeError(f"--buffers broadcast/average: {var} is not set; start workers with "
                                   "`psring train` or torchrun")
        dist.init_process_group("gloo", init_method="env://", rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
        return None
    return dist.new_group(backend="gloo", timeout=timeout)


class BufferSync:
    """Brings ``model``'s float buffers to ``mode``'s agreement after a step (``sync()``)."""

    def __init__(self, model: nn.Module, mode: str, rank: int, world: int, group=None):
        if mode not in MODES:
            raise ValueError(f"--buffers {mode!r}: one of {', '.join(MODES)}")
        self.mode, self.rank, self.world, self.group = mode, rank, world, group
        self.buffers = float_buffers(model)
        self.nbytes = sum(b.numel() * 4 for b in self.buffers)  # travelled as float32

    @property
    def active(self) -> bool:
        return self.mode != "local" and self.world > 1 and bool(self.buffers)

    def wire_bytes(self) -> int:
        """What one ``sync()`` sends (and receives) per worker: 2(N-1)/N of the buffers' bytes."""
        return 2 * (self.world - 1) * self.nbytes // self.world if self.active else 0

    def sync(self) -> tuple[float, int]:
        """(seconds, bytes sent per worker) of agreeing on the buffers; (0, 0) with ``local``."""
        if not self.active:
            return 0.0, 0
        t0 = time.perf_counter()
        with torch.no_grad():
            flat = torch.cat([b.detach().reshape(-1).to("cpu", torch.float32) for b in self.buffers])
            if self.mode == "broadcast" and self.rank != 0:
                flat.zero_()
            dist.all_reduce(flat, group=self.group)
            if self.mode == "average":
                flat /= self.world
            offset = 0
            for b in self.buffers:
                b.copy_(flat[offset:offset + b.numel()].view_as(b))
                offset += b.numel()
        return time.perf_counter() - t0, self.wire_bytes()


def make_buffer_sync(model: nn.Module, sync, buffers: str, timeout_s: float) -> BufferSync:
    """The run's ``BufferSync`` for ``model`` attached to ``sync`` under ``--buffers`` (resolved), less what
    the strategy does itself (``Synchronizer.buffer_mode``); its gloo group made only where it has something
    to do (every rank decides alike, from the same model and mode)."""
    made = BufferSync(getattr(model, "module", model), sync.buffer_mode(buffers), sync.rank, sync.world)
    if made.active:
        made.group = buffer_group(timeout_s)
    return made
