"""The link sampler (``psring.net.links``): parsing the kernel's counters, the sampling loop's lines,
and the check of their sums against per-host totals. The sampler inside a real emulated run, against
the kernel's interface counters, is in tests/test_emulated_run.py."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from psring.net import links

DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:     100       1    0    0    0     0          0         0      100       1    0    0    0     0       0          0
    s0: 5000      10    0    0    0     0          0         0   7000      12    0    0    0     0       0          0
  br0:  999       1    0    0    0     0          0         0      999       1    0    0    0     0       0          0
    s1:  11       1    0    0    0     0          0         0       22       1    0    0    0     0       0          0
   s12:  1       1    0    0    0     0          0         0       2       1    0    0    0     0       0          0
"""


def test_reads_every_switch_port_and_nothing_else(tmp_path):
    f = tmp_path / "dev"
    f.write_text(DEV)
    assert links.read_ports(2, str(f)) == ([5000, 11], [7000, 22])  # s12 is not one of s0..s1; lo, br0 ignored
    assert links.read_ports(3, str(f)) == ([5000, 11, 0], [7000, 22, 0])  # a port not there reads 0


def test_lines_are_deltas_and_a_sigterm_writes_a_last_one(tmp_path):
    """The sampler as the launcher runs it (here on this namespace's ports: none, so zeros); SIGTERM ends it
    with a last line and its CPU seconds."""
    out, cpu = tmp_path / "links.jsonl", tmp_path / "links.cpu"
    p = subprocess.Popen([sys.executable, "-m", "psring.net.links", "--ports", "3", "--out", str(out),
                          "--interval-ms", "10", "--cpu-file", str(cpu)])
    try:
        deadline = time.monotonic() + 30
        while not (out.exists() and out.stat().st_size > 0) and time.monotonic() < deadline:
            time.sleep(0.05)  # flushed after a second of samples
        p.send_signal(signal.SIGTERM)
        assert p.wait(10) == 0
    finally:
        p.kill()
    rows = links.load(out)
    assert len(rows) >= 50, len(rows)
    assert all(len(r["up"]) == len(r["down"]) == 3 for r in rows)
    assert all(r["cpu"] is None or 0 <= r["cpu"] <= 1 for r in rows) and any(r["cpu"] is not None for r in rows)
    gaps = [b["time"] - a["time"] for a, b in zip(rows, rows[1:])]
    assert 0.005 < sorted(gaps)[len(gaps) // 2] < 0.03, "about one line per 10 ms"
    assert float(cpu.read_text()) >= 0


def test_check_holds_sums_against_the_kernel_and_names_the_worst_host(tmp_path):
    f = tmp_path / "links.jsonl"
    rows = [{"time": t, "dt": 0.02, "up": [100, 0], "down": [50, 10]} for t in range(10)]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"time": 3, "dt"')  # a torn last line
    c = links.check(links.load(f), [(1000, 500), (0, 100)])
    assert c["links_samples"] == 10 and c["links_interval_ms"] == 20.0
    assert c["links_up_vs_kernel"] == pytest.approx(1.0) and c["links_down_vs_kernel"] == pytest.approx(1.0)
    assert c["links_worst_host_error"] == pytest.approx(0.0)
    c = links.check(links.load(f), [(1000, 500), (0, 200)])  # host 1 received twice what the samples saw
    assert c["links_down_vs_kernel"] == pytest.approx(600 / 700)
    assert c["links_worst_host_error"] == pytest.approx(0.5)


def test_bad_arguments_are_one_line_and_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "psring.net.links", "--ports", "0", "--out", str(tmp_path / "x")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def tick(t, up, cpu, dt=0.02):
    """A sample of two hosts' links: host 0 uploads ``up`` bytes, host 1 downloads them."""
    return {"time": t, "dt": dt, "up": [up, 0], "down": [0, up], "cpu": cpu}


def test_comm_cpu_is_the_cpu_of_the_intervals_in_which_a_link_carried_traffic():
    rate = [1e9, 1e9]  # 2.5 MB in 20 ms: the link's rate
    full, idle = 2_500_000, 0
    rows = ([tick(0.02 * i, full, 0.9) for i in range(15)] + [tick(0.3 + 0.02 * i, idle, 0.1) for i in range(10)]
            + [tick(0.5 + 0.02 * i, full // 2, 0.5) for i in range(15)])  # half the rate: still busy
    assert links.comm_cpu(rows, rate, -1, 1) == pytest.approx((15 * 0.9 + 15 * 0.5) / 30)  # idle ticks left out
    assert links.comm_cpu(rows, rate, -1, 0.49) == pytest.approx(0.9)  # only the window's ticks
    assert links.comm_cpu(rows, [2e9, 2e9], -1, 1) == pytest.approx(0.9)  # at twice the rate half is not busy
    # weighted by the intervals' lengths
    assert links.comm_cpu([tick(0, 3 * 10**7, 1.0, dt=0.3), tick(1, 10**7, 0.0, dt=0.1)], rate, -1, 2) == \
        pytest.approx(0.75)
    assert links.comm_cpu(rows[:10], rate, -1, 1) is None  # 0.2 s of busy ticks: too few to tell
    just_under = [tick(0.02 * i, full // 2 - 1000, 0.9) for i in range(20)]  # a hair under half the rate
    assert links.comm_cpu(just_under + rows, rate, -1, 1) == pytest.approx((15 * 0.9 + 15 * 0.5) / 30)
    assert links.comm_cpu([{**r, "cpu": None} for r in rows], rate, -1, 1) is None  # an older file: no CPU
