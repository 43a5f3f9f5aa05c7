"""The PS's planned push order (``--ps-order planned``, issue #29): under credits, once ``transport.PLAN_STEP`` was timed, a worker
pushes, at each freed credit, the ready chunk earliest in the order ``transport.push_order`` plans from that
step's hand-over times (TicTac's order, used as a ranking) instead of the one nearest the input; the replay
(``simulate/overlapped_ps.py``) plans with the same function, and training is unchanged."""
from __future__ import annotations

import doctest

import pytest
import torch
from test_ps_state import SGD, Tiny, live_server, train

from psring.config import OptimConfig, TrainConfig
from psring.simulate import overlapped_ps
from psring.simulate.run import simulate
from psring.sync.buckets import Bucket
from psring.sync.ps import sharding, transport
from psring.sync.ps.synchronizer import make_ps
from psring.sync.ps.transport import PLAN_STEP, parse_message, push_order


def test_push_order_is_a_serial_links_priority_order():
    for mod in (transport, sharding):  # push_order, and plan_link_Bps: when a worker plans at all
        assert doctest.testmod(mod).failed == 0
    # handed over together: nearest the input first; one handed over late waits, whatever its priority
    assert push_order([0.0] * 4, [100] * 4, 100.0) == [3, 2, 1, 0]
    assert push_order([0.0, 0.0, 0.0, 9.0], [100] * 4, 100.0) == [2, 1, 0, 3]


class _Client:
    """A PS client with no sockets: a push is acked when the test says so."""
    frame_bytes, bytes_sent, bytes_recv = None, 0, 0

    def __init__(self):
        self.reqs, self.acked = 0, set()

    def send(self, server, header, encoded=None):
        self.reqs += 1
        return self.reqs - 1

    def collect(self, server):
        pass

    def received(self, server, req):
        return req in self.acked


def test_a_planned_worker_pushes_the_ready_chunk_earliest_in_its_plan():
    """One chunk of credits: each push is, of the chunks handed over and not yet pushed, the one earliest in
    the plan, whether or not the plan's earlier chunks are ready (the link never waits for one)."""
    buckets = [Bucket(i, 0, 0, 4, [], torch.zeros(4), group=i % 2) for i in range(6)]
    client = _Client()
    tr = transport.ChunkTransport(client, buckets, 2, torch.device("cpu"), 0, credit_bytes=16, link_Bps=1e6)
    tr.order = [4, 1, 5, 0, 3, 2]
    tr.rank = {c: k for k, c in enumerate(tr.order)}

    def hand(*chunks):
        for c in chunks:
            tr.enqueue(buckets[c])
        tr.pump_ready()

    def ack():  # the oldest push in flight
        client.acked.add(len(client.acked))
        tr.pump_ready()

    hand(0, 3)       # 4 and 1, earlier in the plan, are not ready: 0 goes (before 3)
    hand(2, 5)       # the credit is taken: they wait
    ack()            # 5, the earliest ready
    hand(1)
    ack()            # 1
    ack()            # 3 (2 is last)
    hand(4)
    ack()            # 4
    ack()            # 2
    pushed = [m[1] for _, name, _ in tr.messages if (m := parse_message(name)) and m[0] == "push"]
    assert pushed == [0, 5, 1, 3, 4, 2] and not tr.ready


def test_under_full_a_worker_plans_from_its_pushes_busy_time():
    """``timed_busy`` (``--overlap full``): in step ``PLAN_STEP`` each push's span runs from its send to its ack as
    the pump sees it, and the plan is ``push_order`` over their union; without spans for every chunk (an ack not
    seen), from the bytes at the link's rate."""
    buckets = [Bucket(i, 0, 0, 4, [], torch.zeros(4), group=i % 2) for i in range(4)]
    for acks in (4, 3):
        client = _Client()
        tr = transport.ChunkTransport(client, buckets, 2, torch.device("cpu"), 0, credit_bytes=16, link_Bps=1e6,
                                      timed_busy=True)
        tr.steps_run = PLAN_STEP
        for b in buckets:
            tr.handed(b)
            tr.enqueue(b)
            tr.pump_ready()
        for req in range(acks):
            client.acked.add(req)
            tr.pump_ready()
        spans = [x for x in tr.spans.values() if x[1] is not None]
        assert len(tr.spans) == 4 and len(spans) == acks and all(a <= b for a, b in spans)
        handed = [tr.handed_at[i] for i in range(4)]
        want = push_order(handed, [16] * 4, 1e6, spans if acks == 4 else None)
        tr.end_step()
        assert tr.order == want and not tr.spans


def _pushes(stats) -> list[int]:
    return [m[1] for name, _, _ in stats.messages if (m := parse_message(name)) and m[0] == "push"]


