"""The parameter-server wire format: one msgpack header frame, then one raw binary frame per tensor.

Request  (worker -> server, DEALER -> ROUTER):  [header, tensor_0, tensor_1, ...]
Reply    (server -> worker):                    [header, tensor_0, ...]

The header is a small msgpack map. Tensors are described in it as ``[key, dtype, shape]`` triples
(``[key, dtype, shape, nframes]`` when a large tensor is split over several frames), in frame order;
their bytes travel as raw frames (C-contiguous, native little-endian) and are never pickled:
a frame is turned back into a tensor with ``torch.frombuffer`` after its length was checked against the
declared dtype and shape. "We must never load untrusted pickles" (pyzmq, examples/serialization).

Every request may carry ``protocol`` (1; absent means 1), ``req`` (an int the reply echoes; absent:
null) and ``worker`` (the sender's rank, 0..N-1; required where a row below uses it).

Ops (request ``op`` field):
  init  rank 0 hands a server its shard's initial values and the run's semantics:
        ``optim``  {name: "sgd"|"adam", lr, momentum, weight_decay, betas: [b1, b2], eps} (absent fields
                   take OptimConfig's defaults; an unknown field or value is refused)
        ``design``  "server-optimizer" (default) | "aggregate" (BSP only)
        ``consistency``  "bsp" (default) | "ssp" | "asp";  ``staleness``  SSP's bound k, an int >= 0
        ``codec``  the spec pushes are encoded with (``compress.codecs``: "none" (default), "fp16",
                   "bf16", "topk:R", "randomk:R", "onebit"); see ``encoded`` for the parts a push carries
        ``version``  the step the shard starts at (default 0; a resumed run's first step): BSP pushes of
                   that step are the first accepted, ASP/SSP clocks all start there
        ``opt_state``  optional optimizer state, described like ``tensors`` (its frames follow theirs),
                   named ``KIND/KEY``: SGD with momentum ``momentum_buffer/KEY``; Adam ``exp_avg/KEY``,
                   ``exp_avg_sq/KEY`` (each the parameter's dtype and shape) and ``step/KEY`` (float32,
                   shape []); every kind for every key, or none at all (fresh state, as at step 0)
  push  a worker's gradients for some keys of the shard at step ``step``; acknowledged at once
  pushpull  the same, answered once the consistency model allows (BSP: those keys' step is updated;
        SSP: the slowest worker completed step+1-k steps; ASP: at once) with the keys' new values, or,
        with the aggregate design, the sum of the N workers' gradients (codec fp16/bf16: their mean, in
        that dtype; top-k/random-k: the sum's nonzeros, ``KEY/indices`` and ``KEY/values``); an encoded push (init's ``codec``) names ``KEY/PART`` tensors (``encoded``); ``version`` in the reply: step+1
        under BSP, the slowest worker's clock under SSP/ASP. With ``ack: true`` the server first sends
        ``{"ok": true, "req": id, "ack": true}`` the moment the push is read, before its reply: the
        worker's credits count bytes not yet received (ps-lite's and BytePS's push response)
  pull  the shard's parameters once the server has reached ``version`` (version v = after v updates;
        SSP/ASP: once every worker completed v steps; aggregate: the init's version only)
  state  (any worker, normally rank 0, between steps) the reply carries copies of the shard's
        parameters (``tensors``) and optimizer state (``opt_state``, named as init takes it) and in its
        header ``version``, ``clocks`` (ASP/SSP: every worker's clock; BSP: null), ``optim``, ``design``,
        ``consistency``, ``staleness``, ``codec``: init a fresh server with them and it continues exactly (BSP)
  done  the worker has finished; the server exits once every worker said so
  probe  (``--link-tuning probe``, before init) ``round`` r, optional ``value`` (<= 16 numbers), any tensors:
        answered once all N workers' probes of round r arrived, with the frames echoed and ``values``
        (every worker's value, rank order): the link measured as a step will use it (``ps.probe``)
Every request gets exactly one reply (and a pushpull with ``ack`` one ack before it): ``{"ok": true, "req": id, ...}`` or ``{"ok": false, "req": id,
"error": "..."}`` (``req`` null when the request's own was unreadable or not an int). A pull is answered
when its version is reached, a pushpull when its keys' update is done, not when they arrive; a worker may
have several requests in flight, replies name theirs (``req``).

What a server refuses, with an error reply and one count in its ``errors`` (nothing else changes):
malformed or oversized msgpack, a header that is not a map, an ext type anywhere in it, a field of the
wrong type, an unknown op, a protocol other than 1, a worker id outside 0..N-1, tensor descriptions that
do not match the frames (count, whole items, bytes of dtype x shape), unknown keys or keys twice, wrong
dtypes or shapes, encoded parts that are not the codec's layout or hold invalid values (``encoded``), pushes of another step than the shard's (BSP) or the worker's clock (ASP/SSP; SSP also
more than k ahead of the slowest worker), pulls too far ahead, a second init, inconsistent optimizer
state, frames on a pull/state/done, and a message whose frames add up to more than the server's
``max_message_bytes`` (refused before decoding; a single frame over it never reaches the server:
ZeroMQ's ``MAXMSGSIZE`` drops the connection, and the sender sees a timeout).
"""
from __future__ import annotations

