"""Compressed pushes (``--compress CODEC`` with ``ps``): how a worker's chunk travels encoded, and how a
server reads it back and sums it without ever making it dense first.

Rank 0's init names the codec (``codec``: a spec of ``compress.codecs``, e.g. ``topk:0.01``), like the
optimizer. From then on a push carries, for each key, the codec's parts as tensors named ``KEY/PART``,
in the codec's ``layout`` order (top-k: ``c3/indices`` int32 [k], ``c3/values`` float32 [k]; onebit:
``c3/signs`` uint8 [ceil(n/8)], ``c3/scale`` float32 [1]; fp16: ``c3/values`` float16 [n]), where n is
the key's element count on the server. The server refuses, before anything changes, a push whose parts
are missing, extra, out of order, of another dtype or shape than the layout of that key, or whose values
are invalid (``Codec.check``: top-k's indices outside 0..n-1).

A decoded push is an ``EncodedGrad``: a ``Received`` (the store reads every pushed gradient through
that one interface) whose ``add_into`` is the codec's (a sparse gradient is summed with ``index_add_``,
so a server's work grows with the k elements a worker sent, not with n: the reason top-k suits a
parameter server) and which only becomes a dense tensor where one is needed (an update straight from
one worker's gradient: N=1, ASP/SSP).

Error feedback is the worker's alone (the residual of what its encodings dropped, per chunk): the
server never loses anything itself. Replies: the server-optimizer design answers with the new
parameters, dense (they must be exact). The aggregate design answers with the exact sum in the most
compact form it has: with fp16/bf16 the mean in that dtype; with top-k and random-k the sum's nonzero
elements (``sparse_sum``: at most N*k of them, ``KEY/indices`` int32 and ``KEY/values`` float32 of one
length m <= n), since N sparse vectors add up to a sparse one; with onebit, the dense sum (N sign
vectors do not). A dense reply would cap what compression buys on full-duplex links at nothing: a step
would still move M down however little went up.
"""
from __future__ import annotations

import torch

from ...compress import Codec, CodecState, Encoded
from .protocol import DTYPE_NAMES, ProtocolError
from .received import Received

SEP = "/"


def encode_push(codec: Codec, key: str, flat: torch.Tensor, state: CodecState) -> list[tuple[str, torch.Tensor]]:
    """The tensors of one key's encoded push (contiguous CPU tensors of their own)."""
    enc = codec.encode(flat, state)
    return [(f"{key}{SEP}{part}", t.detach().contiguous().cpu()) for part, t in enc.parts.items()]


class EncodedGrad(Received):
    """A pushed encoding standing for a dense gradient of ``dtype``/``shape`` (the key's)."""

    def __init__(self, codec: Codec, enc: Encoded, dtype: torch.dtype, shape: tuple[int, ...]):
        self.codec, self.enc, self.dtype, self.shape = codec, enc, dtype, torch.Size(shape)
        self._dense: torch.Tensor | None = None

    @property
    def nframes(self) -> int:
        return 1

    @property
    def parts(self) -> list[tuple[int, torch.Tensor]]:
        if self._dense is None:
            self._dense = torch.zeros(self.shape.numel(), dtype=self.dtype)
            self.codec.copy_into(self.enc, self._dense)
        return [(0, self._dense)]

    def add_into(self, dst: torch.Tensor) -> None:
        self.codec.add_into(self.enc, dst.view(-1))

    def copy_into(self, dst: torch.Tensor) -> None:
        self.codec.copy_into(self.enc, dst.view(-1))


def pushed_keys(names: list[str]) -> list[str]:
    """The keys an (accepted) encoded push was for, in order, from its tensors' ``KEY/PART`` names."""
    return list(dict.fromkeys(_part(n)[0] for n in names))


def _part(name: str) -> tuple[str, str]:
    key, sep, part = name.rpartition(SEP)
    return (key, part) if sep else (name, "")


def decode_push(codec: Codec, named: list[tuple[str, Received]],
                params: dict[str, torch.Tensor]) -> list[tuple[str, Received]]:
    """``named`` as pushed (``KEY/PART`` tensors) -> [(key, EncodedGrad)], or ProtocolError naming what
    does not follow the codec's layout for that key."""
    out, i = [], 0
    while i < len(named):
        key, part = _part(named[i][0])
        p = params.get(key)
        if p is None or not part:
            raise ProtocolError(f"pushed tensor {named[i][0]!r:.80}: with codec {codec.name} a push names "
                                f"KEY{SEP}PART for a key of this shard")
        want = codec.layout(p.numel())
        got = named[i:i + len(want)]
        names = [f"{key}{SEP}{w}" for w in want]
        if [n for n, _ in got] != names:
            raise ProtocolError(f"key {key!r:.80}: codec {codec.name} pushes {names}, got "
                                f"{[n for n, _ in got]!r:.120}")
        parts = {}
        for (w, (dtype, shape)), (_, r) in zip(want.items(), got):
            if r.dtype != dtype or tuple(r.shape) != shape:
                raise ProtocolError(f"key {key!r:.80}: part {w} must be {DTYPE_NAMES[dtype]} {list(shape)}, got "
                                    f"{DTYPE_NAMES.get(r.dtype, r.dtype)} {list(r.shape)}")
            parts[w] = r.tensor().view(-1)
        enc = Encoded(parts)
        try:
            codec.check(enc, p.numel())
        except ValueError as e:
            raise ProtocolError(f"key {key!r:.80}: {e}") from None
        out.append((key, EncodedGrad(codec, enc, p.dtype, tuple(p.shape))))
        i += len(want)
    return out



def sparse_sum(key: str, flat: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The aggregate design's reply for a sparse codec: ``flat``'s nonzero elements, indices ascending."""
    idx = flat.nonzero().view(-1)
    return [(f"{key}{SEP}indices", idx.to(torch.int32)), (f"{key}{SEP}values", flat[idx])]


def decode_sparse_sum(codec: Codec, named: list[tuple[str, Received]], key: str, numel: int) -> EncodedGrad:
    """A ``sparse_sum`` reply read back (its indices checked by the codec's own ``check``), or
    ProtocolError."""
    names = [n for n, _ in named]
    want = [f"{key}{SEP}indices", f"{key}{SEP}values"]
    if names != want:
        raise ProtocolError(f"a sparse sum for {key!r:.80} names {want}, got {names!r:.120}")
    (_, idx), (_, val) = named
    m = idx.numel()
    if idx.dtype != torch.int32 or val.dtype != torch.float32 or val.numel() != m or m > numel:
        raise ProtocolError(f"a sparse sum for {key!r:.80} needs int32 indices and float32 values of one "
                            f"length <= {numel}, got {idx.dtype} [{m}] and {val.dtype} [{val.numel()}]")
    enc = Encoded({"indices": idx.tensor().view(-1), "values": val.tensor().view(-1)})
    try:
        codec.check(enc, numel)
    except ValueError as e:
        raise ProtocolError(f"a sparse sum for {key!r:.80}: {e}") from None
    return EncodedGrad(codec, enc, torch.float32, (numel,))
