"""A model of the user's own: ``--model PACKAGE.MODULE:FACTORY`` (uvicorn's ``module:app``), a callable
importable on every worker that returns an ``nn.Module``, called with no arguments after the seed is set
(so every worker builds the same weights); ``--model torchvision:NAME`` where torchvision is installed.
Modules are found on ``sys.path`` and in the current folder (every worker starts in the launcher's; under
torchrun, set PYTHONPATH or install the package on every node).

Every failure (the module does not import, the name is missing, the call raises, the result is no
module) is one ``ValueError`` line naming the factory and the error, raised before any process starts
(``config_checks.check_model`` builds it once on the meta device) and again in a worker if it differs there.
"""
from __future__ import annotations

import importlib
import os
import re
import sys

from torch import nn

SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
TORCHVISION = "torchvision:"


def is_factory(name: str) -> bool:
    """Whether ``name`` names a factory (``module:callable``) rather than a built-in model."""
    return ":" in name


def build_factory(spec: str, num_classes: int | None = None) -> nn.Module:
    """The module ``spec``'s factory returns (``torchvision:NAME``: ``torchvision.models.NAME(weights=None,
    num_classes=...)``)."""
    if not SPEC.fullmatch(spec):
        raise ValueError(f"--model {spec!r}: a factory is PACKAGE.MODULE:FUNCTION, e.g. mypkg.nets:make_model")
    if spec.startswith(TORCHVISION):
        return _torchvision(spec[len(TORCHVISION):], num_classes)
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:  # uvicorn's --app-dir default: a module beside the user's script
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - whatever the user's module raises on import, in one line
        raise ValueError(f"--model {spec}: cannot import {module_name}: {type(e).__name__}: {e}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"--model {spec}: {module_name} has no callable {attr!r}")
    try:
        model = fn()
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"--model {spec}: {attr}() raised {type(e).__name__}: {e}") from None
    if not isinstance(model, nn.Module):
        raise ValueError(f"--model {spec}: {attr}() returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def _torchvision(name: str, num_classes: int | None) -> nn.Module:
    try:
        import torchvision.models as tvm
    except Exception as e:  # noqa: BLE001 - not installed, or an incompatible build (it fails on import)
        raise ValueError(f"--model torchvision:{name}: torchvision does not import here ({type(e).__name__}: "
                         f"{e}); use --model resnet50 / vit_b_16, written in plain torch") from None
    try:
        return tvm.get_model(name, weights=None, **({"num_classes": num_classes} if num_classes else {}))
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"--model torchvision:{name}: {type(e).__name__}: {e}") from None
