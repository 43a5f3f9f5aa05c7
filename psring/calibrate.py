"""Measure this setup's alpha (per-message latency) and B (bandwidth) for ``psring.costmodel``.

Ping-pong over the PS's raw transport: a DEALER sends one message of m bytes (in ``frame_bytes``
frames, as the PS splits its tensors, sent with ``copy=False``) to the ZeroMQ echo server
(``psring.bench.echo``) and waits for it to come back. Per size the median round trip over
``repeats`` (after ``warmup``) is taken; ``t(m) = alpha + m/B`` is fitted by least squares to the
one-way times (rtt/2) - by default alpha from the smallest size and B by least squares over all of
them (see ``fit_link``). The table keeps each size's fitted time and relative error: on loopback, caches
make mid-sized messages faster than the line through the largest ones.

Run ``python -m psring.calibrate --out DIR``: writes ``DIR/calibration.json``.
"""
from __future__ import annotations

import argparse
import datetime
import math
import platform
import re
import shlex
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq

from .bench.runner import parse_size, size_range
from .costmodel import Link, save_calibration
from .fileio import out_folder
from .launch.children import Children
from .launch.launcher import LaunchError, start_listeners
from .launch.outdir import refuse_results
from .net import tcp
from .options import ConfigError, OneLineParser

DEFAULT_SIZES = size_range(64, 16 << 20, 4)  # 64 B, 256 B, ..., 4 MB, 16 MB
MEMORY_COPIES = 3  # a message at its peak: the client's, the echo server's copy of it, the reply received


def fit_link(sizes: list[int], one_way_s: list[float], method: str = "anchored") -> tuple[Link, float]:
    """``(Link(alpha, B), R^2)`` of ``t = alpha + m/B`` fitted to one-way times (R^2 unweighted).

    ``anchored``: the least-squares line through the smallest size's point, so alpha is that message's
    time (less its m/B) and B is set by the large sizes: the model's own definitions (zero-size
    latency, large-message bandwidth). ``relative``: both by least squares weighted by 1/t (every size counts by its relative
    error). A plain fit would let the largest sizes' noise decide alpha, often below zero.

    >>> link, r2 = fit_link([64, 1000, 2000], [1e-5 + 64e-8, 2e-5, 3e-5])
    >>> round(link.alpha_s, 9), round(link.bandwidth_Bps), round(r2, 6)
    (1e-05, 100000000, 1.0)
    """
    x, y = np.asarray(sizes, dtype=float), np.asarray(one_way_s, dtype=float)
    if len(set(sizes)) < 2:
        raise ValueError("need at least two different sizes to fit alpha and B")
    if method == "anchored":
        i = int(np.argmin(x))  # the least-squares line through the smallest size's point (m0, t0)
        slope = float(np.sum(x * (y - y[i])) / np.sum(x * (x - x[i])))
        alpha = float(y[i] - x[i] * slope)
    elif method == "relative":
        slope, alpha = (float(v) for v in np.polyfit(x, y, 1, w=1.0 / y))
    else:
        raise ValueError(f"unknown fit method {method!r}; use 'anchored' or 'relative'")
    if not (slope > 0 and alpha > 0 and np.isfinite(slope) and np.isfinite(alpha)):
        raise ValueError(f"the fit t = {alpha:.3g} + m * {slope:.3g} is not physical; "
                         f"measure a wider range of sizes (from 64 B) or more repeats")
    tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((y - alpha - slope * x) ** 2)) / tot if tot > 0 else 1.0
    return Link(alpha, 1.0 / slope), r2


def _with_port(address: str, reported: str) -> str:
    """``tcp://host`` + the reported ``tcp://127.0.0.1:PORT`` -> ``tcp://host:PORT``."""
    return address if re.search(r":\d+$", address) else f"{address}:{reported.rsplit(':', 1)[1]}"


