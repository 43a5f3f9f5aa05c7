"""The link measured at start (``--link-tuning``, issue #29 item 3): the two-size fit, the reduce family's
partition, when a run probes, and the PS servers' probe op (a barrier per round, frames echoed, every
worker's value handed to all). The runs that probe and still train exactly are in test_equivalence.py;
the probe's figures on emulated links in results/overlap (tests/test_overlap_results.py)."""
from __future__ import annotations

import threading

import pytest
import torch
from test_ps_state import clients, live_server

from psring.config import TUNINGS as CONFIG_TUNINGS
from psring.sync.link_probe import (
    MAX_FIXED_S,
    MAX_PARTITION,
    MIN_FIXED_S,
    MIN_PARTITION,
    TUNINGS,
    LinkProbe,
    calls_core_share,
    cores_partition_bytes,
    fit,
    reduce_partition_bytes,
    ring_wire,
    wants_probe,
)
from psring.sync.ps.client import PSError
from psring.sync.ps.probe import MAX_ROUND, probe_servers


def test_the_fit_is_the_line_through_both_sizes_so_a_burst_at_the_start_is_not_bandwidth():
    # a 1 MB burst at line rate (1 GB/s) then 10 MB/s: each size pays the same burst, the slope is the link
    t = [0.001 + 1e6 / 1e9 + (s - 1e6) / 1e7 for s in (2e6, 6e6)]
    got = fit((2e6, 6e6), tuple(t))
    assert got.rate_Bps == pytest.approx(1e7) and MIN_FIXED_S <= got.fixed_s <= MAX_FIXED_S
    assert fit((2e6, 6e6), (0.4, 0.4)).rate_Bps == pytest.approx(6e6 / 0.4)  # flat: the mean rate, not infinity
    assert fit((2e6, 6e6), (0.4, 0.401)).rate_Bps == pytest.approx(6e6 / 0.401 * 10)  # steep noise: capped at 10x
    assert fit((2e6, 6e6), (10.0, 10.4)).fixed_s == MAX_FIXED_S  # an intercept the noise made huge is clamped
    for bad in [((6e6, 2e6), (0.1, 0.2)), ((2e6, 6e6), (0.0, 0.2)), ((0, 6e6), (0.1, 0.2))]:
        with pytest.raises(ValueError, match="two growing sizes"):
            fit(*bad)


def test_a_tiny_calls_time_bounds_the_intercept_a_slow_smaller_point_inflated():
    # N = 8, 1 Gbit: the 12 MB point on the line (119.6 MB/s, 2 ms), the 4 MB point 40 ms late (a rank's turn on
    # the cores), which alone fits 177 MB/s and an intercept clamped at 50 ms; a 4 kB call took 3 ms
    w1, w2 = ring_wire(4 << 20, 8), ring_wire(12 << 20, 8)
    t1, t2 = 0.002 + w1 / 119.6e6 + 0.040, 0.002 + w2 / 119.6e6
    line = fit((w1, w2), (t1, t2))
    assert line.fixed_s == MAX_FIXED_S and line.rate_Bps > 170e6
    got = fit((w1, w2), (t1, t2), call_s=0.003)
    assert got.fixed_s == 0.003 and got.rate_Bps == pytest.approx(w2 / (t2 - 0.003)) == pytest.approx(119.6e6, rel=0.01)
    m = 44_695_848
    assert reduce_partition_bytes(m, 8, got) < reduce_partition_bytes(m, 8, line) / 3
    # an intercept at or below the tiny call's time is the line's; a call slower than the larger point is no bound
    assert fit((w1, w2), (t2 - (w2 - w1) / 119.6e6, t2), call_s=0.003) == fit((w1, w2), (t2 - (w2 - w1) / 119.6e6, t2))
    assert fit((w1, w2), (t1, t2), call_s=1.0) == line
    assert LinkProbe(1e8, 1e-3, 0.015, 0.0031).as_dict()["probe_call_ms"] == 3.1


