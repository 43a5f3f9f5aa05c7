"""The image classifiers, written in plain torch (no torchvision), and ``build_model``, their registry.

CIFAR-sized (default input 32x32):

- ``cnn``: a small CNN *without* BatchNorm. Its gradient on a global batch is exactly the mean of the
  per-worker gradients, so it is the model of the equivalence tests.
- ``resnet18``: ResNet-18, CIFAR variant (3x3 stem, no max-pool; He et al. 2016), 11,173,962 parameters.
  ``resnet18_narrow``: the same with half the channels (width 32, 2.8 M parameters), for CPU benchmarks.
  BatchNorm statistics are per worker (as with DDP's default broadcast they would come from rank 0), so
  data-parallel training of it is not bit-equivalent to one process; use it for speed, not equivalence.

ImageNet-class (default input 224x224, torchvision's parameter counts at 1,000 classes, tested):
``resnet50`` (``resnet.py``) and ``vit_b_16`` (``vit.py``). And any model of the user's own:
``PACKAGE.MODULE:FACTORY`` or ``torchvision:NAME`` (``factory.py``).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config_choices import CIFAR_SIZE, IMAGENET_SIZE, NUM_CLASSES, side_problem


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int = NUM_CLASSES, image_size: int = 32):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * (image_size // 4) ** 2, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = NUM_CLASSES, width: int = 64):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        layers, c_in = [], width
        for i, stride in enumerate((1, 2, 2, 2)):
            c_out = width * 2**i
            layers += [BasicBlock(c_in, c_out, stride), BasicBlock(c_out, c_out, 1)]
            c_in = c_out
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


@dataclass(frozen=True)
class ModelEntry:
    build: Callable[[int, int], nn.Module]  # (num_classes, image_size) -> the model
    image_size: int  # the default input side


def _vit(num_classes: int, image_size: int) -> nn.Module:
    from .vit import ViT

    return ViT(image_size, num_classes)


def _resnet50(num_classes: int, image_size: int) -> nn.Module:
    from .resnet import ResNet50

    return ResNet50(num_classes)


MODELS: dict[str, ModelEntry] = {
    "cnn": ModelEntry(lambda c, s: SmallCNN(c, s), CIFAR_SIZE),
    "resnet18": ModelEntry(lambda c, s: ResNet18(c), CIFAR_SIZE),
    "resnet18_narrow": ModelEntry(lambda c, s: ResNet18(c, width=32), CIFAR_SIZE),
    "resnet50": ModelEntry(_resnet50, IMAGENET_SIZE),
    "vit_b_16": ModelEntry(_vit, IMAGENET_SIZE),
}


def default_image_size(name: str) -> int:
    """The input side ``name`` takes by default: 224 for the ImageNet-class models, else 32 (a factory's
    too: the bundled data sets' own size; ``--image-size`` sets another)."""
    return MODELS[name].image_size if name in MODELS else CIFAR_SIZE


def build_model(name: str, seed: int, num_classes: int = NUM_CLASSES, image_size: int | None = None) -> nn.Module:
    """The model ``name`` (a built-in one or a factory) for ``num_classes`` classes and square inputs of
    ``image_size`` pixels (default ``default_image_size``), with weights initialised from ``seed``
    (identical on every worker). A bad name or size is one ValueError line."""
    from .factory import build_factory, is_factory

    size = image_size or default_image_size(name)
    if not is_factory(name):
        if name not in MODELS:
            raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}, or PACKAGE.MODULE:FACTORY")
        if refusal := side_problem(name, size):  # (config_choices.MODEL_SIDES: which sides each model takes)
            raise ValueError(refusal)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if is_factory(name):
            return build_factory(name, num_classes)
        return MODELS[name].build(num_classes, size)


def model_of(cfg, seed: int | None = None) -> nn.Module:
    """``cfg``'s model (``cfg.model``, ``cfg.classes``, ``cfg.input_size``), seeded with ``seed`` (default
    ``cfg.seed``); under ``torch.device("meta")`` shapes only. A trainable parameter that is not float32 is
    a one-line ValueError (``check_float32``)."""
    model = build_model(cfg.model, cfg.seed if seed is None else seed, cfg.classes, cfg.input_size)
    check_float32(model)
    return model


# In-place initialisers a model's constructor runs on its parameters. On the meta device they have nothing to fill,
# and torch's meta kernel of normal_ (torch._refs, wrapped in torch._compile._disable_dynamo) imports torch._dynamo at
# its first call: 2-3 s of CPU in a process that builds no optimizer (the launcher; a PS worker or server).
RANDOM_INITS = frozenset({"normal_", "uniform_", "random_", "bernoulli_", "exponential_", "geometric_", "log_normal_",
                          "cauchy_"})


class _MetaInitSkipped(torch.overrides.TorchFunctionMode):
    """Leaves a meta tensor's ``torch.nn.init`` calls and random in-place fills undone (it has no values)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        target = args[0] if args else (kwargs or {}).get("tensor")
        if (isinstance(target, torch.Tensor) and target.is_meta
                and (getattr(func, "__module__", None) == "torch.nn.init"
                     or getattr(func, "__name__", "") in RANDOM_INITS)):
            return target
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def shapes_only():
    """Models built inside are on the meta device, their initialisation skipped: parameters' names, shapes and
    dtypes only (what the launcher's checks count), no memory, no values."""
    with torch.device("meta"), _MetaInitSkipped():
        yield


def check_float32(model: nn.Module) -> None:
    """psring trains float32 parameters: torch's fused CPU SGD (the workers' update) leaves bf16 weight
    matrices unchanged (torch 2.13: a bf16 nn.Linear's weight did not move at lr 0.5, its bias did), and
    the PS's servers update in the parameters' dtype with that kernel too. Refused, naming a parameter."""
    low = next(((n, p.dtype) for n, p in model.named_parameters()
                if p.requires_grad and p.dtype != torch.float32), None)
    if low is not None:
        raise ValueError(f"parameter {low[0]!r} is {str(low[1]).removeprefix('torch.')}: psring trains float32 "
                         f"parameters (torch's fused CPU optimizer leaves bf16 ones unchanged); keep the model "
                         f"in float32 and use --compress bf16 to send bf16 gradients")
