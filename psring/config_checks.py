"""The checks of ``config.py``'s options that need more than a bound: each returns None when the value is
fine, else the rest of a one-line message (``options.Option.check``), or raises ``ConfigError`` for the
checks that read several options at once (``check_ps``, ``check_compress``)."""
from __future__ import annotations

import math

from .link_checks import link_burst, link_delay, link_rate  # noqa: F401 - config.py's checks
from .options import ConfigError


def betas(v) -> str | None:
    ok = len(v) == 2 and all(0 <= b < 1 for b in v)
    return None if ok else f"must be two numbers in [0, 1), got {tuple(v)}"


def curve_keys(folder: str) -> str | None:
    from .auth import AuthError, check_dir

    try:
        check_dir(folder, "server")
        check_dir(folder, "worker")
    except AuthError as e:
        return f"{folder}: {e}"
    return None


def compute(v: str) -> str | None:
    mode, _, ms = v.partition(":")
    if mode not in ("real", "emulated") or (ms and mode != "emulated"):
        return f"must be real, emulated or emulated:MS, got {v!r}"
    try:
        ok = not ms or 0 < float(ms) < math.inf  # (inf: every worker's sleep fails, OverflowError)
    except ValueError:
        ok = False
    return None if ok else f"emulated:MS needs a finite positive number of milliseconds, got {ms!r}"


def model_name(v: str) -> str | None:
    """A built-in model or a factory's shape (``module:callable``); that it builds is ``check_model``'s."""
    from .config import MODELS

    if v in MODELS or ":" in v:
        return None
    return f"must be one of {', '.join(MODELS)}, or PACKAGE.MODULE:FACTORY, got {v!r}"


def dataset_name(v: str) -> str | None:
    """A bundled data set, ``folder:DIR`` or ``npz:FILE`` (that it loads is ``check_available``'s)."""
    from .config import DATASETS

    if v in DATASETS or (v.startswith(("folder:", "npz:")) and v.partition(":")[2]):
        return None
    return f"must be one of {', '.join(DATASETS)}, folder:DIR or npz:FILE, got {v!r}"


def check_model(cfg) -> None:
    """The model builds for the run's classes and input size (a factory imports and returns a module), on
    the meta device: shapes only, no memory; and the classifier covers the data set's classes. A built-in
    model builds at any input side ``config_choices.side_problem`` lets through, so it is not built here:
    the launcher of a run on one does not import torch (``tests/test_models.py`` holds the two equal)."""
    from .config_choices import MODELS, side_problem
    from .train.datasets import dataset_classes

    data = dataset_classes(cfg.dataset) if cfg.num_classes is not None else 0
    if cfg.num_classes is not None and cfg.num_classes < data:
        raise ConfigError(f"--num-classes {cfg.num_classes} is below the data set's {data} classes: "
                          f"its labels would fall outside the classifier")
    if cfg.model in MODELS:
        if refusal := side_problem(cfg.model, cfg.input_size):
            raise ConfigError(refusal)
        return
    from .train.models import model_of, shapes_only

    try:
        with shapes_only():
            model_of(cfg, seed=0)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def compress_spec(v: str) -> str | None:
    """The spec parses (``compress.spec.check_spec``, torch-free); which strategy takes it is ``check_compress``'s."""
    from .compress.spec import check_spec

    try:
        check_spec(v)
    except ValueError as e:
        return str(e)
    return None


def check_compress(cfg) -> None:
    """The codec's name is one the strategy takes (``Strategy.codecs``)."""
    from . import strategies
    from .compress.spec import NONE, POWERSGD

    name = cfg.compress.partition(":")[0]
    takes = strategies.get(cfg.sync).codecs
    if name != NONE and name not in takes:
        offer = f"takes {', '.join(takes)} or none" if takes else "takes no codec (only none)"
        raise ConfigError(f"--compress {cfg.compress}: --sync {cfg.sync} {offer}")
    # ddp's PowerSGD is torch's hook, whose state cannot be restored exactly; the reducers' own
    # (sync/powersgd.py) checkpoints its state. Refused here, before anything starts, not at step K.
    if name == POWERSGD and strategies.get(cfg.sync).reducer is None and (cfg.checkpoint_every or cfg.resume):
        raise ConfigError(f"--compress {cfg.compress}: checkpoints are not supported (torch's PowerSGD state "
                          f"cannot be restored exactly); drop --checkpoint-every/--resume, use fp16/bf16, or "
                          f"--sync allreduce (its own PowerSGD checkpoints)")


