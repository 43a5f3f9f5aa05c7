"""A run whose process dies or hangs must end, quickly, with an error naming that process, and leave
nothing running: SIGKILL a worker or a PS server mid-run, SIGSTOP a worker (default timeouts)."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from conftest import pids_of, processes_mentioning, wait_for

DEADLINE_S = 30


def child_pid(out: Path, role: str, index: int) -> int | None:
    """PID of ``worker i`` / ``server i`` of the run writing to ``out``, found by its command line (a fork of the
    zygote shows the one it would have been started with, a worker's rank after it: ``launch/zygote.py``)."""
    return next(iter(pids_of(out, role, index)), None)


def steps_logged(out: Path, rank: int) -> int:
    f = out / "ranks" / f"rank{rank}.jsonl"
    return len(f.read_text().splitlines()) if f.exists() else 0


@pytest.mark.parametrize("sync,role,sig", [("ps", "worker", "SIGKILL"), ("ps", "server", "SIGKILL"),
                                           ("allreduce", "worker", "SIGKILL"),
                                           ("allreduce", "worker", "SIGSTOP"), ("ps", "server", "SIGSTOP")])
def test_killed_or_stopped_process_stops_everything(psring, tmp_path, sync, role, sig):
    out = tmp_path / "run"
    args = ["train", "--sync", sync, "--workers", "2", "--steps", "100000", "--batch-size", "8",
            "--num-samples", "512", "--out", str(out), "--log-every", "1000"]
    if sync == "ps":
        args += ["--servers", "2"]
    proc = psring.start(*args)
    wait_for(lambda: steps_logged(out, 1) >= 3, 120, "worker 1 to run a few steps")
    victim = wait_for(lambda: child_pid(out, role, 1), 10, f"{role} 1's pid")
    os.kill(victim, getattr(signal, sig))
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=DEADLINE_S + 10)
    except Exception:
        pytest.fail(f"psring train still running {DEADLINE_S + 10} s after {role} 1 got {sig}")
    elapsed = time.monotonic() - t0
    assert proc.returncode not in (0, None)
    assert elapsed <= DEADLINE_S, f"took {elapsed:.1f} s to stop"
    assert f"{role} 1" in err and ("SIGKILL" in err if sig == "SIGKILL" else "stopped" in err), err
    assert len(err.strip().splitlines()) == 1, f"expected one line on stderr, got:\n{err}"
    time.sleep(0.5)
    assert processes_mentioning(str(out)) == [], "processes of the run survived the launcher"


def test_sigterm_to_launcher_stops_children(psring, tmp_path):
    out = tmp_path / "run"
    proc = psring.start("train", "--sync", "ps", "--workers", "2", "--steps", "100000", "--batch-size", "8",
                        "--num-samples", "512", "--out", str(out), "--log-every", "1000")
    wait_for(lambda: steps_logged(out, 0) >= 2, 120, "worker 0 to run a few steps")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 130, err
    time.sleep(0.5)
    assert processes_mentioning(str(out)) == []


def test_launcher_killed_hard_takes_children_with_it(psring, tmp_path):
    """PR_SET_PDEATHSIG: even SIGKILL of the launcher (no cleanup code runs) leaves no orphans."""
    out = tmp_path / "run"
    proc = psring.start("train", "--sync", "allreduce", "--workers", "2", "--steps", "100000",
                        "--batch-size", "8", "--num-samples", "512", "--out", str(out), "--log-every", "1000")
    wait_for(lambda: steps_logged(out, 0) >= 2, 120, "worker 0 to run a few steps")
    proc.kill()
    proc.wait(10)
    wait_for(lambda: processes_mentioning(str(out)) == [], 10, "the workers to die with the launcher")


def test_server_port_in_use_is_one_line_and_exit_2(psring, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = psring.run("server", "--workers", "1", "--port", str(port), timeout=60)
    assert r.returncode == 2 and "Address already in use" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
