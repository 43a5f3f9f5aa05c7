"""TCP's congestion control on the emulated links, against the replay: the hand-written ring, torch's all-reduce
and the PS (S = N) at N = 4, 100 Mbit, each under cubic and under bbr (``--link-cc``), alternating.

    python benchmarks/congestion.py [--repeats 3] [--out results/simulate]          (root)

The point is the one of ``results/compression_sync`` (ResNet-18's gradients, batch 32, compute emulated as a
200 ms wait, ``--overlap none``, every worker and server its own host; ps: the aggregate design), where
``results/simulate/validation.csv`` has the hand-written ring's sync 12% above its replay and torch's all-reduce
4% above. Each repeat runs every strategy under both congestion controls, one run at a time. Writes
``OUT/congestion.csv``: one row per run (strategy, congestion control asked for and the one the hosts ran,
repeat, sync and step p50, CPU utilisation) with the replay's sync for the same configuration (its
``validation.csv`` row) and the ratio. Run it alone on the machine.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from psring.config import TrainConfig
from psring.launch.launcher import launch
from psring.net import tcp

ROOT = Path(__file__).resolve().parents[1]
SYNCS = {"ring": 1, "allreduce": 1, "ps": 4}  # strategy: servers
VALIDATED = "compression_sync"  # validation.csv's folder whose runs have this setting


def replayed_sync_s(validation: pd.DataFrame, sync: str) -> float:
    """The replay's sync p50 of this point: ``validation.csv``'s row for it (torch's all-reduce is replayed the
    same as the ring: one schedule)."""
    rows = validation[(validation.workers == 4) & (validation.link_rate == "100mbit")
                      & (validation.compress == "none") & (validation.overlap == "none")]
    own = rows[(rows.folder == VALIDATED) & (rows.sync == sync)]
    if own.empty:
        own = rows[rows.sync == "ring"]
    return float(own["sim_sync_s"].iloc[0])


def run(sync: str, cc: str, out: Path) -> dict:
    cfg = TrainConfig(sync=sync, workers=4, servers=SYNCS[sync], model="resnet18", batch_size=32, net="emulated",
                      link_rate="100mbit", compute="emulated:200", overlap="none", steps=5, warmup=1,
                      link_cc=cc, out=str(out), **({"ps_design": "aggregate"} if sync == "ps" else {}))
    return launch(cfg, echo=False, overwrite=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ccs", default="cubic,bbr", help="congestion controls to compare")
    ap.add_argument("--out", default="results/simulate")
    a = ap.parse_args(argv)
    ccs = [c for c in a.ccs.split(",") if c]
    if a.repeats < 1 or not ccs or any(tcp.unknown(c) for c in ccs):
        sys.exit(f"congestion: --repeats >= 1 and --ccs of {', '.join(tcp.offered())}, got {a.repeats} and {a.ccs!r}")
    validation = pd.read_csv(ROOT / "results" / "simulate" / "validation.csv")
    replays = {sync: replayed_sync_s(validation, sync) for sync in SYNCS}  # before the first run: a missing row fails here
    rows, t0 = [], time.time()
    with tempfile.TemporaryDirectory(prefix="psring-cc-") as scratch:
        for rep in range(a.repeats):
            for sync in SYNCS:
                for cc in ccs:
                    s = run(sync, cc, Path(scratch) / f"{sync}-{cc}-{rep}")
                    replay = replays[sync]
                    rows.append({"sync": sync, "link_cc": cc, "ran_cc": s["link_cc"], "repeat": rep,
                                 "sync_s_p50": s["sync_s_p50"], "step_s_p50": s["step_s_p50"],
                                 "cpu_util": s["cpu_util"], "replay_sync_s": replay,
                                 "sync_over_replay": s["sync_s_p50"] / replay})
                    print(f"rep {rep} {sync:9} {cc:6}: sync {s['sync_s_p50']:.3f} s, "
                          f"{s['sync_s_p50'] / replay:.3f}x the replay, cpu {s['cpu_util']:.2f}", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(rows)
    df.to_csv(out / "congestion.csv", index=False)
    print(df.groupby(["sync", "link_cc"])["sync_over_replay"].agg(["median", "min", "max"]).round(3).to_string())
    print(f"{(time.time() - t0) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
