"""The floor of an overlapped PS step on this machine, beside psring's own run of the same point, alternating.

    python benchmarks/overlap_floor.py [--workers 4] [--servers 4] [--rate 1gbit] [--compute-ms 374]
        [--modes backward,full] [--repeats 3] [--link-cc cubic] [--out results/overlap_floor]          (root)

For each repeat and ``--overlap`` mode, one after the other: psring's PS run (``psring train --sync ps --net
emulated``, ResNet-18 at batch 16 as ``results/overlap`` ran it, every default schedule, told the rate), then
floors of the same point on fresh emulated networks of the same shape (N workers and S servers, each on a host
of its own, the same compute, forward 1/3 and backward 2/3 with each tensor its share by bytes, as ``--compute
emulated`` has it), run by ``psring.bench.paced`` (raw ZeroMQ workers, one thread each, the same priority
schedule and as many credits as psring's) against ``psring.bench.echo`` servers:

- ``echo``: servers that answer each push at once with their own SGD update of it, at psring's chunk: the
  transport, the update and the schedule, no worker waiting for another;
- ``bsp``: servers that acknowledge each push, sum the N workers' pushes of a chunk, update once and answer
  all N (``echo --bsp``): the work of a BSP PS with none of psring's logic, at psring's chunk and at each
  of ``--floor-chunks-kb``.

- ``trainer`` (``--floors bsp,trainer``): the ``bsp`` floor again with the trainer's own work on this machine's
  cores as psring does it (``paced --trainer-work``: zero_grad and the gradients' accumulation), at the same chunks.

``paced``'s docstring lists what the floors leave out. Writes OUT/overlap_floor.csv (one row per run: kind,
mode, repeat, chunk, step p50 (each step its slowest worker's, as psring's summary has it), the bound of its mode, CPU utilisation over the
timed steps, the hosts' TCP congestion control) and OUT/summary.json: per mode the medians (and spreads) of psring's step and each floor's, over
the bound and psring over the BSP floor pair by pair. A floor above 1.10x its bound puts the target out of
this machine's reach for any PS doing that work; psring above its floor is psring's own cost. Run it alone on
a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from psring.bench.floor import cpu_model, timed, watch
from psring.bench.paced import MODES
from psring.bounds import param_bytes, step_bound_s
from psring.config import TrainConfig
from psring.launch.children import Children
from psring.launch.launcher import child_env, launch, start_listeners
from psring.results import load_config
from psring.sweep import flat_config
from psring.net.emulated import EmulatedNetwork
from psring.simulate.plans import link_Bps
from psring.sync.ps.sharding import credit_chunks
from psring.train.emulation import FORWARD_SHARE

START_DELAY_S = 3.0  # workers import numpy and zmq and connect before the common start


def floor_run(n: int, s: int, rate: str, sizes: list[int], chunk: int, credits: int, compute_s: float, mode: str,
              steps: int, warmup: int, scratch: Path, bsp: bool = False, cc: str = "", trainer: bool = False) -> dict:
    """One floor run on a fresh emulated network; its step p50 (each step its slowest worker's), CPU, and the
    TCP congestion control its hosts ran."""
    kids, nbytes = Children(), sum(sizes)
    try:
        with EmulatedNetwork(n + s, rate, cc=cc) as net:
            cc = net.cc
            specs = [(f"echo {i}", net.exec_prefix(n + i) + [
                sys.executable, "-m", "psring.bench.echo", "--port-file", str(scratch / f"echo{i}.addr"),
                "--bind", net.hosts[n + i].addr, "--update-bytes", str(math.ceil(nbytes / s)), "--bsp", str(n if bsp else 0),
                "--idle-timeout", "120"], scratch / f"echo{i}.addr", scratch / f"echo{i}.log") for i in range(s)]
            addrs, sizes_file = scratch / "addrs.json", scratch / "sizes.json"
            sizes_file.write_text(json.dumps(sizes))
            addrs.write_text(json.dumps(start_listeners(kids, specs)))
            start_at = time.time() + START_DELAY_S
            fwd, bwd = compute_s * FORWARD_SHARE, compute_s * (1 - FORWARD_SHARE)
            workers = [kids.spawn(f"paced worker {r}", net.exec_prefix(r) + [
                sys.executable, "-m", "psring.bench.paced", "--addrs", str(addrs), "--sizes", str(sizes_file),
                "--chunk", str(chunk), "--credits", str(credits), "--forward", str(fwd), "--backward", str(bwd),
                "--mode", mode, *(["--keyed"] if bsp else []), *(["--trainer-work"] if trainer else []), "--steps", str(steps), "--start-at", str(start_at), "--out",
                str(scratch / f"worker{r}.json")], child_env(1), scratch / f"worker{r}.log") for r in range(n)]
            samples = watch(workers, time.monotonic() + 120 + steps * 10 * max(compute_s, 0.1),
                            f"{mode}, chunk {chunk}", scratch)
    finally:
        kids.stop_all()
    starts = [json.loads((scratch / f"worker{r}.json").read_text()) for r in range(n)]
    step, cpu = timed(starts, samples, warmup, steps)
    return {"step_s_p50": step, "cpu_util": cpu, "link_cc": cc}


def psring_run(n: int, s: int, rate: str, model: str, compute_ms: int, mode: str, steps: int, warmup: int,
               out: Path, bucket_mb: float | None = None, cc: str = "") -> dict:
    """psring's PS at the point, as ``results/overlap`` ran it (batch 16); ``bucket_mb``: a chunk cap."""
    cfg = TrainConfig(sync="ps", workers=n, servers=s, model=model, batch_size=16, net="emulated", link_rate=rate,
                      compute=f"emulated:{compute_ms}", overlap=mode, steps=steps, warmup=warmup, out=str(out),
                      link_cc=cc, **({"bucket_mb": bucket_mb} if bucket_mb else {}))
    summ = launch(cfg, echo=False, overwrite=True)
    row = {**flat_config(TrainConfig.from_dict(load_config(out))), **summ}  # as runs.csv has a run
    return {"step_s_p50": summ["step_s_p50"], "cpu_util": summ.get("cpu_util"),
            "cpu_util_sync": summ.get("cpu_util_sync"), "cpu_saturated": summ.get("cpu_saturated"),
            "chunk_bytes": summ["chunk_bytes"],
            "link_cc": summ.get("link_cc"), "row": row}


def bound_at(row: dict, nbytes: int, chunk: int) -> float:
    """The step bound of psring's run (``bounds.step_bound_s``: its mode, compute and the PS's pipeline term)
    had it cut ``chunk``-byte chunks."""
    return step_bound_s({**row, "chunk_bytes": chunk}, nbytes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--compute-ms", type=int, default=374, help="emulated compute a step (default: M/B at 1 Gbit)")
    ap.add_argument("--modes", default="backward,full")
    ap.add_argument("--floor-chunks-kb", default="128,256,1024", help="the floor's chunk ladder, beside psring's own")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--floors", default="bsp", help="bsp, trainer (the BSP floor with the trainer's work), or both")
    ap.add_argument("--link-cc", default="", help="TCP congestion control on every host (default: the machine's)")
    ap.add_argument("--out", default="results/overlap_floor")
    a = ap.parse_args(argv)
    modes = [m for m in a.modes.split(",") if m]
    floors = [f for f in a.floors.split(",") if f]
    if not modes or set(modes) - set(MODES) or a.workers < 1 or a.servers < 1 or a.repeats < 1 or not floors or \
            set(floors) - {"bsp", "trainer"}:
        raise SystemExit(f"overlap_floor: --modes of {', '.join(MODES)}, --floors of bsp, trainer, N, S and --repeats >= 1")
    n, s, out = a.workers, a.servers, Path(a.out)
    sizes = list(param_bytes(a.model))
    nbytes = sum(sizes)
    link = link_Bps(a.rate)
    credits = credit_chunks((link, link), n, s)
    compute_s = a.compute_ms / 1000
    ladder = [int(x) * 1024 for x in a.floor_chunks_kb.split(",") if x]
    rows, t_start = [], time.time()
    out.mkdir(parents=True, exist_ok=True)

    def record(kind: str, mode: str, rep: int, chunk: int, r: dict, bound: float) -> None:
        rows.append({"kind": kind, "mode": mode, "repeat": rep, "chunk_bytes": chunk, "credits": credits,
                     "step_s_p50": r["step_s_p50"], "bound_s": bound, "cpu_util": r["cpu_util"],
                     "cpu_util_sync": r.get("cpu_util_sync"), "cpu_saturated": r.get("cpu_saturated"),
                     "link_cc": r["link_cc"]})
        print(f"rep {rep} {mode:8} {kind:6} chunk {chunk:>8}: {r['step_s_p50']:.3f} s "
              f"({r['step_s_p50'] / bound:.3f}x), cpu {r['cpu_util']:.2f}", flush=True)

    for rep in range(a.repeats):
        for mode in modes:
            r = psring_run(n, s, a.rate, a.model, a.compute_ms, mode, a.steps, a.warmup,
                           out / "runs" / f"psring_{mode}_{rep}", cc=a.link_cc)
            record("psring", mode, rep, int(r["chunk_bytes"]), r, bound_at(r["row"], nbytes, int(r["chunk_bytes"])))
            own = int(r["chunk_bytes"])
            chunks = [own, *(c for c in ladder if c != own)]
            for kind, chunk in [("echo", own), *((k, c) for c in chunks for k in floors)]:
                scratch = Path(tempfile.mkdtemp(prefix="psring-floor-"))  # kept where a run fails: its logs
                f = floor_run(n, s, a.rate, sizes, chunk, credits, compute_s, mode, a.steps, a.warmup, scratch,
                              bsp=kind != "echo", cc=a.link_cc, trainer=kind == "trainer")
                shutil.rmtree(scratch)
                record(kind, mode, rep, chunk, f, bound_at(r["row"], nbytes, chunk))
    df = pd.DataFrame(rows)
    df.to_csv(out / "overlap_floor.csv", index=False)
    summary = {"machine": platform.processor() or platform.machine(), "cpu": cpu_model(), "workers": n, "servers": s,
               "rate": a.rate,
               "model": a.model, "compute_s": compute_s, "credits": credits, "repeats": a.repeats,
               "minutes": round((time.time() - t_start) / 60, 1), "link_cc": sorted(set(df["link_cc"].dropna()))}
    for mode in modes:
        m = df[df["mode"] == mode]
        own = m[m.kind == "psring"]
        chunk = int(own["chunk_bytes"].median())
        at_own = lambda kind: m[(m.kind == kind) & (m.chunk_bytes == chunk)].set_index("repeat")["step_s_p50"]  # noqa: E731
        ps, bound = own.set_index("repeat")["step_s_p50"], own["bound_s"].median()
        summary[mode] = {"bound_s": bound, "psring_chunk_bytes": chunk, "psring_s": ps.median(),
                         "psring_spread_s": ps.max() - ps.min(), "psring_over_bound": ps.median() / bound,
                         "echo_s": at_own("echo").median(), "echo_over_bound": at_own("echo").median() / bound}
        for kind in floors:  # the BSP floor's keys: bsp_*; the trainer floor's: trainer_*
            f = m[m.kind == kind].assign(over=lambda d: d["step_s_p50"] / d["bound_s"])
            best_chunk = int(f.groupby("chunk_bytes")["over"].median().idxmin())  # nearest its own bound
            best = f[f.chunk_bytes == best_chunk].set_index("repeat")["step_s_p50"]
            summary[mode] |= {f"{kind}_s": at_own(kind).median(), f"{kind}_spread_s": at_own(kind).max() - at_own(kind).min(),
                              f"{kind}_over_bound": at_own(kind).median() / bound, f"{kind}_best_s": best.median(),
                              f"{kind}_best_chunk_bytes": best_chunk,
                              f"{kind}_best_bound_s": f[f.chunk_bytes == best_chunk]["bound_s"].median(),
                              f"{kind}_best_over_bound": best.median() / f[f.chunk_bytes == best_chunk]["bound_s"].median(),
                              f"psring_over_{kind}": (ps / at_own(kind)).median()}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
