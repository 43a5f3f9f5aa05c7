"""``psring bench``: time each synchronizer alone, per message size, next to its raw transport.

Definitions (nccl-tests' for all-reduce; README "Bench"): time = median over ``iters`` timed iterations
after ``warmup`` (default 5 + 20), each the slowest worker's; algbw = M / time, M = bytes a worker
synchronizes; busbw = algbw x 2(N-1)/N for all-reduce, and for the PS algbw x max(1, N/S): the rate of
the busiest link per direction (a worker's link carries M, a server's N*M/S). efficiency = raw
transport time / strategy time, where the raw transport is one ``dist.all_reduce`` of a flat tensor of
M bytes (all-reduce) or a ZeroMQ echo of M bytes in pipelined frames to the same S servers (ps).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pandas as pd

from ..compress.spec import NONE
from ..fileio import out_folder, write_atomic
from ..launch.children import Children
from ..launch.launcher import LaunchError, check_alive, child_env, free_port
from ..launch.resources import check_bench, model_bytes
from ..strategies import attr, uses_servers
from .cli import benchable

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``4K`` -> 4096 (K, M, G: powers of 1024; a trailing B allowed); a ValueError in one line otherwise."""
    t = text.strip().upper().removesuffix("B")
    mult = UNITS.get(t[-1:], 1)
    try:
        value = int(float(t[:-1] if t[-1:] in UNITS else t) * mult)
    except ValueError:
        raise ValueError(f"cannot read size {text!r}; use e.g. 4K, 1M, 128M") from None
    except OverflowError:  # inf, 1e400
        raise ValueError(f"size {text!r} is not a finite number of bytes; use e.g. 4K, 1M, 128M") from None
    if value < 64:
        raise ValueError(f"size {text!r} is below 64 bytes")
    return value


def size_range(lo: int, hi: int, factor: int) -> list[int]:
    """lo, lo*factor, ... and hi itself (4K..128M by 4 ends 16M, 64M, 128M)."""
    if factor < 2 or lo < 1 or lo > hi:  # (a factor below 2 would never reach hi)
        raise ValueError(f"no size range from {lo} to {hi} by x{factor}: need 1 <= lo <= hi and factor >= 2")
    sizes, s = [], lo
    while s < hi:
        sizes.append(s)
        s *= factor
    return sizes + [hi]


def run_group(spec: dict, out: Path, workers: int, timeout_s: float) -> list[dict]:
    label = f"{spec['strategy']}-s{spec.get('servers', 1)}"
    spec_path = out / f"{label}.spec.json"
    spec_path.write_text(json.dumps(spec))
    kids, port = Children(), free_port()
    try:
        procs = [kids.spawn(f"bench worker {r}", [sys.executable, "-m", "psring", "bench-worker", "--spec", str(spec_path)],
                            child_env(1, RANK=r, WORLD_SIZE=workers, LOCAL_RANK=r, MASTER_ADDR="127.0.0.1",
                                      MASTER_PORT=port), out / "logs" / f"{label}-worker{r}.log",
                            stdout_to_terminal=(r == 0))
                 for r in range(workers)]
        deadline = time.monotonic() + timeout_s
        while any(p.returncode is None for p in procs):
            check_alive(procs)
            if time.monotonic() > deadline:
                raise LaunchError(f"bench {label} did not finish within {timeout_s:.0f} s")
            time.sleep(0.1)
        check_alive(procs)
    finally:
        kids.stop_all()
    return [json.loads(line) for line in (out / f"{label}.jsonl").read_text().splitlines()]


def add_efficiency(df: pd.DataFrame) -> pd.DataFrame:
    """``efficiency`` of each strategy row: the time of its raw transport (``Strategy.bench_raw``) at the
    same size and S over its own; NaN for the raw rows. ``df``: the rows of one group (one set of
    processes), where a raw transport's rows belong to the one strategy timed beside them."""
    df = df.copy()
    df["efficiency"] = float("nan")
    for strat in df["strategy"].unique():
        raw = attr(strat, "bench_raw")
        if raw is None:  # a raw transport's rows
            continue
        for i, r in df[df["strategy"] == strat].iterrows():
            ref = df[(df["strategy"] == raw) & (df["size_bytes"] == r["size_bytes"])
                     & (df["servers"].fillna(0) == (r["servers"] if pd.notna(r["servers"]) else 0))]
            if not ref.empty:
                df.loc[i, "efficiency"] = ref["time_s"].iloc[0] / r["time_s"]
    return df