def test_the_partition_balances_its_fixed_cost_against_the_tail_after_backward():
    m, n = 44_695_848, 4
    slow, fast = LinkProbe(12e6, 0.005), LinkProbe(120e6, 0.005)
    b_slow, b_fast = reduce_partition_bytes(m, n, slow), reduce_partition_bytes(m, n, fast)
    assert b_slow < b_fast  # a faster link affords bigger partitions for the same tail
    k = 2 * (n - 1) / n

    def cost(b):  # n partitions' fixed cost + the last one's reduction after backward
        return m / b * slow.fixed_s + k * b / slow.rate_Bps

    assert cost(b_slow) <= min(cost(b_slow * 0.7), cost(b_slow * 1.4))
    assert reduce_partition_bytes(m, n, LinkProbe(1e3, 0.0005)) == MIN_PARTITION
    assert reduce_partition_bytes(m, n, LinkProbe(1e12, 0.05)) == MAX_PARTITION
    assert ring_wire(4 << 20, 4) == 1.5 * (4 << 20) and ring_wire(1, 1) == 0


def test_on_shared_cores_the_partitions_are_as_large_as_their_cpu_needs():
    """``cores_partition_bytes``: M/b calls of the probed CPU within CALLS_CORE_SHARE of the cores over the
    communication bound; binding where the cores are scarce (N = 8 on 2 cores at 1 Gbit), not for all-reduce at
    N = 4 or 100 Mbit, or with a core per rank; without a CPU reading (the PS's probe, a hand-made LinkProbe) no floor."""
    m = 44_695_848
    gloo8 = LinkProbe(119.6e6, 5e-4, call_cpu_s=0.015)  # results/overlap_n8_1gbit: the fewest of 21 calls, 14-15 ms
    floor = cores_partition_bytes(m, 8, gloo8, 2)
    assert 3.5 * 2**20 < floor < 7 * 2**20  # the ladder's fastest partitions: 3.5-7 MiB; 2 MiB and below slower
    full = cores_partition_bytes(m, 8, gloo8, 2, full=True)
    assert 13 <= m / full <= 18  # the aligned ladder: all-reduce fastest at 13-18 partitions; 22 and 9 slower
    ring8 = LinkProbe(119.6e6, 5e-4, call_cpu_s=0.0184)  # the hand-written ring's fewest: 17.8-19.8 ms
    assert 11 <= m / cores_partition_bytes(m, 8, ring8, 2, full=True) <= 13  # fastest at 13; 10 3%, 17 10% slower
    assert floor > 3 * reduce_partition_bytes(m, 8, gloo8)  # where the link alone would cut 1.2 MB
    assert cores_partition_bytes(m, 8, gloo8, 16) < reduce_partition_bytes(m, 8, gloo8)  # a core per rank
    for rate, n, call in [(11.95e6, 4, 0.0040), (114e6, 4, 0.0032), (114e6, 4, 0.0043)]:  # 100 Mbit; N = 4, 1 Gbit
        probe = LinkProbe(rate, 5e-4, call_cpu_s=call)
        assert cores_partition_bytes(m, n, probe, 2) < reduce_partition_bytes(m, n, probe), (rate, n)
    assert cores_partition_bytes(m, 8, LinkProbe(119.6e6, 5e-4, call_cpu_s=10.0), 2) == MAX_PARTITION
    assert calls_core_share(8) == pytest.approx(0.1) and calls_core_share(4) == pytest.approx(0.2)
    assert calls_core_share(2) == pytest.approx(0.4) and calls_core_share(1) == pytest.approx(0.8)
    assert calls_core_share(1, full=True) == 1.0
    assert calls_core_share(8, full=True) == pytest.approx(0.17) and calls_core_share(4, full=True) == pytest.approx(0.34)
    assert cores_partition_bytes(m, 8, LinkProbe(119.6e6, 5e-4), 2) == MIN_PARTITION  # no CPU read
    assert LinkProbe(1e8, 1e-3).as_dict().keys() == {"probe_rate_Bps", "probe_fixed_ms"}
    assert set(gloo8.as_dict()) == {"probe_rate_Bps", "probe_fixed_ms", "probe_call_cpu_ms"}


