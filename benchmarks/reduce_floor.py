"""The floor of an overlapped all-reduce step on this machine, beside psring's own run of the same point, alternating.

    python benchmarks/reduce_floor.py [--sync allreduce] [--workers 8] [--rate 1gbit] [--compute-ms 654]
        [--modes full] [--partitions-mb 1,2,3.5,5,7] [--repeats 3] [--out results/reduce_floor]          (root)

For each repeat and ``--overlap`` mode, one after the other: psring's run (``psring train --net emulated``,
ResNet-18 at batch 16 as ``results/overlap_n8_1gbit`` ran it, every default schedule: the partition probed),
then floors of the same point on fresh emulated networks of the same shape (N workers, each a host of its
own, the same compute, forward 1/3 and backward 2/3 with each tensor its share by bytes, as ``--compute
emulated`` has it), run by ``psring.bench.reduce_paced``: raw gloo all-reduces in one thread each, in a fixed
priority order with two in flight, as psring's scheduler keeps them, cut as psring cuts them (``--flat``: equal
slices), at psring's partition and at each of ``--partitions-mb``. ``reduce_paced``'s docstring lists what the floor leaves out.
``--floors plain,trainer`` runs each floor twice, the second (kind ``trainer``) with the trainer's own work on
this machine's cores as psring does it (``reduce_paced --trainer-work``: zero_grad, the gradients' accumulation,
and psring's fused momentum-SGD update in place of plain SGD).

Writes OUT/reduce_floor.csv (one row per run: kind, mode, repeat, partition, step p50 (each step its slowest
worker's, as psring's summary has it), the bound of its mode (with the run's own update time), CPU utilisation
over the timed steps) and OUT/summary.json: per mode the medians (and spreads) of psring's step and each
floor's, over its bound. A floor above 1.10x its bound at every partition puts issue #29's target out of this
machine's reach for any all-reduce doing that work; psring above its floor is psring's own cost. Run it alone
on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from psring.bench.floor import cpu_model, timed, watch
from psring.bench.reduce_paced import MODES
from psring.bounds import param_bytes, step_bound_s
from psring.config import TrainConfig
from psring.launch.children import Children
from psring.launch.launcher import child_env, free_port, launch
from psring.net.emulated import EmulatedNetwork
from psring.results import load_config
from psring.simulate.plans import link_Bps
from psring.sweep import flat_config
from psring.train.emulation import FORWARD_SHARE

START_DELAY_S = 6.0  # ranks import torch, meet at the store and connect gloo's pairs before the common start


def floor_run(n: int, rate: str, sizes: list[int], partition: int, compute_s: float, mode: str, steps: int,
              warmup: int, scratch: Path, flat: bool = False, trainer: bool = False) -> dict:
    """One floor run on a fresh emulated network: its step p50 (each step its slowest rank's), the ranks'
    median update seconds a step, and CPU."""
    kids = Children()
    try:
        with EmulatedNetwork(n, rate) as net:
            sizes_file = scratch / "sizes.json"
            sizes_file.write_text(json.dumps(sizes))
            start_at, port = time.time() + START_DELAY_S, free_port()
            fwd, bwd = compute_s * FORWARD_SHARE, compute_s * (1 - FORWARD_SHARE)
            ranks = [kids.spawn(f"reduce floor rank {r}", net.exec_prefix(r) + [
                sys.executable, "-m", "psring.bench.reduce_paced", "--sizes", str(sizes_file), "--partition",
                str(partition), "--forward", str(fwd), "--backward", str(bwd), "--link-Bps", str(link_Bps(rate)),
                "--mode", mode, *(["--flat"] if flat else []), *(["--trainer-work"] if trainer else []), "--steps", str(steps), "--start-at", str(start_at), "--out",
                str(scratch / f"rank{r}.json")],
                child_env(1, RANK=r, WORLD_SIZE=n, MASTER_ADDR=net.hosts[0].addr, MASTER_PORT=port,
                          GLOO_SOCKET_IFNAME=net.hosts[0].iface), scratch / f"rank{r}.log") for r in range(n)]
            samples = watch(ranks, time.monotonic() + 120 + steps * 10 * max(compute_s, 0.1),
                            f"{mode}, partition {partition}", scratch)
    finally:
        kids.stop_all()
    got = [json.loads((scratch / f"rank{r}.json").read_text()) for r in range(n)]
    step, cpu = timed([g["starts"] for g in got], samples, warmup, steps)
    update = statistics.median(statistics.median(g["update_s"][warmup:]) for g in got)
    return {"step_s_p50": step, "update_s_p50": update, "cpu_util": cpu}


def psring_run(sync: str, n: int, rate: str, model: str, compute_ms: int, mode: str, steps: int, warmup: int,
               out: Path) -> dict:
    """psring's run of the point, as ``results/overlap_n8_1gbit`` ran it (batch 16, the partition probed)."""
    cfg = TrainConfig(sync=sync, workers=n, model=model, batch_size=16, net="emulated", link_rate=rate,
                      compute=f"emulated:{compute_ms}", overlap=mode, steps=steps, warmup=warmup, out=str(out))
    summ = launch(cfg, echo=False, overwrite=True)
    row = {**flat_config(TrainConfig.from_dict(load_config(out))), **summ}  # as runs.csv has a run
    return {"step_s_p50": summ["step_s_p50"], "cpu_util": summ.get("cpu_util"),
            "cpu_util_sync": summ.get("cpu_util_sync"), "cpu_saturated": summ.get("cpu_saturated"),
            "update_s_p50": summ["update_s_p50"],
            "partition_bytes": int(summ["partition_bytes"]), "row": row}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sync", default="allreduce", help="psring's strategy beside the floor (allreduce, ring)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--compute-ms", type=int, default=654, help="emulated compute a step (default: 2(N-1)/N M/B)")
    ap.add_argument("--modes", default="full")
    ap.add_argument("--partitions-mb", default="1,2,3.5,5,7", help="the floor's partition ladder (MiB), beside psring's")
    ap.add_argument("--flat", action="store_true", help="the floors cut equal slices, not psring's partitions")
    ap.add_argument("--floors", default="plain", help="plain, trainer (the trainer's own work in: the docstring), or both")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="results/reduce_floor")
    a = ap.parse_args(argv)
    modes = [m for m in a.modes.split(",") if m]
    floors = [f for f in a.floors.split(",") if f]
    if not modes or set(modes) - set(MODES) or a.workers < 2 or a.repeats < 1 or not floors or \
            set(floors) - {"plain", "trainer"}:
        raise SystemExit(f"reduce_floor: --modes of {', '.join(MODES)}, --floors of plain, trainer, N >= 2 and "
                         f"--repeats >= 1")
    n, out = a.workers, Path(a.out)
    sizes = list(param_bytes(a.model))
    nbytes = sum(sizes)
    ladder = [int(float(x) * 2**20) for x in a.partitions_mb.split(",") if x]
    rows, t_start = [], time.time()
    out.mkdir(parents=True, exist_ok=True)

    def record(kind: str, mode: str, rep: int, part: int, r: dict, row: dict) -> None:
        bound = step_bound_s({**row, "update_s_p50": r["update_s_p50"]}, nbytes)
        cut = "flat" if kind != "psring" and a.flat else "aligned"
        rows.append({"kind": kind, "mode": mode, "repeat": rep, "partition_bytes": part, "cut": cut,
                     "step_s_p50": r["step_s_p50"], "update_s_p50": r["update_s_p50"], "bound_s": bound, "cpu_util": r["cpu_util"],
                     "cpu_util_sync": r.get("cpu_util_sync"), "cpu_saturated": r.get("cpu_saturated")})
        print(f"rep {rep} {mode:8} {kind:6} partition {part:>9}: {r['step_s_p50']:.3f} s "
              f"({r['step_s_p50'] / bound:.3f}x), cpu {r['cpu_util']:.2f}", flush=True)

    for rep in range(a.repeats):
        for mode in modes:
            r = psring_run(a.sync, n, a.rate, a.model, a.compute_ms, mode, a.steps, a.warmup,
                           out / "runs" / f"psring_{mode}_{rep}")
            record("psring", mode, rep, r["partition_bytes"], r, r["row"])
            for part in [r["partition_bytes"], *ladder]:
                for kind in floors:
                    scratch = Path(tempfile.mkdtemp(prefix="psring-rfloor-"))  # kept where a run fails: its logs
                    f = floor_run(n, a.rate, sizes, part, a.compute_ms / 1000, mode, a.steps, a.warmup, scratch, a.flat,
                                  trainer=kind == "trainer")
                    shutil.rmtree(scratch)
                    record("floor" if kind == "plain" else "trainer", mode, rep, part, f, r["row"])
    df = pd.DataFrame(rows)
    df.to_csv(out / "reduce_floor.csv", index=False)
    df["over"] = df["step_s_p50"] / df["bound_s"]
    summary = {"machine": platform.processor() or platform.machine(), "cpu": cpu_model(), "sync": a.sync,
               "workers": n, "rate": a.rate,
               "model": a.model, "compute_s": a.compute_ms / 1000, "repeats": a.repeats,
               "minutes": round((time.time() - t_start) / 60, 1)}
    for mode in modes:
        m = df[df["mode"] == mode]
        own = m[m.kind == "psring"]
        summary[mode] = {"psring_s": own["step_s_p50"].median(), "psring_over_bound": own["over"].median(),
                         "psring_spread_s": own["step_s_p50"].max() - own["step_s_p50"].min(),
                         "psring_partition_bytes": own["partition_bytes"].tolist()}
        for kind in ("floor", "trainer"):  # (the trainer floor's keys: trainer_*)
            by = m[(m.kind == kind) & m.partition_bytes.isin(ladder)].groupby("partition_bytes")
            if len(by):
                summary[mode] |= {f"{kind}_over_bound": {int(k): round(v, 4) for k, v in by["over"].median().items()},
                                  f"{kind}_s": {int(k): round(v, 4) for k, v in by["step_s_p50"].median().items()},
                                  f"{kind}_best_over_bound": by["over"].median().min()}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
