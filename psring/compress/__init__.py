"""Gradient compression: the codec interface (``base``) and the codecs with their spec parser (``codecs``).
The all-reduce family uses them through ``sync.compressed.CompressedReducer``, the parameter server through
``sync.ps.encoded`` (encoded pushes, summed on the servers)."""
from .base import Codec, CodecState, Encoded
from .codecs import parse

__all__ = ["Codec", "CodecState", "Encoded", "parse"]