def ping_pong(sock: zmq.Socket, size: int, repeats: int, warmup: int, frame_bytes: int | None,
              timeout_s: float) -> list[float]:
    """Round-trip times of ``repeats`` messages of ``size`` bytes, one at a time."""
    buf = memoryview(np.ones(size, dtype=np.uint8)).cast("B")
    step = frame_bytes or size
    frames = [buf[o:o + step] for o in range(0, size, step)]
    times = []
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        sock.send_multipart(frames, copy=False)
        if not sock.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"no echo of a {size}-byte message within {timeout_s} s")
        got = sock.recv_multipart(copy=False)
        dt = time.perf_counter() - t0
        if sum(len(f) for f in got) != size:
            raise RuntimeError(f"echo returned {sum(len(f) for f in got)} bytes, sent {size}")
        if i >= warmup:
            times.append(dt)
    return times


def calibrate(address: str | None = None, sizes: list[int] | None = None, repeats: int = 30, warmup: int = 3,
              frame_bytes: int | None = 1 << 20, timeout_s: float = 30.0, prefix: list[str] | None = None,
              workdir: str | Path | None = None, fit: str = "anchored") -> tuple[Link, list[dict]]:
    """Fit ``Link(alpha, B)`` to ping-pongs with an echo server; also return the per-size table.

    ``address=None``: start an echo server here (under the command ``prefix`` if given, e.g.
    ``["ip", "netns", "exec", "ns1"]``) and use the address it reports; with ``address`` and a
    ``prefix``, start it under the prefix but connect to ``address`` (one without a port, e.g.
    ``tcp://10.0.0.2``, takes the port the server reports); with ``address`` alone, connect to an echo
    server already running there. The echo server is always stopped before returning.
    ``workdir`` holds its port file and log (a temporary directory if None); ``fit``: see ``fit_link``.
    """
    sizes = sorted(set(sizes or DEFAULT_SIZES))
    kids, ctx, sock = Children(), zmq.Context(), None
    tmp = tempfile.TemporaryDirectory(prefix="psring-calibrate-") if workdir is None else None
    wd = Path(tmp.name if tmp else workdir)
    try:
        if address is None or prefix:
            pf = wd / "calibrate-echo.addr"
            argv = [*(prefix or []), sys.executable, "-m", "psring.bench.echo", "--port-file", str(pf),
                    "--idle-timeout", str(max(60.0, 2 * timeout_s))]
            if address is not None:  # listen where we will connect (e.g. another namespace's address)
                argv += ["--bind", address.removeprefix("tcp://").rsplit(":", 1)[0]]
            [reported] = start_listeners(kids, [("calibrate echo", argv, pf, wd / "calibrate-echo.log")])
            address = reported if address is None else _with_port(address, reported)
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(address)
        table = []
        for size in sizes:
            rtts = ping_pong(sock, size, repeats, warmup, frame_bytes, timeout_s)
            rtt = statistics.median(rtts)
            table.append({"size_bytes": size, "rtt_s": rtt, "one_way_s": rtt / 2, "repeats": len(rtts),
                          "rtt_min_s": min(rtts), "rtt_max_s": max(rtts)})
    finally:
        if sock is not None:
            sock.close(linger=0)
        ctx.term()
        kids.stop_all(grace_s=2)
        if tmp:
            tmp.cleanup()
    link, _ = fit_link([r["size_bytes"] for r in table], [r["one_way_s"] for r in table], fit)
    for r in table:
        r["fit_s"] = link.time(r["size_bytes"])
        r["rel_err"] = r["one_way_s"] / r["fit_s"] - 1
    return link, table


def summary(link: Link, table: list[dict], r2: float) -> str:
    worst = max(table, key=lambda r: abs(r["rel_err"]))
    return (f"alpha {link.alpha_s * 1e6:.1f} us  bandwidth {link.bandwidth_Bps / 1e9:.2f} GB/s  "
            f"(fit over {len(table)} sizes, R^2 {r2:.3f}; worst: {worst['size_bytes']:,d} B "
            f"measured {worst['rel_err']:+.0%} vs the fit)")


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m psring.calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".", help="directory for calibration.json")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace the calibration.json in --out (default: refuse, exit 2)")
    ap.add_argument("--sizes", help="comma-separated sizes (e.g. 64,4K,1M); default 64 B to 16 MB by x4")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--frame-bytes", default="1M",
                    help="split messages into frames of this size, as the PS does (default 1M)")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for any one echo")
    ap.add_argument("--address", help="connect here (an echo server already running, or the prefix's)")
    ap.add_argument("--fit", choices=["anchored", "relative"], default="anchored",
                    help="anchored: alpha from the smallest size, B by least squares (default)")
    ap.add_argument("--prefix", help="run the echo server under this command, e.g. 'ip netns exec ns1'")
    return ap


