"""The servers' optimizers (``--ps-design server-optimizer``): torch's fused kernels run on a shard.

Both are the kernels ``base.make_local_optimizer`` gives the workers (``torch.optim.SGD(fused=True)``,
``torch.optim.Adam(fused=True)``), called through torch's functional API on the shard's own tensors and
state, so a server's update is bit for bit what the same optimizer computes on a worker (tested).

An update is a list of ``(key, element offset, parameter region, gradient region)``, the regions 1-D.
SGD is elementwise with elementwise state (the momentum buffer), so it can update any region of a key:
a gradient that arrived in several frames is applied frame by frame, straight from the wire. Adam keeps
a per-tensor step count, so it updates whole keys only (``whole = True``: the store joins a split
gradient first).

Every region reaches torch's kernel as whole 64-byte blocks (``lane_blocks``), so an element's update
does not depend on where chunks and frames cut its parameter: the same bits on any S, chunk size or
frame split (issue #25; ``tests/test_chunking_invariance.py``).

State (``state_tensors`` / ``load_state``, for checkpoints): named ``KIND/KEY`` with torch's names for
the kinds (``momentum_buffer``; ``exp_avg``, ``exp_avg_sq``, ``step``), each in its parameter's shape
(``step``: a float32 scalar), so a shard restored from them continues bit for bit.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.optim.adam import adam
from torch.optim.sgd import sgd

from ...config import OptimConfig
from .protocol import ProtocolError
from .received import received

OPTIM_FIELDS = ("name", "lr", "momentum", "weight_decay", "betas", "eps")


def optim_header(cfg: OptimConfig) -> dict:
    """The ``optim`` field of an init request: every hyper-parameter the servers' optimizer needs."""
    return {"name": cfg.name, "lr": cfg.lr, "momentum": cfg.momentum, "weight_decay": cfg.weight_decay,
            "betas": list(cfg.betas), "eps": cfg.eps}


def parse_optim(optim) -> OptimConfig:
    """An init's ``optim`` map -> a validated ``OptimConfig`` (absent fields take their defaults), or a
    ``ProtocolError`` naming what is wrong (unknown field, unknown optimizer, value out of range)."""
    if not isinstance(optim, dict):
        raise ProtocolError(f"bad optimizer settings in init: expected a map, got {type(optim).__name__}")
    unknown = sorted(set(optim) - set(OPTIM_FIELDS))
    if unknown:
        raise ProtocolError(f"bad optimizer settings in init: unknown field {unknown[0]!r}")
    try:
        cfg = OptimConfig(**optim)
        for name in ("lr", "momentum", "weight_decay", "eps"):
            value = getattr(cfg, name)
            if type(value) not in (int, float):
                raise TypeError(f"{name} must be a number, got {value!r:.40}")
            setattr(cfg, name, float(value))
        if not (isinstance(cfg.betas, (list, tuple)) and all(type(b) in (int, float) for b in cfg.betas)):
            raise TypeError(f"betas must be two numbers, got {cfg.betas!r:.40}")
        cfg.betas = tuple(float(b) for b in cfg.betas)
        if not isinstance(cfg.name, str):
            raise TypeError(f"name must be a string, got {cfg.name!r:.40}")
        cfg.validate()
    except (TypeError, ValueError) as e:  # ConfigError is a ValueError: all the peer's fault
        raise ProtocolError(f"bad optimizer settings in init: {e}") from None
    return cfg


def state_kinds(cfg: OptimConfig | None) -> tuple[str, ...]:
    """The optimizer state kinds each key has (``cfg`` None: no optimizer here, design aggregate)."""
    if cfg is None or (cfg.name == "sgd" and not cfg.momentum):
        return ()
    return ("momentum_buffer",) if cfg.name == "sgd" else ("exp_avg", "exp_avg_sq", "step")


def check_opt_state(kinds: tuple[str, ...], params: dict[str, torch.Tensor], named: list) -> dict:
    """An init's ``opt_state`` -> ``{(kind, key): Received}``: nothing at all (fresh state), or
    exactly one tensor of every kind for every key, each of the right dtype and shape; else a
    ``ProtocolError`` (checked before the shard changes)."""
    out: dict[tuple[str, str], object] = {}
    for name, t in named:
        kind, sep, key = name.partition("/")
        if not sep or kind not in kinds:
            raise ProtocolError(f"init: optimizer state {name!r:.80} is not KIND/KEY with KIND one of "
                                f"{', '.join(kinds) or '(none: this optimizer keeps no state)'}")
        p = params.get(key)
        if p is None:
            raise ProtocolError(f"init: optimizer state {name!r:.80} for a key the init does not carry")
        if (kind, key) in out:
            raise ProtocolError(f"init: optimizer state {name!r:.80} twice")
        shape, dtype = (torch.Size(()), torch.float32) if kind == "step" else (p.shape, p.dtype)
        if t.shape != shape or t.dtype != dtype:
            raise ProtocolError(f"init: optimizer state {name!r:.80} is {t.dtype} {tuple(t.shape)}, "
                                f"expected {dtype} {tuple(shape)}")
        out[(kind, key)] = received(t)
    if out and len(out) != len(kinds) * len(params):
        kind, key = next((k, p) for p in params for k in kinds if (k, p) not in out)
        raise ProtocolError(f"init: optimizer state incomplete: no {kind}/{key}")
    return out


def _load(dst: torch.Tensor, src) -> None:
    src.copy_into(dst)


# torch's fused CPU optimizers run a vectorised body over each tensor they are given and a scalar loop
# over its last numel % (vector width) elements, and the two round differently (the body uses FMA):
# 1 ulp apart on AVX2 and AVX-512, equal only with ATEN_CPU_CAPABILITY=default. Which elements fall in a
# tail would then depend on where chunk and frame boundaries cut a parameter, and so would the last bit
# of a resumed run on another S (issue #25). 64 bytes is a multiple of every vector width torch uses,
# and its kernels split work between threads at 64-byte units.
LANE_BYTES = 64


