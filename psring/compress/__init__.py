"""Gradient compression: the codec interface (``base``), the codecs with their parser (``codecs``) and the
specs as text (``spec``, torch-free). The all-reduce family uses them through
``sync.compressed.CompressedReducer``, the parameter server through ``sync.ps.encoded`` (encoded pushes,
summed on the servers). The names below load torch on first use only, so that reading a spec does not."""
from __future__ import annotations

__all__ = ["Codec", "CodecState", "Encoded", "parse"]


def __getattr__(name: str):
    if name in ("Codec", "CodecState", "Encoded"):
        from . import base

        return getattr(base, name)
    if name == "parse":
        from .codecs import parse

        return parse
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
