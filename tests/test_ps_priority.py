"""The PS's priority scheduler (``--ps-credit-mb``, issue #29): pushes leave from a thread of their own,
the chunk nearest the model's input first, within credits that the servers' acks give back; the
servers ack a pushpull the moment they read it; the default credits; and training through it is
exactly the same training (the equivalence runs are in test_equivalence.py)."""
from __future__ import annotations

import contextlib

import torch
from test_ps_state import SGD, Tiny, live_server, train

from psring.config import OptimConfig
from psring.sync.ps.client import PSClient
from psring.sync.ps.comm import LocalChannel, PSComm
from psring.sync.ps.sharding import CREDIT_CHUNKS, credit_bytes, credit_chunks, credits_fit, servers_narrower
from psring.sync.ps.synchronizer import make_ps
from psring.sync.ps.transport import parse_message


def test_default_credits_are_chunks_where_the_link_is_known_and_compute_overlaps():
    link = (12.5e6, 12.5e6)
    two = credit_chunks(link, 4, 4)
    assert two == CREDIT_CHUNKS == credit_chunks(link, 2, 2)
    assert credit_bytes(None, "full", two, 100_000) == CREDIT_CHUNKS * 100_000 == credit_bytes(None, "backward",
                                                                                               two, 100_000)
    assert credit_chunks(link, 8, 8) == 4  # one per two workers: N copies of a chunk converge on its server
    assert credit_bytes(None, "none", two, 100_000) == 0  # all of it after backward: FIFO, measured at the bound
    assert credit_chunks(None, 4, 4) == 0 == credit_bytes(None, "full", 0, 100_000)  # loopback: no link
    assert credit_chunks(link, 8, 1) == 0  # the server's link is the narrow side
    assert credit_bytes(0.5, "none", 0, 1) == 1 << 19 and credit_bytes(0.0, "full", two, 1) == 0


def test_no_default_credits_where_the_servers_links_are_the_narrower_side():
    mbit = 1e6 / 8
    assert servers_narrower((50 * mbit, 50 * mbit), 8, 1)  # one server's link under 8 workers' pushes
    assert not servers_narrower((50 * mbit, 50 * mbit), 4, 4)
    assert not servers_narrower((50 * mbit, 400 * mbit), 8, 1)  # a fast server link carries the 8
    assert servers_narrower((50 * mbit, float("inf")), 4, 2)  # probed: the server side unknown, S < N
    assert not servers_narrower((50 * mbit, float("inf")), 4, 4)
    assert credits_fit((50 * mbit, 50 * mbit), 4, 4) and not credits_fit((50 * mbit, 50 * mbit), 8, 1)
    assert not credits_fit(None, 4, 4)  # loopback: no link to schedule


@contextlib.contextmanager
def inited_client(n=4):
    """A client of a one-worker server whose shard holds one key, ``k``: ``n`` ones."""
    with live_server(1) as srv:
        c = PSClient([srv.address], 0, 10)
        try:
            c.call(0, {"op": "init", "optim": {"name": "sgd", "lr": 0.1}}, [("k", torch.ones(n))])
            yield c
        finally:
            c.close()


def test_a_pushpull_with_ack_is_acknowledged_before_its_reply():
    with inited_client() as c:
        req = c.send(0, {"op": "pushpull", "step": 0, "ack": True}, [("k", torch.ones(4))])
        while not c.received(0, req):
            c.wait_any([0])
        _, named = c.recv(0, req)
        assert torch.allclose(named[0][1].tensor(), torch.full((4,), 0.9), atol=1e-3)  # 1 - 0.1 * (1 + wd)
        plain = c.send(0, {"op": "pushpull", "step": 1}, [("k", torch.ones(4))])
        c.recv(0, plain)
        assert not c.acks[0], "no ack without asking"


def test_pushes_leave_by_priority_within_the_credits_and_training_is_unchanged():
    """One worker, every chunk made ready one after the other (--overlap none) with credits of one chunk:
    once all are queued, the pushes leave nearest-the-input first (descending chunk index), from the
    channel's thread, while the first ones left as they came; the parameters
    after 3 steps are those of the FIFO path bit for bit."""
    cfg = OptimConfig(**SGD)
    got = {}
    for credit in (None, 0.00002):  # FIFO on the trainer's thread; the priority scheduler
        with live_server(1) as s0, live_server(1) as s1:
            sync = make_ps(0, 1, torch.device("cpu"), [s0.address, s1.address], cfg, timeout_s=10,
                           bucket_mb=0.00002, overlap="none", credit_mb=credit)
            try:
                model = sync.attach(Tiny())
                assert isinstance(sync.chan, PSComm if credit else LocalChannel)
                train(sync, model, range(2))
                model.zero_grad(set_to_none=False)
                torch.nn.functional.cross_entropy(model(torch.randn(4, 6)), torch.tensor([0, 1, 2, 0])).backward()
                stats = sync.step(2)
                got[credit] = {k: v.detach().clone() for k, v in model.state_dict().items()}
            finally:
                sync.close()
        pushes = [parse_message(name) for name, _, _ in stats.messages]
        order = [m[1] for m in pushes if m and m[0] == "push"]
        assert len(order) == len(sync.buckets.buckets) > 4
        if credit:  # the first pushes leave as their chunks come; once all are there, the highest first
            top = order.index(max(order))
            assert order[:top] == list(range(top)) and order[top:] == sorted(order[top:], reverse=True), order
    assert all(torch.equal(got[None][k], got[0.00002][k]) for k in got[None])


def test_ack_reply_helpers_do_not_leak():
    """``received`` forgets an ack once seen, and answers True for a request already replied to."""
    with inited_client(2) as c:
        req = c.send(0, {"op": "pushpull", "step": 0, "ack": True}, [("k", torch.ones(2))])
        c.recv(0, req)  # takes the ack on the way to the reply
        assert c.received(0, req) and not c.acks[0]


def test_a_hook_hands_over_every_chunk_it_completes_before_the_scheduler_looks():
    """One parameter can complete several chunks at once (ResNet-18's 9.4 MB convolutions span 13). The
    scheduler must see them all before it picks, or it pushes the lowest of them first: ``GradBuckets``
    calls ``after_launch`` once per hook, after its last ``on_ready``, and the PS wakes its thread only
    then (measured: woken per chunk, two workers' push orders differed, and a chunk one of them pushed
    early waited for the other's late push)."""
    from psring.sync.buckets import GradBuckets, flat_layout
    from psring.sync.ps.sharding import plan_chunks

    model = torch.nn.Linear(8, 4)  # bias 4 elements, weight 32: 9 chunks of 4 over 3 servers
    layout = flat_layout(list(model.named_parameters()))
    ranges = plan_chunks([[p.numel() for _, p, _ in sp.members] for sp in layout], [4], 3, 16, split=True)
    events = []
    buckets = GradBuckets(layout, ranges, lambda b: events.append(b.index),
                          after_launch=lambda: events.append("wake"))
    model(torch.randn(2, 8)).sum().backward()
    wakes = [i for i, e in enumerate(events) if e == "wake"]
    assert len(wakes) == 2 and wakes[-1] == len(events) - 1, events  # one per parameter's hook
    assert sorted(e for e in events if e != "wake") == list(range(len(buckets.buckets))), events
    assert wakes[1] - wakes[0] - 1 == 8, events  # the weight's hook (backward order: after the bias's)
    # completed its 8 chunks at once, then woke the thread once
