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
import re
import signal
import threading
import time
from pathlib import Path

from .zygote import RANK_TITLE

_TITLED_RANK = re.compile(re.escape(RANK_TITLE).replace(re.escape("{}"), r"(\d+)") + "$")


def role_of(pid: int) -> str | None:
    """``"worker R"`` or ``"server I"`` for a psring worker or server, started afresh (its rank in ``RANK=`` of its
    environment) or forked from the zygote (its rank in the title ``zygote.RANK_TITLE`` ends its command line
    with); None for any other process, or one that is gone."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").split()
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    if args[1:3] != ["-m", "psring"] or len(args) < 4 or args[3] not in ("worker", "server"):
        return None
    if args[3] == "server":
        port_file = next((a for a in args if a.endswith(".addr")), "server?.addr")
        return "server " + Path(port_file).stem.removeprefix("server")
    titled = _TITLED_RANK.search(" ".join(args))
    return "worker " + (titled.group(1) if titled else next(
        (e[5:].decode() for e in env if e.startswith(b"RANK=")), "?"))


def children_of(pid: int, out: Path) -> dict[int, str]:
    """The launcher's psring processes: ``{pid: "worker R" | "server I"}``: its children, the children of its zygote
    (``zygote.py``) and the run's workers and servers whose command line names its folder ``out`` (forked by a zygote
    the shared one made for it: not the launcher's descendants, ``PSRING_ZYGOTE``)."""
    parent = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    mine = {p for p, pp in parent.items() if pp == pid}
    mine |= {p for p, pp in parent.items() if pp in mine}
    named = {f"{out}/", f"{Path(out).resolve()}/"}
    mine |= {p for p in parent if any(_names(p, text) for text in named)}
    return {p: role for p in sorted(mine) if (role := role_of(p)) is not None}


def _names(pid: int, text: str) -> bool:
    try:
        return text.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


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
        kids = children_of(self.launcher, self.out)
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
            kids = {p: n for p, n in children_of(self.launcher, self.out).items() if p in kids}
            if not kids:
                continue  # the run ended (or failed) meanwhile
            pid = self.rng.choice(sorted(kids))
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.kills_done.append((kids[pid], pid))
            before = set(kids)
