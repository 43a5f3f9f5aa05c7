"""``hierarchical`` on CPU: its in-host stages through shared memory (``sync/host_memory.py``), its cross-host
all-reduce in pieces, and gloo's collectives where a host cannot map the memory. Each test spawns 2 hosts x 2
gloo processes on loopback (a file store) that reduce buckets of awkward sizes and save what came out; the
sums must be exact sums of every rank's bucket, and no segment may be left under /dev/shm."""
from __future__ import annotations

import datetime
import os

import pytest
import torch
from test_ring import spawn

GLOO_TIMEOUT_S = 60
# an empty-ish bucket, one not a multiple of G (padded), one of several pieces (part > 1 MB), one of more
SIZES = (3, 1001, 3 * 2**20 + 5, 5 * 2**20)


def _worker(rank: int, world: int, store: str, out: str, shm_dir: str | None = None) -> None:
    import torch.distributed as dist

    from psring.sync import host_memory
    from psring.sync.buckets import Bucket
    from psring.sync.hierarchical import HierarchicalAllReduce
    from psring.sync.process_group import ProcessGroupInfo
    from psring.sync.reducer import CommThread

    if shm_dir is not None:
        host_memory.SHM_DIR = shm_dir
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
    red = HierarchicalAllReduce(ProcessGroupInfo(rank, world, rank, torch.device("cpu"), "gloo", None), 2)
    red.use_comm(CommThread(GLOO_TIMEOUT_S))
    try:
        buckets = [Bucket(i, 0, 0, n, [], torch.arange(n, dtype=torch.float32) % 97 * (rank + 1) + rank)
                   for i, n in enumerate(SIZES)]
        for h in [red.launch(b) for b in buckets]:
            h.wait()
        torch.save({"flat": [b.flat for b in buckets], "shared": red.memory is not None and not red.memory.failed,
                    "phases": sorted({m[0].split(" ", 2)[2] for m in red.take_messages()})},
                   os.path.join(out, f"rank{rank}.pt"))
    finally:
        red.comm.close()
        red.close()
        dist.destroy_process_group()


def _worker_without_shm(rank: int, world: int, store: str, out: str) -> None:
    _worker(rank, world, store, out, shm_dir=os.path.join(out, "no-such-dir"))


def _worker_second_host_without_shm(rank: int, world: int, store: str, out: str) -> None:
    """Host 0 maps its memory, host 1 cannot: their cross-host collectives must still line up."""
    _worker(rank, world, store, out, shm_dir=None if rank < 2 else os.path.join(out, "no-such-dir"))


@pytest.mark.parametrize("fn,shared", [(_worker, [True] * 4), (_worker_without_shm, [False] * 4),
                                       (_worker_second_host_without_shm, [True, True, False, False])])
def test_hierarchical_sums_exactly_through_memory_or_gloo(tmp_path, fn, shared):
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    assert spawn(fn, 4, tmp_path) == [0] * 4
    outs = [torch.load(tmp_path / f"rank{r}.pt") for r in range(4)]
    for i, n in enumerate(SIZES):
        base = torch.arange(n, dtype=torch.float32) % 97
        want = sum(base * (r + 1) + r for r in range(4))
        for o in outs:
            assert torch.equal(o["flat"][i], want), (i, n)
    assert [o["shared"] for o in outs] == shared
    assert all(o["phases"] == ["cross-host all-reduce", "host all-gather", "host reduce-scatter"] for o in outs)
    if os.path.isdir("/dev/shm"):
        assert not {f for f in set(os.listdir("/dev/shm")) - before if f.startswith("psring-")}
