"""One bench worker (started by ``psring bench`` with torchrun's environment): for each message size,
time a synchronizer's ``step`` and its raw transport side by side, in the same processes.

Each timed iteration starts after a barrier; its time is the slowest worker's (a synchronous exchange
ends when its last worker does); a size's figure is the median of ``iters`` iterations after ``warmup``.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import zmq
from torch import nn

from ..allocator import keep_freed_memory
from ..collector import freeze_setup_objects
from ..config import OptimConfig
from ..launch.children import Children
from ..launch.launcher import start_listeners
from ..strategies import get
from ..sync.process_group import exit_without_teardown, init_process_group
from ..sync.ps.synchronizer import PSSync
from ..compress.spec import NONE
from ..sync.compressed import wrap
from ..sync.reducer import ReduceSync
from ..train.models import build_model
from .cli import FLOOR_OF


class FlatModel(nn.Module):
    """``size`` bytes of float32 parameters in ``parts`` tensors (enough to shard over the servers)."""

    def __init__(self, size: int, parts: int):
        super().__init__()
        numel = max(parts, size // 4)
        counts = [numel // parts + (1 if i < numel % parts else 0) for i in range(parts)]
        g = torch.Generator().manual_seed(0)
        self.ps = nn.ParameterList([nn.Parameter(torch.randn(c, generator=g)) for c in counts])
        for p in self.ps:
            p.grad = torch.randn(p.shape, generator=g) * 1e-3


ECHO_TIMEOUT_S = 120.0  # a send (zmq blocks one once 1,000 messages wait for a server: for good if it is gone), an echo


def connect(ctx: zmq.Context, addrs: list[str]) -> list:
    socks = []
    for a in addrs:
        s = ctx.socket(zmq.DEALER)
        s.linger = 0
        s.sndtimeo = int(ECHO_TIMEOUT_S * 1000)
        s.connect(a)
        socks.append(s)
    return socks


def timed(fns: list, warmup: int, iters: int) -> list[list[float]]:
    """Per-iteration times of each ``fns[k](i)`` (which may return its own time, else wall time is used),
    interleaved: iteration i runs every fn once, each after a barrier, so a strategy and its raw
    transport see the same machine conditions. Each time is the slowest rank's."""
    times = [[] for _ in fns]
    for i in range(warmup + iters):
        for k, fn in enumerate(fns):
            dist.barrier()
            t0 = time.perf_counter()
            own = fn(i)
            if i >= warmup:
                times[k].append(own if own is not None else time.perf_counter() - t0)
    tt = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(tt, op=dist.ReduceOp.MAX)
    return tt.tolist()


def echo_round(socks: list, payload: memoryview, chunk: int) -> None:
    """Send ``payload`` split evenly over the echo servers, in pipelined ``chunk``-byte messages; wait
    for every echo. This is the PS's traffic (M up, M down per worker) with none of its logic."""
    per = math.ceil(len(payload) / len(socks))
    counts = []
    for s, sock in enumerate(socks):
        part = payload[s * per:(s + 1) * per]
        n = 0
        for off in range(0, len(part), chunk):
            try:
                sock.send(part[off:off + chunk], copy=False)
            except zmq.Again:
                raise TimeoutError(f"echo server took no message within {ECHO_TIMEOUT_S:g} s") from None
            n += 1
        counts.append(n)
    for sock, n in zip(socks, counts):
        for _ in range(n):
            if not sock.poll(int(ECHO_TIMEOUT_S * 1000)):
                raise TimeoutError(f"echo server did not answer within {ECHO_TIMEOUT_S:g} s")
            sock.recv(copy=False)


