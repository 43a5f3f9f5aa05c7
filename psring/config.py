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
DATASETS = ("synthetic",)
BACKENDS = ("auto", "gloo", "nccl")


class ConfigError(ValueError):
    """A user-facing configuration problem; the CLI prints it on one line and exits with code 2."""


@dataclass
class OptimConfig:
    """SGD hyper-parameters; the same values drive the workers' optimizer and the PS servers' optimizer."""

    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4

    def validate(self) -> None:
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
    num_samples: int = 10_000
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
    bucket_mb: float = 25.0  # gradient bucket size (allreduce and ps), like DDP's bucket_cap_mb
    first_bucket_mb: float = 1.0  # smaller first bucket, so communication starts early in backward
    overlap: bool = True  # start each bucket's communication during backward
    frame_kb: int = 1024  # ps: pushed tensors are split over ZeroMQ frames of at most this size (0 = no split)
    out: str = "runs/latest"
    ps_addrs: list[str] = field(default_factory=list)  # filled by the launcher, or given for external servers

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
        for name in ("workers", "batch_size", "steps", "num_samples", "log_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not (self.bucket_mb > 0 and self.first_bucket_mb > 0):
            raise ConfigError(f"--bucket-mb and --first-bucket-mb must be > 0, got {self.bucket_mb}, {self.first_bucket_mb}")
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
        elif self.servers != 1:
            raise ConfigError(f"--servers only applies to --sync ps (got --sync {self.sync} --servers {self.servers})")
        if self.global_batch > self.num_samples:
            raise ConfigError(
                f"global batch {self.global_batch} (= --batch-size {self.batch_size} x --workers {self.workers}) "
                f"exceeds the data set's {self.num_samples} samples; lower one or raise --num-samples"
            )
        self.optim.validate()
        return self

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
        d["optim"] = OptimConfig(**d.get("optim", {}))
        return cls(**d)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> TrainConfig:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError, TypeError) as e:
            raise ConfigError(f"cannot read config {path}: {e}") from None
