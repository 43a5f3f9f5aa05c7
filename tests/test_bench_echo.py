"""The bench's raw transports: the ZeroMQ echo server, and its ``--update-bytes`` variant (echo + SGD
update, the PS's floor), served in a thread on loopback; and a bench run that times that floor."""
from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import pandas as pd
import pytest
import torch
import zmq

from psring.bench.echo import serve
from psring.bench.runner import run_bench
from psring.config import OptimConfig

TIMEOUT_MS = 10_000


@contextlib.contextmanager
def echo_in_thread(pf: Path, update_bytes: int = 0):
    """An echo server in a daemon thread: (its address, the thread); stopped on the way out (an empty message),
    even when the test failed, so that its socket and port do not wait out its 20 s idle timeout."""
    th = threading.Thread(target=serve, args=(str(pf), 20.0, "127.0.0.1", update_bytes), daemon=True)
    th.start()
    for _ in range(200):
        if pf.exists():
            break
        th.join(0.05)
    addr = pf.read_text().strip()
    try:
        yield addr, th
    finally:
        if th.is_alive():
            ctx = zmq.Context()
            stop = ctx.socket(zmq.DEALER)
            stop.linger = 0
            stop.connect(addr)
            stop.send(b"")
            th.join(10)
            ctx.destroy(linger=0)


def roundtrip(tmp_path, update_bytes: int, rounds: list[list[bytes]]) -> list[list[bytes]]:
    """Serve an echo in a thread, send each round's frames as one message, return the replies."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    try:
        with echo_in_thread(tmp_path / f"echo{update_bytes}.addr", update_bytes) as (addr, th):
            sock.connect(addr)
            replies = []
            for frames in rounds:
                sock.send_multipart(frames)
                assert sock.poll(TIMEOUT_MS), "echo server did not answer"
                replies.append(sock.recv_multipart())
            sock.send(b"")  # an empty message stops it
            th.join(10)
            assert not th.is_alive()
            return replies
    finally:
        sock.close()
        ctx.term()


def test_echo_returns_every_frame_unchanged(tmp_path):
    frames = [b"abc", bytes(range(256)) * 100, b"\x00" * 70_000]
    assert roundtrip(tmp_path, 0, [frames]) == [frames]


def test_echo_with_update_answers_with_sgd_updated_parameters(tmp_path):
    """A 6-element vector: two rounds in frames of 4 and 2 elements, then one of 6 that wraps to the start:
    the replies are what torch.optim.SGD (the PS's defaults, zeros at start) computes for the same
    gradients."""
    g = [torch.randn(6, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    rounds = [[g[i][:4].numpy().tobytes(), g[i][4:].numpy().tobytes()] for i in range(2)] + [[g[2].numpy().tobytes()]]
    replies = roundtrip(tmp_path, 24, rounds)
    cfg = OptimConfig()
    p = torch.zeros(6, requires_grad=True)
    opt = torch.optim.SGD([p], lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    for i in range(3):
        p.grad = g[i].clone()
        opt.step()
        got = torch.frombuffer(bytearray(b"".join(replies[i])), dtype=torch.float32)
        torch.testing.assert_close(got, p.detach(), rtol=1e-6, atol=1e-7)


def test_bench_times_the_update_floor_next_to_the_echo(tmp_path):
    """``floor=True``: a ps bench row set has the echo, the echo + SGD floor and the synchronizer, each
    with positive times, for the one size asked."""
    df = run_bench(1, [256 << 10], ["ps"], str(tmp_path / "b"), warmup=1, iters=3, servers=[1], floor=True,
                   timeout_s=240)
    assert sorted(df["strategy"]) == ["ps", "raw_zmq_echo", "raw_zmq_echo_sgd"]
    assert (df["time_s"] > 0).all() and (df["size_bytes"] == (256 << 10)).all()
    assert pd.read_csv(tmp_path / "b" / "bench.csv")["strategy"].nunique() == 3


def test_keep_freed_memory_applies_on_glibc_and_is_harmless_to_repeat():
    """Where the C library is glibc, mallopt exists and accepts the settings, twice in a row; elsewhere
    the call says it did nothing."""
    import platform

    from psring.allocator import keep_freed_memory

    expect = platform.libc_ver()[0] == "glibc"
    assert keep_freed_memory() is expect and keep_freed_memory() is expect


def test_bench_cli_floor_flag_adds_the_floor_rows(psring, tmp_path):
    """``psring bench --floor`` passes through: the CSV has raw_zmq_echo_sgd next to ps and its echo."""
    out = tmp_path / "cli"
    r = psring.run("bench", "--workers", "1", "--strategies", "ps", "--sizes", "64K", "--warmup", "0",
                   "--iters", "2", "--floor", "--out", str(out), timeout=240)
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(out / "bench.csv")
    assert set(df["strategy"]) == {"ps", "raw_zmq_echo", "raw_zmq_echo_sgd"}


def test_freezing_setup_objects_keeps_them_from_collections_and_still_frees_later_cycles():
    """``collector.freeze_setup_objects`` (what every psring worker, server and echo server calls once set up):
    what was alive moves out of the collector's reach, collections then walk only what came after, and a
    cycle made later is still freed. In a process of its own: a frozen pytest worker would keep every test's
    garbage."""
    import subprocess
    import sys

    code = """
import gc, weakref
import torch  # what a psring process holds: a few hundred thousand objects
from psring.collector import freeze_setup_objects
frozen = freeze_setup_objects()
assert frozen > 50_000, frozen
assert sum(gc.get_count()) < 1_000 and all(not gc.get_objects(g) or len(gc.get_objects(g)) < 10_000 for g in (0, 1, 2))
class Node: pass
a, b = Node(), Node(); a.other, b.other = b, a
gone = weakref.ref(a); del a, b
gc.collect()
assert gone() is None
print("ok", frozen)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr[-2000:]


def test_an_echo_round_to_no_server_fails_in_its_timeout_not_never(monkeypatch):
    """An echo server that is not there: zmq queues a DEALER's messages for it until 1,000 wait, then its send
    blocked for good. A round of 3,000 messages now fails after ``ECHO_TIMEOUT_S``."""
    import time

    from psring.bench import worker
    from psring.launch.launcher import free_port

    monkeypatch.setattr(worker, "ECHO_TIMEOUT_S", 0.3)
    ctx = zmq.Context()
    try:
        socks = worker.connect(ctx, [f"tcp://127.0.0.1:{free_port()}"])
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="took no message within 0.3 s"):
            worker.echo_round(socks, memoryview(bytes(3000 * 64)), 64)
        assert time.monotonic() - t0 < 5
    finally:
        ctx.destroy(linger=0)
