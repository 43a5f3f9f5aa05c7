"""Traffic on every link over time: the byte counters of every emulated host's link, sampled every few ms.

The sampler is a process of its own that the launcher starts inside the switch namespace (not anything
on the workers' step path): there one read of ``/proc/net/dev`` gives the counters of every switch port
``s<i>``, and a port's counters are its host's link seen from the switch — what the port received is
the host's upload, what it sent is the host's download. Every ``interval`` it appends one line to
``links.jsonl``::

    {"time": 1796160689.70, "dt": 0.020, "up": [bytes per host], "down": [bytes per host], "cpu": 0.93}

``time``: wall clock at the read (the clock of the step records, so links and steps line up); ``up`` and
``down``: bytes since the previous line; ``cpu``: the machine's CPU utilisation (all cores, ``/proc/stat``)
over the same interval, None where unreadable. ``comm_cpu`` reads it back over the intervals in which a
link carried traffic: the cores' load while the run communicates, which a run's mean over whole steps
(emulated compute is an idle wait) or over its synchronizer's calls (with overlap, most communication runs
during backward) does not show. SIGTERM makes it take a last sample and exit; it also exits
when its launcher is gone. ``kernel_totals`` and ``check`` hold the samples' sums against the hosts' own
interface counters once a run is over.

Run as ``python -m psring.net.links --ports N --out FILE --interval-ms MS`` (inside the namespace).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..metrics.cpu import cpu_times, utilisation
from ..metrics.jsonl import read_jsonl
from .reaper import CMD_TIMEOUT_S

FILE = "links.jsonl"
FLUSH_EVERY_S = 1.0
BUSY_LINK = 0.5  # an interval in which some link carried at least this share of its rate: communicating
MIN_BUSY_S = 0.25  # fewer seconds of such intervals than this: too few to tell (None)


def read_ports(n: int, path: str = "/proc/net/dev") -> tuple[list[int], list[int]]:
    """(received, sent) byte counters of switch ports s0..s{n-1}, from one read of ``path``."""
    rx, tx = [0] * n, [0] * n
    with open(path, "rb") as f:
        for line in f.read().decode().splitlines()[2:]:
            name, _, rest = line.partition(":")
            name = name.strip()
            if name.startswith("s") and name[1:].isdigit() and int(name[1:]) < n:
                fields = rest.split()
                rx[int(name[1:])], tx[int(name[1:])] = int(fields[0]), int(fields[8])
    return rx, tx


def sample(n: int, out: Path, interval_s: float, cpu_file: Path | None = None, read=read_ports) -> None:
    """Append a line per interval to ``out`` until SIGTERM (then one last line) or the parent is gone;
    then write the sampler's own CPU seconds to ``cpu_file``."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    parent = os.getppid()
    last, t_last, cpu_last = read(n), time.time(), cpu_times()
    next_at, flushed = time.monotonic() + interval_s, time.monotonic()
    with open(out, "w") as f:
        while True:
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += interval_s
            now, t, cpu = read(n), time.time(), cpu_times()
            up = [a - b for a, b in zip(now[0], last[0])]
            down = [a - b for a, b in zip(now[1], last[1])]
            util = utilisation(cpu_last, cpu)
            f.write(json.dumps({"time": round(t, 4), "dt": round(t - t_last, 5), "up": up, "down": down,
                                "cpu": None if util is None else round(util, 4)}) + "\n")
            last, t_last, cpu_last = now, t, cpu
            if stop or os.getppid() != parent:
                break
            if time.monotonic() - flushed > FLUSH_EVERY_S:
                f.flush()
                flushed = time.monotonic()
    if cpu_file is not None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        Path(cpu_file).write_text(f"{usage.ru_utime + usage.ru_stime:.3f}\n")


def kernel_totals(ip: str, netns: str, iface: str) -> tuple[int, int]:
    """(sent, received) bytes of ``iface`` in ``netns`` since it was created, from ``ip -s -j link``."""
    r = subprocess.run([ip, "-n", netns, "-s", "-j", "link", "show", "dev", iface], capture_output=True,
                       text=True, timeout=CMD_TIMEOUT_S, check=True)
    stats = json.loads(r.stdout)[0]["stats64"]
    return int(stats["tx"]["bytes"]), int(stats["rx"]["bytes"])


def load(path: Path) -> list[dict]:
    """The samples of ``links.jsonl`` (a torn last line from a killed sampler is skipped)."""
    return read_jsonl(path)


def check(rows: list[dict], kernel: list[tuple[int, int]], cpu_file: Path | None = None) -> dict:
    """The samples' sums (``rows``: ``load``'s) against the hosts' interface counters (``kernel``: (sent,
    received) per host): summary.json's ``links_*`` fields. Ratios are over all hosts' bytes of a direction;
    the worst host's ratio beside them."""
    up = sum(sum(r["up"]) for r in rows)
    down = sum(sum(r["down"]) for r in rows)
    k_up, k_down = sum(k[0] for k in kernel), sum(k[1] for k in kernel)
    per_host = [(sum(r["up"][i] for r in rows) / k[0] if k[0] else 1.0,
                 sum(r["down"][i] for r in rows) / k[1] if k[1] else 1.0) for i, k in enumerate(kernel)]
    worst = max((abs(x - 1) for pair in per_host for x in pair), default=0.0)
    return {"links_samples": len(rows),
            "links_interval_ms": round(1e3 * sum(r["dt"] for r in rows) / len(rows), 2) if rows else None,
            "links_up_vs_kernel": up / k_up if k_up else None,
            "links_down_vs_kernel": down / k_down if k_down else None,
            "links_worst_host_error": worst,
            "links_sampler_cpu_s": float(Path(cpu_file).read_text()) if cpu_file and Path(cpu_file).is_file()
            else None}


def comm_cpu(rows: list[dict], rates_bps: list[float], start: float, end: float) -> float | None:
    """The machine's CPU utilisation over the samples between ``start`` and ``end`` (wall clock) in which
    some host's link carried at least ``BUSY_LINK`` of its rate (``rates_bps``, per host) in either
    direction, weighted by their lengths: ``cpu_util_comm``. None where the samples carry no CPU (an older
    file) or such intervals add up to less than ``MIN_BUSY_S``."""
    busy_s = cpu_s = 0.0
    for r in rows:
        if not (start < r["time"] <= end) or r.get("cpu") is None or r["dt"] <= 0:
            continue
        load = max(max(u, d) * 8 / r["dt"] / rate for u, d, rate in zip(r["up"], r["down"], rates_bps))
        if load >= BUSY_LINK:
            busy_s += r["dt"]
            cpu_s += r["cpu"] * r["dt"]
    return cpu_s / busy_s if busy_s >= MIN_BUSY_S else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m psring.net.links", description=__doc__.splitlines()[0])
    ap.add_argument("--ports", type=int, required=True, help="switch ports s0..s{N-1}: one per host")
    ap.add_argument("--out", required=True, help="the links.jsonl to write")
    ap.add_argument("--interval-ms", type=float, default=20.0)
    ap.add_argument("--cpu-file", help="where to write the sampler's own CPU seconds at the end")
    a = ap.parse_args(argv)
    if a.ports < 1 or a.interval_ms <= 0:
        print("psring links: --ports and --interval-ms must be positive", file=sys.stderr)
        return 2
    sample(a.ports, Path(a.out), a.interval_ms / 1e3, a.cpu_file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
