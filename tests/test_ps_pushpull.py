"""The PS's pushpull (answered with the pushed keys' new values once their update ran), the fused
server update, and the client's handling of replies that arrive before the one it waits for."""
from __future__ import annotations

import torch
from test_ps import INIT, OPTIM, grads, server, sgd  # noqa: F401 - server is a fixture used by name

from psring.sync.ps import protocol as P
from psring.sync.ps.client import PSClient
from psring.sync.ps.store import ShardStore

MOMENTUM = {"lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4}


def test_pushpull_waits_for_every_worker_then_returns_new_values(server):  # noqa: F811
    c0, c1 = PSClient([server.address], 0, 10), PSClient([server.address], 1, 10)
    try:
        c0.call(0, {"op": "init", "optim": OPTIM}, INIT)
        g0, g1 = grads(1), grads(2)
        # each worker pushes the two keys in two requests, like two buckets
        r0 = [c0.send(0, {"op": "pushpull", "step": 0}, [g]) for g in g0]
        assert c0.socks[0].poll(300) == 0, "a pushpull was answered before worker 1 pushed"
        r1 = [c1.send(0, {"op": "pushpull", "step": 0}, [g]) for g in g1]
        expected = sgd(dict(INIT), g0, g1)
        for c, reqs in ((c0, r0), (c1, r1)):
            for req, (key, _) in zip(reqs, INIT):
                header, [(got_key, got)] = c.recv(0, req)
                assert header["version"] == 1 and got_key == key and torch.equal(got.tensor(), expected[key])
        # step 1 is accepted right away: the version advanced with the last key's update
        r0 = c0.send(0, {"op": "pushpull", "step": 1}, grads(3))
        r1 = c1.send(0, {"op": "pushpull", "step": 1}, grads(4))
        expected = sgd(expected, grads(3), grads(4))
        for c, req in ((c0, r0), (c1, r1)):
            _, named = c.recv(0, req)
            assert all(torch.equal(t.tensor(), expected[k]) for k, t in named) and len(named) == len(INIT)
    finally:
        c0.close()
        c1.close()


def test_client_keeps_replies_that_arrive_before_the_awaited_one(server):  # noqa: F811
    c = PSClient([server.address], 0, 10)
    try:
        init = c.send(0, {"op": "init", "optim": OPTIM}, INIT)
        pull = c.send(0, {"op": "pull", "version": 0})
        header, named = c.recv(0, pull)  # the init's reply arrives first and is kept
        assert header["version"] == 0 and [k for k, _ in named] == [k for k, _ in INIT]
        assert c.recv(0, init)[0]["ok"] and c.early[0] == {}
    finally:
        c.close()


def split_frames(named, frame_bytes):
    """What a server decodes after a worker sent ``named`` in frames of at most ``frame_bytes``."""
    metas, frames = P.encode_tensors(named, frame_bytes)
    return P.decode_tensors({"tensors": metas}, [bytes(f) for f in frames])


def test_fused_update_bit_exact_with_torch_sgd_for_split_frames_and_two_workers():
    """One worker with tensors split over frames (updated frame by frame, straight from the wire) and
    two workers (summed, halved): both equal torch.optim.SGD on the mean gradient, bit for bit."""
    torch.manual_seed(0)
    init = torch.randn(5000)
    for workers in (1, 2):
        store = ShardStore(workers)
        store.init([("w", init)], MOMENTUM)
        p = torch.nn.Parameter(init.clone())
        opt = torch.optim.SGD([p], **MOMENTUM)
        for t in range(4):
            gs = [torch.randn(5000) for _ in range(workers)]
            for w, g in enumerate(gs):
                named = split_frames([("w", g)], 4096)
                assert named[0][1].nframes > 1
                store.push(w, t, named)
            p.grad = gs[0].clone() if workers == 1 else (gs[0] + gs[1]).div_(2)
            opt.step()
            assert store.version == t + 1
            assert torch.equal(store.params["w"], p.detach()), (workers, t)
