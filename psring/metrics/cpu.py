"""The machine's CPU time from ``/proc/stat``, so a run can say whether its cores were saturated: on a
machine with fewer cores than processes, a slow run may be measuring CPU contention, not communication.

``cpu_times()`` is ``(busy, total)`` in jiffies (USER_HZ ticks) summed over all cores since boot;
busy = total - idle - iowait. Utilisation over an interval is Δbusy / Δtotal."""
from __future__ import annotations

from pathlib import Path

PROC_STAT = Path("/proc/stat")
SATURATED = 0.90  # utilisation of all cores from which a run counts as CPU-saturated


def parse_stat(text: str) -> tuple[int, int] | None:
    """``(busy, total)`` from the aggregate ``cpu`` line of /proc/stat's text; None if it has none."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            try:
                ticks = [int(x) for x in fields[1:]]
            except ValueError:
                return None
            # user nice system idle iowait irq softirq steal guest guest_nice: guest and guest_nice are
            # already inside user and nice, so only the first eight add up to the time that passed
            total = sum(ticks[:8])
            return total - sum(ticks[3:5]), total
    return None


def cpu_times(path: Path = PROC_STAT) -> tuple[int, int] | None:
    """``(busy, total)`` jiffies of all cores now; None where /proc/stat is absent or unreadable."""
    try:
        return parse_stat(path.read_text())
    except OSError:
        return None


def utilisation(start: tuple[float, float] | None, end: tuple[float, float] | None) -> float | None:
    """Δbusy / Δtotal between two ``(busy, total)`` samples; None if either is missing or no tick passed."""
    if start is None or end is None or not end[1] > start[1]:
        return None
    return (end[0] - start[0]) / (end[1] - start[1])
