"""A server's shard: its parameters, their optimizer state, and the rules of its consistency model.

Pure torch, no sockets, so the rules are testable on their own (see ``consistency`` for BSP/SSP/ASP and
the staleness records). BSP rule: gradients for step t are accepted only while the shard is at version t
(t updates applied); each key is aggregated as soon as all N workers' gradients for it arrived (the sum
is accumulated in place, on arrival) and the shard's version becomes t+1 when every key was done.
ASP/SSP: each worker's push is applied on arrival, as is; the version is the slowest worker's clock.
A rejected push changes nothing.

Designs: ``server-optimizer`` updates the parameters here (fused SGD or Adam, ``optimizers``) and
answers with their new values; ``aggregate`` (BSP only) keeps the initial parameters, only sums the
gradients and answers with the sum: the workers' local optimizer divides it by N as it reads it, exactly
as after an all-reduce. The sums are double-buffered by step parity: a reply may still be leaving when
the next step's first gradient arrives, never when the one after it does.

Checkpoints: ``state`` returns copies of the parameters and optimizer state and the version; ``init``
takes them back (``opt_state``, ``version``), and the shard continues exactly where the old one was.
"""
from __future__ import annotations

import time
from collections import Counter

import torch

from ...compress import Codec, parse
from ...compress.spec import NONE
from .consistency import Clocks, Semantics, parse_semantics
from .encoded import decode_push, sparse_sum
from .optimizers import check_opt_state, make_server_optimizer, parse_optim, state_kinds
from .protocol import MAX_VERSION, ProtocolError
from .received import Received, received


