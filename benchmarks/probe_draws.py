"""What the reduce family's link probe draws, start after start, in two source trees alternating (root: an emulated
cluster):

    git worktree add --detach /tmp/a HEAD~1
    python benchmarks/probe_draws.py /tmp/a . --starts 4 --syncs ring,allreduce --modes full,backward --out DIR

Each start is ``psring train --sync SYNC --workers 8 --net emulated --link-rate 1gbit --model resnet18 --batch-size
16 --compute emulated:654 --overlap MODE --link-tuning probe`` with ``PYTHONPATH`` at its tree (run from the tree),
``--steps 2 --warmup 1`` by default: a start is its probe, and only ``tuned.json`` (what the probe measured and the
partition it cut) is read; ``--steps 12 --warmup 4`` times the start too. Which tree goes first flips each start.
Writes ``DIR/probe_draws.csv``, one row per start: its arm, strategy, mode, the probe's rate, fixed cost, a 4 kB
call's time and CPU where the tree records them, the partition and the link's and the cores' cuts (and its step p50
over its bound where timed). Run folders go to a temporary folder and are removed.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import pandas as pd
from ps_order_ab import measured  # (benchmarks/ is on the path: this script's own folder)
from tree_ab import train_in, trees_ok

COMPUTE_MS = {4: 561, 8: 654}  # compute:comm = 1 for the reduce family at 1 Gbit (results/overlap)


def start(tree: str, sync: str, mode: str, a, out: Path) -> dict:
    args = ["--sync", sync, "--workers", str(a.workers), "--net", "emulated", "--link-rate", a.link_rate,
            "--model", "resnet18", "--batch-size", "16", "--compute", f"emulated:{COMPUTE_MS[a.workers]}",
            "--overlap", mode, "--link-tuning", "probe", "--steps", str(a.steps), "--warmup", str(a.warmup)]
    train_in(tree, args, out)
    row = json.loads((out / "tuned.json").read_text())
    if a.steps > 2:
        s, bound = measured(out)
        row.update(step_s=s["step_s_p50"], bound_s=bound, step_over_bound=s["step_s_p50"] / bound,
                   cpu_util=s.get("cpu_util"), cpu_util_sync=s.get("cpu_util_sync"))
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tree_a")
    ap.add_argument("tree_b")
    ap.add_argument("--starts", type=int, default=4)
    ap.add_argument("--syncs", default="ring,allreduce")
    ap.add_argument("--modes", default="full,backward")
    ap.add_argument("--workers", type=int, default=8, choices=sorted(COMPUTE_MS))
    ap.add_argument("--link-rate", default="1gbit")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if not trees_ok(a.tree_a, a.tree_b):
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="psring-probe-draws-") as tmp:
        for n in range(a.starts):
            for sync in a.syncs.split(","):
                for mode in a.modes.split(","):
                    arms = (("A", a.tree_a), ("B", a.tree_b))
                    for arm, tree in arms if n % 2 == 0 else arms[::-1]:
                        got = start(tree, sync, mode, a, Path(tmp) / f"{arm}{n}{sync}{mode}")
                        rows.append({"start": n, "arm": arm, "strategy": sync, "overlap": mode, **got})
                        print(n, arm, sync, mode, {k: got.get(k) for k in ("probe_fixed_ms", "probe_call_ms",
                              "probe_rate_Bps", "partition_bytes", "step_over_bound")}, flush=True)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(Path(a.out) / "probe_draws.csv", index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
