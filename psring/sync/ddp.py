"""``ddp``: torch's DistributedDataParallel, the reference baseline.

DDP all-reduces gradient buckets *during* backward, overlapped with it, so its communication cannot be
timed apart from backward: ``sync_s`` is reported as ``None`` and the cost shows in backward time.

Buckets: ``--bucket-mb`` and ``--first-bucket-mb`` reach DDP as ``bucket_cap_mb_list=[first, cap]`` (the
last cap repeats), so it cuts its buckets as ``allreduce`` does; with the defaults (1 MB, then 25 MB)
that is DDP's own default. ``--no-overlap`` is refused for ddp (``config``): torch's reducer always
launches a bucket from inside backward and has no switch to defer it.

Compression (``--compress``, issue 15): torch's own comm hooks, registered on the DDP module, not copies:
``fp16`` / ``bf16`` -> ``default_hooks.fp16_compress_hook`` / ``bf16_compress_hook`` (divide by N, cast,
all-reduce in the low precision, cast back); ``powersgd:RANK`` -> ``powerSGD_hook.powerSGD_hook`` with a
``PowerSGDState`` (error feedback and warm start on). Bytes per step are derived from the algorithm
(gloo has no byte counters): see ``powersgd_elements`` for PowerSGD's.

Example::

    psring train --sync ddp --workers 2 --compress powersgd:2
"""
from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from ..compress.spec import NONE, POWERSGD, powersgd_rank
from ..config import OptimConfig
from .allreduce import ring_bytes_per_worker
from .base import Synchronizer, SyncStats, grad_bytes, make_local_optimizer, timed_update
from .process_group import ProcessGroupInfo

HALF_HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}
# PowerSGD compresses from this step on (0-based; the steps before it are plain all-reduce). torch
# requires >= 2 with error feedback or warm start: DDP rebuilds its buckets after the first iteration,
# so the per-bucket error and P/Q memories would be keyed to buckets that then change shape. 2 is the
# smallest it allows, so short runs (the tests' 5 steps) compress in most of their steps.
POWERSGD_START = 2
MIN_COMPRESSION_RATE = 2  # PowerSGDState's default: compress a matrix only if it shrinks at least 2x


FUTURE = torch.futures.Future[torch.Tensor]


def _hook(fn):
    """DDP checks a hook's return annotation is the real ``Future[Tensor]``, not the string that
    ``from __future__ import annotations`` leaves."""
    fn.__annotations__["return"] = FUTURE
    return fn


@_hook
def gloo_bf16_compress_hook(process_group, bucket) -> FUTURE:
    """torch's ``bf16_compress_hook`` itself, under another name: DDP refuses that name unless CUDA and NCCL
    2.10+ are present (``_check_comm_hook``), but gloo sums bfloat16 on the CPU (checked in the tests)."""
    return default_hooks.bf16_compress_hook(process_group, bucket)


def in_bucket_order(hook):
    """``hook`` with each bucket launched only once the previous bucket's future is done. PowerSGD's hook
    issues the all-reduces of P and Q from its futures' callbacks (gloo's thread) while DDP launches the
    next bucket's first all-reduce from backward: on gloo, which matches collectives by the order they
    are issued, the ranks may then issue them in different orders ("Received data size doesn't match
    expected size"). Waiting keeps every rank's order bucket by bucket; it costs the overlap of one
    bucket's P/Q round with the next bucket's backward, not any bytes."""
    last: list[torch.futures.Future] = []

    @_hook
    def ordered_hook(state, bucket) -> FUTURE:
        if last:
            last.pop().wait()
        fut = hook(state, bucket)
        last.append(fut)
        return fut

    return ordered_hook


def powersgd_elements(model: nn.Module, rank: int, min_rate: float = MIN_COMPRESSION_RATE) -> int:
    """Elements a worker all-reduces per step once PowerSGD compresses (``powerSGD_hook``, per bucket):
    each gradient is viewed as a matrix n x m (n = shape[0], m = numel / n; a bias is n x 1); with
    r = min(n, m, RANK) it is compressed iff (n + m) * r * min_rate < n * m, into P (n x r) and Q (m x r),
    and P and Q are each all-reduced; every other gradient is all-reduced as it is. So the three
    all-reduces of a bucket carry  sum_uncompressed n*m + sum_compressed n*r + sum_compressed m*r  elements,
    and the buckets together carry that sum over all trainable parameters (the split into buckets does not
    change it)."""
    total = 0
    for p in model.parameters():
        if not p.requires_grad:
            continue
        n = p.shape[0] if p.dim() > 0 else 1
        m = p.numel() // n
        r = min(n, m, rank)
        total += (n + m) * r if (n + m) * r * min_rate < n * m else n * m
    return total


