"""Reading JSON-lines records (steps, per-rank and server files) without importing torch, so that
``psring.plot`` and ``psring.results`` stay light."""
from __future__ import annotations

import json
from pathlib import Path


def read_jsonl(path: Path) -> list[dict]:
    """Records of a JSON-lines file; a torn last line (a crashed run) is skipped."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
