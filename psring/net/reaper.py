"""Delete a run's network namespaces once the process that created them is gone, however it went.

``EmulatedNetwork`` starts this file as a separate process (``python -S reaper.py IP PREFIX``) with the read
end of a pipe as its stdin; only the owner holds the write end. The kernel closes that write end when the
owner exits for any reason, SIGKILL included, so ``read()`` returning EOF is the one signal that needs no
cooperation from the owner. The reaper then deletes every namespace whose name starts with PREFIX (twice,
0.5 s apart, to catch one an in-flight ``ip`` created after the owner died) and exits. On a normal
``close()`` the owner deletes the namespaces itself, writes ``closed`` and closes the pipe; the reaper then
looks once, finds nothing left, and exits.

Stdlib only and no package imports: it is run by path with ``-S`` so it starts in milliseconds and does
not depend on the owner's environment. ``emulated.py`` imports the helpers below, so the owner, the reaper
and ``cleanup()`` list, recognise and delete namespaces the same way.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

CMD_TIMEOUT_S = 10.0  # an `ip` call that hangs this long is stuck; give up rather than hang the caller
PREFIX = "psr-"
# psr-<owner pid>-<4 hex>-<role>; the pid lets cleanup() tell a live run's namespaces from a dead one's.
NAME_RE = re.compile(r"^psr-(\d+)-[0-9a-f]{4}-(?:sw|chk|h\d+)$")


def list_namespaces(ip: str) -> list[str]:
    """Names of all network namespaces (``ip netns list`` prints ``name`` or ``name (id: N)``)."""
    out = subprocess.run([ip, "netns", "list"], capture_output=True, text=True, timeout=CMD_TIMEOUT_S,
                         check=False)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def delete_namespaces(ip: str, names: list[str]) -> None:
    """Delete ``names`` with one ``ip`` process; ``-force`` keeps going past a name that is already gone.

    Deleting a namespace destroys its interfaces (so both ends of each veth) and their qdiscs with it.
    Processes still inside keep the namespace alive, unnamed, until they exit.
    """
    if names:
        subprocess.run([ip, "-force", "-batch", "-"], input="".join(f"netns del {n}\n" for n in names),
                       capture_output=True, text=True, timeout=CMD_TIMEOUT_S, check=False)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def stale_namespaces(ip: str, all_runs: bool = False) -> list[str]:
    """psring's namespaces whose owning pid is gone (all of psring's if ``all_runs``)."""
    return [n for n in list_namespaces(ip)
            if (m := NAME_RE.match(n)) and (all_runs or not _pid_alive(int(m.group(1))))]


def main(argv: list[str]) -> int:
    ip, prefix = argv[1], argv[2]
    try:
        said = sys.stdin.buffer.read()  # returns once every write end is closed: by close() or by death
    except OSError:
        said = b""
    rounds = 1 if said else 2  # close() writes b"closed" first; bare EOF means the owner died
    for i in range(rounds):
        if i:
            # An `ip netns add` the owner started just before it died finishes on its own; take that too.
            time.sleep(0.5)
        delete_namespaces(ip, [n for n in list_namespaces(ip) if n.startswith(prefix)])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
