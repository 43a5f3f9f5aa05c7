"""The alpha-beta cost model against hand-computed values, and the loopback calibration."""
from __future__ import annotations

import doctest
import json
import math
import time

import pytest
from conftest import kill_mentioning, processes_mentioning

from psring import calibrate as cal
from psring.net import tcp
from psring import costmodel as cm
from psring import topology
from psring.costmodel import Link

L = Link(alpha_s=1e-4, bandwidth_Bps=1e8)  # 100 us, 100 MB/s
M = 1e8  # 100 MB: M/B = 1 s


def test_doctests():
    for mod in (cm, cal, topology):
        assert doctest.testmod(mod).failed == 0


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16])
def test_unified_reduces_to_the_ring_at_k0_and_to_the_dedicated_ps_at_k_n(n):
    assert cm.ps_unified(n, 0, M, L) == pytest.approx(cm.ring_allreduce(n, M, L) - 2 * (n - 1) * L.alpha_s
                                                      + 2 * L.alpha_s)
    assert cm.ps_unified(n, n, M, L) == pytest.approx(cm.ps(n, n, M, L, overlap=True))
    for k in range(n + 1):  # more dedicated servers never slow a step
        assert cm.ps_unified(n, k + 1, M, L) <= cm.ps_unified(n, k, M, L) + 1e-12


@pytest.mark.parametrize("n,k", [(4, 1), (4, 2), (4, 3), (8, 3), (6, 5)])
def test_unified_split_is_the_best_split(n, k):
    """BytePS's x against every split on a fine grid: none has a less loaded busiest link."""
    def busiest(x):
        return max(x + 2 * (1 - x) * (n - 1) / n, n * x / k)
    best = min(busiest(i / 10_000) for i in range(10_001))
    assert busiest(cm.unified_split(n, k)) == pytest.approx(best, abs=1e-3)
    assert cm.ps_unified(n, k, M, Link(0.0, 1e8)) == pytest.approx(busiest(cm.unified_split(n, k)))


def test_hosts_of_several_workers():
    # hierarchical, 4 hosts x 2: 2*3*1e-4 + 2*3/4*1; the flat ring over 8: 2*7*1e-4 + 2*7/8
    assert cm.hierarchical(8, M, L, per_host=2) == pytest.approx(1.5006)
    assert cm.hierarchical(8, M, L, per_host=1) == pytest.approx(cm.ring_allreduce(8, M, L))
    assert cm.hierarchical(8, M, L, per_host=2, intra=Link(0.0, 1e9)) == pytest.approx(1.5006 + 0.1)
    # G workers per host push G*M through the host's link: dedicated S=N is then link-bound at G*M/B
    assert cm.ps(8, 8, M, L, overlap=True, per_host=2) == pytest.approx(2e-4 + 2.0)
    assert cm.ps_colocated(8, M, L, per_host=2) == pytest.approx(2e-4 + 2 * 2 * 3 / 4)
    assert cm.STRATEGIES["ps"](8, M, L, servers=6, per_host=2, placement="mixed") == \
        pytest.approx(cm.ps_unified(4, 2, M, L, per_host=2))


def test_ring():
    # 2(N-1) alpha + 2(N-1)/N M/B = 2*3*1e-4 + 2*3/4*1 = 0.0006 + 1.5
    assert cm.ring_allreduce(4, M, L) == pytest.approx(1.5006)
    # N=2: 2*1*1e-4 + 2*1/2*1 = 1.0002
    assert cm.ring_allreduce(2, M, L) == pytest.approx(1.0002)


def test_ps_one_server():
    # per phase alpha + max(M/B_w, N*M/(S*B_s)) = 1e-4 + max(1, 4*1/1) = 4.0001; push + pull: 8.0002
    assert cm.ps(4, 1, M, L) == pytest.approx(8.0002)
    # overlapped: 2 alpha + max(...) once = 2e-4 + 4
    assert cm.ps(4, 1, M, L, overlap=True) == pytest.approx(4.0002)


def test_ps_servers_equal_workers():
    # S = N = 4: the server links carry 4*1/4 = 1 s each way, as the workers': 2*(1e-4 + 1) = 2.0002
    assert cm.ps(4, 4, M, L) == pytest.approx(2.0002)
    # S = 2: 2*(1e-4 + max(1, 4/2)) = 4.0002
    assert cm.ps(4, 2, M, L) == pytest.approx(4.0002)
    # more servers than workers: the worker link binds, 2*(1e-4 + 1)
    assert cm.ps(4, 8, M, L) == pytest.approx(2.0002)


