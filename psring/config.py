"""The resolved configuration of one training run, shared by the launcher, every worker and the PS servers.

One dataclass, validated in one place, so every process of a run sees the same values and a bad value
fails once, before anything starts, with a one-line message (``ConfigError``) instead of a traceback.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

SYNCS = ("ps", "allreduce", "ddp", "none")
MODELS = ("cnn", "resnet18", "resnet18_narrow")
DATASETS = ("synthetic", "cifar10", "digits")
BACKENDS = ("auto", "gloo", "nccl")
OPTIMIZERS = ("sgd", "adam")
PARTITIONS = ("uniform", "stratified", "random")
CONSISTENCY = ("bsp", "ssp", "asp")
PS_DESIGNS = ("server-optimizer", "aggregate")
NETS = ("loopback", "emulated")


class ConfigError(ValueError):
    """A user-facing configuration problem; the CLI prints it on one line and exits with code 2."""


@dataclass
class OptimConfig:
    """Optimizer hyper-parameters; the same values drive the workers' optimizer and the PS servers' one.
    ``momentum`` is SGD's; ``betas`` and ``eps`` are Adam's."""

    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    name: str = "sgd"
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def validate(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ConfigError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.name!r}")
        self.betas = tuple(self.betas)
        if not (len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas)):
            raise ConfigError(f"Adam betas must be two numbers in [0, 1), got {self.betas}")
        if not self.eps > 0:
            raise ConfigError(f"Adam eps must be > 0, got {self.eps}")
        if not self.lr > 0:
            raise ConfigError(f"--lr must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"--momentum must be in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            raise ConfigError(f"--weight-decay must be >= 0, got {self.weight_decay}")


@dataclass
class TrainConfig:
    sync: str = "allreduce"
    workers: int = 1
    servers: int = 1
    model: str = "cnn"
    dataset: str = "synthetic"
    num_samples: int | None = None  # training samples; None = the whole set (synthetic: 10,000)
    data_dir: str | None = None  # cifar10: folder of the binary files (default $PSRING_DATA, ~/.cache/psring)
    partition: str = "uniform"  # how the training set is split over workers: uniform | stratified | random
    batch_size: int = 32
    steps: int = 50
    seed: int = 0
    augment: bool = False
    optim: OptimConfig = field(default_factory=OptimConfig)
    threads: int = 0  # torch intra-op threads per worker; 0 = cores // workers
    backend: str = "auto"  # torch.distributed backend for allreduce/ddp
    timeout_s: float = 120.0  # every blocking network wait gives up after this long
    log_every: int = 10
    warmup: int = 3  # first steps left out of every summary figure
    trace: bool = False  # also write trace.json (Chrome trace format) at the end of the run
    # gradient bucket size: allreduce 25 MB like DDP's bucket_cap_mb; ps 4 MB, the largest chunk of a
    # server's shard, because a chunk is also the server's pipelining unit (it updates and answers a chunk
    # once all of it arrived): on emulated 1 Gbit links 4 MB cut PS sync time by a third against 25 MB
    bucket_mb: float | None = None
    first_bucket_mb: float = 1.0  # allreduce: smaller first bucket, so communication starts early in backward
    overlap: bool = True  # start each bucket's communication during backward
    frame_kb: int = 1024  # ps: pushed tensors are split over ZeroMQ frames of at most this size (0 = no split)
    # ps: most pushpulls a worker leaves unanswered per server (credits); None: ceil(4/S) on an emulated
    # link, no limit on loopback (sharding.default_window); 0: no limit
    ps_window: int | None = None
    # --- parameter-server semantics (--sync ps) ---
    consistency: str = "bsp"  # bsp | ssp | asp
    staleness: int = 2  # SSP's bound k: a worker starting step t waits while the slowest is below t - k
    ps_design: str = "server-optimizer"  # servers run the optimizer, or only sum gradients ("aggregate")
    curve: str | None = None  # ps: CurveZMQ key folder (psring keys DIR): encrypted, only known workers
    checkpoint_every: int = 0  # write an atomic checkpoint every K steps (0: never)
    resume: str | None = None  # a run folder (or its checkpoint/) to continue from
    # --- experiments ---
    straggler: str | None = None  # "RANK:FACTOR": that worker's compute takes FACTOR times as long
    eval: bool = True  # test accuracy on the held-out split at the end of every epoch (and of the run)
    # --- emulated cluster ---
    net: str = "loopback"  # loopback | emulated (each worker and server in its own rate-limited namespace)
    link_rate: str = "1gbit"  # --net emulated: every host's link, each direction
    server_link_rate: str | None = None  # --net emulated: PS servers' links, if different
    link_delay: str | None = None  # --net emulated: one-way delay (needs sch_netem)
    compute: str = "real"  # real | emulated | emulated:MS (forward+backward replaced by a wait)
    out: str = "runs/latest"  # psring train without --out: a new runs/DATE-TIME-SYNC-nN (launch/outdir.py)
    ps_addrs: list[str] = field(default_factory=list)  # filled by the launcher, or given for external servers

    @property
    def samples(self) -> int:
        """Training samples the run draws from (synthetic: generated; real sets: capped at their size)."""
        return self.num_samples if self.num_samples is not None else 10_000

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.workers

    def resolved_threads(self) -> int:
        if self.threads > 0:
            return self.threads
        return max(1, (os.cpu_count() or 1) // max(1, self.workers))

    def validate(self) -> TrainConfig:
        if self.sync not in SYNCS:
            raise ConfigError(f"--sync must be one of {', '.join(SYNCS)}, got {self.sync!r}")
        if self.model not in MODELS:
            raise ConfigError(f"--model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if self.dataset not in DATASETS:
            raise ConfigError(f"--dataset must be one of {', '.join(DATASETS)}, got {self.dataset!r}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"--backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        for name in ("workers", "batch_size", "steps", "log_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.bucket_mb is None:
            self.bucket_mb = 4.0 if self.sync == "ps" else 25.0
        if not (self.bucket_mb > 0 and self.first_bucket_mb > 0):
            raise ConfigError(f"--bucket-mb and --first-bucket-mb must be > 0, got {self.bucket_mb}, {self.first_bucket_mb}")
        if self.ps_window is not None and self.ps_window < 0:
            raise ConfigError(f"--ps-window must be >= 0 (0 = no limit), got {self.ps_window}")
        if self.frame_kb < 0:
            raise ConfigError(f"--frame-kb must be >= 0 (0 = one frame per tensor), got {self.frame_kb}")
        if self.warmup < 0:
            raise ConfigError(f"--warmup must be >= 0, got {self.warmup}")
        if self.threads < 0:
            raise ConfigError(f"--threads must be >= 0 (0 = automatic), got {self.threads}")
        if self.timeout_s <= 0:
            raise ConfigError(f"--timeout must be > 0 seconds, got {self.timeout_s}")
        if self.sync == "ps":
            if self.servers < 1:
                raise ConfigError(f"--servers must be >= 1, got {self.servers}")
            self._check_shardable()
        elif self.servers != 1:
            raise ConfigError(f"--servers only applies to --sync ps (got --sync {self.sync} --servers {self.servers})")
        if self.num_samples is not None and self.num_samples < 1:
            raise ConfigError(f"--num-samples must be >= 1, got {self.num_samples}")
        if self.dataset == "synthetic" and self.global_batch > self.samples:
            raise ConfigError(
                f"global batch {self.global_batch} (= --batch-size {self.batch_size} x --workers {self.workers}) "
                f"exceeds the data set's {self.samples} samples; lower one or raise --num-samples"
            )
        self._validate_choices()
        self.optim.validate()
        if self.curve is not None:
            from .auth import AuthError, check_dir

            try:
                check_dir(self.curve, "server")
                check_dir(self.curve, "worker")
            except AuthError as e:
                raise ConfigError(str(e)) from None
        if self.dataset != "synthetic":
            from .train.datasets import check_available

            try:
                check_available(self.dataset, self.data_dir)
            except ValueError as e:
                raise ConfigError(str(e)) from None
        return self

    def _check_shardable(self) -> None:
        """Every server must own at least one parameter element (servers hold equal chunks of them)."""
        from .train.models import build_model

        n = sum(p.numel() for p in build_model(self.model, 0).parameters() if p.requires_grad)
        if self.servers > n:
            raise ConfigError(f"{self.servers} servers for {n} parameter elements: some servers would own "
                              f"nothing; use --servers {n} or fewer")

    def _validate_choices(self) -> None:
        for flag, value, allowed in (("--partition", self.partition, PARTITIONS),
                                     ("--consistency", self.consistency, CONSISTENCY),
                                     ("--ps-design", self.ps_design, PS_DESIGNS), ("--net", self.net, NETS)):
            if value not in allowed:
                raise ConfigError(f"{flag} must be one of {', '.join(allowed)}, got {value!r}")
        if self.sync != "ps" and (self.consistency != "bsp" or self.ps_design != "server-optimizer"):
            raise ConfigError(f"--consistency and --ps-design apply to --sync ps only (got --sync {self.sync})")
        if self.ps_design == "aggregate" and self.consistency != "bsp":
            raise ConfigError(f"--ps-design aggregate sums every worker's gradient for a step, so it needs "
                              f"--consistency bsp (got {self.consistency})")
        if self.checkpoint_every < 0:
            raise ConfigError(f"--checkpoint-every must be >= 0, got {self.checkpoint_every}")
        if self.curve is not None and self.sync != "ps":
            raise ConfigError(f"--curve secures the parameter server's sockets: it needs --sync ps (got {self.sync})")
        if self.staleness < 0:
            raise ConfigError(f"--staleness must be >= 0, got {self.staleness}")
        if self.straggler is not None:
            rank, _, factor = self.straggler.partition(":")
            try:
                r, f = int(rank), float(factor)
            except ValueError:
                raise ConfigError(f"--straggler must be RANK:FACTOR, e.g. 1:3, got {self.straggler!r}") from None
            if not (0 <= r < self.workers and f >= 1):
                raise ConfigError(f"--straggler {self.straggler}: rank must be in 0..{self.workers - 1} "
                                  f"and factor >= 1")
        mode, _, ms = self.compute.partition(":")
        if mode not in ("real", "emulated") or (ms and mode != "emulated"):
            raise ConfigError(f"--compute must be real, emulated or emulated:MS, got {self.compute!r}")
        if ms:
            try:
                ok = float(ms) > 0
            except ValueError:
                ok = False
            if not ok:
                raise ConfigError(f"--compute emulated:MS needs a positive number of milliseconds, got {ms!r}")

    def straggler_factor(self, rank: int) -> float:
        if self.straggler is None:
            return 1.0
        r, _, f = self.straggler.partition(":")
        return float(f) if int(r) == rank else 1.0

    # --- serialisation: config.json is the resolved config, and how workers receive it ---------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        d = dict(d)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown config keys: {', '.join(sorted(unknown))}")
        optim = dict(d.get("optim", {}))
        if "betas" in optim:
            optim["betas"] = tuple(optim["betas"])
        d["optim"] = OptimConfig(**optim)
        return cls(**d)

    def save(self, path: Path) -> None:
        """Raises ``fileio.WriteError`` naming the cause (a full disk, ...); an earlier file stays whole."""
        from .fileio import write_atomic

        write_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> TrainConfig:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError, TypeError) as e:
            raise ConfigError(f"cannot read config {path}: {e}") from None