import warnings

import msgpack
import torch

from .errors import ProtocolError
from .received import Received

PROTOCOL = 1
MAX_HEADER_BYTES = 1 << 20
MAX_DIMS, MAX_DIM, MAX_FRAMES = 16, 1 << 40, 1 << 20  # generous for any real tensor; keeps torch's size arithmetic in range
MAX_VERSION = 1 << 53  # steps and versions: ints in 0..2**53 (exact in JSON and float64)
SECTIONS = ("tensors", "opt_state")  # header fields describing frames, in frame order

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32, "int16": torch.int16,
    "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def pack_header(header: dict) -> bytes:
    return msgpack.packb(header, use_bin_type=True)


def _no_ext(code: int, data: bytes):
    raise ValueError(f"msgpack ext type {code} not allowed")


def nbytes(buf) -> int:
    """The byte length of a frame (``len`` counts items of a typed memoryview); ProtocolError if ``buf``
    is not bytes-like."""
    if type(buf) is memoryview:
        return buf.nbytes
    if isinstance(buf, (bytes, bytearray)):
        return len(buf)
    try:
        return memoryview(buf).nbytes
    except TypeError:
        raise ProtocolError(f"a frame must be bytes-like, got {type(buf).__name__}") from None


def unpack_header(buf) -> dict:
    """Decode a header frame with explicit limits: a hostile peer cannot make us allocate much. Strings
    and bins <= 64 KiB, arrays <= 2**18 items, maps <= 1024 pairs, map keys str (or bin), no ext types
    at all (no hook turns bytes into objects; timestamps are ext -1 and refused too), nesting bounded
    by msgpack's own stack (StackError); the frame itself <= MAX_HEADER_BYTES."""
    n = nbytes(buf)
    if n > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {n} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(buf, raw=False, strict_map_key=True, max_str_len=1 << 16, max_bin_len=1 << 16,
                                 max_array_len=1 << 18, max_map_len=1 << 10, max_ext_len=0, ext_hook=_no_ext)
    except Exception as e:  # noqa: BLE001 - msgpack raises several unrelated types for malformed input
        raise ProtocolError(f"malformed msgpack header: {type(e).__name__}: {e!s:.200}") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header must be a map, got {type(header).__name__}")
    return header


