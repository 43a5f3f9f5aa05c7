"""ZeroMQ frames in and out of a socket at the PS's rate (thousands a step): sends without pyzmq's per-frame
flag arithmetic on its enums, a readiness check without building a poller, and the frames of tensors sent
again and again made once (``FrameCache``), as ``zmq.Frame`` objects: pyzmq hands each zero-copy send of a
buffer to a garbage-collector thread of its own (a registration, and a message to wake that thread once libzmq is
done with the memory), while a ``zmq.Frame`` sent again is a reference copy (``zmq_msg_copy``)."""
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


def shared_frame(buf):
    """``buf`` as a zero-copy ``zmq.Frame`` to send many times (it views the memory, so it stays right as that
    changes), where pyzmq would not copy it anyway (``zmq.COPY_THRESHOLD``: smaller buffers are copied per send,
    from the memory as it is then). Measured on loopback, a 474 KB frame: 204-220 us of the sending process's CPU a
    send against 227-254 us sent as a buffer each time."""
    return zmq.Frame(buf, copy=False) if len(buf) >= zmq.COPY_THRESHOLD else buf


class FrameCache:
    """``encode_tensors`` for tensors sent again and again (a BSP shard's parameters to every worker, each
    step; a worker's chunk buffers): a key's metas and frames are made once per tensor object and reused
    while that same object is sent under it (frames view its memory, so they stay right as it changes;
    ``shared_frame``)."""

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
                metas1, frames1 = encode_tensors([(key, t)], self.max_frame)
                got = self.made[key] = (t, metas1, [shared_frame(f) for f in frames1])
            metas += got[1]
            frames += got[2]
        return metas, frames
