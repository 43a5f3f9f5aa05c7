"""The overlap floor's raw pieces (``psring.bench.paced`` workers against ``psring.bench.echo`` servers), on
loopback: its BSP servers sum every worker's push of a chunk and update once, its workers keep the schedule's
compute time and never deadlock under credits, and a reply lands in the parameters."""
from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

from psring.bench.paced import PacedWorker
from psring.config import OptimConfig
from psring.launch.children import Children
from psring.launch.launcher import start_listeners

SIZES = [4000, 12_000, 2000, 6000]  # bytes of four "tensors", in forward order


@pytest.fixture
def servers(tmp_path):
    """Two echo servers of the given kind (``--bsp 2`` or a plain echo with its update); their addresses."""
    kids = Children()

    def start(bsp: int) -> list[str]:
        specs = [(f"echo {i}", [sys.executable, "-m", "psring.bench.echo", "--port-file", str(tmp_path / f"e{i}"),
                                "--update-bytes", str(sum(SIZES)), "--bsp", str(bsp), "--idle-timeout", "60"],
                  tmp_path / f"e{i}", tmp_path / f"e{i}.log") for i in range(2)]
        return start_listeners(kids, specs)

    yield start
    kids.stop_all()


def run_workers(addrs: list[str], n: int, mode: str, steps: int, forward_s: float, backward_s: float,
                credits: int, keyed: bool, ones: bool = False) -> list[tuple[PacedWorker, list[float]]]:
    """``n`` paced workers in threads, started together; each with its steps' start times."""
    import time

    workers = [PacedWorker(addrs, SIZES, 4096, credits, forward_s, backward_s, mode, keyed) for _ in range(n)]
    real: list = [None] * n  # each worker's steps on the wall clock, not on its own compute clock
    if ones:
        for w in workers:
            w.grads[:] = np.ones(sum(SIZES) // 4, dtype=np.float32).view(np.uint8)
    out: list = [None] * n
    start_at = time.time() + 0.2

    def go(i: int) -> None:
        out[i] = workers[i].run(steps, start_at)
        real[i] = time.time() - start_at

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)  # (longer than a worker's own REPLY_TIMEOUT_S: it gives up first, and closes nothing early)
        assert all(o is not None for o in out), "a paced worker did not finish"
    finally:
        for w, t in zip(workers, threads):
            if not t.is_alive():  # (a socket is closed only by a thread that no longer uses it)
                w.close()
    return [(w, o, r) for w, o, r in zip(workers, out, real)]


def test_bsp_servers_sum_every_push_and_update_once(servers):
    """Two workers push gradients of 1.0; a BSP server answers with one momentum-SGD update of their sum:
    parameters 0 - lr * (1 + 1) after one step, whichever chunk and server."""
    done = run_workers(servers(2), 2, "backward", 1, 0.0, 0.0, credits=1, keyed=True, ones=True)
    want = -OptimConfig().lr * 2
    for w, starts, _ in done:
        got = w.params.view(np.float32)
        assert np.allclose(got, want), (got.min(), got.max(), want)
        assert len(starts) == 2


@pytest.mark.parametrize("mode", ["backward", "full"])
def test_paced_steps_keep_their_compute_and_finish_under_credits(servers, mode):
    """With one credit and keyed BSP servers nothing deadlocks (credits come back with acks), and the steps
    take at least their compute on the wall clock: forward + backward each (``full`` overlaps only
    communication), however fast the loopback answers."""
    forward_s, backward_s = 0.02, 0.04
    done = run_workers(servers(2), 2, mode, 5, forward_s, backward_s, credits=1, keyed=True)
    for w, starts, real in done:
        assert len(starts) == 6 and all(w.answered)
        assert real >= 0.99 * 5 * (forward_s + backward_s), real


def test_echo_floor_without_bsp_answers_each_push(servers):
    """Plain echo servers with their update answer in send order, per worker (no keys on the wire)."""
    done = run_workers(servers(0), 1, "none", 3, 0.0, 0.0, credits=0, keyed=False)
    (w, starts, _), = done
    assert len(starts) == 4 and all(w.answered) and w.waiting == 0


def test_overlap_floor_table_without_its_columns_is_one_line_error(tmp_path):
    from psring.plot.overlap_floor import load_overlap_floor

    assert load_overlap_floor(tmp_path) is None
    (tmp_path / "overlap_floor.csv").write_text("kind,mode\npsring,full\n")
    with pytest.raises(ValueError, match="missing column"):
        load_overlap_floor(tmp_path)


def test_a_start_at_far_ahead_is_refused_not_slept_on(tmp_path, capsys):
    """``--start-at`` is time.time() in seconds: one far ahead (milliseconds given, say) is an error, not a sleep
    of years, in both paced workers."""
    import time

    from psring.bench import paced, reduce_paced

    far = str(time.time() * 1000)
    for main, extra in ((paced.main, ["--addrs", "a.json", "--chunk", "1024"]),
                        (reduce_paced.main, ["--partition", "1024", "--link-Bps", "1e8"])):
        with pytest.raises(SystemExit) as e:
            main(["--sizes", "s.json", *extra, "--start-at", far, "--out", str(tmp_path / "o")])
        assert e.value.code == 2 and "is more than 60 s from now" in capsys.readouterr().err