def start_set(kids: Children, out: Path, kind: str, n: int, workers: int, tag: str,
              update_bytes: int = 0) -> list[str]:
    """``kind``: "echo" (raw echo servers; with ``update_bytes``, echo + SGD update) or "server" (psring's)."""
    specs = []
    for i in range(n):
        pf = out / "addrs" / f"{tag}-{kind}{i}.addr"
        argv = ([sys.executable, "-m", "psring.bench.echo", "--port-file", str(pf), "--update-bytes",
                 str(update_bytes)] if kind == "echo" else
                [sys.executable, "-m", "psring", "server", "--workers", str(workers), "--port-file", str(pf),
                 "--idle-timeout", "300"])
        specs.append((f"{kind} {i}", argv, pf, out / "logs" / f"{tag}-{kind}{i}.log"))
    return start_listeners(kids, specs)


def shared_addrs(rank: int, make, path: Path) -> list[str]:
    """Rank 0 starts a set of listeners and publishes their addresses; everyone returns them."""
    if rank == 0:
        addrs = make()
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(addrs))
        tmp.rename(path)
    dist.barrier()
    return json.loads(path.read_text())


def row(strategy: str, world: int, servers, size: int, times: list[float], compress: str = "none") -> dict:
    """A bench.csv row; ``servers`` None: an all-reduce (a reducer's or the raw one), else S servers;
    ``compress``: the strategy's codec (``size`` stays the dense gradients' bytes)."""
    t = statistics.median(times)
    algbw = size / t / 1e9
    if servers is None:
        factor = 2 * (world - 1) / world  # nccl-tests' bus bandwidth for all-reduce
    else:
        factor = max(1.0, world / servers)  # PS: the busiest link carries max(M, N*M/S) each way
    return {"strategy": strategy, "workers": world, "servers": servers, "size_bytes": size, "time_s": t,
            "time_p90": sorted(times)[int(0.9 * (len(times) - 1))], "algbw_GBps": algbw,
            "busbw_GBps": algbw * factor, "iters": len(times), "compress": compress}


