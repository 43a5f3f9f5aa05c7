"""The codecs behind ``--compress CODEC`` and ``parse``, the registry that turns a spec into one.

* ``none``: the identity (float32 as it is), the reference every codec is measured against.
* ``fp16``, ``bf16``: the bucket cast to that dtype (``dense``: encodings can be summed in it, as
  Horovod's ``Compression.fp16`` and DDP's ``fp16_compress_hook`` do). 2 bytes per element.
* ``topk:RATIO``: the k = ceil(RATIO * numel) largest magnitudes, as int32 indices and float32 values
  (Aji & Heafield 2017; Lin et al., Deep Gradient Compression, 2018). 8k bytes.
* ``randomk:RATIO``: k indices drawn uniformly without replacement from a generator seeded by (bucket,
  rank, step), so a run is reproducible and resumes exactly (Stich et al. 2018). 8k bytes.
* ``onebit``: the signs packed 8 per byte and one float32 scale, the mean |x| of the bucket (1-bit SGD,
  Seide et al. 2014; signSGD with a scale, Bernstein et al. 2018). ceil(numel / 8) + 4 bytes.

The sparse and 1-bit codecs carry error feedback unless told not to: each encodes grad + residual and
keeps residual = (grad + residual) - decode(encode(grad + residual)), so what one step drops is sent
later (Karimireddy et al. 2019, "Error feedback fixes SignSGD").

    >>> c = parse("topk:0.5")
    >>> enc = c.encode(torch.tensor([1.0, -3.0, 0.5, 2.0]), CodecState())
    >>> c.decode(enc, 4).tolist(), c.wire_bytes(4)
    ([0.0, -3.0, 0.0, 2.0], 16)
"""
from __future__ import annotations

import math

import torch

from .base import Codec, CodecState, Encoded
from .spec import NONE, POWERSGD, RATIO, check_spec, ratio


