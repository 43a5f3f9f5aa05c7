"""The one interface between the trainer and a synchronization strategy.

The trainer runs forward and backward, then calls ``sync.step(t)``. When ``step`` returns, the model's
parameters hold the globally synchronized, updated parameters for step t on every worker. How that
happens is the strategy's business alone: all-reduce the gradients and run a local optimizer, or push
gradients to parameter servers that update and pull the result back. The trainer never branches on
the strategy, so in a measurement the synchronizer is the only thing that differs.

Example::

    sync = make_synchronizer(cfg, rank=0, world=1, local_rank=0)
    model = sync.attach(build_model("cnn", seed=0).to(sync.device))
    for t in range(steps):
        loss = loss_fn(model(x), y)
        model.zero_grad(set_to_none=False)
        loss.backward()
        stats = sync.step(t)          # parameters are now step-t parameters everywhere
    sync.close()
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn

from ..config import OptimConfig
from ..metrics.steps import PhaseClock


class Message(NamedTuple):
    """One transfer of a step, for ``--trace`` timelines (a JSON array once written: name, start, duration)."""
    name: str
    start_s: float  # after the step's sync began (a reducer's ``take_messages``: a perf_counter time)
    duration_s: float


@dataclass
class SyncStats:
    """What one ``Synchronizer.step`` cost on this worker.

    sync_s: seconds spent communicating (sending, waiting for peers or servers, receiving).
    update_s: seconds of the optimizer update run on this worker (0 when servers update).
    bytes_sent / bytes_recv: payload bytes this worker put on / took off the wire for the step.
    phases: named parts of sync_s (e.g. ps: push_s, wait_s, pull_s), each a column of steps.jsonl.
    messages: the step's individual transfers (per shard, per bucket), for ``--trace`` timelines.
    ready: ``[bucket, s after sync began]`` when each gradient bucket was ready (``GradBuckets.ready_offsets``).
    """

    sync_s: float | None = 0.0
    update_s: float = 0.0
    bytes_sent: int = 0
    bytes_recv: int = 0
    phases: dict[str, float] = field(default_factory=dict)  # parts of sync_s a strategy can tell apart
    messages: list[Message] = field(default_factory=list)
    ready: list[list] = field(default_factory=list)


class Synchronizer(ABC):
    """Base class of every strategy; see the module docstring for the contract."""

    name: str = ""

    def __init__(self, rank: int, world: int, device: torch.device):
        self.rank, self.world, self.device = rank, world, device
        self.clock = PhaseClock(device)  # device-synchronizing clock for the strategy's own sub-phases
        self.resume: tuple[dict, int] | None = None  # (state_dict() of a checkpoint, first step to run)
        self.resume_rank: dict | None = None  # what this rank's rank_state() returned then, if it saved one
        self.tuned: dict = {}  # what attach measured and chose (--link-tuning), for summary.json

    def resume_from(self, state: dict, step: int, rank_state: dict | None = None) -> None:
        """Before ``attach``: continue a run at ``step`` from ``state`` (what ``state_dict`` returned when
        the checkpoint was written; the model's parameters are already loaded) and this rank's
        ``rank_state`` then (None: it saved none)."""
        self.resume, self.resume_rank = (state, step), rank_state

    def rank_state(self) -> dict:
        """What only this rank holds and a checkpoint needs (every rank calls it, between steps; each
        writes its own file): {} for most strategies, whose state is rank 0's or gathered in ``state_dict``."""
        return {}

    def state_dict(self) -> dict:
        """What a checkpoint needs besides the model: the optimizer's state, wherever it lives (here, a
        local optimizer's; ``ps`` also fetches its servers' shards and optimizer state)."""
        opt = getattr(self, "optimizer", None)
        return {"optimizer": opt.state_dict()} if opt is not None else {}

    def _restore_optimizer(self) -> None:
        """Call at the end of ``attach`` of a strategy with a local optimizer."""
        if self.resume is not None and "optimizer" in self.resume[0]:
            self.optimizer.load_state_dict(self.resume[0]["optimizer"])

    def buffer_mode(self, mode: str) -> str:
        """What ``sync.buffer_sync`` still has to do for ``--buffers MODE`` after this strategy (``ddp``
        broadcasts itself, as DDP does: local then)."""
        return mode

    @abstractmethod
    def attach(self, model: nn.Module) -> nn.Module:
        """Take ownership of ``model`` (already on ``self.device``); return the module to run forward on."""

    @abstractmethod
    def step(self, step: int) -> SyncStats:
        """Synchronize after backward of ``step``; on return the parameters are updated everywhere (with
        ``--overlap full``: the step's communication is launched, ``wait_params``/``drain`` finish it)."""

    full = False  # --overlap full (``sync.overlap``): the next forward waits per module, not step()

    def wait_params(self, params: list[nn.Parameter]) -> None:
        """``--overlap full``: block until ``params`` hold the last step's update (a module's forward
        pre-hook calls it); nothing otherwise."""

    def drain(self) -> SyncStats | None:
        """``--overlap full``: finish what the last step left in flight (what no forward waited for),
        before the next backward; that step's bytes, messages and readiness marks. None: nothing was."""
        return None

    def take_waits(self) -> tuple[float, float]:
        """(seconds blocked in ``wait_params``, seconds of optimizer updates run in it and in ``drain``)
        since last taken: the trainer books them as synchronization, not as forward."""
        return 0.0, 0.0

    def close(self) -> None:
        """Release sockets and process groups. Safe to call twice."""


def make_local_optimizer(params, optim: OptimConfig, grad_divisor: int = 1) -> torch.optim.Optimizer:
    """The optimizer of every strategy that updates on the worker (none, allreduce, ddp, ps with
    ``--ps-design aggregate``): ``optim.name`` "sgd" (momentum, weight decay) or "adam" (betas, eps, L2
    weight decay), each torch's fused kernel: one pass over parameters, gradients and state; SGD's is bit
    for bit the result of the unfused one, Adam's within float32 rounding of it. The PS servers run the
    same kernels on their shards (``ps.optimizers``).

    ``grad_divisor``: the kernel divides each gradient by it as it reads it and writes the quotient back
    to ``.grad`` (how ``GradScaler`` unscales for fused optimizers), so the 1/N of an all-reduce's sum
    costs no pass of its own. The kernel multiplies by the reciprocal, which can differ from ``div_`` in the
    last bit for N that are not powers of two."""
    if optim.name == "sgd":
        opt = torch.optim.SGD(params, lr=optim.lr, momentum=optim.momentum, weight_decay=optim.weight_decay,
                              fused=True)
    elif optim.name == "adam":
        opt = torch.optim.Adam(params, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps,
                               weight_decay=optim.weight_decay, fused=True)
    else:
        raise ValueError(f"unknown optimizer {optim.name!r}; expected sgd or adam")
    if grad_divisor != 1:
        opt.grad_scale = torch.tensor(float(grad_divisor))
    return opt



def timed_update(optimizer: torch.optim.Optimizer, device: torch.device) -> float:
    """Run ``optimizer.step()`` and return its wall time (device synchronized around it on GPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def grad_bytes(model: nn.Module) -> int:
    """M: the bytes of one full set of gradients (trainable parameters only)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
