"""The PS's overlapped schedule at issue #29's N = 4, 1 Gbit point, replayed without any CPU: how far its own
schedule (chunks, credits, BSP) sits from the bound at each chunk size and credit, with no per-message cost.

    python benchmarks/ps_schedule_replay.py --out results/overlap_floor

Replays the committed ``--overlap full`` and ``backward`` runs of results/overlap (ps S=4, N=4, 1 Gbit) with
``psring simulate``'s flow network (``simulate(..., tuned={"chunk_bytes": ...})``, the same pump, credits and
acks the workers run) at chunks of 128 KiB to psring's fitted 474 KiB and credits of 1 to 8 chunks, and the
chunks again under ``--ps-order planned`` (``transport.push_order``), and writes ``ps_schedule_replay.csv``: one
row per replay with its step, the step's bound at that chunk (``bounds.step_bound_s``, as ``psring bounds``
reads a run) and their ratio. Seconds, no root.
"""
from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

import pandas as pd

from psring.bounds import with_bounds
from psring.config import TrainConfig
from psring.simulate.run import simulate

ROOT = Path(__file__).resolve().parent.parent
RUN = ("sync-ps_workers-4_servers-4_compute-emulated:374_link_rate-1gbit_link_tuning-auto_overlap-{mode}_steps-12"
       "_trace-False_warmup-4")
CHUNKS_KIB = (128, 192, 256, 384, 474)
CREDIT_CHUNKS = (1, 2, 4, 8)


def replay(cfg: TrainConfig, chunk: int, credit_chunks: int | None, scratch: Path, order: str = "priority") -> dict:
    cfg = dataclasses.replace(cfg, ps_order=order)
    if credit_chunks is not None:
        cfg = dataclasses.replace(cfg, ps_credit_mb=credit_chunks * chunk / 2**20)
    s = simulate(cfg, scratch / f"{cfg.overlap}-{chunk}-{credit_chunks}-{order}", tuned={"chunk_bytes": chunk})
    row = {**cfg.to_dict(), **s, "chunk_bytes": chunk}
    bound = float(with_bounds(pd.DataFrame([row]))["step_bound_s"].iloc[0])
    return {"overlap": cfg.overlap, "ps_order": order, "chunk_bytes": chunk, "credit_chunks": credit_chunks or 2,
            "step_s": s["step_s_p50"], "bound_s": bound, "step_over_bound": s["step_s_p50"] / bound}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/overlap_floor")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="psring-ps-replay-") as tmp:
        for mode in ("full", "backward"):
            cfg = TrainConfig.load(ROOT / "results" / "overlap" / "runs" / RUN.format(mode=mode) / "config.json")
            for kib in CHUNKS_KIB:
                rows.append(replay(cfg, kib * 1024, None, Path(tmp)))
                print(rows[-1], flush=True)
            for c in CREDIT_CHUNKS:
                if c != 2:  # (2, the default, is in the chunk rows)
                    rows.append(replay(cfg, CHUNKS_KIB[-1] * 1024, c, Path(tmp)))
                    print(rows[-1], flush=True)
            for kib in CHUNKS_KIB:
                rows.append(replay(cfg, kib * 1024, None, Path(tmp), "planned"))
                print(rows[-1], flush=True)
    out = Path(a.out) / "ps_schedule_replay.csv"
    pd.DataFrame(rows).to_csv(out, index=False)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
