"""What the floor benchmarks (``benchmarks/overlap_floor.py``, ``benchmarks/reduce_floor.py``) share: wait for a
floor's processes while sampling the machine's CPU, and read a step time and the CPU over the timed steps from
the start times each process wrote."""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from ..launch.watch import check_alive
from ..metrics.cpu import cpu_times, utilisation

SAMPLE_S = 0.05


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The machine's CPU as /proc/cpuinfo names it, with its model number ("AMD EPYC (model 1)"): the floors
    differ between draws of "a 2-core machine", and a summary says which one it measured; "" where unreadable."""
    try:
        fields = dict(line.split(":", 1) for line in Path(cpuinfo).read_text().splitlines()[:30] if ":" in line)
    except OSError:
        return ""
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    name, model = fields.get("model name", ""), fields.get("model", "")
    return f"{name} (model {model})" if name and model else name


def watch(children: list, deadline_s: float, what: str, scratch: Path) -> list[tuple[float, tuple | None]]:
    """Wait until every child exited, sampling ``(time.time(), cpu_times())`` every ``SAMPLE_S``; a child that
    failed is check_alive's LaunchError, one still running after ``deadline_s`` (monotonic) a TimeoutError."""
    samples = []
    while any(c.returncode is None for c in children):
        check_alive(children)
        if time.monotonic() > deadline_s:
            raise TimeoutError(f"floor run ({what}) did not finish in time; see {scratch}")
        samples.append((time.time(), cpu_times()))
        time.sleep(SAMPLE_S)
    check_alive(children)
    return samples


def timed(starts: list[list[float]], samples: list, warmup: int, steps: int) -> tuple[float, float | None]:
    """(step p50, each step its slowest process's, as psring's own summary takes it (``metrics.summary``: a step's
    wall time); the machine's CPU utilisation between the samples nearest the timed steps' start and end).

    >>> timed([[0.0, 1.0, 2.5, 3.5], [0.0, 1.2, 2.4, 3.6]], [(0.9, (0, 0)), (3.6, (150, 200))], 1, 3)
    (1.35, 0.75)
    """
    per_step = [max(st[t + 1] - st[t] for st in starts) for t in range(warmup, steps)]
    t0, t1 = min(st[warmup] for st in starts), max(st[steps] for st in starts)
    near = lambda t: min(samples, key=lambda x: abs(x[0] - t))[1]  # noqa: E731
    return statistics.median(per_step), utilisation(near(t0), near(t1))
