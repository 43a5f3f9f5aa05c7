"""The parameter-server wire format: one msgpack header frame, then one raw binary frame per tensor.

Request  (worker -> server, DEALER -> ROUTER):  [header, tensor_0, tensor_1, ...]
Reply    (server -> worker):                    [header, tensor_0, ...]

The header is a small msgpack map. Tensors are described in it as ``[key, dtype, shape]`` triples
(``[key, dtype, shape, nframes]`` when a large tensor is split over several frames), in frame order;
their bytes travel as raw frames (C-contiguous, native little-endian) and are never pickled:
a frame is turned back into a tensor with ``torch.frombuffer`` after its length was checked against the
declared dtype and shape. "We must never load untrusted pickles" (pyzmq, examples/serialization).

Ops (request ``op`` field):
  init  rank 0 hands a server its shard's initial values and the run's semantics:
        ``optim``  {name: "sgd"|"adam", lr, momentum, weight_decay, betas: [b1, b2], eps} (absent fields
                   take OptimConfig's defaults; an unknown field or value is refused)
        ``design``  "server-optimizer" (default) | "aggregate" (BSP only)
        ``consistency``  "bsp" (default) | "ssp" | "asp";  ``staleness``  SSP's bound k, an int >= 0
  push  a worker's gradients for some keys of the shard at step ``step``; acknowledged at once
  pushpull  the same, answered once the consistency model allows (BSP: those keys' step is updated;
        SSP: the slowest worker completed step+1-k steps; ASP: at once) with the keys' new values, or,
        with the aggregate design, the sum of the N workers' gradients; ``version`` in the reply: step+1
        under BSP, the slowest worker's clock under SSP/ASP
  pull  the shard's parameters once the server has reached ``version`` (version v = after v updates;
        SSP/ASP: once every worker completed v steps; aggregate: version 0 only)
  done  the worker has finished; the server exits once every worker said so
Every request gets exactly one reply: ``{"ok": true, "req": id, ...}`` or ``{"ok": false, "req": id,
"error": "..."}``. A pull is answered when its version is reached, a pushpull when its keys' update is
done, not when they arrive; a worker may have several requests in flight, replies name theirs (``req``).
"""
from __future__ import annotations

import warnings

import msgpack
import torch

PROTOCOL = 1
MAX_HEADER_BYTES = 1 << 20
MAX_DIMS, MAX_DIM, MAX_FRAMES = 16, 1 << 40, 1 << 20  # generous for any real tensor; keeps torch's size arithmetic in range

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
    except Exception as e:  # noqa: BLE001 - msgpack raises several unrelated types for malformed input
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


def parse_meta(meta) -> tuple[str, torch.dtype, tuple[int, ...], int]:
    """``[key, dtype, shape]`` or ``[key, dtype, shape, nframes]`` -> (key, dtype, shape, nframes)."""
    if not (isinstance(meta, (list, tuple)) and len(meta) in (3, 4)):
        raise ProtocolError(f"tensor description must be [key, dtype, shape(, nframes)], got {meta!r:.80}")
    key, dtype, shape = meta[:3]
    nframes = meta[3] if len(meta) == 4 else 1
    if not isinstance(key, str):
        raise ProtocolError(f"tensor key must be a string, got {type(key).__name__}")
    if dtype not in DTYPES:
        raise ProtocolError(f"tensor {key!r}: unknown dtype {dtype!r}")
    if not (isinstance(shape, (list, tuple)) and len(shape) <= MAX_DIMS
            and all(type(d) is int and 0 <= d <= MAX_DIM for d in shape)):
        raise ProtocolError(f"tensor {key!r}: shape must be a list of at most {MAX_DIMS} ints in "
                            f"0..{MAX_DIM}, got {shape!r:.80}")
    if type(nframes) is not int or not 1 <= nframes <= MAX_FRAMES:
        raise ProtocolError(f"tensor {key!r}: nframes must be an int in 1..{MAX_FRAMES}, got {nframes!r:.40}")
    extent = 1
    for d in shape:  # even an empty tensor's strides must fit in int64
        extent *= max(d, 1)
    if extent > MAX_DIM:
        raise ProtocolError(f"tensor {key!r}: shape {shape!r:.80} is too large")
    return key, DTYPES[dtype], tuple(shape), nframes


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _view(buf, dtype: torch.dtype) -> torch.Tensor:
    with warnings.catch_warnings():  # zmq frames are read-only; we only ever read from this view
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(buf, dtype=dtype)