def int_field(header: dict, name: str, lo: int = 0, hi: int = MAX_VERSION, default=None) -> int:
    """``header[name]`` as an int in lo..hi (bools refused), or ``default`` when absent and not None."""
    value = header.get(name, default)
    if type(value) is not int or not lo <= value <= hi:
        raise ProtocolError(f"{name!r} must be an int in {lo}..{hi}, got {value!r:.40}")
    return value


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
    if type(dtype) is not str or dtype not in DTYPES:
        raise ProtocolError(f"tensor {key!r:.80}: unknown dtype {dtype!r:.40}")
    if not (isinstance(shape, (list, tuple)) and len(shape) <= MAX_DIMS
            and all(type(d) is int and 0 <= d <= MAX_DIM for d in shape)):
        raise ProtocolError(f"tensor {key!r:.80}: shape must be a list of at most {MAX_DIMS} ints in "
                            f"0..{MAX_DIM}, got {shape!r:.80}")
    if type(nframes) is not int or not 1 <= nframes <= MAX_FRAMES:
        raise ProtocolError(f"tensor {key!r:.80}: nframes must be an int in 1..{MAX_FRAMES}, got {nframes!r:.40}")
    extent = 1
    for d in shape:  # even an empty tensor's strides must fit in int64
        extent *= max(d, 1)
    if extent > MAX_DIM:
        raise ProtocolError(f"tensor {key!r:.80}: shape {shape!r:.80} is too large")
    return key, DTYPES[dtype], tuple(shape), nframes


def _itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize


# zmq frames are read-only and psring only ever reads from a view of one; the warning is filtered once
# here by its message, not per frame with ``catch_warnings`` (which costs more than decoding the frame)
warnings.filterwarnings("ignore", "The given buffer is not writable", UserWarning)


def _view(buf, dtype: torch.dtype) -> torch.Tensor:
    return torch.frombuffer(buf, dtype=dtype)


def frame_tensor(buf, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor viewing ``buf`` (read-only: callers copy out of it, never write into it)."""
    numel = 1
    for d in shape:
        numel *= d
    itemsize, n = _itemsize(dtype), nbytes(buf)
    if n != numel * itemsize:
        raise ProtocolError(f"frame of {n} bytes does not match dtype/shape ({numel * itemsize} bytes)")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    t = _view(buf, dtype)
    return t if len(shape) == 1 else t.view(shape)  # (a view costs microseconds; a chunk is 1-D already)


def _received(key: str, bufs: list, dtype: torch.dtype, shape: tuple[int, ...]) -> Received:
    numel = 1
    for d in shape:
        numel *= d
    if len(bufs) == 1:  # one frame: its length must be exactly dtype x shape
        t = frame_tensor(bufs[0], dtype, shape)
        return Received(dtype, shape, [(0, t if t.dim() == 1 else t.view(-1))])
    itemsize, parts, off = _itemsize(dtype), [], 0
    for buf in bufs:
        size = nbytes(buf)
        if size == 0 or size % itemsize:
            raise ProtocolError(f"tensor {key!r:.80}: a frame of {size} bytes is not a whole number of items")
        n = size // itemsize
        parts.append((off, _view(buf, dtype)))
        off += n
    if off != numel:
        raise ProtocolError(f"tensor {key!r:.80}: its frames hold {off} items, shape needs {numel}")
    return Received(dtype, shape, parts)


def decode_tensors(header: dict, frames: list) -> list[tuple[str, Received]]:
    """Pair the header's ``tensors`` descriptions with the raw frames that follow it, each as a
    ``Received`` viewing its frames (no copy)."""
    return decode_sections(header, frames)["tensors"]


def decode_sections(header: dict, frames: list, fields: tuple[str, ...] = ("tensors",)) -> dict[str, list]:
    """``decode_tensors`` for several header fields (``SECTIONS``) whose frames follow one another in
    ``fields`` order; the frames must be exactly those they describe (so a field this op does not take,
    describing frames, makes the count wrong)."""
    parsed = {}
    for field in fields:
        metas = header.get(field, [])
        if not isinstance(metas, list):
            raise ProtocolError(f"{field!r} must be a list")
        parsed[field] = [parse_meta(m) for m in metas]
    described = sum(p[3] for ps in parsed.values() for p in ps)
    if described != len(frames):
        raise ProtocolError(f"header describes {described} frames but {len(frames)} followed")
    out, i = {}, 0
    for field, ps in parsed.items():
        named = out[field] = []
        for key, dtype, shape, nframes in ps:
            named.append((key, _received(key, frames[i:i + nframes], dtype, shape)))
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