class Identity(Codec):
    name, dense, dtype = NONE, True, torch.float32

    def encode(self, flat: torch.Tensor, state: CodecState) -> Encoded:
        return Encoded({"values": flat.contiguous()})

    def decode(self, enc: Encoded, numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return enc.parts["values"].to(dtype)

    def wire_bytes(self, numel: int) -> int:
        return 4 * numel

    def layout(self, numel: int) -> dict:
        return {"values": (torch.float32, (numel,))}


class Cast(Codec):
    """The bucket in a lower-precision dtype; no error feedback (rounding errors do not accumulate
    against the gradient the way dropped elements do)."""

    dense = True

    def __init__(self, name: str, dtype: torch.dtype):
        self.name, self.dtype = name, dtype

    def encode(self, flat: torch.Tensor, state: CodecState) -> Encoded:
        return Encoded({"values": flat.to(self.dtype)})

    def decode(self, enc: Encoded, numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return enc.parts["values"].to(dtype)

    def wire_bytes(self, numel: int) -> int:
        return numel * torch.finfo(self.dtype).bits // 8

    def layout(self, numel: int) -> dict:
        return {"values": (self.dtype, (numel,))}

    def add_into(self, enc: Encoded, dst: torch.Tensor) -> None:
        dst.add_(enc.parts["values"])  # promoted to dst's dtype element by element, no float32 copy

    def copy_into(self, enc: Encoded, dst: torch.Tensor) -> None:
        dst.copy_(enc.parts["values"])


class Feedback(Codec):
    """A lossy codec with optional error feedback; subclasses write ``_encode`` of the corrected bucket."""

    def __init__(self, error_feedback: bool = True):
        self.error_feedback = error_feedback

    def encode(self, flat: torch.Tensor, state: CodecState) -> Encoded:
        x = flat.float()
        if self.error_feedback and state.residual is not None:
            x = x + state.residual
        enc = self._encode(x, state)
        if self.error_feedback:
            state.residual = x - self.decode(enc, x.numel())
        state.steps += 1
        return enc

    def _encode(self, x: torch.Tensor, state: CodecState) -> Encoded:
        raise NotImplementedError


class Sparse(Feedback):
    """k = ceil(ratio * numel) elements as int32 indices and float32 values; ``_pick`` chooses them."""

    sparse = True

    def __init__(self, ratio: float, error_feedback: bool = True):
        super().__init__(error_feedback)
        self.ratio = ratio

    def k(self, numel: int) -> int:
        return min(numel, math.ceil(self.ratio * numel))

    def _encode(self, x: torch.Tensor, state: CodecState) -> Encoded:
        idx = self._pick(x, self.k(x.numel()), state)
        return Encoded({"indices": idx.to(torch.int32), "values": x[idx].contiguous()})

    def _pick(self, x: torch.Tensor, k: int, state: CodecState) -> torch.Tensor:
        raise NotImplementedError

    def decode(self, enc: Encoded, numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        values = enc.parts["values"]
        out = torch.zeros(numel, dtype=dtype, device=values.device)
        return out.index_put_((enc.parts["indices"].long(),), values.to(dtype), accumulate=True)

    def wire_bytes(self, numel: int) -> int:
        return 8 * self.k(numel)

    def layout(self, numel: int) -> dict:
        k = self.k(numel)
        return {"indices": (torch.int32, (k,)), "values": (torch.float32, (k,))}

    def check(self, enc: Encoded, numel: int) -> None:
        idx = enc.parts["indices"]
        if idx.numel() and not (0 <= int(idx.min()) and int(idx.max()) < numel):
            raise ValueError(f"indices must lie in 0..{numel - 1}, got {int(idx.min())}..{int(idx.max())}")

    def add_into(self, enc: Encoded, dst: torch.Tensor) -> None:
        dst.index_add_(0, enc.parts["indices"].long(), enc.parts["values"].to(dst.dtype))


class TopK(Sparse):
    name = "topk"

    def _pick(self, x: torch.Tensor, k: int, state: CodecState) -> torch.Tensor:
        return torch.topk(x.abs(), k, sorted=False).indices


class RandomK(Sparse):
    name = "randomk"

    def _pick(self, x: torch.Tensor, k: int, state: CodecState) -> torch.Tensor:
        # re-seeded from (seed, step) every step, not drawn on from step 0: a resumed run then draws
        # what the uninterrupted one drew (CodecState.load_state_dict keeps seed and steps)
        if state.generator is None:
            state.generator = torch.Generator()
        state.generator.manual_seed((state.seed * 1_000_003 + state.steps) % 2**63)
        return torch.randperm(x.numel(), generator=state.generator)[:k].to(x.device)


_SHIFTS = torch.arange(7, -1, -1, dtype=torch.uint8)


class OneBit(Feedback):
    name = "onebit"

    def _encode(self, x: torch.Tensor, state: CodecState) -> Encoded:
        n = x.numel()
        bits = torch.zeros(math.ceil(n / 8) * 8, dtype=torch.uint8, device=x.device)
        bits[:n] = x >= 0
        packed = (bits.view(-1, 8) << _SHIFTS.to(x.device)).sum(1, dtype=torch.uint8)
        return Encoded({"signs": packed, "scale": x.abs().mean().reshape(1)})

    def decode(self, enc: Encoded, numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        packed = enc.parts["signs"]
        bits = (packed.unsqueeze(1) >> _SHIFTS.to(packed.device)) & 1
        signs = bits.reshape(-1)[:numel].to(dtype) * 2 - 1
        return signs * enc.parts["scale"].to(dtype)

    def wire_bytes(self, numel: int) -> int:
        return math.ceil(numel / 8) + 4

    def layout(self, numel: int) -> dict:
        return {"signs": (torch.uint8, (math.ceil(numel / 8),)), "scale": (torch.float32, (1,))}


def parse(spec: str, error_feedback: bool = True) -> Codec:
    """The codec a ``--compress`` spec names; ValueError with a one-line message for a bad spec
    (``spec.check_spec``; PowerSGD is not a ``Codec``: ``sync/powersgd.py``)."""
    name = check_spec(spec)
    if name == POWERSGD:
        raise ValueError(f"--compress {spec}: PowerSGD is a reducer of the all-reduce family, not a codec")
    if name in RATIO:
        return (TopK if name == "topk" else RandomK)(ratio(spec), error_feedback)
    if name == "onebit":
        return OneBit(error_feedback)
    if name == NONE:
        return Identity()
    return Cast(name, torch.float16 if name == "fp16" else torch.bfloat16)


def dense_codec(spec: str) -> Codec | None:
    """The codec ``spec`` names where it casts every element (fp16, bf16): its encodings are summed in place,
    chunk by chunk, as the uncompressed gradient is; None for ``none``, a sparse or 1-bit codec, or a bad spec."""
    if spec == NONE:
        return None
    try:
        codec = parse(spec)
    except ValueError:
        return None
    return codec if codec.dense else None
