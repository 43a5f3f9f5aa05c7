"""psring inside your own training loop: ``DistributedOptimizer``, the shape of Horovod's
``hvd.DistributedOptimizer`` and BytePS's ``bps.DistributedOptimizer``. Start the script with torchrun::

    torchrun --nproc-per-node 4 train.py

and change three lines of an ordinary loop::

    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    opt = psring.DistributedOptimizer(opt, model, sync="ps", out="runs/mine")  # psring train's option names
    for x, y in loader:                    # each rank its own part of every global batch
        loss = F.cross_entropy(model(x), y)
        loss.backward()                    # gradients leave from backward's hooks (--overlap backward)
        opt.step()                         # every rank's parameters are the step's synchronized ones
        opt.zero_grad()
    opt.close()                            # with ``out``: steps.jsonl and summary.json, as psring train's

The wrapped optimizer gives its class and hyper-parameters (SGD with momentum and weight decay, or Adam);
psring runs that update itself (the reduce family: a fused local step on the summed gradients; the PS's
server-optimizer design: on the servers, which ``--ps-placement colocated``, the default here, starts one
per node), so the wrapped object's own state is not used. ``options`` are ``psring train``'s (``servers``,
``bucket_mb``, ``compress``, ``consistency``, ``link_tuning``, ...); ``workers`` is torchrun's WORLD_SIZE.
Refused in one line: ``ddp`` (use torch's DistributedDataParallel itself), ``--overlap full`` (the next
forward's gates need the trainer's loop), another optimizer class or SGD's nesterov/dampening.
BatchNorm's running statistics stay each worker's own unless ``buffers="broadcast"`` (rank 0's) or
``"average"`` (the workers' mean), agreed after every ``step()``.
"""
from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import torch
from torch import nn

from .config import OptimConfig, TrainConfig
from .options import ConfigError


def optim_config(optimizer: torch.optim.Optimizer) -> OptimConfig:
    """The psring hyper-parameters of ``optimizer`` (one parameter group); one-line ``ConfigError`` else."""
    if len(optimizer.param_groups) != 1:
        raise ConfigError(f"DistributedOptimizer takes an optimizer of one parameter group, got "
                          f"{len(optimizer.param_groups)}: psring applies one set of hyper-parameters everywhere")
    g = optimizer.param_groups[0]
    if type(optimizer) is torch.optim.SGD:
        if g.get("nesterov") or g.get("dampening"):
            raise ConfigError("DistributedOptimizer: SGD's nesterov and dampening are not supported (psring's "
                              "fused update is torch's plain SGD with momentum)")
        return OptimConfig(lr=float(g["lr"]), momentum=float(g["momentum"]),
                           weight_decay=float(g["weight_decay"]), name="sgd")
    if type(optimizer) is torch.optim.Adam:
        if g.get("amsgrad"):
            raise ConfigError("DistributedOptimizer: Adam's amsgrad is not supported")
        return OptimConfig(lr=float(g["lr"]), weight_decay=float(g["weight_decay"]), name="adam",
                           betas=tuple(float(b) for b in g["betas"]), eps=float(g["eps"]))
    raise ConfigError(f"DistributedOptimizer takes torch.optim.SGD or torch.optim.Adam, got "
                      f"{type(optimizer).__name__}: the servers and the fused local step implement those two")


