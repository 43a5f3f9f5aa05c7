"""Training runs on an emulated cluster (``--net emulated``): traffic really crosses each host's shaped
link, the kernel's byte counters confirm the ring's 2(N-1)/N*M per worker, and no namespace outlives a
run, even one whose launcher is SIGKILLed. The link rates themselves are tested in test_net.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from conftest import processes_mentioning

from psring.net import NetError, check_available
from psring.net import tcp
from psring.train.models import build_model

try:
    check_available()
    NET_SKIP = None
except NetError as e:
    NET_SKIP = str(e)
needs_net = pytest.mark.skipif(NET_SKIP is not None, reason=NET_SKIP or "")


def psring_namespaces(pid: int | None = None) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    names = [line.split()[0] for line in out.splitlines() if line.startswith("psr-")]
    return [n for n in names if pid is None or n.startswith(f"psr-{pid}-")]


@pytest.fixture
def no_new_namespaces():
    """Namespaces this test's runs leave behind (others, e.g. of a sweep running beside, are not ours). Listed before
    ``psring`` in a test's arguments, it checks after that fixture reaped the test's runs (fixtures tear down in
    reverse order): a test failed mid-run then reports its failure, not namespaces its live launcher still held."""
    before = set(psring_namespaces())
    yield
    deadline = time.monotonic() + 10  # (a killed launcher's reaper deletes them: give it the time)
    while (left := set(psring_namespaces()) - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"namespaces left behind: {sorted(left)}"


def grad_bytes(model: str) -> int:
    return sum(p.numel() * 4 for p in build_model(model, 0).parameters())


@needs_net
def test_allreduce_traffic_on_the_wire_is_the_ring_formula(no_new_namespaces, psring, tmp_path):
    n, out = 3, tmp_path / "ring"
    r = psring.run("train", "--sync", "allreduce", "--workers", str(n), "--net", "emulated", "--link-rate",
                   "1gbit", "--compute", "emulated:20", "--model", "resnet18_narrow", "--steps", "5",
                   "--warmup", "2", "--out", str(out), timeout=240)
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    ring = 2 * (n - 1) / n * grad_bytes("resnet18_narrow")
    for k in ("wire_tx_bytes_per_step", "wire_rx_bytes_per_step"):  # counted by the kernel, headers included
        assert ring <= s[k] <= 1.05 * ring, (k, s[k], ring)


@needs_net
def test_ps_runs_on_emulated_hosts_and_server_traffic_crosses_links(no_new_namespaces, psring, tmp_path):
    out = tmp_path / "ps"
    cc = tcp.offered()[0]  # asked for by name, and then said to have run
    r = psring.run("train", "--sync", "ps", "--workers", "2", "--servers", "1", "--net", "emulated",
                   "--link-rate", "1gbit", "--compute", "emulated:20", "--model", "cnn", "--steps", "4",
                   "--warmup", "1", "--trace", "--link-cc", cc, "--out", str(out), timeout=240)
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["link_cc"] == cc, s
    m = grad_bytes("cnn")  # each worker pushes M and gets M back per step, over its own link
    assert m <= s["wire_tx_bytes_per_step"] <= 1.1 * m and m <= s["wire_rx_bytes_per_step"] <= 1.1 * m, s
    # the launcher's link samples (links.jsonl), summed over the run, are the kernel's interface counters
    assert s["links_samples"] > 20 and 15 <= s["links_interval_ms"] <= 25, s
    assert abs(s["links_up_vs_kernel"] - 1) < 0.02 and abs(s["links_down_vs_kernel"] - 1) < 0.02, s
    assert s["links_worst_host_error"] < 0.02, s
    rows = [json.loads(line) for line in (out / "links.jsonl").read_text().splitlines()]
    server_down = sum(row["down"][2] for row in rows)  # host 2: the server, which every push reaches
    assert all(0 <= row["cpu"] <= 1 for row in rows if row["cpu"] is not None) and any(row["cpu"] for row in rows)
    assert "cpu_util_comm" in s  # None here: 4 short steps carry too few busy intervals to tell
    assert server_down >= 2 * 4 * m, (server_down, m)
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert all(rec["ready"] and all(off < rec["sync_s"] for _, off in rec["ready"]) for rec in steps)
    trace = json.loads((out / "trace.json").read_text())["traceEvents"]
    assert {e["ph"] for e in trace} >= {"C", "i"}, "link counter tracks and readiness marks"
    from psring.plot.links import figure_links

    fig = figure_links(out)  # both directions' heatmaps, their colour bar, and the CPU over the same bins
    assert len(fig.axes) == 4 and fig.axes[2].get_ylabel() == "CPU", [a.get_ylabel() for a in fig.axes]


@needs_net
def test_sigkilled_launcher_leaves_no_namespace_and_no_process(psring, tmp_path):
    out = tmp_path / "killed"
    p = psring.start("train", "--sync", "ps", "--workers", "2", "--net", "emulated", "--link-rate", "100mbit",
                     "--compute", "emulated:50", "--model", "resnet18_narrow", "--steps", "1000", "--out", str(out))
    deadline = time.monotonic() + 120
    while not (out / "ranks" / "rank0.jsonl").exists() or not (out / "ranks" / "rank0.jsonl").stat().st_size:
        assert p.poll() is None, p.stderr.read()
        assert time.monotonic() < deadline, "the run never finished a step"
        time.sleep(0.2)
    assert psring_namespaces(p.pid), "the run's namespaces should exist while it runs"
    os.kill(p.pid, signal.SIGKILL)
    p.wait(10)
    deadline = time.monotonic() + 15
    while psring_namespaces(p.pid) or processes_mentioning(str(out)):
        assert time.monotonic() < deadline, (psring_namespaces(p.pid), processes_mentioning(str(out)))
        time.sleep(0.2)


def test_without_root_the_emulated_net_is_a_one_line_error(monkeypatch, capsys, tmp_path):
    from psring import cli

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    rc = cli.main(["train", "--net", "emulated", "--steps", "2", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "needs root" in err, err
    rc = cli.main(["net", "cleanup"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "needs root" in err, err