def format_table(df: pd.DataFrame) -> str:
    head = (f"{'strategy':<18}{'N':>3}{'S':>3}{'size':>12}{'time ms':>11}{'algbw GB/s':>12}"
            f"{'busbw GB/s':>12}{'efficiency':>12}")
    lines = [head, "-" * len(head)]
    for r in df.sort_values(["size_bytes", "strategy", "servers"]).to_dict("records"):
        s = "-" if pd.isna(r["servers"]) else int(r["servers"])
        eff = "" if pd.isna(r["efficiency"]) else f"{r['efficiency']:.2f}"
        codec = r.get("compress")
        name = r["strategy"] + (f"+{codec}" if isinstance(codec, str) and codec != NONE else "")
        lines.append(f"{name:<18}{r['workers']:>3}{s:>3}{r['size_bytes']:>12,d}{r['time_s'] * 1e3:>11.3f}"
                     f"{r['algbw_GBps']:>12.3f}{r['busbw_GBps']:>12.3f}{eff:>12}")
    return "\n".join(lines)


def run_bench(workers: int, sizes: list[int], strategies: list[str], out: str, warmup: int = 5, iters: int = 20,
              chunk_bytes: int | list[int] = 1 << 20, timeout_s: float = 1800, model: str | None = None,
              servers: list[int] | None = None, bucket_mb: float = 25.0, floor: bool = False,
              force: bool = False, compress: str = "none") -> pd.DataFrame:
    """``model``: bench that model's gradient set (its real tensor shapes) instead of each size;
    ``chunk_bytes``: a list means the raw echo is timed at each and the fastest is kept; ``floor``: ps
    also times ``raw_zmq_echo_sgd``, echo servers that run the SGD update too (``bench.echo``): the
    transport plus the update with none of psring's logic, the PS's floor on this machine. ``force``:
    start even what the memory check (``launch.resources``) says this machine cannot hold. ``compress``:
    the strategies' gradient codec (bench.csv's ``compress`` column; raw transports stay dense)."""
    groups = []
    for name in (n for n in benchable() if n in strategies):  # those without servers first, then per S
        groups += ([{"strategy": name, "servers": s} for s in (servers or sorted({1, workers}))]
                   if uses_servers(name) else [{"strategy": name, "servers": 1}])
    check_bench(workers, [model_bytes(model)] if model else sizes,  # before anything starts
                [g["servers"] for g in groups if uses_servers(g["strategy"])], floor, force)
    out_dir = out_folder(out)  # (one line if it cannot be made) before any process starts
    frames = []
    for g in groups:
        print(f"== {g['strategy']}" + (f" S={g['servers']}" if uses_servers(g["strategy"]) else "")
              + f", N={workers}", flush=True)
        spec = {**g, "sizes": [0] if model else sizes, "model": model, "warmup": warmup, "iters": iters, "chunk_bytes": chunk_bytes,
                "out": str(out_dir), "timeout_s": min(timeout_s, 300), "bucket_mb": bucket_mb, "floor": floor,
                "compress": compress}
        frames.append(add_efficiency(pd.DataFrame(run_group(spec, out_dir, workers, timeout_s))))
    df = pd.concat(frames, ignore_index=True)
    write_atomic(out_dir / "bench.csv", df.to_csv(index=False))  # an earlier one: whole until replaced
    write_atomic(out_dir / "bench.txt", format_table(df) + "\n")
    print()
    print(format_table(df))
    print(f"\nefficiency = raw transport time / strategy time (1.0 = the transport's limit); {out_dir / 'bench.csv'}")
    return df
