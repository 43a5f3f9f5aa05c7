"""The reduce family's priority scheduler (sync/schedule.py): ranks whose buckets become ready at other
times still reduce them in one order (their collectives line up), that order serves the highest ready
index first, no rank spins waiting for another, at most ``credits`` reductions are in flight, and a
reduction's failure reaches every waiting bucket."""
from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from psring.launch.launcher import free_port
from psring.sync.buckets import Bucket
from psring.sync.handles import Handle
from psring.sync.schedule import PLANS, PriorityScheduler

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


def _rank(rank: int, port: int, out, disjoint: bool = False, steps: int = 1) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        rec = Recorder()
        sched = PriorityScheduler(rec, dist.new_group([0, 1], backend="gloo"), N_BUCKETS, timeout_s=30,
                                  learn_steps=1)
        rounds = []  # consensus rounds taken by the end of each step
        for _ in range(steps):
            submit_step(sched, rank, disjoint)
            rounds.append(sched.decisions)
        sched.close()
        out.put((rank, rec.order, rounds))
    finally:
        dist.destroy_process_group()


def submit_step(sched: PriorityScheduler, rank: int, disjoint: bool) -> None:
    """One step's buckets, each rank at its own times; returns once every one is reduced."""
    handles = []
    if disjoint:  # rank 0: the last bucket, then 0.3 s later the rest; rank 1: one by one, the last last
        order = [N_BUCKETS - 1, *range(N_BUCKETS - 1)] if rank == 0 else list(range(N_BUCKETS))
        pause = [0.3] + [0.0] * N_BUCKETS if rank == 0 else [0.02] * N_BUCKETS
    else:  # rank 0: every bucket at once; rank 1: the first half one by one, then the rest together
        order = list(range(N_BUCKETS))
        pause = [0.0] * N_BUCKETS if rank == 0 else [0.02] * (N_BUCKETS // 2) + [0.0] * N_BUCKETS
    for i, wait in zip(order, pause):
        handles.append(sched.submit(bucket(i)))
        time.sleep(wait)
    for h in handles:
        h.wait()


def run_two(disjoint: bool, steps: int = 1) -> dict:
    port = free_port()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, out, disjoint, steps), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = dict((r, (order, decisions)) for r, order, decisions in (out.get(timeout=60) for _ in procs))
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    return got


def test_ranks_agree_on_one_priority_order():
    got = run_two(disjoint=False)
    assert got[0][0] == got[1][0], got  # the same collectives, in the same order, on both ranks
    order = got[0][0]
    assert sorted(order) == list(range(N_BUCKETS))
    # a bucket goes once ready on both ranks; once the last ones are, the newest first, then the rest
    top = order.index(N_BUCKETS - 1)
    assert top < N_BUCKETS // 2 + 1 and order[top:] == sorted(order[top:], reverse=True), order


def test_no_rank_spins_while_another_is_behind():
    """For 0.3 s each rank has buckets the other lacks: each asks again only with a new bucket of its own
    (or blocks in the all-reduce until the other does), instead of a round every few hundred microseconds."""
    got = run_two(disjoint=True)
    assert got[0][0] == got[1][0] and sorted(got[0][0]) == list(range(N_BUCKETS)), got
    assert got[0][1] == got[1][1] and got[0][1][0] <= 2 * N_BUCKETS + 2, got


def test_later_steps_keep_a_planned_order_without_rounds():
    """After ``learn_steps`` (1 here) the ranks launch in the order planned from the timed steps (the last
    one agreed on, then the first run in its plan: ``PLANS``), one order on both ranks whatever their timing,
    with no more consensus rounds."""
    got = run_two(disjoint=False, steps=2 + PLANS)
    assert got[0][0] == got[1][0], got  # still one order on both ranks
    steps = [got[0][0][i * N_BUCKETS:(i + 1) * N_BUCKETS] for i in range(2 + PLANS)]
    assert all(sorted(s) == list(range(N_BUCKETS)) for s in steps), steps
    assert steps[-1] == steps[-2], steps  # planned for the last time from step PLANS - 1
    rounds = got[0][1]
    assert rounds[0] >= N_BUCKETS and len(set(rounds)) == 1, got  # the first step's rounds only


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


class Timed(Handle):
    """A reduction that takes ``dur_s`` from its launch, counted in flight until then."""

    def __init__(self, log: list, dur_s: float):
        self.log, self.end = log, time.perf_counter() + dur_s
        log.append(1)
        self.inflight = sum(log)

    def wait(self) -> None:
        time.sleep(max(0.0, self.end - time.perf_counter()))
        self.log.append(-1)


class Pipelined:
    """A reducer whose launch returns at once (as gloo's async all-reduce or the ring's comm thread do)."""

    def __init__(self):
        self.log, self.handles = [], []

    def launch(self, b: Bucket) -> Handle:
        h = Timed(self.log, 0.02)
        self.handles.append(h)
        return h


@pytest.mark.parametrize("credits", [1, 2, 3])
def test_the_next_reduction_is_agreed_on_while_one_is_in_flight(credits):
    """With credits, the next bucket is launched while the last one still runs, never more than that many."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        red = Pipelined()
        sched = PriorityScheduler(red, dist.new_group([0], backend="gloo"), N_BUCKETS, timeout_s=10,
                                  credits=credits)
        try:
            for h in [sched.submit(bucket(i)) for i in range(N_BUCKETS)]:
                h.wait()
        finally:
            sched.close()
    finally:
        dist.destroy_process_group()
    assert max(h.inflight for h in red.handles) == credits