class DDPSync(Synchronizer):
    name = "ddp"

    def __init__(self, pg: ProcessGroupInfo, optim: OptimConfig, bucket_mb: float = 25.0,
                 first_bucket_mb: float = 1.0, compress: str = NONE, broadcast_buffers: bool = True):
        super().__init__(pg.rank, pg.world, pg.device)
        self.broadcast_buffers = broadcast_buffers  # --buffers broadcast: DDP's own, at every forward
        self.pg, self.optim_cfg = pg, optim
        self.caps_mb = [first_bucket_mb, bucket_mb]
        self.compress = compress
        self.powersgd_rank = powersgd_rank(compress) if compress.partition(":")[0] == POWERSGD else None
        if compress not in (NONE, *HALF_HOOKS) and self.powersgd_rank is None:
            raise ValueError(f"--compress {compress!r}: ddp takes none, fp16, bf16 or powersgd:RANK")
        self.powersgd_state: powerSGD_hook.PowerSGDState | None = None

    def attach(self, model: nn.Module) -> nn.Module:
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=device_ids, process_group=self.pg.group,
                                      bucket_cap_mb_list=self.caps_mb, broadcast_buffers=self.broadcast_buffers)
        self._register_hook(ddp)
        m = grad_bytes(model)
        self.wire_bytes = ring_bytes_per_worker(m, self.world)
        if self.compress in HALF_HOOKS:  # 2-byte elements: half the bytes of the float32 ring
            self.wire_bytes = ring_bytes_per_worker(m // 2, self.world)
        self.compressed_bytes = None
        if self.powersgd_rank is not None:  # P, Q and the uncompressed gradients stay float32
            elements = powersgd_elements(model, self.powersgd_rank)
            self.compressed_bytes = ring_bytes_per_worker(4 * elements, self.world)
        # DDP's broadcast of rank 0's float buffers before every forward: (N-1)/N of their bytes sent per
        # worker, on average over the ranks, whatever tree gloo sends it along
        b = sum(x.numel() * x.element_size() for x in model.buffers() if x.is_floating_point())
        self.buffer_bytes = b * (self.world - 1) // self.world if self.broadcast_buffers and self.world > 1 else 0
        self.optimizer = make_local_optimizer(ddp.parameters(), self.optim_cfg)
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self._restore_optimizer()
        return ddp

    def _register_hook(self, ddp: DistributedDataParallel) -> None:
        gloo = self.pg.backend == "gloo"
        if self.compress == "bf16" and gloo:
            ddp.register_comm_hook(self.pg.group, gloo_bf16_compress_hook)
        elif self.compress in HALF_HOOKS:
            ddp.register_comm_hook(self.pg.group, HALF_HOOKS[self.compress])
        elif self.powersgd_rank is not None:
            self.powersgd_state = powerSGD_hook.PowerSGDState(
                process_group=self.pg.group, matrix_approximation_rank=self.powersgd_rank,
                start_powerSGD_iter=POWERSGD_START, min_compression_rate=MIN_COMPRESSION_RATE,
                use_error_feedback=True, warm_start=True)
            hook = powerSGD_hook.powerSGD_hook
            ddp.register_comm_hook(self.powersgd_state, in_bucket_order(hook) if gloo else hook)

    def step(self, step: int) -> SyncStats:
        self._check_used()
        wire = self.wire_bytes
        # the hook counts iterations itself (``iter``, +1 per backward): this step compressed iff it
        # began at iter >= start, i.e. iter > start now
        if self.powersgd_state is not None and self.powersgd_state.iter > self.powersgd_state.start_powerSGD_iter:
            wire = self.compressed_bytes
        wire += self.buffer_bytes
        return SyncStats(sync_s=None, update_s=timed_update(self.optimizer, self.device), bytes_sent=wire,
                         bytes_recv=wire, phases={"buffer_bytes": self.buffer_bytes} if self.buffer_bytes else {})

    def buffer_mode(self, mode: str) -> str:
        return "local" if mode == "broadcast" else mode  # torch's DDP broadcasts them itself

    def _check_used(self) -> None:
        """DDP without find_unused_parameters fails the *next* forward, in many lines, if a parameter got no
        gradient: refuse it here, in one (``buckets.UnusedParameterError``, as the other strategies do)."""
        missing = [n for n, p in self.named if p.grad is None]
        if missing:
            from .buckets import UnusedParameterError

            raise UnusedParameterError.of(missing)

    def _refuse_checkpoints(self) -> None:
        # PowerSGDState keeps its error feedback and warm-start P/Q per DDP bucket *index* (valid only
        # after DDP's first-iteration bucket rebuild, which a resumed process redoes) and a numpy
        # RandomState for Q's seeds, which a weights_only checkpoint cannot hold: a resume would not be
        # exact, so refuse rather than continue silently on a different trajectory.
        if self.powersgd_rank is not None:
            raise ValueError(f"ddp --compress {self.compress}: checkpoints are not supported (torch's "
                             "PowerSGD state cannot be restored exactly); drop --checkpoint-every/--resume "
                             "or use --compress fp16/bf16")

    def resume_from(self, state: dict, step: int) -> None:
        self._refuse_checkpoints()
        super().resume_from(state, step)

    def state_dict(self) -> dict:
        self._refuse_checkpoints()
        return super().state_dict()