class ShardStore:
    def __init__(self, workers: int):
        if workers < 1:
            raise ValueError(f"a server needs at least one worker, got {workers}")
        self.workers = workers
        self.version = -1  # -1 until rank 0's init arrives; then the number of (BSP) updates / rounds applied
        self.base = 0  # the version init started at (aggregate: the only one whose parameters it holds)
        self.params: dict[str, torch.Tensor] = {}
        self.semantics = Semantics()
        self.aggregate = False
        self.clocks: Clocks | None = None  # ASP/SSP only
        self.codec_spec, self.codec = NONE, None  # the init's codec (``encoded``); None: dense float pushes
        self.key_updates = 0  # BSP: keys updated so far (a waiting pushpull can only become answerable then)
        self.update_s = 0.0  # running totals for the server's own metrics
        self.aggregate_s = 0.0
        self.staleness: Counter = Counter()  # samples per value since the metrics last took them
        self.delay: Counter = Counter()

    @property
    def initialized(self) -> bool:
        return self.version >= 0

    @property
    def shared_replies(self) -> bool:
        """Whether replies hand out the shard's own parameter tensors (BSP, server-optimizer): the same
        objects every step, whose frames a server may keep (``frames.FrameCache``)."""
        return self.clocks is None and not self.aggregate

    def init(self, named: list[tuple[str, torch.Tensor]], optim: dict, semantics: dict | None = None,
             opt_state: list | None = None, version: int = 0, codec: str = NONE) -> None:
        """``optim``: the optimizer's hyper-parameters (``optimizers.OPTIM_FIELDS``); ``semantics``: the
        init's ``design``, ``consistency`` and ``staleness`` fields (absent: server-optimizer, bsp);
        ``codec``: the spec pushes are encoded with (``encoded``; ``none``: plain tensors; with the
        aggregate design it also decides the replies' form);
        ``opt_state``: ``[(KIND/KEY, tensor)]`` as ``state`` returns it, or nothing (fresh state);
        ``version``: the step to start at (a resumed run's first step)."""
        if self.initialized:
            raise ProtocolError("shard already initialised (a second init arrived)")
        if not named:
            raise ProtocolError("init carries no tensors")
        named = [(k, received(t)) for k, t in named]
        if type(version) is not int or not 0 <= version <= MAX_VERSION:
            raise ProtocolError(f"init: 'version' must be an int in 0..{MAX_VERSION}, got {version!r:.40}")
        cfg = parse_optim(optim)
        sem = parse_semantics(semantics or {})
        decoder = _codec(codec)
        keys = [k for k, _ in named]
        if len(set(keys)) != len(keys):
            raise ProtocolError("init lists a key twice")
        for key, t in named:  # check everything first: a rejected init must leave no trace
            if not t.dtype.is_floating_point:
                raise ProtocolError(f"init: parameter {key!r:.80} has non-float dtype {t.dtype}")
        aggregate = sem.design == "aggregate"
        loaded = check_opt_state(state_kinds(None if aggregate else cfg), dict(named), opt_state or [])
        self.cfg, self.semantics, self.aggregate = cfg, sem, aggregate
        self.codec_spec, self.codec = codec, decoder
        self.sparse_replies = aggregate and decoder is not None and decoder.sparse
        for key, t in named:
            p = t.owned()
            p.grad = torch.zeros_like(p)
            self.params[key] = p
        self.opt = None if self.aggregate else make_server_optimizer(cfg, self.params)
        if loaded:
            self.opt.load_state(loaded)
        self.sums = [{k: p.grad for k, p in self.params.items()},
                     {k: torch.zeros_like(p) for k, p in self.params.items()}] if self.aggregate else None
        # BSP updates done per key, counted from step 0 (pushpull replies wait on it)
        self.key_version = dict.fromkeys(self.params, version)
        self.count = dict.fromkeys(self.params, 0)
        self.pushed: dict[str, set[int]] = {k: set() for k in self.params}
        self.updated: set[str] = set()  # keys already updated in the current step
        self.clocks = Clocks(self.workers, keys, version) if sem.asynchronous else None
        self.version = self.base = version

    def state(self) -> dict:
        """Copies of what a checkpoint needs: ``params`` and ``opt_state`` ([(name, tensor)] as ``init``
        takes them), ``version`` and ``clocks`` (ASP/SSP; None under BSP). Under BSP only between
        steps: once a key has this step's update the shard is neither the old version nor the new."""
        if not self.initialized:
            raise ProtocolError("state before init")
        if self.updated:
            raise ProtocolError(f"state asked mid-step: {len(self.updated)} of {len(self.params)} keys already "
                                f"hold step {self.version}'s update; ask between steps")
        return {"version": self.version, "clocks": None if self.clocks is None else list(self.clocks.clock),
                "codec": self.codec_spec,
                "params": [(k, p.clone()) for k, p in self.params.items()],
                "opt_state": [] if self.opt is None else self.opt.state_tensors()}

    def check_push(self, worker: int, step: int, named: list[tuple[str, Received]]) -> list[tuple[str, Received]]:
        """The push's gradients per key (an encoded push decoded: ``encoded.decode_push``), or
        ``ProtocolError`` unless the whole push is acceptable (so a bad push changes nothing)."""
        if not self.initialized:
            raise ProtocolError("push before init")
        if not (type(worker) is int and 0 <= worker < self.workers):
            raise ProtocolError(f"worker id {worker!r:.40} outside 0..{self.workers - 1}")
        if not named:
            raise ProtocolError("a push carries no tensors")
        if self.codec is not None:
            named = decode_push(self.codec, [(k, received(g)) for k, g in named], self.params)
        bsp = self.clocks is None
        if bsp and (type(step) is not int or step != self.version):
            raise ProtocolError(f"push for step {step!r:.40} but this shard is at step {self.version} (BSP)")
        seen = set()
        for key, g in named:
            p = self.params.get(key)
            if p is None:
                raise ProtocolError(f"unknown key {key!r:.80} (not in this server's shard)")
            if key in seen or (bsp and (worker in self.pushed[key] or key in self.updated)):
                raise ProtocolError(f"key {key!r:.80} pushed twice by worker {worker} for step {step}")
            if g.dtype != p.dtype or g.shape != p.shape:
                raise ProtocolError(f"key {key!r:.80}: got {g.dtype} {tuple(g.shape)}, "
                                    f"expected {p.dtype} {tuple(p.shape)}")
            seen.add(key)
        if not bsp:
            lead = self.semantics.staleness if self.semantics.consistency == "ssp" else None
            self.clocks.check(worker, step, list(seen), lead)
        return named

    def push(self, worker: int, step: int, named: list[tuple[str, Received | torch.Tensor]]) -> bool:
        """Take a worker's gradients; True when this push advanced the version (BSP: completed the step;
        ASP/SSP: completed the slowest worker's step)."""
        named = self.check_push(worker, step, [(k, received(g)) for k, g in named])
        if self.clocks is not None:
            return self._push_async(worker, step, named)
        self.staleness[0] += 1  # BSP: every gradient is computed on the version it is applied to
        self.delay[0] += 1
        t0 = time.perf_counter()
        ready: list[tuple] = []  # (key, offset, param region, gradient region) to update now
        done = []
        for key, g in named:
            p = self.params[key]
            self.pushed[key].add(worker)
            self.count[key] += 1
            if self.workers == 1 and not self.aggregate:
                ready += self._regions(key, p, g)
                done.append(key)
                continue
            acc = self.sums[step % 2][key] if self.aggregate else p.grad
            first = self.count[key] == 1
            if first:  # the first push copies, so the buffer never needs a zeroing pass
                g.copy_into(acc)
            else:
                g.add_into(acc)
            if self.count[key] == self.workers:
                if not self.aggregate:
                    acc.div_(self.workers)  # mean of the workers' gradients = gradient of the global batch
                    ready.append((key, 0, p.view(-1), acc.view(-1)))
                done.append(key)
        t1 = time.perf_counter()
        self.aggregate_s += t1 - t0
        if ready:
            self.opt.step(ready)
            self.update_s += time.perf_counter() - t1
        self.key_updates += len(done)
        for key in done:
            self.count[key] = 0
            self.key_version[key] += 1
            self.pushed[key].clear()
            self.updated.add(key)
        if len(self.updated) == len(self.params):
            self.updated.clear()
            self.version += 1
            return True
        return False

    def _regions(self, key: str, p: torch.Tensor, g: Received) -> list[tuple]:
        """The update of ``key`` straight from the received gradient: one region per frame (SGD), or the
        whole key (Adam: a gradient split over frames is joined into ``p.grad`` first)."""
        if g.nframes == 1:
            return [(key, 0, p.view(-1), g.parts[0][1])]
        if self.opt.whole:
            g.copy_into(p.grad)
            return [(key, 0, p.view(-1), p.grad.view(-1))]
        flat = p.view(-1)
        return [(key, o, flat[o:o + r.numel()], r) for o, r in g.regions(p)]

    def _push_async(self, worker: int, step: int, named: list[tuple[str, Received]]) -> bool:
        t0 = time.perf_counter()
        ready = []
        for key, g in named:
            ready += self._regions(key, self.params[key], g)
        if ready:
            self.opt.step(ready)
        self.update_s += time.perf_counter() - t0
        advanced = self.clocks.applied(worker, step, [k for k, _ in named], self.staleness, self.delay)
        if advanced:
            self.version = self.clocks.slowest
        return advanced

    # --- replies -------------------------------------------------------------------------------------
    def reply_ready(self, keys: list[str], step: int) -> bool:
        """Whether a pushpull of step ``step`` for ``keys`` may be answered now (BSP: their update of that
        step is done; SSP: the slowest worker has completed step + 1 - k steps; ASP: always)."""
        if self.clocks is None:
            return self.updated_past(keys, step)
        if self.semantics.consistency == "ssp":
            return self.version >= step + 1 - self.semantics.staleness
        return True

    def reply(self, worker: int, keys: list[str], step: int) -> tuple[int, list[tuple[str, torch.Tensor]]]:
        """(version, tensors) answering a ready pushpull: the keys' new values, or (aggregate) the sums."""
        if self.clocks is None:
            if self.aggregate:
                sums = self.sums[step % 2]
                if self.sparse_replies:  # N sparse gradients add up to a sparse sum: its nonzeros (a copy)
                    return step + 1, [kt for k in keys for kt in sparse_sum(k, sums[k].view(-1))]
                if self.codec is not None and self.codec.dense:  # fp16/bf16: the mean, divided first so it
                    low = self.codec.dtype                         # stays in range (a copy, not the buffer)
                    return step + 1, [(k, sums[k].div(self.workers).to(low)) for k in keys]
                return step + 1, [(k, sums[k]) for k in keys]
            return step + 1, self.snapshot(keys)
        return self.version, self.read_values(worker, keys)

    def read_values(self, worker: int, keys: list[str] | None = None) -> list[tuple[str, torch.Tensor]]:
        """Values to send to ``worker`` (a pull's or a reply's). Under ASP/SSP they are copies, recorded as
        read for the staleness of its next gradients: the originals change with the next push while
        ZeroMQ may still be sending them. Under BSP they are the shard's own memory (see ``_send``)."""
        named = self.snapshot(keys)
        if self.clocks is None:
            return named
        self.clocks.mark_read(worker, [k for k, _ in named])
        return [(k, t.clone()) for k, t in named]

    def pull_limit(self) -> int | None:
        """The highest version a pull may ask for now (an honest worker never asks for more): BSP one
        step ahead, SSP k + 1, aggregate the init's; ASP and before init: None (any; the server bounds how
        many pulls wait)."""
        if not self.initialized or self.semantics.consistency == "asp":
            return None
        if self.aggregate:
            return self.base
        return self.version + 1 + (self.semantics.staleness if self.semantics.consistency == "ssp" else 0)

    def updated_past(self, keys: list[str], step: int) -> bool:
        """Whether every key in ``keys`` has had step ``step``'s (BSP) update applied."""
        return all(self.key_version[k] > step for k in keys)

    def snapshot(self, keys: list[str] | None = None) -> list[tuple[str, torch.Tensor]]:
        if keys is None:
            return list(self.params.items())
        missing = [k for k in keys if k not in self.params]
        if missing:
            raise ProtocolError(f"unknown key {missing[0]!r:.80} (not in this server's shard)")
        return [(k, self.params[k]) for k in keys]

    def take_staleness(self) -> tuple[Counter, Counter]:
        """The (staleness, delay) samples since the last call, emptied."""
        out = self.staleness, self.delay
        self.staleness, self.delay = Counter(), Counter()
        return out


def _codec(spec) -> Codec | None:
    """The init's ``codec`` field as a decoder (None for plain pushes), or ProtocolError."""
    if type(spec) is not str:
        raise ProtocolError(f"init: 'codec' must be a codec spec string, got {spec!r:.40}")
    try:
        codec = parse(spec)
    except ValueError as e:
        raise ProtocolError(f"init: {e}") from None
    return None if codec.name == NONE else codec