def test_who_probes(monkeypatch):
    assert TUNINGS == CONFIG_TUNINGS
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # one host: no link between the workers
    assert not wants_probe("auto", False) and wants_probe("probe", True) and not wants_probe("off", False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # four hosts (torchrun's nodes, emulated hosts)
    assert wants_probe("auto", False) and not wants_probe("auto", True)  # told (the PS on --net emulated)
    assert wants_probe("probe", True) and not wants_probe("off", False)
    with pytest.raises(ValueError, match="auto, probe, off"):
        wants_probe("sometimes", False)


def test_every_worker_gets_the_same_probe_from_the_servers():
    """Two workers, two servers: the rounds are barriers, the last one hands every worker all workers'
    times, so both fit the same line (and cut the same chunks)."""
    with live_server(2) as a, live_server(2) as b:
        from psring.sync.ps.client import PSClient

        made = [PSClient([a.address, b.address], w, 10) for w in range(2)]
        got: dict[int, LinkProbe] = {}
        ts = [threading.Thread(target=lambda w=w: got.setdefault(w, probe_servers(made[w], (1 << 18, 1 << 20))),
                               daemon=True) for w in range(2)]
        try:
            for t in ts:
                t.start()
            for t in ts:
                t.join(30)
        finally:  # (a client a thread still uses is left to it: zmq sockets are not shared across threads)
            for c, t in zip(made, ts):
                if not t.is_alive():
                    c.close()
        assert set(got) == {0, 1} and got[0] == got[1] and got[0].rate_Bps > 0
        assert a.errors == b.errors == 0


def test_a_probe_round_waits_for_every_worker_and_echoes_each_ones_frames():
    with live_server(2) as srv, clients(srv.address, 2) as (c0, c1):
        r0 = c0.send(0, {"op": "probe", "round": 3, "value": [1.5]}, [("p", torch.arange(5, dtype=torch.uint8))])
        with pytest.raises(PSError, match="did not answer"):  # one of two: no reply yet
            PSClient_timeout(c0, r0)
        r1 = c1.send(0, {"op": "probe", "round": 3, "value": [2]}, [("q", torch.full((3,), 7, dtype=torch.uint8))])
        h0, t0 = c0.recv(0, r0)
        h1, t1 = c1.recv(0, r1)
        assert h0["values"] == h1["values"] == [[1.5], [2]]
        assert t0[0][0] == "p" and t0[0][1].tensor().tolist() == [0, 1, 2, 3, 4]
        assert t1[0][0] == "q" and t1[0][1].tensor().tolist() == [7, 7, 7]


def PSClient_timeout(c, req, timeout_ms=300):
    saved, c.timeout_ms = c.timeout_ms, timeout_ms
    try:
        return c.recv(0, req)
    finally:
        c.timeout_ms = saved


@pytest.mark.parametrize("header,match", [
    ({"round": MAX_ROUND + 1}, "round"), ({"round": -1}, "round"), ({"round": "1"}, "round"),
    ({"round": 0, "value": "fast"}, "list of at most"), ({"round": 0, "value": [1] * 17}, "list of at most"),
    ({"round": 0, "value": [None]}, "list of at most"),
])
def test_bad_probes_are_refused_in_one_line(header, match):
    with live_server(2) as srv, clients(srv.address, 1) as (c,):
        with pytest.raises(PSError, match=match):
            c.call(0, {"op": "probe", **header})
        assert srv.errors == 1


def test_a_second_probe_of_a_round_from_the_same_worker_is_refused():
    with live_server(2) as srv, clients(srv.address, 1) as (c,):
        c.send(0, {"op": "probe", "round": 0})
        with pytest.raises(PSError, match="probed round 0 twice"):
            c.call(0, {"op": "probe", "round": 0})


def test_link_tuning_off_leaves_the_ps_at_its_one_host_defaults():
    """``--link-tuning off``: the PS is not fitted to a told rate either (4 MB chunks, no window, no
    credits), and the bound counts the chunks it then cuts."""
    from psring.bounds import ps_chunks_per_server
    from psring.costmodel import emulated_links_Bps

    assert emulated_links_Bps("emulated", "100mbit", None, "off") is None
    assert emulated_links_Bps("emulated", "100mbit", None, "probe") == (12.5e6, 12.5e6)
    row = {"net": "emulated", "link_rate": "100mbit", "bucket_mb": 4.0, "workers": 4, "servers": 4}
    m = 44_695_848
    assert ps_chunks_per_server({**row, "link_tuning": "off"}, 4, 4, m) == 3  # 11.2 MB a server in 4 MB
    assert ps_chunks_per_server({**row, "link_tuning": "auto"}, 4, 4, m) > 3
    # the fit the run recorded (--overlap full under credits: a drain of 4, two shared cores): twice the chunks
    fitted = ps_chunks_per_server({**row, "link_tuning": "auto"}, 4, 4, m)
    drained = ps_chunks_per_server({**row, "link_tuning": "auto", "chunk_drain": 4, "chunk_cores": 2}, 4, 4, m)
    assert drained == pytest.approx(2 * fitted, abs=1)
