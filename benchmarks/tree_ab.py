"""Two source trees of psring at one emulated PS point, in alternating pairs (root: an emulated cluster):

    git worktree add --detach /tmp/a HEAD~1 && git worktree add --detach /tmp/b HEAD
    python benchmarks/tree_ab.py /tmp/a /tmp/b --pairs 3 --overlap full --out DIR

Each run is ``psring train`` with ``PYTHONPATH`` at its tree (run from the tree, so nothing else is imported): ps
S = N, ResNet-18, batch 16, ``--net emulated``, compute:comm = 1 by default (the PS's no-overlap bound M/B: 374 ms
at 1 Gbit), as ``results/overlap``'s rows; which arm goes first flips each pair. Writes ``DIR/tree_ab.csv``: one
row per run (its arm, its step p50, its bound, ``bounds.step_bound_s``, their ratio, its CPU, while synchronising
too) and prints each pair's ratio B / A. Run folders go to a temporary folder and are removed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
from ps_order_ab import measured, point  # (benchmarks/ is on the path: this script's own folder)


def trees_ok(*trees: str) -> bool:
    """Whether every tree is a psring source tree; else one line on stderr (the caller exits 2)."""
    for tree in trees:
        if not (Path(tree) / "psring" / "__init__.py").is_file():
            print(f"error: {tree} is not a psring source tree (no psring/__init__.py)", file=sys.stderr)
            return False
    return True


def train_in(tree: str, args: list[str], out: Path) -> None:
    """``psring train ARGS --out OUT`` with ``PYTHONPATH`` at ``tree``, run from it (nothing else imported)."""
    env = {**os.environ, "PYTHONPATH": tree}
    subprocess.run([sys.executable, "-m", "psring", "train", *args, "--out", str(out)], check=True, timeout=600,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tree)


def run(tree: str, args: list[str], out: Path) -> dict:
    train_in(tree, args, out)
    s, bound = measured(out)
    return {"step_s": s["step_s_p50"], "bound_s": bound, "step_over_bound": s["step_s_p50"] / bound,
            "backward_s": s.get("backward_s_p50"), "cpu_util": s.get("cpu_util"),
            "cpu_util_sync": s.get("cpu_util_sync"), "chunk_bytes": s.get("chunk_bytes")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tree_a")
    ap.add_argument("tree_b")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--overlap", default="full")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--link-rate", default="1gbit")
    ap.add_argument("--compute", default="emulated:374")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--link-tuning", default="auto")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if not trees_ok(a.tree_a, a.tree_b):
        return 2
    args = [*point(a), "--overlap", a.overlap]  # ps_order_ab's point: the same runs as its A/B
    rows, ratios = [], []
    with tempfile.TemporaryDirectory(prefix="psring-tree-ab-") as tmp:
        for pair in range(a.pairs):
            arms = (("A", a.tree_a), ("B", a.tree_b))
            got = {}
            for arm, tree in arms if pair % 2 == 0 else arms[::-1]:
                got[arm] = run(tree, args, Path(tmp) / f"{arm}{pair}")
                rows.append({"pair": pair, "arm": arm, "overlap": a.overlap, "workers": a.workers,
                             "link_rate": a.link_rate, **got[arm]})
            ratios.append(got["B"]["step_s"] / got["A"]["step_s"])
            print(pair, {k: round(v["step_over_bound"], 3) for k, v in got.items()}, "B / A", round(ratios[-1], 3),
                  flush=True)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(Path(a.out) / "tree_ab.csv", index=False)
    print("median B / A", round(statistics.median(ratios), 3))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
