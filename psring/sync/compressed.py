"""``--compress CODEC`` for the all-reduce family: a ``Reducer`` that wraps any other one with a codec
(``compress.codecs``), the shape of DDP's ``fp16_compress_wrapper(hook)``: the codec composes with
every reducer instead of being written into each.

* dense codecs (fp16, bf16): each bucket is divided by N, cast into a low-precision shadow bucket, and
  the shadow is reduced by the inner reducer (torch's all-reduce or the hand-written ring), so the
  reduction itself runs, and is counted, in 2 bytes per element; the sum is cast back into
  ``bucket.flat`` times N (``ReduceSync``'s optimizer divides by N). Dividing first keeps the sum of N
  gradients inside fp16's range: "Apply the division first to avoid overflow, especially for FP16"
  (torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py, ``fp16_compress_hook``).
* sparse and 1-bit codecs (topk, randomk, onebit): encodings cannot be summed chunk by chunk, so every
  rank's encoding is all-gathered (each part with a flat all-gather: every rank's parts have
  the same sizes for these codecs) and every rank decodes the N encodings and sums them, in rank order
  (so every rank holds the same sum, bit for bit). This runs on the comm thread, so backward goes on.
  Bytes per worker: (N - 1) encodings sent and received (a ring all-gather), growing with N where a
  ring all-reduce's 2(N - 1)/N * M does not.

The codec's per-bucket state (the error-feedback residual, a random codec's step) is part of
``state_dict``: every rank's residual, gathered to the checkpoint, and each rank's own restored on
resume, so a checkpointed BSP run resumes exactly.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ..compress import CodecState, Encoded, parse
from .buckets import Bucket
from .process_group import ALL_GATHER, ProcessGroupInfo
from .reducer import CommThread, Handle, Reducer

STATE_KEY = "compress"  # this reducer's entry in a checkpoint's sync state


def wrap(inner: Reducer, pg: ProcessGroupInfo, spec: str, error_feedback: bool = True) -> Reducer:
    """``inner`` with the codec ``spec``: PowerSGD (``sync.powersgd``) or any codec of ``compress``."""
    from ..compress.spec import POWERSGD

    if spec.partition(":")[0] == POWERSGD:
        from .powersgd import PowerSGDReducer

        return PowerSGDReducer(inner, pg, spec, error_feedback)
    return CompressedReducer(inner, pg, spec, error_feedback)


class Wrapped(Reducer):
    """A reducer around ``inner`` (a codec's wrapper): the inner reducer's buckets, comm thread, resume,
    trace messages and steps are handed through; subclasses write ``launch``, ``wire_bytes``, state."""

    def __init__(self, inner: Reducer, pg: ProcessGroupInfo):
        super().__init__(inner.rank, inner.world, inner.device)
        self.inner, self.pg = inner, pg
        self.name, self.wait_phase, self.uses_thread = inner.name, inner.wait_phase, inner.uses_thread

    def use_comm(self, thread: CommThread | None, lanes: int = 1) -> None:
        # ReduceSync gives the wrapper its one CommThread; an inner reducer that uses one shares it, one lane
        super().use_comm(thread)
        if self.inner.uses_thread:
            self.inner.use_comm(thread)

    def ranges(self, layout, cap_bytes: int, first_cap_bytes: int):
        return self.inner.ranges(layout, cap_bytes, first_cap_bytes)

    def attach(self, model: nn.Module, buckets: list[Bucket]) -> None:
        self.inner.resume, self.inner.resume_rank = self.resume, self.resume_rank
        self.inner.attach(model, buckets)

    def take_messages(self) -> list:
        return self.inner.take_messages()

    def end_step(self) -> None:
        self.inner.end_step()

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's ``t`` as rows (world x numel), on the CPU: a collective (gloo: a flat output)."""
        mine = t.detach().contiguous()
        out = torch.empty(self.world * mine.numel(), dtype=mine.dtype, device=mine.device)
        ALL_GATHER(out, mine, group=self.pg.group)
        return out.view(self.world, -1).cpu()

    def close(self) -> None:
        self.inner.close()


class _DecodeHandle(Handle):
    """The inner reducer's handle of a shadow bucket; ``wait`` then writes the sum back into the bucket."""

    def __init__(self, inner: Handle, finish):
        self.inner, self.finish = inner, finish

    def wait(self) -> None:
        self.inner.wait()
        self.finish()


class CompressedReducer(Wrapped):
    """``inner`` (a reducer of the all-reduce family) with the codec ``spec`` on every bucket."""

    def __init__(self, inner: Reducer, pg: ProcessGroupInfo, spec: str, error_feedback: bool = True):
        super().__init__(inner, pg)
        self.spec, self.codec = spec, parse(spec, error_feedback)
        # dense: the inner reducer's own thread, if it has one; all-gather: always on the comm thread
        self.uses_thread = inner.uses_thread if self.codec.dense else True
        self.states: dict[int, CodecState] = {}
        self.shadows: dict[int, Bucket] = {}

    def attach(self, model: nn.Module, buckets: list[Bucket]) -> None:
        super().attach(model, buckets)
        for b in buckets:
            self.states[b.index] = CodecState(seed=(self.rank << 20) + b.index)
            if self.codec.dense:
                low = torch.empty(b.flat.numel(), dtype=self.codec.dtype, device=b.flat.device)
                self.shadows[b.index] = dataclasses.replace(b, flat=low)
        if self.resume is not None and STATE_KEY in self.resume[0]:
            self._load(self.resume[0][STATE_KEY])

    def launch(self, bucket: Bucket) -> Handle:
        if not self.codec.dense:
            return self.comm.submit(lambda: self._gather(bucket))
        shadow = self.shadows[bucket.index]
        # divide first: the sum stays in range (see above). In place, then cast: bit for bit copy_(flat.div(N))
        # (the bucket is overwritten with the sum at the end anyway) in two plain passes; the temporary and
        # the mixed-dtype division cost 7x that on a CPU (25 MB: 21 ms against 3), on the cores the rounds need
        shadow.flat.copy_(bucket.flat.div_(self.world))

        def finish() -> None:
            bucket.flat.copy_(shadow.flat).mul_(self.world)  # the sum, as ReduceSync expects

        return _DecodeHandle(self.inner.launch(shadow), finish)

    def _gather(self, bucket: Bucket) -> None:
        """Runs on the comm thread: encode, all-gather every rank's encoding, decode and sum in rank order."""
        enc = self.codec.encode(bucket.flat, self.states[bucket.index])
        gathered = {}
        for name, part in enc.parts.items():
            out = torch.empty(self.world * part.numel(), dtype=part.dtype, device=part.device)
            ALL_GATHER(out, part.contiguous(), group=self.pg.group)
            gathered[name] = out.view(self.world, -1)
        numel = bucket.flat.numel()
        total = torch.zeros(numel, dtype=torch.float32, device=bucket.flat.device)
        for r in range(self.world):
            total += self.codec.decode(Encoded({n: g[r] for n, g in gathered.items()}), numel)
        bucket.flat.copy_(total)

    def wire_bytes(self, bucket: Bucket) -> tuple[int, int]:
        if self.codec.dense:
            return self.inner.wire_bytes(self.shadows[bucket.index])  # M scaled by 2/4, chunks as the inner cuts them
        n = (self.world - 1) * self.codec.wire_bytes(bucket.flat.numel())
        return n, n

    # --- checkpoints --------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The inner reducer's state and, under ``compress``, every rank's codec state per bucket (a
        collective: every rank calls ``state_dict`` at the same step; rank 0 writes the checkpoint)."""
        buckets = {}
        for index, st in sorted(self.states.items()):
            residuals = None if st.residual is None else self.gather(st.residual)
            buckets[index] = {"residuals": residuals, "steps": st.steps}
        return {**self.inner.state_dict(), STATE_KEY: {"codec": self.spec, "buckets": buckets}}

    def _load(self, saved: dict) -> None:
        if saved["codec"] != self.spec:
            raise ValueError(f"the checkpoint was written with --compress {saved['codec']}, this run has "
                             f"--compress {self.spec}")
        for index, d in saved["buckets"].items():
            st = self.states[int(index)]
            st.steps = d["steps"]
            if d["residuals"] is not None:
                st.residual = d["residuals"][self.rank].to(self.device).clone()