def largest_message() -> int | None:
    """The largest message this machine can ping-pong now: ``MEMORY_COPIES`` of it must fit in the memory
    available; None if that is unknown."""
    from .launch.resources import available_bytes

    avail = available_bytes()
    return None if avail is None else avail // MEMORY_COPIES


def read_sizes(text: str | None) -> list[int] | None:
    """``--sizes`` (None: the default sizes): readable, at least two different ones, and each small enough
    for this machine's memory (``largest_message``), or one ConfigError line."""
    from .launch.resources import gib

    if text is None:
        return None
    if not text.strip():
        raise ConfigError("--sizes is empty: give comma-separated sizes, e.g. 64,4K,1M (or leave it out)")
    try:
        sizes = [parse_size(s) for s in text.split(",")]
    except ValueError as e:
        raise ConfigError(f"--sizes: {e}") from None
    limit = largest_message()
    if limit is not None and max(sizes) > limit:
        raise ConfigError(f"--sizes: a message of {gib(max(sizes))} does not fit in this machine's memory: "
                          f"{MEMORY_COPIES} copies of it are held at once (sent, echoed, received) and "
                          f"{gib(limit * MEMORY_COPIES)} is available, so at most {gib(limit)} ({limit} bytes)")
    if len(set(sizes)) < 2:
        raise ConfigError(f"--sizes needs at least two different sizes to fit alpha and B, got {text!r}")
    return sizes


def check_args(a: argparse.Namespace) -> tuple[list[int] | None, int]:
    """``(sizes, frame_bytes)`` from the flags, every problem one ConfigError line; reads, changes nothing."""
    if a.repeats < 1:
        raise ConfigError(f"--repeats must be >= 1 (round trips per size, the median taken), got {a.repeats}")
    if a.warmup < 0:
        raise ConfigError(f"--warmup must be >= 0, got {a.warmup}")
    if not (math.isfinite(a.timeout) and a.timeout > 0):
        raise ConfigError(f"--timeout must be a number of seconds above 0, got {a.timeout}")
    sizes = read_sizes(a.sizes)
    try:
        frame_bytes = parse_size(a.frame_bytes)
    except ValueError as e:
        raise ConfigError(f"--frame-bytes: {e}") from None
    if not str(a.out).strip():
        raise ConfigError("--out is empty: give a folder")
    refuse_results(a.out, ("calibration.json",), "a calibration", a.overwrite)
    return sizes, frame_bytes


def main(argv: list[str] | None = None) -> int:
    """``psring calibrate`` (loopback: called in its process) and ``python -m psring.calibrate``: 0, or 2
    with one line on stderr (bad flags, a folder in the way, no echo, a fit that is not physical)."""
    argv = sys.argv[1:] if argv is None else argv
    a = parser().parse_args(argv)
    try:
        sizes, frame_bytes = check_args(a)
        out = out_folder(a.out)
        link, table = calibrate(a.address, sizes, a.repeats, a.warmup, frame_bytes, a.timeout,
                                shlex.split(a.prefix) if a.prefix else None, fit=a.fit)
    except (ValueError, OSError, MemoryError, zmq.ZMQError, LaunchError) as e:
        # a flag, a fit that is not physical, no echo (TimeoutError), a bad --address or --prefix: one line
        where = (f"--address {a.address}: " if isinstance(e, zmq.ZMQError) and a.address else
                 f"--prefix {a.prefix}: " if isinstance(e, (FileNotFoundError, PermissionError)) and a.prefix else "")
        print(f"psring calibrate: error: {where}{e}", file=sys.stderr)
        return 2
    _, r2 = fit_link([r["size_bytes"] for r in table], [r["one_way_s"] for r in table], a.fit)
    meta = {"r2": r2, "fit": a.fit, "fitted_from": table, "frame_bytes": frame_bytes,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "host": socket.gethostname(), "platform": platform.platform(), "link_cc": tcp.here(),
            "command": shlex.join([sys.executable, "-m", "psring.calibrate", *argv])}
    save_calibration(link, out / "calibration.json", meta)
    print(summary(link, table, r2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