def lane_blocks(ts: tuple, written: tuple[int, ...], back: list) -> list[tuple]:
    """``ts``: one region's 1-D tensors of one length (parameter, gradient, state; None where a state is
    absent). Returns it as regions of whole 64-byte blocks for the fused kernel: the body in place, a
    tail as a zero-padded block of its own (so it takes the vectorised path too), and appends to
    ``back`` the ``(destination, padded)`` pairs of the ``written`` tensors' tails, for ``copy_back``
    after the kernel ran. Zero padding is harmless: SGD and Adam map zeros to finite values, dropped."""
    n = ts[0].numel()
    block = max(1, LANE_BYTES // ts[0].element_size())
    tail = n % block
    if tail == 0:
        return [ts]
    body = n - tail
    padded = tuple(None if t is None else F.pad(t[body:], (0, block - tail)) for t in ts)
    back += [(ts[i][body:], padded[i]) for i in written if ts[i] is not None]
    return ([tuple(None if t is None else t[:body] for t in ts)] if body else []) + [padded]


def copy_back(back: list[tuple]) -> None:
    for dst, padded in back:
        dst.copy_(padded[:dst.numel()])


class ServerSGD:
    """SGD with momentum and weight decay (dampening 0, no Nesterov), in place, one fused call per update."""

    whole = False

    def __init__(self, cfg: OptimConfig, params: dict[str, torch.Tensor]):
        self.cfg = cfg
        # momentum buffers start at zero rather than as a copy of the first gradient: 0.9 * 0 + g is g
        self.bufs = {k: torch.zeros_like(p).view(-1) for k, p in params.items()} if cfg.momentum else {}
        self.shapes = {k: p.shape for k, p in params.items()}

    def state_tensors(self) -> list[tuple[str, torch.Tensor]]:
        return [(f"momentum_buffer/{k}", b.view(self.shapes[k]).clone()) for k, b in self.bufs.items()]

    def load_state(self, state: dict) -> None:
        for (_, key), t in state.items():
            _load(self.bufs[key], t)

    def step(self, ready: list[tuple]) -> None:
        cfg, bufs = self.cfg, self.bufs
        params = [r[2] for r in ready]
        grads = [r[3] for r in ready]
        if bufs:  # a region's slice of the key's buffer (no slicing for whole keys: views cost microseconds)
            moms = [b if o == 0 and g.numel() == b.numel() else b[o:o + g.numel()]
                    for k, o, _, g in ready for b in (bufs[k],)]
        else:
            moms = [None] * len(ready)
        back: list = []
        blocks = [b for r in zip(params, grads, moms) for b in lane_blocks(r, (0, 2), back)]
        params, grads, moms = (list(c) for c in zip(*blocks))
        sgd(params, grads, moms, fused=True, weight_decay=cfg.weight_decay, momentum=cfg.momentum, lr=cfg.lr,
            dampening=0.0, nesterov=False, maximize=False)
        copy_back(back)


class ServerAdam:
    """Adam (L2 weight decay as torch.optim.Adam, no AMSGrad), in place, one fused call per update."""

    whole = True

    def __init__(self, cfg: OptimConfig, params: dict[str, torch.Tensor]):
        self.cfg = cfg
        self.exp_avg = {k: torch.zeros_like(p).view(-1) for k, p in params.items()}
        self.exp_avg_sq = {k: torch.zeros_like(p).view(-1) for k, p in params.items()}
        # torch keeps fused Adam's step count as a float32 tensor on the parameter's device
        self.steps = {k: torch.zeros((), dtype=torch.float32, device=p.device) for k, p in params.items()}
        self.shapes = {k: p.shape for k, p in params.items()}

    def state_tensors(self) -> list[tuple[str, torch.Tensor]]:
        return [(f"{kind}/{k}", t.view(self.shapes[k] if kind != "step" else ()).clone())
                for kind, d in (("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq), ("step", self.steps))
                for k, t in d.items()]

    def load_state(self, state: dict) -> None:
        for (kind, key), t in state.items():
            _load({"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq, "step": self.steps}[kind][key], t)

    def step(self, ready: list[tuple]) -> None:
        cfg = self.cfg
        keys = [r[0] for r in ready]
        if len(set(keys)) != len(keys) or any(r[1] != 0 or r[2].numel() != self.exp_avg[r[0]].numel()
                                              for r in ready):
            raise ValueError("Adam updates whole keys, each at most once per call")
        blocks, steps, back = [], [], []
        for k, _, p, g in ready:  # a key's step count once, copies for its padded tail (the kernel adds 1 to each)
            mine = lane_blocks((p, g, self.exp_avg[k], self.exp_avg_sq[k]), (0, 2, 3), back)
            steps += [self.steps[k]] + [self.steps[k].clone() for _ in mine[1:]]
            blocks += mine
        p, g, m, v = (list(c) for c in zip(*blocks))
        adam(p, g, m, v, [], steps, fused=True, amsgrad=False, beta1=cfg.betas[0], beta2=cfg.betas[1],
             lr=cfg.lr, weight_decay=cfg.weight_decay, eps=cfg.eps, maximize=False)
        copy_back(back)


def make_server_optimizer(cfg: OptimConfig, params: dict[str, torch.Tensor]):
    if cfg.name == "sgd":
        return ServerSGD(cfg, params)
    if cfg.name == "adam":
        return ServerAdam(cfg, params)
    raise ProtocolError(f"unknown optimizer {cfg.name!r}")