def bench_reducer(entry, pg, model, nbytes: int, spec: dict) -> list[dict]:
    """(raw all-reduce row, the reducer's row) for one size: ReduceSync over the entry's reducer against one
    flat ``dist.all_reduce`` of the same bytes, interleaved."""
    flat = torch.randn(nbytes // 4)
    reducer, compress = entry.reducer(pg), spec.get("compress", "none")
    if compress != NONE:
        reducer = wrap(reducer, pg, compress)
    sync = ReduceSync(reducer, OptimConfig(), spec.get("bucket_mb", 25.0))
    try:
        sync.attach(model)
        raw, mine = timed([lambda i: dist.all_reduce(flat), lambda i: sync.step(i).sync_s],
                          spec["warmup"], spec["iters"])
    finally:
        sync.close()
    return [row(entry.bench_raw, pg.world, None, nbytes, raw), row(entry.name, pg.world, None, nbytes, mine, compress)]


def bench_ps(entry, spec: dict, model, nbytes: int, where: tuple, socks: list) -> tuple[list[dict], list]:
    """(rows, sockets to close) for one size: the PS against the raw echo (its best frame size) and, with
    ``floor``, against echo servers that also run the SGD update (the PS's floor here).
    ``where``: (children, zmq context, output folder, rank, world, servers)."""
    kids, ctx, out, rank, world, servers = where
    payload = memoryview(torch.randn(nbytes // 4).numpy()).cast("B")
    chunks = spec["chunk_bytes"] if isinstance(spec["chunk_bytes"], list) else [spec["chunk_bytes"]]
    tag = f"s{servers}-{nbytes}"
    addrs = shared_addrs(rank, lambda: start_set(kids, out, "server", servers, world, tag),
                         out / "addrs" / f"{tag}.json")
    sync = PSSync(rank, world, torch.device("cpu"), addrs, OptimConfig(), spec.get("timeout_s", 300),
                  spec.get("bucket_mb", 25.0), compress=spec.get("compress", "none"))
    sync.attach(model)
    echoes = [lambda i, c=c: echo_round(socks, payload, c) for c in chunks]
    floors, sgd_socks = [], []
    if spec.get("floor") and entry.bench_raw in FLOOR_OF:
        per = math.ceil(nbytes / servers)
        sgd_socks = connect(ctx, shared_addrs(
            rank, lambda: start_set(kids, out, "echo", servers, world, f"{tag}-sgd", per),
            out / "addrs" / f"{tag}-sgd.json"))
        floors = [lambda i, c=c: echo_round(sgd_socks, payload, c) for c in chunks]
    try:
        times = timed(echoes + floors + [lambda i: sync.step(i).sync_s], spec["warmup"], spec["iters"])
    finally:
        sync.close()
    rows = [row(entry.bench_raw, world, servers, nbytes, min(times[:len(chunks)], key=statistics.median))]
    if floors:
        rows.append(row(FLOOR_OF[entry.bench_raw], world, servers, nbytes,
                        min(times[len(chunks):-1], key=statistics.median)))
    rows.append(row(entry.name, world, servers, nbytes, times[-1], spec.get("compress", "none")))  # (raws: their best frame size)
    return rows, sgd_socks


def run(spec: dict) -> int:
    entry = get(spec["strategy"])
    if entry.bench_raw is None or (entry.reducer is None and not entry.servers):
        raise ValueError(f"psring bench cannot time {entry.name}: it has no raw transport or no bench path")
    keep_freed_memory()  # as psring worker does
    torch.set_num_threads(1)
    pg = init_process_group("gloo", spec.get("timeout_s", 300))
    freeze_setup_objects()  # as psring worker does, here before any model: the imports are most of it
    rank, world, out = pg.rank, pg.world, Path(spec["out"])
    strategy, servers, rows = spec["strategy"], spec.get("servers", 1), []
    kids = Children()
    ctx = zmq.Context()
    socks = []
    try:
        if entry.servers:
            addrs = shared_addrs(rank, lambda: start_set(kids, out, "echo", servers, world, f"s{servers}"),
                                 out / "addrs" / f"s{servers}-echo.json")
            socks = connect(ctx, addrs)
        warm = torch.zeros(1024)
        for _ in range(10):  # connections and buffers of the transport are set up lazily: not in any size's figure
            dist.all_reduce(warm)
        for size in spec["sizes"]:
            model = build_model(spec["model"], 0) if spec.get("model") else FlatModel(size, max(16, servers))
            nbytes = sum(p.numel() * 4 for p in model.parameters())
            if entry.reducer is not None:  # the reducer family: against one flat dist.all_reduce
                new, floors = bench_reducer(entry, pg, model, nbytes, spec), False
            else:  # a strategy with servers: psring's PS against a ZeroMQ echo to as many servers
                new, extra = bench_ps(entry, spec, model, nbytes, (kids, ctx, out, rank, world, servers), socks)
                floors = bool(extra)
            rows += new
            if rank == 0:
                print(f"  {strategy:>9} S={servers if entry.servers else '-'} {nbytes:>11,d} B: "
                      f"{rows[-1]['time_s'] * 1e3:9.3f} ms (raw {rows[-2 - bool(floors)]['time_s'] * 1e3:9.3f} ms)",
                      flush=True)
        if rank == 0:
            with open(out / f"{strategy}-s{servers}.jsonl", "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
        dist.barrier()
    finally:
        # every socket of the context, also those a size that failed midway left open (term would wait on them)
        ctx.destroy(linger=0)
        kids.stop_all(grace_s=2)
        dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> None:
    """One bench worker (``psring bench-worker --spec FILE``, forked from the launcher's zygote as training's
    workers are; ``python -m psring.bench.worker`` starts one afresh); leaves without teardown."""
    ap = argparse.ArgumentParser(prog="psring bench-worker")
    ap.add_argument("--spec", required=True)
    rc = 1
    try:
        rc = run(json.loads(Path(ap.parse_args(argv).spec).read_text()))
    except BaseException:  # noqa: BLE001 - reported here, then the same exit as below
        import traceback

        traceback.print_exc()
    finally:
        exit_without_teardown(rc)


if __name__ == "__main__":
    main()
