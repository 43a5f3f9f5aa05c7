"""The resolved configuration of one training run, shared by the launcher, every worker and the PS servers: one
dataclass, validated in one place; every process sees the same values, a bad one fails once, early, in one line.

Each option is declared once, below (``options.opt``: default, help, section, flag, check); the flags of
``psring train`` and ``psring worker`` are generated from these declarations, one argument group per
section. Sections are declaration metadata only: the attributes stay flat (``cfg.bucket_mb``) and so does
``config.json`` (``optim`` is its one nested table). What depends on the strategy (default bucket,
sections it reads, overlap modes) comes from ``psring.strategies``.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

from . import config_checks as checks
from . import strategies
from .options import ConfigError, above, at_least, check_options, declared, nested, off_default, opt, within
from .config_choices import (  # noqa: F401 - re-exported: psring.config is where callers look
    MODELS, DATASETS, BACKENDS, OPTIMIZERS, PARTITIONS, CONSISTENCY, PS_DESIGNS, PS_ORDERS, NETS, PS_PLACEMENTS,
    OVERLAPS, TUNINGS, BUFFERS, DEFAULT_STEPS, NUM_CLASSES, CIFAR_SIZE, IMAGENET_SIZE, IMAGENET_MODELS,
    SECTIONS, owners, section_titles)


@dataclass
class OptimConfig:
    """Optimizer hyper-parameters; the same values drive the workers' optimizer and the PS servers' one.
    ``momentum`` is SGD's; ``betas`` and ``eps`` are Adam's."""

    lr: float = opt(0.05, "learning rate", section="optimizer", check=above(0))
    momentum: float = opt(0.9, "SGD's momentum", section="optimizer", check=within(0, 1))
    weight_decay: float = opt(5e-4, "L2 weight decay", section="optimizer", check=at_least(0))
    name: str = opt("sgd", "the optimizer", section="optimizer", flag="--optimizer", choices=OPTIMIZERS)
    betas: tuple[float, float] = opt((0.9, 0.999), "Adam's betas", section="optimizer", check=checks.betas,
                                     metavar=("B1", "B2"))
    eps: float = opt(1e-8, "Adam's eps", section="optimizer", check=above(0))

    def validate(self) -> None:
        self.betas = tuple(self.betas)
        check_options(self)


RAN_BEFORE = {"ps_order": "priority"}  # options newer than runs saved without them: what those ran (``from_dict``)

_SYNC_HELP = "how gradients are synchronized: " + "; ".join(f"{n}: {strategies.get(n).help}"
                                                            for n in strategies.names())
_BUCKET_HELP = ("gradient bucket size, MB (default per strategy: " + ", ".join(
    f"{n} {b:g}" if (b := strategies.get(n).bucket_mb) else f"{n} cut to the link measured at start (--link-tuning)"
    for n in strategies.names()) + ")")


def tcp_unknown(name: str) -> str | None:
    """``--link-cc``'s check (``net.tcp.unknown``)."""
    from .net.tcp import unknown  # here, not at the top: psring.net imports this module

    return unknown(name)


