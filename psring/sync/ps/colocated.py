"""``--ps-placement colocated`` under torchrun: the local rank 0 of every node starts that node's PS
server itself, so a multi-node PS run is one torchrun command per node and no server is started by hand.

Server h runs on node h (GROUP_RANK), binds the address its node reaches MASTER_ADDR from, and is told
``--workers N``; its address goes into torchrun's store, and every worker reads all H of them, in node
order, before it connects. The server is this worker's child: it exits on its own once every worker
said done (the normal end), is stopped by ``stop_started`` when its worker finishes or fails, and dies
with its worker if that one is killed (the kernel's parent-death signal).
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

from ...launch.children import die_with_parent
from ...topology import local_world
from ...train.torchrun import job_store, own_address

ADDR_KEY = "psring/server-addr/"
START_TIMEOUT_S, EXIT_WAIT_S = 60.0, 10.0
_started: list[subprocess.Popen] = []  # still to stop (``stop_started``)
_hosts: list[int] = []  # the nodes whose server this process started (``started_hosts``)


def server_records(out: Path, host: int) -> Path:
    return Path(out) / "servers" / f"server{host}.jsonl"


def colocated_addrs(cfg, rank: int, world: int) -> list[str]:
    """Start this node's server (local rank 0 only) and return every node's server address."""
    g = local_world()
    hosts, host = world // g, rank // g
    store = job_store(rank, world, cfg.timeout_s)
    if rank % g == 0:
        store.set(f"{ADDR_KEY}{host}", start_server(cfg, host, world))
    return [store.get(f"{ADDR_KEY}{h}").decode() for h in range(hosts)]


def start_server(cfg, host: int, world: int) -> str:
    out = Path(cfg.out) / "servers"
    out.mkdir(parents=True, exist_ok=True)
    pf = out / f"server{host}.addr"
    pf.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "psring", "server", "--workers", str(world), "--bind", own_address(),
            "--port", "0", "--port-file", str(pf), "--idle-timeout", str(max(cfg.timeout_s * 2, 60)),
            "--metrics", str(server_records(cfg.out, host))] + (["--curve", cfg.curve] if cfg.curve else [])
    log = open(Path(cfg.out) / "servers" / f"server{host}.log", "ab")  # noqa: SIM115 - the child holds it
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=partial(die_with_parent, signal.SIGTERM))
    finally:
        log.close()
    _started.append(proc)
    _hosts.append(host)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not pf.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"the PS server of node {host} exited ({proc.returncode}); see {out}/server{host}.log")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the PS server of node {host} did not start within {START_TIMEOUT_S:.0f} s")
        time.sleep(0.05)
    return pf.read_text().strip()


def stop_started(wait_s: float = EXIT_WAIT_S) -> None:
    """Wait up to ``wait_s`` for the servers this worker started to finish (they do once every worker
    said done), then stop what is left."""
    deadline = time.monotonic() + wait_s
    while _started:
        proc = _started.pop()
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def started_hosts() -> list[int]:
    """The nodes whose server this process started (its own, under torchrun), stopped or not."""
    return list(_hosts)
