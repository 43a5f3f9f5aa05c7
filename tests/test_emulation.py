"""Compute emulation (train/emulation.py): gradients come in backward order, each no earlier than the end of
its byte share of the backward time, and the backward as a whole keeps to that time rather than adding to it
what runs between the nodes (only lower bounds are asserted: an upper one would be a timing test)."""
from __future__ import annotations

import time

import torch
from torch import nn

from psring.train.emulation import FORWARD_SHARE, EmulatedCompute, _Deadlines


def test_each_gradient_is_due_at_the_end_of_its_share_of_backward():
    model = nn.Sequential(nn.Linear(40, 30), nn.Linear(30, 20), nn.Linear(20, 10))
    params = list(model.parameters())
    ms = 150.0
    emu = EmulatedCompute(model, ms, seed=0)
    landed: dict[int, float] = {}
    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda _p, i=i: landed.__setitem__(i, time.perf_counter()))
    loss = emu.forward()
    t0 = time.perf_counter()
    loss.backward()
    backward_s = ms / 1000 * (1 - FORWARD_SHARE)
    assert time.perf_counter() - t0 >= backward_s * 0.999
    # the last parameters first, as a real backward; parameter i no earlier than its due time
    assert sorted(landed, key=landed.get) == list(reversed(range(len(params))))
    total = sum(p.numel() for p in params)
    due = 0.0
    for i in reversed(range(len(params))):
        due += backward_s * params[i].numel() / total
        assert landed[i] - t0 >= due - 2e-3, (i, landed[i] - t0, due)
    for p, g in zip(params, emu.grads):
        torch.testing.assert_close(p.grad, g)


def test_deadlines_absorb_the_time_spent_between_nodes():
    """Work between two nodes (an accumulation, a hook) is inside the next node's wait, not added to it."""
    clock = _Deadlines()
    t0 = time.perf_counter()
    clock.wait(0.0)  # starts the clock
    time.sleep(0.1)  # 100 ms of work between nodes ...
    clock.wait(0.2)  # ... inside the 200 ms the next node is due at: 0.2 s in all, not 0.3
    assert 0.2 <= time.perf_counter() - t0 < 0.28
