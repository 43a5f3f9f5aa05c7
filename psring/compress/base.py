"""The codec interface: how a bucket's gradients are made smaller before they travel, and read back.

Horovod's ``Compressor`` shape (``compress(tensor) -> (tensor, ctx)``, ``decompress``), with the
per-bucket state that error feedback needs kept beside the codec, not inside an optimizer:

* ``encode(flat, state) -> Encoded``: the message for one bucket's 1-D gradient buffer. A codec with
  error feedback adds ``state.residual`` (what earlier encodings dropped) before encoding and keeps
  what this encoding dropped for the next step (Seide et al. 2014; Stich et al. 2018; Karimireddy et
  al. 2019), so nothing is lost for good, only delayed.
* ``decode(enc, numel, dtype) -> Tensor``: the dense 1-D gradient the message stands for.
* ``dense``: the encoding is a tensor of the bucket's shape in another dtype (fp16, bf16) whose *sum*
  is meaningful, so an all-reduce can add the encodings themselves (in that dtype). Sparse and 1-bit
  encodings cannot be summed chunk by chunk: all-reduce strategies all-gather them and every worker
  decodes and sums locally, so their bytes grow with N; a parameter server sums them naturally.
* ``wire_bytes(numel)``: the bytes one encoding of ``numel`` float32 elements puts on the wire (the
  formula the byte counters are checked against).
* ``layout(numel)``, ``check(enc, numel)``, ``add_into(enc, dst)``: what a receiver that did not encode
  (a parameter server) needs: the parts an encoding of ``numel`` elements must have (names, dtypes,
  shapes; anything else on the wire is refused), the values it must hold (e.g. indices in range), and
  the encoding added into a dense buffer without a dense copy of it (a sparse sum is an ``index_add_``).

Codecs are chosen by a spec string (``--compress CODEC``): ``none``, ``fp16``, ``bf16``, ``topk:RATIO``,
``randomk:RATIO``, ``onebit``; ``codecs.parse`` turns one into a ``Codec``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch


@dataclass
class Encoded:
    """One bucket's message: named tensors (e.g. ``values`` and ``indices``; ``scale``), each contiguous."""
    parts: dict[str, torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.parts.values())


@dataclass
class CodecState:
    """What a codec keeps per bucket between steps: the error-feedback residual (float32, the bucket's
    shape, created on first use) and a generator for codecs that draw at random (seeded per bucket and
    rank, so a run is reproducible). Part of checkpoints (``state_dict``/``load_state_dict``)."""
    residual: torch.Tensor | None = None
    generator: torch.Generator | None = None
    seed: int = 0
    steps: int = 0
    extra: dict = field(default_factory=dict)

    def state_dict(self) -> dict:
        return {"residual": self.residual, "steps": self.steps, "seed": self.seed}

    def load_state_dict(self, d: dict) -> None:
        self.residual, self.steps, self.seed = d["residual"], d["steps"], d["seed"]
        self.generator = None  # re-seeded from (seed, steps) on next use


class Codec(ABC):
    """One compression scheme. Subclasses set ``name`` and ``dense``."""

    name = ""
    dense = False
    sparse = False  # an encoding is (indices, values) of some elements: N of them add up to a sparse sum
    error_feedback = False

    @abstractmethod
    def encode(self, flat: torch.Tensor, state: CodecState) -> Encoded:
        """The message for ``flat`` (1-D float32, read only; with error feedback ``state.residual`` is
        added first and the part this message drops is kept in it)."""

    @abstractmethod
    def decode(self, enc: Encoded, numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense 1-D tensor of ``numel`` elements that ``enc`` stands for."""

    @abstractmethod
    def wire_bytes(self, numel: int) -> int:
        """Bytes of one encoding of ``numel`` float32 elements."""

    @abstractmethod
    def layout(self, numel: int) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        """The parts of an encoding of ``numel`` elements, in wire order: {name: (dtype, shape)}."""

    def check(self, enc: Encoded, numel: int) -> None:
        """ValueError (one line) unless ``enc``'s values are valid for ``numel`` elements (its parts
        already match ``layout``)."""

    def add_into(self, enc: Encoded, dst: torch.Tensor) -> None:
        """``dst`` (1-D, ``numel`` elements) += what ``enc`` stands for."""
        dst.add_(self.decode(enc, dst.numel(), dst.dtype))

    def copy_into(self, enc: Encoded, dst: torch.Tensor) -> None:
        """``dst`` (1-D) = what ``enc`` stands for."""
        dst.zero_()
        self.add_into(enc, dst)