def test_after_the_timed_step_a_worker_plans_its_order_and_trains_the_same():
    """One worker, two servers, 1-chunk credits, the link told: no plan before ``PLAN_STEP`` ended, then a
    plan (a permutation of the chunks) and every chunk pushed once in the next step; the parameters are
    those of the same run by priority (``--ps-order priority``: no plan), bit for bit."""
    cfg, got = OptimConfig(**SGD), {}
    for order in ("priority", "planned"):
        with live_server(1) as s0, live_server(1) as s1:
            sync = make_ps(0, 1, torch.device("cpu"), [s0.address, s1.address], cfg, timeout_s=10,
                           bucket_mb=0.00002, overlap="backward", credit_mb=0.00002, links_Bps=(1e5, 1e5),
                           order=order)
            try:
                model = sync.attach(Tiny())
                train(sync, model, range(PLAN_STEP + 1))
                planned = sync.tr.order
                model.zero_grad(set_to_none=False)
                torch.nn.functional.cross_entropy(model(torch.randn(4, 6)), torch.tensor([0, 1, 2, 0])).backward()
                stats = sync.step(PLAN_STEP + 1)
                got[order] = {k: v.detach().clone() for k, v in model.state_dict().items()}
            finally:
                sync.close()
        n = len(sync.buckets.buckets)
        if order == "priority":
            assert planned is None
        else:
            assert sorted(planned) == list(range(n)) and n > 4
            assert sorted(_pushes(stats)) == list(range(n))
    assert all(torch.equal(got["priority"][k], got["planned"][k]) for k in got["priority"])


def test_the_replay_plans_with_the_workers_function_and_pushes_by_its_rank(tmp_path, monkeypatch):
    """ps S = N = 4, 1 Gbit, ``--overlap full``: every replayed worker plans once, from step PLAN_STEP's ready
    times and its pushes' spans, with ``transport.push_order`` itself; each later push is, of its step's ready
    chunks, the one earliest in that plan (before the plan: the one nearest the input)."""
    assert overlapped_ps.push_order is transport.push_order and overlapped_ps.PLAN_STEP == PLAN_STEP
    plans, pushed = [], {}
    real_push = overlapped_ps.OverlapPS._push

    def spy_order(handed, nbytes, link_Bps, spans=None):
        assert spans is not None and len(spans) == len(nbytes)  # --overlap full: from the pushes' spans
        plans.append(push_order(handed, nbytes, link_Bps, spans))
        return plans[-1]

    def spy_push(self, w, step, c):
        mine = {x for s, x in self.ready[w] if s == step} | {c}  # its step's ready chunks, c just taken off
        assert step <= PLAN_STEP or self.order[w] in plans  # its plan is push_order's
        rank = {x: k for k, x in enumerate(self.order[w])} if step > PLAN_STEP else {x: -x for x in mine}
        assert min(mine, key=rank.get) == c, (w, step, c)
        pushed.setdefault((w, step), []).append(c)
        return real_push(self, w, step, c)

    monkeypatch.setattr(overlapped_ps, "push_order", spy_order)
    monkeypatch.setattr(overlapped_ps.OverlapPS, "_push", spy_push)
    cfg = TrainConfig(sync="ps", servers=4, workers=4, model="resnet18", net="emulated", link_rate="1gbit",
                      compute="emulated:374", overlap="full", steps=PLAN_STEP + 3, warmup=1, batch_size=16,
                      ps_order="planned").validate()
    simulate(cfg, tmp_path / "sim")
    assert len(plans) == 4 and all(sorted(p) == list(range(len(plans[0]))) for p in plans)
    for w in range(4):  # each step pushes every chunk once
        for step in range(cfg.steps):
            assert sorted(pushed[w, step]) == sorted(plans[0]), (w, step)
        assert pushed[w, PLAN_STEP + 1] != pushed[w, 0]  # the plan changed the order


def test_priority_plans_nothing_in_the_replay_and_old_runs_load_as_priority(tmp_path, monkeypatch):
    """``--ps-order priority`` plans nothing; ``planned`` is the default (results/overlap_floor: faster at N = 4,
    1 Gbit and at N = 8, 100 Mbit with the rate probed), and a run saved before the option existed, which pushed
    by priority, loads as ``priority`` (its replay is what it ran)."""
    monkeypatch.setattr(overlapped_ps, "push_order", lambda *a: pytest.fail("planned under --ps-order priority"))
    cfg = TrainConfig(sync="ps", servers=4, workers=4, model="resnet18", net="emulated", link_rate="1gbit",
                      compute="emulated:374", overlap="full", steps=PLAN_STEP + 2, warmup=1, batch_size=16,
                      ps_order="priority").validate()
    assert TrainConfig().ps_order == "planned"
    old = cfg.to_dict()
    del old["ps_order"]
    assert TrainConfig.from_dict(old).ps_order == "priority"
    simulate(cfg, tmp_path / "sim")
