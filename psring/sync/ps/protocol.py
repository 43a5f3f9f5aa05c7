"""The parameter-server wire format: one msgpack header frame, then one raw binary frame per tensor.

Request  (worker -> server, DEALER -> ROUTER):  [header, tensor_0, tensor_1, ...]
Reply    (server -> worker):                    [header, tensor_0, ...]

The header is a small msgpack map. Tensors are described in it as ``[key, dtype, shape]`` triples, in
frame order; their bytes travel as raw frames (C-contiguous, native little-endian) and are never pickled:
a frame is turned back into a tensor with ``torch.frombuffer`` after its length was checked against the
declared dtype and shape. "We must never load untrusted pickles" (pyzmq, examples/serialization).

Ops (request ``op`` field):
  init  rank 0 hands a server its shard's initial values and the optimizer hyper-parameters
  push  a worker's gradients for some keys of the shard at step ``step``
  pull  the shard's parameters once the server has reached ``version`` (version v = after v updates)
  done  the worker has finished; the server exits once every worker said so
Every request gets exactly one reply: ``{"ok": true, "req": id, ...}`` or ``{"ok": false, "req": id,
"error": "..."}``. A pull is answered when its version is reached, not when it arrives.
"""
from __future__ import annotations

import warnings

import msgpack
import torch

PROTOCOL = 1
MAX_HEADER_BYTES = 1 << 20
MAX_DIMS, MAX_DIM = 16, 1 << 40  # generous for any real tensor; keeps torch's size arithmetic in range

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32, "int16": torch.int16,
    "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class ProtocolError(ValueError):
    """A message that does not follow this module's format; the server answers it with an error reply."""


def pack_header(header: dict) -> bytes:
    return msgpack.packb(header, use_bin_type=True)


def unpack_header(buf) -> dict:
    """Decode a header frame with explicit limits: a hostile peer cannot make us allocate much."""
    if len(buf) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(buf)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(bytes(buf), raw=False, strict_map_key=True, max_str_len=1 << 16,
                                 max_bin_len=1 << 16, max_array_len=1 << 18, max_map_len=1 << 10)
    except Exception as e:  # msgpack raises several unrelated types for malformed input
        raise ProtocolError(f"malformed msgpack header: {type(e).__name__}: {e}") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header must be a map, got {type(header).__name__}")
    return header


def tensor_meta(key: str, t: torch.Tensor) -> list:
    return [key, DTYPE_NAMES[t.dtype], list(t.shape)]


def tensor_frame(t: torch.Tensor) -> memoryview:
    """The tensor's bytes without a copy (``t`` must be a contiguous CPU tensor kept alive until sent)."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("tensor_frame needs a contiguous CPU tensor")
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def parse_meta(meta) -> tuple[str, torch.dtype, tuple[int, ...]]:
    if not (isinstance(meta, (list, tuple)) and len(meta) == 3):
        raise ProtocolError(f"tensor description must be [key, dtype, shape], got {meta!r:.80}")
    key, dtype, shape = meta
    if not isinstance(key, str):
        raise ProtocolError(f"tensor key must be a string, got {type(key).__name__}")
    if dtype not in DTYPES:
        raise ProtocolError(f"tensor {key!r}: unknown dtype {dtype!r}")
    if not (isinstance(shape, (list, tuple)) and len(shape) <= MAX_DIMS
            and all(type(d) is int and 0 <= d <= MAX_DIM for d in shape)):
        raise ProtocolError(f"tensor {key!r}: shape must be a list of at most {MAX_DIMS} ints in "
                            f"0..{MAX_DIM}, got {shape!r:.80}")
    extent = 1
    for d in shape:  # even an empty tensor's strides must fit in int64
        extent *= max(d, 1)
    if extent > MAX_DIM:
        raise ProtocolError(f"tensor {key!r}: shape {shape!r:.80} is too large")
    return key, DTYPES[dtype], tuple(shape)


def frame_tensor(buf, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor viewing ``buf`` (read-only: callers copy out of it, never write into it)."""
    numel = 1
    for d in shape:
        numel *= d
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(buf) != numel * itemsize:
        raise ProtocolError(f"frame of {len(buf)} bytes does not match dtype/shape ({numel * itemsize} bytes)")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    with warnings.catch_warnings():  # zmq frames are read-only; we only ever read from this view
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(buf, dtype=dtype).view(shape)


def decode_tensors(header: dict, frames: list) -> list[tuple[str, torch.Tensor]]:
    """Pair the header's ``tensors`` descriptions with the raw frames that follow it."""
    metas = header.get("tensors", [])
    if not isinstance(metas, list):
        raise ProtocolError("'tensors' must be a list")
    if len(metas) != len(frames):
        raise ProtocolError(f"header describes {len(metas)} tensors but {len(frames)} frames followed")
    out = []
    for meta, frame in zip(metas, frames):
        key, dtype, shape = parse_meta(meta)
        out.append((key, frame_tensor(frame, dtype, shape)))
    return out


def encode_tensors(named: list[tuple[str, torch.Tensor]]) -> tuple[list, list[memoryview]]:
    """``(metas, frames)`` for the header's ``tensors`` field and the frames that follow it."""
    return [tensor_meta(k, t) for k, t in named], [tensor_frame(t) for _, t in named]
