"""What a worker does for itself when torchrun (not ``psring train``) started it, on one host or many:
reach the job's key-value store, start its host's colocated PS server (``sync/ps/colocated.py``), and
hand its records to rank 0, so rank 0 writes ``steps.jsonl`` and ``summary.json`` whether or not the
output folder is shared between hosts.

The store is torchrun's own (its agent on node 0 hosts a TCPStore at MASTER_ADDR:MASTER_PORT and says
so in TORCHELASTIC_USE_AGENT_STORE); started some other way, rank 0 hosts one there, as
``torch.distributed``'s env:// initialisation does (multi-tenant: a process group's store on the same
port is shared, not clashed with).
"""
from __future__ import annotations

import datetime
import os
import socket
from pathlib import Path

RECORDS_KEY, SERVER_RECORDS_KEY = "psring/ranks/", "psring/server-records/"


def launched_by_psring() -> bool:
    return os.environ.get("PSRING_LAUNCHER") is not None


def job_store(rank: int, world: int, timeout_s: float):
    """A client of the job's TCPStore (rank 0 hosts it where no torchrun agent does)."""
    import torch.distributed as dist

    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise RuntimeError(f"{var} is not set; start workers with `psring train` or torchrun")
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                         is_master=rank == 0 and not agent, timeout=datetime.timedelta(seconds=timeout_s),
                         multi_tenant=True, wait_for_workers=False)


def own_address() -> str:
    """This host's address as the others reach it: the one its packets to MASTER_ADDR leave from (a UDP
    socket's connect sends nothing; it only picks the route)."""
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((master, 9))
        return s.getsockname()[0]


def gather_records(out: Path, rank: int, world: int, timeout_s: float, mine: dict[int, Path],
                   servers: list[int]) -> None:
    """Every rank hands its ``ranks/rankR.jsonl`` (and the records of the PS servers it started,
    ``mine``: {server index: file}) to rank 0 through the store; rank 0 writes what its own ``out``
    lacks of every rank's and of ``servers``' (the other hosts' started servers), then marks each rank
    done. Called after training, by every rank."""
    store = job_store(rank, world, timeout_s)
    if rank != 0:
        for i, path in mine.items():
            store.set(f"{SERVER_RECORDS_KEY}{i}", path.read_bytes() if path.is_file() else b"")
        store.set(f"{RECORDS_KEY}{rank}", (out / "ranks" / f"rank{rank}.jsonl").read_bytes())
        return
    ranks = out / "ranks"
    for r in range(1, world):
        _write_if_other(ranks / f"rank{r}.jsonl", store.get(f"{RECORDS_KEY}{r}"))
        (ranks / f"rank{r}.done").touch()
    for i in servers:
        data = store.get(f"{SERVER_RECORDS_KEY}{i}")
        if data:
            _write_if_other(out / "servers" / f"server{i}.jsonl", data)


def _write_if_other(path: Path, data: bytes) -> None:
    """A shared folder already holds the same bytes: leave it (another host may be reading it)."""
    if path.is_file() and path.read_bytes() == data:
        return
    from ..fileio import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)
