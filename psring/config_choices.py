"""The choices and sections of ``psring.config``'s options: the values each option may take, declared once
(torch-free, so the launcher, the CLI and the checks read them without importing a strategy)."""
from __future__ import annotations

from . import strategies

MODELS = ("cnn", "resnet18", "resnet18_narrow", "resnet50", "vit_b_16")  # train.models.MODELS (torch-free here)
DATASETS = ("synthetic", "cifar10", "digits")
BACKENDS = ("auto", "gloo", "nccl")
OPTIMIZERS = ("sgd", "adam")
PARTITIONS = ("uniform", "stratified", "random")
CONSISTENCY = ("bsp", "ssp", "asp")
PS_DESIGNS = ("server-optimizer", "aggregate")
PS_ORDERS = ("priority", "planned")  # --ps-order: the pushes' order under credits
NETS = ("loopback", "emulated")
PS_PLACEMENTS = ("dedicated", "colocated", "mixed")
OVERLAPS = strategies.OVERLAPS  # none | backward | full
TUNINGS = ("auto", "probe", "off")  # sync.link_probe.TUNINGS (not imported here: it imports torch)
# --buffers: BatchNorm running statistics and other float buffers across workers (sync/buffer_sync.py);
# auto is the strategy's own (``Strategy.buffers``: DDP broadcasts, the others keep their own)
BUFFERS = ("auto", "local", "broadcast", "average")
DEFAULT_STEPS = 50  # without --steps or --epochs
NUM_CLASSES = 10  # every bundled data set's (train.datasets.NUM_CLASSES)
CIFAR_SIZE, IMAGENET_SIZE = 32, 224  # train.models' default input sides
IMAGENET_MODELS = ("resnet50", "vit_b_16")
# Each built-in model's input side: (a multiple of, at least). train.models.build_model and
# config_checks.check_model both refuse a side with ``side_problem``; the check reads it without building the
# model, so the launcher of a run on a built-in model does not import torch (about 2 s of CPU a run)
MODEL_SIDES = {"cnn": (4, 4), "resnet18": (1, 8), "resnet18_narrow": (1, 8), "resnet50": (1, 32), "vit_b_16": (16, 16)}


def side_problem(model: str, side: int) -> str | None:
    """The one-line refusal of an input of ``side`` pixels for the built-in ``model`` (None: it fits).

    >>> side_problem("vit_b_16", 224), side_problem("vit_b_16", 30)
    (None, '--image-size 30 does not fit --model vit_b_16: it takes a multiple of 16, at least 16')
    """
    k, least = MODEL_SIDES[model]
    if side >= least and side % k == 0:
        return None
    return f"--image-size {side} does not fit --model {model}: it takes a multiple of {k}, at least {least}"

# Every option's section, in the order `psring train --help` shows them. A strategy's ``options`` names
# the sections only it reads (``ps``); an option of such a section is refused off its default elsewhere.
SECTIONS = {"run": "run", "model": "model", "data": "data", "optimizer": "optimizer",
            "buckets": "gradient buckets and overlap", "ps": "parameter server",
            "network": "network (--net emulated)", "compute": "compute", "measurement": "measurement",
            "checkpoints": "checkpoints", "compression": "compression", "experiments": "experiments"}


def owners(section: str) -> tuple[str, ...]:
    """The strategies that read ``section`` (none: every strategy does)."""
    return tuple(n for n in strategies.names() if section in strategies.get(n).options)


def section_titles() -> dict[str, str]:
    """SECTIONS' titles, each strategy-specific one naming its strategies: "parameter server (--sync ps)"."""
    return {k: f"{t} (--sync {' | '.join(owners(k))})" if owners(k) else t for k, t in SECTIONS.items()}