def test_ps_faster_server_link():
    # one server with a 4x link: max(1, 4*1/(1*4)) = 1 -> 2*(1e-4 + 1) = 2.0002
    assert cm.ps(4, 1, M, L, server_link=Link(1e-4, 4e8)) == pytest.approx(2.0002)


def test_colocated_ps():
    # 2 alpha + 2(N-1)/N M/B = 2e-4 + 1.5 = 1.5002
    assert cm.ps_colocated(4, M, L) == pytest.approx(1.5002)
    # its bandwidth term equals ring's: with alpha = 0 the two coincide for every N
    l0 = Link(0.0, 1e8)
    for n in (2, 3, 4, 8, 16, 64):
        assert cm.ps_colocated(n, M, l0) == pytest.approx(cm.ring_allreduce(n, M, l0))


def test_tree_and_halving_doubling():
    # tree: 2 ceil(log2 N)(alpha + M/B) = 2*2*(1e-4 + 1) = 4.0004; N=5: ceil(log2 5)=3 -> 6.0006
    assert cm.tree_allreduce(4, M, L) == pytest.approx(4.0004)
    assert cm.tree_allreduce(5, M, L) == pytest.approx(6.0006)
    # halving-doubling: 2 ceil(log2 N) alpha + 2(N-1)/N M/B = 4e-4 + 1.5 = 1.5004
    assert cm.halving_doubling(4, M, L) == pytest.approx(1.5004)
    l0 = Link(0.0, 1e8)
    for n in (2, 4, 8, 16):  # bandwidth terms equal; latency: 2 log2 N alpha < ring's 2(N-1) alpha
        assert cm.halving_doubling(n, M, l0) == pytest.approx(cm.ring_allreduce(n, M, l0))
        assert cm.halving_doubling(n, 0, L) <= cm.ring_allreduce(n, 0, L)
    # for big M the tree (whole M each of 2 log2 N steps) loses to ring; for tiny M it wins on latency
    assert cm.tree_allreduce(16, M, L) > cm.ring_allreduce(16, M, L)
    assert cm.tree_allreduce(16, 8, L) < cm.ring_allreduce(16, 8, L)


def test_one_worker_needs_no_sync():
    for name, f in cm.STRATEGIES.items():
        assert f(1, M, L) == 0.0, name
        assert f(1, M, L, servers=2, server_link=L) == 0.0, name


def test_strategies_registry():
    assert set(cm.STRATEGIES) == {"allreduce", "ps", "ps_colocated", "two_level", "tree", "halving_doubling"}
    got = {k: f(4, M, L, servers=4) for k, f in cm.STRATEGIES.items()}
    assert got == pytest.approx({"allreduce": 1.5006, "ps": 2.0002, "ps_colocated": 1.5002, "two_level": 1.5006,
                                 "tree": 4.0004, "halving_doubling": 1.5004})
    assert cm.STRATEGIES["ps"](4, M, L) == pytest.approx(8.0002)  # servers=None: one server


def test_predict_step_and_speedup():
    assert cm.predict_step(1.0, 0.5) == 1.5
    assert cm.predict_step(1.0, 0.5, overlap=0.5) == 1.25
    assert cm.predict_step(0.2, 1.0, overlap=1.0) == 1.0  # can't hide more than the compute
    with pytest.raises(ValueError):
        cm.predict_step(1.0, 1.0, overlap=1.5)
    ring = lambda n: cm.ring_allreduce(n, M, L)
    assert cm.predicted_speedup(1, 1.0, ring) == 1.0
    # N=4: 4*1 / (1 + 1.5006)
    assert cm.predicted_speedup(4, 1.0, ring) == pytest.approx(4 / 2.5006)
    assert cm.predicted_speedup(4, 1.0, 1.5006) == pytest.approx(4 / 2.5006)
    assert cm.predicted_speedup(4, 1.0, ring, overlap=1.0) == pytest.approx(4 / 1.5006)
    assert cm.predicted_speedup(8, 1.0, 0.0) == 8.0  # free sync: linear


def test_link_from_rate():
    assert Link.from_rate("1gbit", 5e-5) == Link(5e-5, 1.25e8)
    assert Link.from_rate("100mbit").bandwidth_Bps == pytest.approx(12.5e6)
    assert Link.from_rate("2.5GB/s").bandwidth_Bps == pytest.approx(2.5e9)
    assert Link.from_rate(1e9, 1e-6) == Link(1e-6, 1e9)
    with pytest.raises(ValueError):
        Link.from_rate("fast")
    assert L.time(M) == pytest.approx(1.0001)