def check_placement(cfg) -> None:
    """``--ps-placement``: colocated is one server on each of the H worker hosts; mixed adds k = S - H
    dedicated ones, 0 < k < H (from k = H on, BytePS's optimum gives the colocated ones nothing)."""
    h = cfg.hosts
    if cfg.ps_placement == "colocated" and cfg.servers != h:
        raise ConfigError(f"--ps-placement colocated runs one server on each of the {h} worker hosts: "
                          f"use --servers {h} (got {cfg.servers})")
    if cfg.ps_placement == "mixed" and h < 2:
        raise ConfigError(f"--ps-placement mixed needs at least 2 worker hosts (here {h}: --net emulated, "
                          f"--workers-per-host); on one host use --ps-placement dedicated or colocated")
    if cfg.ps_placement == "mixed" and not h < cfg.servers < 2 * h:
        raise ConfigError(f"--ps-placement mixed runs one server on each of the {h} worker hosts plus k "
                          f"dedicated ones, 1 <= k < {h}: use --servers {h + 1} to {2 * h - 1} "
                          f"(got {cfg.servers}); with k >= {h} use --ps-placement dedicated")


def check_overlap(cfg, s) -> None:
    """``--overlap MODE`` where strategy ``s`` honours it; ``full`` with BSP only: its forward waits for
    the parameters of the step just sent, which SSP/ASP replies need not be."""
    from . import strategies

    if cfg.overlap not in s.overlaps:
        alt = [n for n in strategies.where(cost_model=s.cost_model) if cfg.overlap in strategies.get(n).overlaps]
        alt = alt or [n for n in strategies.names() if cfg.overlap in strategies.get(n).overlaps]
        raise ConfigError(f"--overlap {cfg.overlap}: --sync {s.name} ({s.help}) runs only --overlap "
                          f"{' | '.join(s.overlaps)}; use --sync {alt[0]} --overlap {cfg.overlap}")
    if cfg.overlap == "full" and s.servers and cfg.consistency != "bsp":
        raise ConfigError(f"--overlap full needs --consistency bsp (got {cfg.consistency}): the next forward "
                          f"waits for this step's parameters, which SSP/ASP do not promise; use --overlap backward")


def check_buffers(cfg, s) -> None:
    """``--buffers broadcast|average`` needs a strategy that communicates (not the baseline's independent workers)."""
    if cfg.buffers in ("broadcast", "average") and s.baseline and cfg.workers > 1:
        raise ConfigError(f"--buffers {cfg.buffers}: --sync {s.name} workers communicate nothing; use --buffers "
                          "local, or a strategy that synchronizes")


