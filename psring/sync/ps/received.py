"""A tensor as it came off the wire: ``Received``, the one interface every reader of a pushed or replied
tensor uses, whether it arrived in one ZeroMQ frame or several (``protocol.decode_tensors`` makes them)."""
from __future__ import annotations

import torch


class Received:
    """A tensor as it arrived, in one frame or several: ``parts`` are (element offset, 1-D read-only view
    of one frame). Every user reads it through this one interface, whatever the frame count: it is
    used where it lands (``copy_into``, ``add_into``, ``regions``) without first joining the frames;
    ``tensor()`` is a zero-copy view when it came in one frame."""

    def __init__(self, dtype: torch.dtype, shape: tuple[int, ...], parts: list[tuple[int, torch.Tensor]]):
        self.dtype, self.shape, self.parts = dtype, torch.Size(shape), parts

    @property
    def nframes(self) -> int:
        return len(self.parts)

    def numel(self) -> int:
        return self.shape.numel()

    def add_into(self, dst: torch.Tensor) -> None:
        flat = dst.view(-1)
        for off, t in self.parts:
            flat[off:off + t.numel()].add_(t)

    def copy_into(self, dst: torch.Tensor) -> None:
        flat = dst.view(-1)
        for off, t in self.parts:
            flat[off:off + t.numel()].copy_(t)

    def regions(self, dst: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """(element offset into ``dst`` flattened, 1-D view of that part): where each frame belongs."""
        if dst.shape != self.shape:
            raise ValueError(f"a tensor of shape {tuple(self.shape)} cannot land in {tuple(dst.shape)}")
        return self.parts

    def tensor(self) -> torch.Tensor:
        """The tensor: a read-only view of the frame (one frame), or the frames joined (a copy)."""
        if len(self.parts) == 1:
            return self.parts[0][1].view(self.shape)
        return self.owned()

    def owned(self) -> torch.Tensor:
        """A copy that outlives the frames and may be written."""
        out = torch.empty(self.shape, dtype=self.dtype)
        self.copy_into(out)
        return out


def received(t) -> Received:
    """``t`` as a ``Received`` (a plain tensor, e.g. in-process callers of the store, is wrapped without
    a copy; a ``Received`` is returned as is)."""
    if isinstance(t, Received):
        return t
    return Received(t.dtype, tuple(t.shape), [(0, t.detach().reshape(-1))])