class DistributedOptimizer:
    """See the module docstring. ``step()`` returns the step's ``SyncStats``."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: nn.Module, sync: str = "allreduce",
                 out: str | os.PathLike | None = None, **options):
        from . import strategies
        from .sync import make_synchronizer
        from .sync.process_group import env_rank
        from .train.models import check_float32

        rank, world, _ = env_rank()
        if sync in strategies.names() and not strategies.get(sync).sync_timed:  # its communication is its module's
            raise ConfigError(f"DistributedOptimizer: for {sync} wrap the model in torch's "
                              "DistributedDataParallel itself; psring's strategies here: " + ", ".join(
                                  n for n in strategies.names() if strategies.get(n).sync_timed))
        if options.get("overlap") == "full":
            raise ConfigError("DistributedOptimizer: --overlap full needs psring train's loop (each layer of the "
                              "next forward waits for its parameters there); use overlap='backward'")
        if sync in strategies.names() and strategies.get(sync).servers and not options.get("ps_addrs"):
            options.setdefault("ps_placement", "colocated")  # every node's local rank 0 starts its server
            if options["ps_placement"] == "colocated":
                from .topology import local_world

                options.setdefault("servers", max(1, world // local_world()))
        self.out = Path(out) if out is not None else None
        try:
            cfg = TrainConfig(sync=sync, workers=world, optim=optim_config(optimizer),
                              out=str(self.out or tempfile.mkdtemp(prefix="psring-loop-")), **options)
        except TypeError as e:
            raise ConfigError(f"DistributedOptimizer: {e} (options are psring train's, e.g. servers=2)") from None
        self.cfg = cfg.validate()
        cfg.model = f"own:{type(model).__name__}"  # a label for the records: the model is the caller's
        self.rank, self.step_index = rank, 0
        try:
            check_float32(model)
        except ValueError as e:
            raise ConfigError(f"DistributedOptimizer: {e}") from None
        self.sync = make_synchronizer(cfg)
        attached = self.sync.attach(model)
        if attached is not model:  # pragma: no cover - every strategy but ddp attaches in place
            raise ConfigError(f"DistributedOptimizer: --sync {sync} wraps the model; not supported here")
        from .sync.buffer_sync import make_buffer_sync

        self.buffers = make_buffer_sync(model, self.sync, cfg.resolved_buffers, cfg.timeout_s)
        self.model, self.closed = model, False
        self._times = _ForwardClock(model, self.sync.clock)
        self.log = None
        if self.out is not None:
            from .metrics.steps import StepLog
            from .train.trainer import write_tuned

            self.out.mkdir(parents=True, exist_ok=True)
            if rank == 0:
                cfg.save(self.out / "config.json")
            write_tuned(self.sync, rank, self.out)
            self.log = StepLog(self.out / "ranks" / f"rank{rank}.jsonl")
        self._times.start()

    @property
    def param_groups(self) -> list[dict]:
        """The optimizer psring runs on this worker (the reduce family; the PS's servers hold theirs)."""
        opt = getattr(self.sync, "optimizer", None)
        return opt.param_groups if opt is not None else []

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zero the gradients in place: they are views into psring's gradient buckets (``set_to_none`` is
        ignored for that reason)."""
        self.model.zero_grad(set_to_none=False)

    def step(self, closure=None):
        """Synchronize this step's gradients and update; afterwards every rank holds the same parameters."""
        from .metrics.cpu import cpu_times
        from .train.trainer import step_record, with_buffers

        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        cpu0 = cpu_times()
        t3 = self.sync.clock.now()
        st = with_buffers(self.sync.step(self.step_index), self.buffers)
        t4 = self.sync.clock.now()
        cpu1 = cpu_times()
        if self.log is not None:
            t0, t1, t2, samples = self._times.take()
            rec = step_record(self.cfg, self.sync, st, (t0, t1, t2, t2, t3, t4), rank=self.rank,
                              step=self.step_index, loss=_number(loss), samples=samples,
                              cpu_sync=[*cpu0, *cpu1] if cpu0 and cpu1 else None)
            self.log.write(rec)  # no progress lines: the loop is the user's
        self.step_index += 1
        self._times.start()
        return st

    def state_dict(self) -> dict:
        return self.sync.state_dict()

    def close(self) -> None:
        """Stop the synchronizer and, with ``out``, write steps.jsonl and summary.json (rank 0)."""
        if self.closed:
            return
        self.closed = True
        from .sync.process_group import destroy_process_group
        from .sync.ps.colocated import stop_started
        from .train.trainer import finish_outside_launcher

        try:
            self.sync.close()
            destroy_process_group(barrier=True)
        finally:
            stop_started()
            if self.log is not None:
                self.log.close()
        if self.out is not None:
            self.cfg.steps = self.step_index  # the steps this loop ran
            (self.out / "ranks" / f"rank{self.rank}.done").touch()
            finish_outside_launcher(self.cfg)

    def __enter__(self) -> DistributedOptimizer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _number(loss) -> float | None:
    if loss is None:
        return None
    v = float(loss.detach()) if torch.is_tensor(loss) else float(loss)
    return v if math.isfinite(v) else None


class _ForwardClock:
    """When this step's first forward began and its last one ended (the root module's hooks), and the
    samples it took: a step's data, forward and backward phases without the user's loop telling them."""

    def __init__(self, model: nn.Module, clock):
        self.clock = clock
        model.register_forward_pre_hook(self._pre)
        model.register_forward_hook(self._post)

    def start(self) -> None:
        self.t0 = self.clock.now()
        self.t1 = self.t2 = None
        self.samples = 0

    def _pre(self, _m, args) -> None:
        if self.t1 is None:
            self.t1 = self.clock.now()
        if args and torch.is_tensor(args[0]):
            self.samples += len(args[0])

    def _post(self, _m, _args, _out) -> None:
        self.t2 = self.clock.now()

    def take(self) -> tuple[float, float, float, int]:
        now = self.clock.now()
        t1 = self.t1 if self.t1 is not None else now
        return self.t0, t1, self.t2 if self.t2 is not None else t1, self.samples


__all__ = ["DistributedOptimizer", "optim_config"]
