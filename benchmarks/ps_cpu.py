"""Where a PS step's CPU goes, thread by thread: psring's PS on loopback, where no link is waited on and
every cost is the CPU's, at the chunk and credits the emulated 1 Gbit point cuts (issue #29's ps S = N = 4).

    python benchmarks/ps_cpu.py [--workers 4] [--servers 4] [--chunk-mb 0.4633] [--credit-chunks 2]
        [--compute-ms 374] [--steps 50] [--warmup 8] [--repeats 3] [--label L [--append]] [--out results/ps_cpu]

Each repeat runs ``psring train --sync ps --overlap full`` (ResNet-18, batch 16, emulated compute, the link
tuning off so that the chunk and credits are the ones given) and reads every thread of its processes from
``/proc/PID/task`` when rank 0 has logged ``--warmup`` steps and again ``--steps - --warmup - 2`` steps later.
Per role (worker, server) and thread, CPU milliseconds a step per process: ``main`` (the trainer's loop; the
server's loop), ``other`` (the worker's PS communication thread, pyzmq's garbage thread), ``zmq-io``
(ZeroMQ's I/O threads: the sockets' system calls); and the machine's core-seconds a step over the same window
(``/proc/stat``, the kernel included). Writes OUT/ps_cpu.csv (one row per repeat, role and thread, and
``--label``; ``--append`` adds to the table there) and prints the medians. The CPU a message costs decides
how small the PS's chunks can be on a machine's cores (``sharding.cores_chunks``). Run it alone on a quiet
machine. For a before/after, run it from outside any checkout (``python -m psring`` takes the working
directory's ``psring`` first) with ``PYTHONPATH`` set to the other checkout: its processes then run that psring.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd

from psring.config import TrainConfig
from psring.launch.launcher import launch
from psring.metrics.cpu import cpu_times

TICK_S = 1 / os.sysconf("SC_CLK_TCK")  # /proc's CPU times are in these clock ticks


def threads_of(out: Path) -> dict:
    """{(pid, tid): (role, thread kind, CPU ticks)} of the run's worker and server processes."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if str(out) not in cmd or " -m psring " not in cmd:
                continue
            role = "server" if " server " in cmd else "worker" if " worker " in cmd else None
            for tid in os.listdir(f"/proc/{pid}/task") if role else ():
                stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
                name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
                kind = "main" if tid == pid else "zmq-io" if name.startswith("ZMQbg") else "other"
                found[pid, tid] = (role, kind, int(fields[11]) + int(fields[12]))
        except (OSError, ValueError):
            continue  # a process or thread that ended between the listing and the read
    return found


def logged(out: Path) -> int:
    try:
        return sum(1 for _ in open(out / "ranks" / "rank0.jsonl"))
    except OSError:
        return 0


def sample(out: Path, first: int, last: int, got: dict) -> None:
    """Snapshots once rank 0 has logged ``first`` and ``last`` steps (into ``got``)."""
    for key, steps in (("a", first), ("b", last)):
        while logged(out) < steps:
            if got.get("stop"):
                return
            time.sleep(0.02)
        got[key] = (logged(out), threads_of(out), cpu_times())


def one_run(a, out: Path) -> list[dict]:
    cfg = TrainConfig(sync="ps", workers=a.workers, servers=a.servers, model="resnet18", batch_size=16,
                      compute=f"emulated:{a.compute_ms}", overlap="full", steps=a.steps, warmup=a.warmup,
                      bucket_mb=a.chunk_mb, ps_credit_mb=a.credit_chunks * a.chunk_mb, link_tuning="off",
                      out=str(out))
    got: dict = {}
    sampler = threading.Thread(target=sample, args=(out, a.warmup, a.steps - 2, got), daemon=True)
    sampler.start()
    try:
        launch(cfg, echo=False, overwrite=True)
    finally:
        got["stop"] = True
        sampler.join(timeout=5)
    if "b" not in got:
        raise SystemExit("ps_cpu: the run ended before its second sample; give it more --steps")
    (n0, t0, c0), (n1, t1, c1) = got["a"], got["b"]
    steps = n1 - n0
    per: dict = {}
    for key, (role, kind, ticks) in t1.items():
        if key in t0:
            per.setdefault((role, kind), {}).setdefault(key[0], 0)
            per[role, kind][key[0]] += ticks - t0[key][2]
    rows = [{"role": role, "thread": kind, "processes": len(pids),
             "ms_per_step": sum(pids.values()) * TICK_S * 1000 / steps / len(pids)}
            for (role, kind), pids in sorted(per.items())]
    rows.append({"role": "machine", "thread": "all cores", "processes": None,
                 "ms_per_step": (c1[0] - c0[0]) * TICK_S * 1000 / steps})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--chunk-mb", type=float, default=0.4633, help="the chunk cap (default: the 1 Gbit point's)")
    ap.add_argument("--credit-chunks", type=int, default=2)
    ap.add_argument("--compute-ms", type=int, default=374)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--label", default="", help="a name for these runs' rows (e.g. the checkout)")
    ap.add_argument("--append", action="store_true", help="add the rows to OUT/ps_cpu.csv instead of replacing it")
    ap.add_argument("--out", default="results/ps_cpu")
    a = ap.parse_args(argv)
    if a.steps - a.warmup < 6 or a.repeats < 1 or a.workers < 1 or a.servers < 1:
        raise SystemExit("ps_cpu: --steps at least --warmup + 6, --repeats, N and S >= 1")
    rows = []
    with tempfile.TemporaryDirectory(prefix="psring-ps-cpu-") as tmp:
        for rep in range(a.repeats):
            rows += [{"label": a.label, "repeat": rep, **r} for r in one_run(a, Path(tmp) / f"run{rep}")]
    df, out = pd.DataFrame(rows), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    table = out / "ps_cpu.csv"
    if a.append and table.exists():  # the label's repeats go on numbering from what the table holds
        old = pd.read_csv(table)
        same = old[old["label"].fillna("").astype(str) == a.label]
        df["repeat"] += int(same["repeat"].max()) + 1 if len(same) else 0
        df = pd.concat([old, df])
    df.to_csv(table, index=False)
    for (role, thread), g in df[df["label"] == a.label].groupby(["role", "thread"], sort=False):
        vals, what = g["ms_per_step"].tolist(), "core-ms a step" if role == "machine" else "ms a step per process"
        print(f"{role:>8} {thread:>9}: {statistics.median(vals):6.1f} {what} ({min(vals):.1f}-{max(vals):.1f})")
    print(f"{out / 'ps_cpu.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
