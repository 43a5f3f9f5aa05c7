"""``--buffers local|broadcast|average`` (#26 item 4): BatchNorm's running statistics across workers.

In training mode the statistics never reach a gradient, so every mode trains the same parameters; what
differs is the buffers: ``broadcast`` leaves rank 0's own, ``average`` the workers' mean, equal whichever
strategy carried the gradients (the PS included, which has no collective of its own), and DDP's
``broadcast_buffers=False`` plus psring's average gives what all-reduce gives."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import types

import pytest
import torch
from conftest import Psring, run_concurrently
from test_equivalence import max_rel_diff

from psring.launch.launcher import free_port

MODEL, B, STEPS = "resnet18_narrow", 8, 3
RUNS = {"allreduce-local": ("allreduce", "local"), "allreduce-broadcast": ("allreduce", "broadcast"),
        "allreduce-average": ("allreduce", "average"), "ps-average": ("ps", "average"),
        "ddp-average": ("ddp", "average"), "ring-auto": ("ring", "auto")}


def _rank(rank: int, world: int, port: int, mode: str, dist_first: bool, q, received) -> None:
    import torch.distributed as dist
    from torch import nn

    from psring.sync.buffer_sync import make_buffer_sync

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        if dist_first:  # the reduce family: torch.distributed is up; the buffers get a group of their own
            dist.init_process_group("gloo", rank=rank, world_size=world)
        model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.BatchNorm1d(4))
        with torch.no_grad():
            for i, b in enumerate(model.buffers()):
                if b.is_floating_point():
                    b.copy_(torch.arange(b.numel(), dtype=torch.float32) * (rank + 1) + i)
                else:
                    b.fill_(7)
        strategy = types.SimpleNamespace(rank=rank, world=world, buffer_mode=lambda m: m)  # one that leaves them
        sync = make_buffer_sync(model, strategy, mode, 30)
        seconds, sent = sync.sync()
        q.put((rank, [b.clone() for b in model.buffers()], sent, sync.nbytes))
        # the tensors travel as file descriptors this process hands out: stay until the test has them
        received.wait(60)
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - reported to the test
        q.put((rank, repr(e), None, None))


def _agree(mode: str, world: int, dist_first: bool) -> dict:
    ctx = mp.get_context("spawn")
    q, received, port = ctx.Queue(), ctx.Event(), free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, mode, dist_first, q, received))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        got = dict((r, rest) for r, *rest in (q.get(timeout=60) for _ in procs))
    finally:
        received.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    for r, (bufs, _, _) in got.items():
        assert not isinstance(bufs, str), bufs
    return got


@pytest.mark.parametrize("mode,world,dist_first", [("broadcast", 2, True), ("average", 3, False),
                                                   ("local", 2, True)])
def test_buffers_agree_as_their_mode_says(mode, world, dist_first):
    got = _agree(mode, world, dist_first)
    start = {r: [torch.arange(4, dtype=torch.float32) * (r + 1) + i for i in (0, 1, 3, 4)] for r in range(world)}
    for r, (bufs, sent, nbytes) in got.items():
        floats = [b for b in bufs if b.is_floating_point()]
        assert all(int(b) == 7 for b in bufs if not b.is_floating_point())  # num_batches_tracked: untouched
        want = {"local": start[r], "broadcast": start[0],
                "average": [sum(start[k][i] for k in range(world)) / world for i in range(4)]}[mode]
        for a, b in zip(floats, want):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        assert nbytes == 4 * 4 * 4  # four float buffers of 4 elements
        assert sent == (0 if mode == "local" else 2 * (world - 1) * nbytes // world)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("buffers")
    runner = Psring(tmp)
    jobs = {k: ["train", "--sync", sync, "--workers", "2", "--model", MODEL, "--batch-size", str(B), "--steps",
                str(STEPS), "--seed", "3", "--num-samples", "256", "--buffers", mode, "--no-eval", "--out",
                str(tmp / k)] for k, (sync, mode) in RUNS.items()}
    try:
        done = run_concurrently(runner, jobs, at_once=3)
        for k, r in done.items():
            assert r.returncode == 0, (k, r.stderr[-2000:])
        yield tmp
    finally:
        runner.reap()


def _split(state: dict) -> tuple[dict, dict]:
    bufs = {k: v for k, v in state.items() if "running_" in k}
    return {k: v for k, v in state.items() if k not in bufs and v.is_floating_point()}, bufs


def test_every_mode_trains_the_same_parameters_and_keeps_its_own_statistics(runs):
    states = {k: _split(torch.load(runs / k / "model.pt")) for k in RUNS}
    params, bufs = states["allreduce-local"]
    for k in RUNS:
        assert max_rel_diff(states[k][0], params) <= 1e-5, k
    # rank 0's statistics are its own under broadcast (and under local, and as the ring keeps them)
    assert max_rel_diff(states["allreduce-broadcast"][1], bufs) <= 1e-6
    assert max_rel_diff(states["ring-auto"][1], bufs) <= 1e-5
    # the mean moved them, the same mean whichever strategy carried the gradients
    assert max_rel_diff(states["allreduce-average"][1], bufs) > 1e-3
    for k in ("ps-average", "ddp-average"):
        assert max_rel_diff(states[k][1], states["allreduce-average"][1]) <= 1e-5, k


def test_the_buffers_bytes_are_counted(runs):
    from psring.sync.buffer_sync import float_buffers
    from psring.train.models import build_model

    nbytes = sum(b.numel() * 4 for b in float_buffers(build_model(MODEL, 0)))
    for k in ("allreduce-average", "ps-average", "allreduce-broadcast"):
        s = json.loads((runs / k / "summary.json").read_text())
        assert s["buffer_bytes_per_step"] == nbytes, k  # 2(N-1)/N of them at N = 2
        assert s["buffers_s_p50"] is not None and s["buffers_s_p50"] > 0
    local = json.loads((runs / "allreduce-local" / "summary.json").read_text())
    avg = json.loads((runs / "allreduce-average" / "summary.json").read_text())
    assert avg["bytes_sent_per_step"] == local["bytes_sent_per_step"] + nbytes
    assert "buffer_bytes_per_step" not in local


def test_none_refuses_to_share_buffers_in_one_line(psring, tmp_path):
    r = psring.run("train", "--sync", "none", "--workers", "2", "--buffers", "average", "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "--buffers average" in r.stderr and "communicate nothing" in r.stderr
