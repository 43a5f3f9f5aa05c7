"""Chaos for ``--max-restarts``: SIGKILL a random worker or PS server of a running ``psring train``,
again and again, each time once the run has restarted and made progress. Used by tests/test_chaos.py and
benchmarks/chaos.py; it only ever signals the launcher's own children.

A kill is sent only once the current attempt's processes are all new (not those of the attempt killed
before), a checkpoint exists (else there is nothing to restart from and the run rightly fails), and
every worker has logged a step of this attempt; then after a random delay, so kills land anywhere in a
step: in forward, in backward's pushes, while rank 0 writes a checkpoint.
"""
from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path


def children_of(pid: int) -> dict[int, str]:
    """The launcher's psring processes: ``{pid: "worker R" | "server I"}``: its children, and the children of its
    zygote (``zygote.py``: forks that show the command line they replace, a worker's rank after it)."""
    parent, argv, env = {}, {}, {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").split()
            env[int(d.name)] = (d / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
    mine = {p for p, pp in parent.items() if pp == pid}
    mine |= {p for p, pp in parent.items() if pp in mine}
    found = {}
    for p in sorted(mine & argv.keys()):
        args = argv[p]
        if b"worker" in args:
            titled = args[-2:][0] == b"(rank" if len(args) > 1 else False
            rank = args[-1][:-1].decode() if titled else next(
                (e[5:].decode() for e in env[p] if e.startswith(b"RANK=")), "?")
            found[p] = f"worker {rank}"
        elif b"server" in args:
            port_file = next((a.decode() for a in args if a.endswith(b".addr")), "server?.addr")
            found[p] = "server " + Path(port_file).stem.removeprefix("server")
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


class Chaos(threading.Thread):
    """``Chaos(launcher_pid, out, workers, kills).start()``; ``kills_done`` lists ``(name, pid)``
    killed. Ends after ``kills`` kills, when the launcher is gone, on ``stop()``, or after ``timeout_s``."""

    def __init__(self, launcher_pid: int, out: Path, workers: int, kills: int, seed: int = 0,
                 max_delay_s: float = 0.5, timeout_s: float = 300.0):
        super().__init__(daemon=True)
        self.launcher, self.out, self.workers, self.kills = launcher_pid, Path(out), workers, kills
        self.rng, self.max_delay_s = random.Random(seed), max_delay_s
        self.deadline = time.monotonic() + timeout_s
        self.kills_done: list[tuple[str, int]] = []
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(10)

    def _running(self) -> bool:
        return not self._halt.is_set() and time.monotonic() < self.deadline and _alive(self.launcher)

    def _progressed(self, before: set[int]) -> dict[int, str] | None:
        """The current attempt's processes once it is ready for a kill; None while not (yet)."""
        kids = children_of(self.launcher)
        workers = sum(name.startswith("worker") for name in kids.values())
        ranks = [self.out / "ranks" / f"rank{r}.jsonl" for r in range(self.workers)]
        if (workers < self.workers or set(kids) & before or not (self.out / "checkpoint").is_dir()
                or not all(f.exists() and f.stat().st_size > 0 for f in ranks)):
            return None
        return kids

    def run(self) -> None:
        before: set[int] = set()
        while len(self.kills_done) < self.kills and self._running():
            kids = self._progressed(before)
            if kids is None:
                time.sleep(0.05)
                continue
            time.sleep(self.rng.uniform(0, self.max_delay_s))
            kids = {p: n for p, n in children_of(self.launcher).items() if p in kids}
            if not kids:
                continue  # the run ended (or failed) meanwhile
            pid = self.rng.choice(sorted(kids))
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.kills_done.append((kids[pid], pid))
            before = set(kids)
