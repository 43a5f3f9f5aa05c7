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
OFFERED = "/proc/sys/net/ipv4/tcp_available_congestion_control"


def offered() -> list[str]:
    """The congestion controls this kernel has loaded."""
    try:
        return Path(OFFERED).read_text().split()
    except OSError:
        return []


def unknown(cc: str) -> str | None:
    """Why ``cc`` cannot be set here, in one line (None: it can, or none was asked for)."""
    if cc and cc not in (have := offered()):
        return f"--link-cc {cc!r}: this kernel offers {', '.join(have) or 'none'} (modprobe tcp_{cc} for another)"
    return None


def set_command(ip: str, netns: str, cc: str) -> list[str]:
    """The command that makes ``cc`` the congestion control of namespace ``netns``."""
    return [ip, "netns", "exec", netns, "sh", "-c", f'echo "$0" > {FILE}', cc]


def read(ip: str, netns: str) -> str:
    """The congestion control of namespace ``netns`` ("" if it cannot be read)."""
    r = subprocess.run([ip, "netns", "exec", netns, "cat", FILE], capture_output=True, text=True,
                       timeout=CMD_TIMEOUT_S, check=False)
    return r.stdout.strip()