def test_calibration_roundtrip(tmp_path):
    p = tmp_path / "calibration.json"
    cm.save_calibration(L, p, {"host": "h", "r2": 0.9})
    assert cm.load_calibration(p) == L
    assert json.loads(p.read_text())["host"] == "h"


def test_fit_link():
    sizes = [64, 1024, 1 << 16, 1 << 20, 1 << 24]
    exact = [L.time(m) for m in sizes]
    for method in ("anchored", "relative"):
        link, r2 = cal.fit_link(sizes, exact, method)
        assert link.alpha_s == pytest.approx(L.alpha_s, rel=1e-6)
        assert link.bandwidth_Bps == pytest.approx(L.bandwidth_Bps, rel=1e-6)
        assert r2 == pytest.approx(1.0)
    with pytest.raises(ValueError):
        cal.fit_link([64, 64], [1e-5, 1e-5])
    with pytest.raises(ValueError):  # time falling with size: no positive bandwidth
        cal.fit_link([64, 1 << 20], [1e-3, 1e-5])
    with pytest.raises(ValueError):
        cal.fit_link(sizes, exact, "magic")


def _check(link: Link, table: list[dict], sizes: list[int]) -> None:
    assert link.alpha_s > 0 and math.isfinite(link.alpha_s)
    assert link.bandwidth_Bps > 0 and math.isfinite(link.bandwidth_Bps)
    assert [r["size_bytes"] for r in table] == sizes
    for r in table:
        assert 0 < r["rtt_min_s"] <= r["rtt_s"] <= r["rtt_max_s"] and math.isfinite(r["rel_err"])


@pytest.mark.alone  # timings the fit needs physical (alpha, B > 0): not beside the suite's other xdist worker
def test_calibrate_loopback(tmp_path):
    sizes = [64, 4096, 1 << 16, 1 << 20, 4 << 20]
    try:
        t0 = time.monotonic()
        link, table = cal.calibrate(sizes=sizes, repeats=5, warmup=2, timeout_s=10, workdir=tmp_path)
        _check(link, table, sizes)
        assert time.monotonic() - t0 < 30
        assert processes_mentioning(str(tmp_path)) == []  # the echo server was stopped
    finally:
        kill_mentioning(str(tmp_path))


@pytest.mark.alone  # (beside it, busy, a 64 B echo once took 3.6 ms and 64 KB 0.17: "not physical")
def test_main_with_prefix_writes_json(tmp_path, capsys):
    try:  # `env` as the prefix: the echo server runs under a command, as it will under `ip netns exec`
        assert cal.main(["--out", str(tmp_path), "--sizes", "64,64K,1M", "--repeats", "3", "--warmup", "1",
                         "--prefix", "env", "--address", "tcp://127.0.0.1", "--timeout", "10"]) == 0
        assert processes_mentioning(str(tmp_path)) == []
    finally:
        kill_mentioning(str(tmp_path))
    data = json.loads((tmp_path / "calibration.json").read_text())
    assert cm.load_calibration(tmp_path / "calibration.json") == Link(data["alpha_s"], data["bandwidth_Bps"])
    assert {"date", "host", "command", "r2", "fitted_from"} <= set(data)
    assert data["link_cc"] == tcp.here() != ""  # TCP's congestion control where the client ran
    assert len(data["fitted_from"]) == 3
    assert capsys.readouterr().out.startswith("alpha ")


def test_calibrate_times_out_without_a_server():
    from psring.launch.launcher import free_port
    with pytest.raises(TimeoutError):  # nothing listens there: the first receive gives up
        cal.calibrate(address=f"tcp://127.0.0.1:{free_port()}", sizes=[64, 128], repeats=1, warmup=0,
                      timeout_s=0.5)


def test_main_refuses_a_fit_that_is_not_physical_in_one_line(tmp_path, monkeypatch, capsys):
    def falling(*args, **kwargs):  # as a busy machine can measure: the larger message came back sooner
        return cal.fit_link([64, 1 << 16], [1.6e-3, 1.2e-3])
    monkeypatch.setattr(cal, "calibrate", falling)
    assert cal.main(["--out", str(tmp_path), "--sizes", "64,64K"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not physical" in err[0] and "more repeats" in err[0]
    assert not (tmp_path / "calibration.json").exists()
