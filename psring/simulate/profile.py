"""When backward makes each gradient (``--readiness``, ``psring simulate`` only).

* ``bytes`` (the default): in proportion to the parameters' sizes, as ``train.emulation`` makes them, so that a
  replay of an emulated run times what the run did.
* ``flops``: in proportion to the multiply-adds of the layer each parameter belongs to (a convolution's
  output elements x its input channels per group x its kernel; a linear layer's output elements x its inputs),
  counted once by a forward at ``cfg``'s input size on the meta device; a parameter of a layer without them
  (a bias, a norm's scale and shift) costs nothing: ready once what backward reached before it is done.
  Forward's per-parameter shares follow the same counts (``--overlap full``). This is how a real backward spends its time, to first order: where a
  model's bytes and its compute sit apart (VGG-16: 89% of the bytes in the fully connected layers, which
  backward reaches first, in about 1% of its multiply-adds) the two readinesses give very different overlap.
"""
from __future__ import annotations

READINESS = ("bytes", "flops")
NO_JITTER = "none"  # ``--jitter``'s default: every worker's compute the same each step (``run.parse_jitter``)


def check_readiness(readiness: str) -> str:
    from ..config import ConfigError

    if readiness not in READINESS:
        raise ConfigError(f"--readiness {readiness!r}: one of {', '.join(READINESS)}")
    return readiness


def param_weights(cfg, readiness: str) -> dict[str, float] | None:
    """Each trainable parameter's share of compute by name (``flops``), or None (``bytes``: by size). One-line
    ``ConfigError`` for a model with a weight matrix outside the layers counted (attention's projections)."""
    if check_readiness(readiness) == "bytes":
        return None
    import torch
    from torch import nn

    from ..config import ConfigError
    from ..train.models import model_of, shapes_only

    macs: dict[int, float] = {}

    def count(mod, _inputs, out):
        per_out = mod.in_features if isinstance(mod, nn.Linear) else \
            mod.in_channels // mod.groups * mod.kernel_size[0] * mod.kernel_size[1]
        macs[id(mod)] = macs.get(id(mod), 0.0) + float(out.numel()) * per_out

    with shapes_only():
        model = model_of(cfg).eval()  # (a norm over a batch of one is fine in eval mode)
    with torch.device("meta"):
        layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
        hooks = [m.register_forward_hook(count) for m in layers]
        try:
            model(torch.empty(1, 3, cfg.input_size, cfg.input_size))
        except Exception as e:  # noqa: BLE001 - whatever a user's model does with shapes alone, in one line
            raise ConfigError(f"--readiness flops runs {cfg.model}'s forward on the meta device (shapes only) to "
                              f"count its multiply-adds, and it failed ({type(e).__name__}: {str(e)[:80]}); use "
                              f"--readiness bytes") from None
        finally:
            for h in hooks:
                h.remove()
    owner = {id(p): m for m in layers for p in m.parameters(recurse=False)}
    weights = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        m = owner.get(id(p))
        if m is None and p.dim() >= 2:
            raise ConfigError(f"--readiness flops counts convolutions and linear layers; {cfg.model}'s {name} "
                              f"is a weight matrix of neither: use --readiness bytes")
        weights[name] = macs.get(id(m), 0.0) if m is not None and p is m.weight else 0.0
    if not sum(weights.values()):
        raise ConfigError(f"--readiness flops found no multiply-adds in {cfg.model}: use --readiness bytes")
    return weights