@dataclass
class TrainConfig:
    sync: str = opt("allreduce", _SYNC_HELP, section="run", choices=strategies.names())
    workers: int = opt(1, "number of workers N", section="run", short="-n", check=at_least(1))
    servers: int = opt(1, "PS server processes S", section="ps", short="-s", check=at_least(1))
    model: str = opt("cnn", f"the model trained: {', '.join(MODELS)}, or PACKAGE.MODULE:FACTORY (a callable every "
                     "worker imports, returning an nn.Module; torchvision:NAME where torchvision imports)",
                     section="model", check=checks.model_name, metavar="MODEL")
    dataset: str = opt("synthetic", f"the training set: {', '.join(DATASETS)}, folder:DIR (one sub-folder of images "
                       "per class) or npz:FILE (arrays images, labels)", section="data", check=checks.dataset_name,
                       metavar="DATA")
    num_samples: int | None = opt(None, "training samples (default: the whole set; synthetic generates 10,000)",
                                  section="data", check=at_least(1))
    data_dir: str | None = opt(None, "cifar10: folder of the binary files (default $PSRING_DATA or "
                               "~/.cache/psring)", section="data")
    partition: str = opt("uniform", "how the training set is split over workers", section="data",
                         choices=PARTITIONS)
    batch_size: int = opt(32, "per-worker batch size B", section="data", short="-b", check=at_least(1))
    steps: int | None = opt(None, f"training steps (default {DEFAULT_STEPS}, or those of --epochs)",
                            section="run", check=at_least(1))
    seed: int = opt(0, "seed of the weights and of the data", section="run", check=within(0, 2 ** 32))
    augment: bool = opt(False, "random crop + horizontal flip", section="data")
    optim: OptimConfig = nested(OptimConfig)
    threads: int = opt(0, "torch intra-op threads per worker (0 = cores / N)", section="compute",
                       check=at_least(0, " (0 = automatic)"))
    backend: str = opt("auto", "torch.distributed backend of the strategies that use a process group",
                       section="run", choices=BACKENDS)
    timeout_s: float = opt(120.0, "seconds any network wait may take before the run fails", section="run",
                           flag="--timeout", check=above(0))
    log_every: int = opt(10, "a progress line every K steps", section="measurement", check=at_least(1))
    warmup: int = opt(3, "first steps left out of every summary figure", section="measurement",
                      check=at_least(0))
    trace: bool = opt(False, "also write trace.json (open in Perfetto/chrome://tracing)", section="measurement")
    # ps 4 MB, the largest chunk of a server's shard, because a chunk is also the server's pipelining unit
    # (it updates and answers a chunk once all of it arrived): on emulated 1 Gbit links 4 MB cut PS sync
    # time by a third against 25 MB (DDP's bucket_cap_mb, all-reduce's); None: the strategy's bucket_mb
    bucket_mb: float | None = opt(None, _BUCKET_HELP, section="buckets", check=above(0))
    first_bucket_mb: float = opt(1.0, "first all-reduce bucket, MB, so communication starts early in backward",
                                 section="buckets", check=above(0))
    overlap: str = opt("backward", "none: communicate after backward; backward: each bucket once ready; full: "
                       "also during the next forward, each layer waiting for its own parameters", section="buckets",
                       choices=OVERLAPS, aliases=(("--no-overlap", "none"),))
    frame_kb: int = opt(1024, "largest ZeroMQ frame of a push, KB (0 = one per tensor)", section="ps",
                        check=at_least(0, " (0 = one frame per tensor)"))
    ps_window: int | None = opt(None, "most pushpulls unanswered per server (default ceil(4/S) on --net "
                                "emulated, else no limit; 0 = no limit)", section="ps",
                                check=at_least(0, " (0 = no limit)"))
    ps_credit_mb: float | None = opt(None, "MB of pushes not yet received; pushes leave by priority within them from a "
                                     "thread of their own (default: max(2, N/2) chunks on --net emulated, --overlap backward|"
                                     "full, S server links no narrower than N workers'; else 0: FIFO by --ps-window)",
                                     section="ps", check=at_least(0, " (0 = FIFO per server)"))
    ps_order: str = opt("planned", "the pushes' order under credits, whenever a credit frees: planned (where the "
                        "link is known), the ready chunk earliest in the order a link of its rate (full: its acks' pace) "
                        "served the second step's by priority (TicTac's), or priority, the one nearest the input",
                        section="ps", choices=PS_ORDERS)
    # staleness and the consistency/design pair are checked by the servers' own rule (check_semantics)
    consistency: str = opt("bsp", "bulk-synchronous, stale-synchronous (see --staleness) or asynchronous",
                           section="ps", choices=CONSISTENCY)
    staleness: int = opt(2, "SSP's bound k: a worker starting step t waits while the slowest is below t - k",
                         section="ps")
    ps_design: str = opt("server-optimizer", "server-optimizer (servers update) | aggregate (servers sum, "
                         "workers update)", section="ps", choices=PS_DESIGNS)
    curve: str | None = opt(None, "CurveZMQ key folder from `psring keys DIR` (encrypted; servers accept only "
                            "authorized workers)", section="ps", check=checks.curve_keys)
    checkpoint_every: int = opt(0, "write an atomic checkpoint (model, optimizer, PS shards) every K steps "
                                "(0: never)", section="checkpoints", check=at_least(0))
    resume: str | None = opt(None, "continue from the checkpoint in this run folder (or its checkpoint/)",
                             section="checkpoints")
    straggler: str | None = opt(None, "RANK:FACTOR: slow one worker's compute FACTOR times", section="experiments")
    eval: bool = opt(True, "skip the test-set accuracy at the end of every epoch and of the run",
                     section="measurement")
    net: str = opt("loopback", "emulated: every worker and server in its own network namespace behind a "
                   "rate-limited link (root)", section="network", choices=NETS)
    link_rate: str = opt("1gbit", "each host's link, each direction, e.g. 100mbit, 1gbit, 10gbit",
                         section="network", check=checks.link_rate)
    server_link_rate: str | None = opt(None, "PS servers' links, if different", section="network", check=checks.link_rate)
    link_delay: str | None = opt(None, "one-way delay, e.g. 1ms (needs sch_netem)", section="network",
                                 check=checks.link_delay)
    compute: str = opt("real", "real | emulated | emulated:MS: replace forward+backward by a wait "
                       "(emulated: the measured single-worker time)", section="compute", check=checks.compute)
    out: str = opt("runs/latest", "output directory (psring train: default a new runs/DATE-TIME-SYNC-nN, or the "
                   "run folder of --resume; psring worker: %(default)s)", section="run", check=checks.folder)
    ps_addrs: list[str] = opt([], "comma-separated addresses of running `psring server`s (psring train "
                              "starts its own and fills this in)", section="ps", commands=("worker",),
                              metavar="tcp://HOST:PORT,...")
    # compression and the options below last: config.json's earlier keys keep their order
    compress: str = opt("none", "gradient codec: none, fp16, bf16, topk:RATIO, randomk:RATIO, onebit (which "
                        "ones a strategy takes: its registry entry)", section="compression",
                        metavar="CODEC", check=checks.compress_spec)
    error_feedback: bool = opt(True, "drop error feedback (the residual a sparse or 1-bit codec carries to "
                               "the next step)", section="compression")
    ps_placement: str = opt("dedicated", "where PS servers run: dedicated (hosts of their own), colocated (one "
                            "on each worker host: --servers H), mixed (one on each worker host plus "
                            "--servers - H dedicated, loads split by BytePS's optimum)", section="ps",
                            choices=PS_PLACEMENTS)
    workers_per_host: int = opt(0, "workers per host G: they share the host's one link and reach each other "
                                "inside it (0: all on this one host on loopback, one per host with --net "
                                "emulated)", section="run", check=at_least(0, " (0 = automatic)"))
    link_sample_ms: int = opt(20, "read every emulated host link's byte counters every MS ms into links.jsonl "
                              "(the launcher does, not the workers; 0: off)", section="network",
                              check=at_least(0))
    epochs: int | None = opt(None, "train E epochs instead of --steps: E passes over the training set, each "
                             "worker over its partition (E x the steps of an epoch at global batch N x B, "
                             "a last partial batch dropped)", section="run", check=at_least(1), metavar="E")
    link_burst: str = opt("1mb", "tbf's burst of every emulated link (e.g. 128kb where messages are a few MB: a "
                          "1 MB credit refilled during compute carries part of each step faster than the rate)",
                          section="network", check=checks.link_burst)
    link_cc: str = opt("", "TCP congestion control of every emulated host, e.g. cubic or bbr (default: the machine's, "
                       "which new namespaces inherit; summary.json's link_cc says which one ran)", section="network",
                       check=tcp_unknown)
    link_tuning: str = opt("auto", "how partitions, chunks and credits learn the link: auto (the PS fits them to "
                           "--link-rate on --net emulated; otherwise a probe at start where workers span hosts), "
                           "probe (measure even where told: the rate hidden), off (fixed buckets, no credits)",
                           section="buckets", choices=TUNINGS)
    image_size: int | None = opt(None, "input side in pixels, images resized to it (default 224 for resnet50 and "
                                 "vit_b_16, else 32)", section="model", check=at_least(4), metavar="PX")
    num_classes: int | None = opt(None, "classifier outputs (default: the data set's classes)", section="model",
                                  check=at_least(2))
    buffers: str = opt("auto", "BatchNorm running statistics (float buffers) across workers after every step: local "
                       "(each keeps its own, Horovod's way), broadcast (rank 0's, DDP's broadcast_buffers), average "
                       "(the workers' mean); auto: broadcast for ddp, local otherwise", section="model",
                       choices=BUFFERS)

    @property
    def samples(self) -> int:
        """Training samples the run draws from (synthetic: generated; real sets: capped at their size)."""
        return self.num_samples if self.num_samples is not None else 10_000

    @property
    def classes(self) -> int:
        """The classifier's outputs: ``--num-classes``, else the data set's (10 for the bundled ones)."""
        return self.num_classes or checks.data_classes(self.dataset, DATASETS, NUM_CLASSES)

    @property
    def input_size(self) -> int:
        """The input side: ``--image-size``, else the model's default (``train.models.default_image_size``)."""
        if self.image_size:
            return self.image_size
        return IMAGENET_SIZE if self.model in IMAGENET_MODELS else CIFAR_SIZE

    @property
    def resolved_buffers(self) -> str:
        """``--buffers`` resolved: auto is the strategy's own (``Strategy.buffers``)."""
        return strategies.get(self.sync).buffers if self.buffers == "auto" else self.buffers

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.workers

    @property
    def per_host(self) -> int:
        """G, the workers on each host (``--workers-per-host``, resolved; at most N)."""
        g = self.workers_per_host or (1 if self.net == "emulated" else self.workers)
        return min(g, self.workers)

    def __post_init__(self) -> None:
        self.overlap = strategies.overlap_mode(self.overlap)

    @property
    def hosts(self) -> int:
        """H = N / G, the hosts the workers are on."""
        return self.workers // self.per_host

    def resolved_threads(self) -> int:
        if self.threads > 0:
            return self.threads
        return max(1, (os.cpu_count() or 1) // max(1, self.workers))

    def validate(self) -> TrainConfig:
        check_options(self, only=("sync",))
        s = strategies.get(self.sync)
        self._check_sections(s)
        self.optim.betas = tuple(self.optim.betas)
        check_options(self)
        if self.bucket_mb is None:
            self.bucket_mb = s.bucket_mb
        checks.check_overlap(self, s)
        checks.check_buffers(self, s)
        checks.check_sizes(self)
        checks.check_straggler(self)
        checks.check_compress(self)
        for section in s.options:
            SECTION_CHECKS.get(section, lambda cfg: None)(self)
        checks.check_data(self)
        checks.check_model(self)  # after the data's checks: the classifier covers its classes
        checks.resolve_steps(self, DEFAULT_STEPS)  # after the data's checks: --epochs counts its samples
        return self

    def _check_sections(self, s: strategies.Strategy) -> None:
        """An option of a section only other strategies read (``Strategy.options``) stays at its default."""
        for section in SECTIONS:
            if not owners(section) or section in s.options:
                continue
            off = next(off_default(self, section), None)
            if off:
                raise ConfigError(f"{off[0].flag} only applies to --sync {' or '.join(owners(section))} "
                                  f"(got --sync {s.name} {off[0].shown(off[1])})")

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
        for x in declared(cls):  # an option newer than the run, where its strategy reads it: what the run ran with
            if x.name in RAN_BEFORE and x.name not in d and d.get("sync") in owners(x.option.section):
                d[x.name] = RAN_BEFORE[x.name]
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


# the checks of a strategy-specific section, run when the strategy reads it (``Strategy.options``)
SECTION_CHECKS = {"ps": checks.check_ps}