def frame_tensor(buf, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor viewing ``buf`` (read-only: callers copy out of it, never write into it)."""
    numel = 1
    for d in shape:
        numel *= d
    itemsize = _itemsize(dtype)
    if len(buf) != numel * itemsize:
        raise ProtocolError(f"frame of {len(buf)} bytes does not match dtype/shape ({numel * itemsize} bytes)")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    return _view(buf, dtype).view(shape)


class Pieces:
    """A tensor that arrived in several frames: ``parts`` are (element offset, 1-D read-only view).
    It is used where it lands (``add_into``, ``copy_into``) without first joining the frames."""

    def __init__(self, dtype: torch.dtype, shape: tuple[int, ...], parts: list[tuple[int, torch.Tensor]]):
        self.dtype, self.shape, self.parts = dtype, torch.Size(shape), parts

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
            raise ValueError(f"Pieces of shape {tuple(self.shape)} cannot land in {tuple(dst.shape)}")
        return self.parts

    def join(self) -> torch.Tensor:
        out = torch.empty(self.shape, dtype=self.dtype)
        self.copy_into(out)
        return out


def _pieces(key: str, bufs: list, dtype: torch.dtype, shape: tuple[int, ...]) -> Pieces:
    numel = 1
    for d in shape:
        numel *= d
    itemsize, parts, off = _itemsize(dtype), [], 0
    for buf in bufs:
        if len(buf) == 0 or len(buf) % itemsize:
            raise ProtocolError(f"tensor {key!r}: a frame of {len(buf)} bytes is not a whole number of items")
        n = len(buf) // itemsize
        parts.append((off, _view(buf, dtype)))
        off += n
    if off != numel:
        raise ProtocolError(f"tensor {key!r}: its frames hold {off} items, shape needs {numel}")
    return Pieces(dtype, shape, parts)


def decode_tensors(header: dict, frames: list) -> list[tuple[str, torch.Tensor | Pieces]]:
    """Pair the header's ``tensors`` descriptions with the raw frames that follow it: a tensor sent in
    one frame comes back as a tensor viewing it, one sent in several as ``Pieces``."""
    metas = header.get("tensors", [])
    if not isinstance(metas, list):
        raise ProtocolError("'tensors' must be a list")
    parsed = [parse_meta(m) for m in metas]
    if sum(p[3] for p in parsed) != len(frames):
        raise ProtocolError(f"header describes {sum(p[3] for p in parsed)} frames but {len(frames)} followed")
    out, i = [], 0
    for key, dtype, shape, nframes in parsed:
        if nframes == 1:
            out.append((key, frame_tensor(frames[i], dtype, shape)))
        else:
            out.append((key, _pieces(key, frames[i:i + nframes], dtype, shape)))
        i += nframes
    return out


def encode_tensors(named: list[tuple[str, torch.Tensor]], max_frame: int | None = None) -> tuple[list, list]:
    """``(metas, frames)`` for the header's ``tensors`` field and the frames that follow it. Tensors over
    ``max_frame`` bytes are split into frames of at most that size (zero-copy slices of their memory):
    ZeroMQ moves many ~1 MB frames much faster than one huge one (see README, Performance)."""
    metas, frames = [], []
    for key, t in named:
        buf = tensor_frame(t)
        step = max_frame - max_frame % t.element_size() if max_frame else 0
        if not step or len(buf) <= step:
            metas.append(tensor_meta(key, t))
            frames.append(buf)
        else:
            chunks = [buf[o:o + step] for o in range(0, len(buf), step)]
            metas.append(tensor_meta(key, t) + [len(chunks)])
            frames += chunks
    return metas, frames
