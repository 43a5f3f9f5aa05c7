"""TCP's congestion control in an emulated host's namespace (``--link-cc``).

Each network namespace has its own ``net.ipv4.tcp_congestion_control``, set from the machine's when the
namespace is made. It decides how fully a flow keeps a tbf-shaped link busy: at 100 Mbit, N = 4, the
hand-written ring's sync is 7-10% longer under bbr than under cubic, which meets the replay to 0.5%
(``results/simulate/congestion.csv``).
"""
from __future__ import annotations

import subprocess
from pathlib import Path

from .reaper import CMD_TIMEOUT_S

FILE = "/proc/sys/net/ipv4/tcp_congestion_control"  # per network namespace
OFFERED = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"  # what a namespace may pick, not just what is loaded


def offered() -> list[str]:
    """The congestion controls a new namespace may take here (the kernel's allowed list)."""
    try:
        return Path(OFFERED).read_text().split()
    except OSError:
        return []


def unknown(cc: str) -> str | None:
    """Why ``cc`` cannot be set here, in one line after the flag (None: it can, or none was asked for)."""
    if cc and cc not in (have := offered()):
        return f"{cc!r}: this kernel allows {', '.join(have) or 'none'} (modprobe tcp_{cc} for another)"
    return None


def here() -> str:
    """The congestion control of the namespace this process runs in ("" if it cannot be read)."""
    try:
        return Path(FILE).read_text().strip()
    except OSError:
        return ""


def set_command(ip: str, netns: str, cc: str) -> list[str]:
    """The command that makes ``cc`` the congestion control of namespace ``netns``."""
    return [ip, "netns", "exec", netns, "sh", "-c", f'echo "$0" > {FILE}', cc]


def read(ip: str, netns: str) -> str:
    """The congestion control of namespace ``netns`` ("" if it cannot be read)."""
    try:
        r = subprocess.run([ip, "netns", "exec", netns, "cat", FILE], capture_output=True, text=True,
                           timeout=CMD_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return r.stdout.strip()


def apply(ip: str, netns: list[str], cc: str, run, error: type[Exception]) -> str:
    """Make ``cc`` (if any) every namespace's congestion control, with ``run(cmd, what)``; returns the one they
    run, read back from the first; ``error`` when that is not the one asked for or cannot be read."""
    for ns in netns if cc else []:
        run(set_command(ip, ns, cc), f"set {ns}'s TCP congestion control")
    got = read(ip, netns[0])
    if not got or (cc and got != cc):
        raise error(f"emulated network: TCP congestion control {got or 'unreadable'} on the hosts, {cc or 'any'} asked")
    return got
