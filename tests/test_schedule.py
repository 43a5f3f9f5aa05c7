"""The reduce family's priority scheduler (sync/schedule.py): ranks whose buckets become ready at other
times still reduce them in one order (their collectives line up), that order serves the highest ready
index first, and a reduction's failure reaches every waiting bucket."""
from __future__ import annotations

import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from psring.sync.buckets import Bucket
from psring.sync.handles import Handle
from psring.sync.schedule import PriorityScheduler

N_BUCKETS = 8


class Done(Handle):
    def wait(self) -> None:
        pass


class Recorder:
    """A reducer that only records the order it was asked to reduce in."""

    def __init__(self, fail_at: int | None = None):
        self.order, self.fail_at = [], fail_at

    def launch(self, b: Bucket) -> Handle:
        if b.index == self.fail_at:
            raise RuntimeError(f"bucket {b.index} broke")
        self.order.append(b.index)
        time.sleep(0.03)  # a reduction takes a while: later buckets queue up behind it
        return Done()


def bucket(i: int) -> Bucket:
    return Bucket(i, 0, i, i + 1, [], torch.zeros(1))


def _rank(rank: int, port: int, out) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        rec = Recorder()
        sched = PriorityScheduler(rec, dist.new_group([0, 1], backend="gloo"), N_BUCKETS, timeout_s=30)
        handles = []
        # rank 0: every bucket at once; rank 1: the first half one by one, then the rest together
        for i in range(N_BUCKETS):
            handles.append(sched.submit(bucket(i)))
            if rank == 1 and i < N_BUCKETS // 2:
                time.sleep(0.02)
        for h in handles:
            h.wait()
        sched.close()
        out.put((rank, rec.order, sched.decisions))
    finally:
        dist.destroy_process_group()


def test_ranks_agree_on_one_priority_order():
    port = free_port()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, out), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = dict((r, (order, decisions)) for r, order, decisions in (out.get(timeout=60) for _ in procs))
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    assert got[0][0] == got[1][0], got  # the same collectives, in the same order, on both ranks
    order = got[0][0]
    assert sorted(order) == list(range(N_BUCKETS))
    # a bucket goes once ready on both ranks; once the last ones are, the newest first, then the rest
    top = order.index(N_BUCKETS - 1)
    assert top < N_BUCKETS // 2 + 1 and order[top:] == sorted(order[top:], reverse=True), order


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_failed_reduction_fails_every_later_bucket():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        sched = PriorityScheduler(Recorder(fail_at=1), dist.new_group([0], backend="gloo"), 3, timeout_s=10)
        try:
            with pytest.raises(RuntimeError, match="bucket 1 broke"):
                sched.submit(bucket(1)).wait()
            with pytest.raises(RuntimeError, match="earlier bucket"):
                sched.submit(bucket(0)).wait()
        finally:
            sched.close()
    finally:
        dist.destroy_process_group()
