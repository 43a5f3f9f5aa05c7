"""ZeroMQ frames in and out of a socket at the PS's rate (thousands a step): sends without pyzmq's per-frame
flag arithmetic on its enums, a readiness check without building a poller, and the frames of tensors sent
again and again made once (``FrameCache``)."""
from __future__ import annotations

import torch
import zmq

from .protocol import encode_tensors

_MORE, _POLLIN, _EVENTS = int(zmq.SNDMORE), int(zmq.POLLIN), int(zmq.EVENTS)  # plain ints: pyzmq's enums
DONTWAIT = int(zmq.DONTWAIT)                                                   # cost ~2 us an operation


def send_frames(sock, frames: list, flags: int = 0) -> None:
    """``sock.send_multipart(frames, copy=False, flags=flags)`` (``flags`` a plain int) without its
    arithmetic on pyzmq's flag enums, a few microseconds a frame at thousands of frames a step."""
    last = len(frames) - 1
    for i, f in enumerate(frames):
        sock.send(f, _MORE | flags if i < last else flags, copy=False)


def readable(sock) -> bool:
    """Whether a message waits on ``sock``: ``poll(0)`` without building a poller (``ZMQ_EVENTS``)."""
    return bool(sock.getsockopt(_EVENTS) & _POLLIN)


class FrameCache:
    """``encode_tensors`` for tensors sent again and again (a BSP shard's parameters to every worker, each
    step; a worker's chunk buffers): a key's metas and frames are made once per tensor object and reused
    while that same object is sent under it (frames view its memory, so they stay right as it changes)."""

    def __init__(self, max_frame: int | None):
        self.max_frame, self.made = max_frame, {}

    def encode(self, named: list[tuple[str, torch.Tensor]], cache: bool = True) -> tuple[list, list]:
        """``encode_tensors(named)``; ``cache`` False: without the cache (tensors made for one message)."""
        if not cache:
            return encode_tensors(named, self.max_frame)
        metas, frames = [], []
        for key, t in named:
            got = self.made.get(key)
            if got is None or got[0] is not t:
                got = self.made[key] = (t, *encode_tensors([(key, t)], self.max_frame))
            metas += got[1]
            frames += got[2]
        return metas, frames