def check_ps(cfg) -> None:
    """The servers' own rules, here before anything starts: the design/consistency/staleness combination
    (``consistency.check_semantics``, which every server applies to its init) and the shard plan
    (``sharding.plan_chunks``: every server owns at least one parameter element), of ``param_spaces``."""
    from .sync.ps.consistency import check_semantics
    from .sync.ps.sharding import plan_chunks, waits_for_round
    from .topology import server_shares

    check_placement(cfg)
    if cfg.ps_window and waits_for_round(cfg.consistency, cfg.staleness):
        raise ConfigError(f"--ps-window {cfg.ps_window} with --consistency ssp --staleness 0 would deadlock (a "
                          f"reply waits for every worker's whole round); leave --ps-window unset or use 0")
    try:
        check_semantics(cfg.ps_design, cfg.consistency, cfg.staleness)
        plan_chunks(*param_spaces(cfg), cfg.servers, int(cfg.bucket_mb * 2**20),
                    shares=server_shares(cfg.ps_placement, cfg.hosts, cfg.servers))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def param_spaces(cfg) -> tuple[list[list[int]], list[int]]:
    """The model's parameters as the shard plan reads them (``buckets.space_sizes``). A built-in model at the
    settings of ``resources.MODEL_BYTES`` (float32, 10 classes, its default size) is one space of that many
    elements: the plan's checks read only each space's total, and a PS launch then does not import torch (3-4 s
    of CPU); any other is built on the meta device: shapes only, no memory."""
    from .launch.resources import MODEL_BYTES

    if cfg.model in MODEL_BYTES and cfg.classes == 10 and not cfg.image_size:
        return [[MODEL_BYTES[cfg.model] // 4]], [4]
    from .sync.buckets import flat_layout, space_sizes
    from .train.models import model_of, shapes_only

    with shapes_only():
        model = model_of(cfg, seed=0)
    return space_sizes(flat_layout(model.named_parameters()))


def train_size(cfg) -> int:
    """How many samples ``datasets.build_dataset`` gives the workers to train on, counted without
    generating or reading them where it can (synthetic: the number asked; cifar10: its files' records)."""
    from .train import datasets

    if cfg.dataset == "synthetic":
        return cfg.samples
    if cfg.dataset == "cifar10":
        folder = datasets.cifar10_dir(cfg.data_dir)
        size = sum((folder / f).stat().st_size for f in datasets.CIFAR10_FILES["train"])
        n = size // datasets.CIFAR10_RECORD  # whole records each (check_available)
    else:
        n = len(datasets.build_dataset(cfg.dataset, None, cfg.seed, cfg.data_dir))
    return n if cfg.num_samples is None else min(n, cfg.num_samples)


def epoch_steps(cfg) -> list[int]:
    """The steps of each of ``cfg.epochs`` epochs, as the workers' ``ShardedBatches`` cut them (BSP: the
    smallest partition's whole batches of B, so N x B samples a step; a last partial batch is dropped)."""
    from .train.partition import epoch_steps as steps

    try:
        return steps(cfg.partition, train_size(cfg), cfg.workers, cfg.batch_size, cfg.seed, cfg.epochs)
    except ValueError as e:  # a global batch larger than the data set
        raise ConfigError(f"--epochs {cfg.epochs}: {e}") from None


def resolve_steps(cfg, default: int) -> None:
    """``cfg.steps``: those of ``--epochs E`` (``epoch_steps``' sum), else ``--steps``, else ``default``.
    Both given must agree: config.json holds both once resolved, and every worker validates it again
    (under torchrun each rank resolves them itself, the same way); otherwise a one-line error."""
    if cfg.epochs is None:
        cfg.steps = default if cfg.steps is None else cfg.steps
        return
    steps = sum(epoch_steps(cfg))
    if cfg.steps is not None and cfg.steps != steps:
        raise ConfigError(f"--steps {cfg.steps} and --epochs {cfg.epochs} (= {steps} steps) disagree: "
                          f"give one of them")
    cfg.steps = steps


def epochs_line(cfg) -> str:
    """What ``--epochs`` became, for the terminal: ``psring: 3 epochs = 234 steps (10,000 samples, 4
    workers x batch 32: 78 steps an epoch, 16 samples an epoch left out)``."""
    per = epoch_steps(cfg)
    n, gb = train_size(cfg), cfg.global_batch
    each = f"{per[0]:,} steps an epoch" if min(per) == max(per) else \
        f"{min(per):,}-{max(per):,} steps an epoch, {cfg.partition} partition"
    left = n - min(per) * gb if min(per) == max(per) else None
    dropped = f", {left:,} samples an epoch left out" if left else ""
    return (f"psring: {cfg.epochs} epoch{'s' * (cfg.epochs != 1)} = {cfg.steps:,} steps ({n:,} samples, "
            f"{cfg.workers} worker{'s' * (cfg.workers != 1)} x batch {cfg.batch_size}: {each}{dropped})")


def check_straggler(cfg) -> None:
    """``--straggler RANK:FACTOR``: a rank of this run and a factor of at least 1."""
    if cfg.straggler is None:
        return
    rank, _, factor = cfg.straggler.partition(":")
    try:
        r, f = int(rank), float(factor)
    except ValueError:
        raise ConfigError(f"--straggler must be RANK:FACTOR, e.g. 1:3, got {cfg.straggler!r}") from None
    if not (0 <= r < cfg.workers and 1 <= f < math.inf):
        raise ConfigError(f"--straggler {cfg.straggler}: rank must be in 0..{cfg.workers - 1} and factor a finite "
                          f"number >= 1")


def check_data(cfg) -> None:
    """A data set other than the generated one exists and reads (a folder's classes, an npz's arrays)."""
    if cfg.dataset == "synthetic":
        return
    from .train.datasets import check_available

    try:
        check_available(cfg.dataset, cfg.data_dir)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_sizes(cfg) -> None:
    """The global batch fits the generated set, and every host runs the same number of workers."""
    if cfg.dataset == "synthetic" and cfg.global_batch > cfg.samples:
        raise ConfigError(
            f"global batch {cfg.global_batch} (= --batch-size {cfg.batch_size} x --workers {cfg.workers}) "
            f"exceeds the data set's {cfg.samples} samples; lower one or raise --num-samples")
    if cfg.workers % cfg.per_host:
        raise ConfigError(f"--workers {cfg.workers} is not a multiple of --workers-per-host {cfg.per_host}: "
                          f"every host runs the same number of workers (as torchrun's --nproc-per-node)")


def data_classes(dataset: str, bundled: tuple, bundled_classes: int) -> int:
    """A data set's classes: the bundled sets' count, else a folder's sub-folders or an npz's labels."""
    if dataset in bundled:
        return bundled_classes
    from .train.datasets import dataset_classes

    return dataset_classes(dataset)


def folder(path: str) -> str | None:
    """An output folder's name: not empty (``--out ''`` would write the run into the working directory)."""
    return None if path.strip() else "is empty: give a folder"
