"""``psring simulate --overlap backward|full`` (issue #27, the replay of issue #29's schedules): the flat
ring's units are ``ReduceSync``'s own plan, readiness follows the emulated backward, overlap only hides
communication (never adds bytes), and what the replay does not cover yet is refused in one line."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from psring.config import ConfigError, TrainConfig
from psring.simulate import overlapped
from psring.simulate.run import check, layout_of, simulate

RESULTS = Path(__file__).resolve().parent.parent / "results"


def _cfg(**kw) -> TrainConfig:
    base = dict(sync="ring", workers=4, model="resnet18", net="emulated", link_rate="100mbit",
                compute="emulated:3000", overlap="backward", steps=4, warmup=1, batch_size=16)
    return TrainConfig(**{**base, **kw}).validate()


def test_the_units_are_reduce_syncs_own_plan(monkeypatch):
    """The replay asks ``ReduceSync._ranges`` itself (a test that fails if the two ever cut differently)."""
    from psring.sync.reducer import ReduceSync

    seen = []
    real = ReduceSync._ranges

    def spy(self, layout):
        seen.append((self.scheduled, self.cap, self.first_cap))
        return real(self, layout)

    monkeypatch.setattr(ReduceSync, "_ranges", spy)
    layout = layout_of(_cfg())
    back = overlapped.unit_ranges(_cfg(), layout, 400_000)
    full = overlapped.unit_ranges(_cfg(overlap="full"), layout, 400_000)
    assert seen == [(False, 400_000, 1 << 20), (True, 400_000, 1 << 20)]
    # backward: DDP's whole-parameter buckets (a 9.4 MB convolution is one); full: M/cap partitions at the
    # parameters' boundaries (``buckets.aligned_ranges``), none far above the cap
    m_bytes = sum(sp.numel * sp.dtype.itemsize for sp in layout)
    assert max(u.end - u.start for u in back) * 4 > 9e6 and len(full) == -(-m_bytes // 400_000)
    assert max(u.end - u.start for u in full) * 4 <= 2 * 400_000


def test_units_are_ready_in_backward_order_and_every_parameter_is_covered():
    plan = overlapped.Plan(layout_of(_cfg()), overlapped.unit_ranges(_cfg(overlap="full"), layout_of(_cfg()),
                                                                   400_000))
    assert plan.ready == sorted(plan.ready) and plan.ready[-1] == pytest.approx(1.0)
    assert sum(plan.shares) == pytest.approx(1.0) and all(plan.covering)
    # the first layer's parameters (forward order) sit in the last units (backward order)
    assert min(plan.covering[0]) > len(plan.numels) - 3


def test_overlap_only_hides_communication(tmp_path):
    """Same bytes in every mode; full <= backward <= none; the step never beats its compute or its link."""
    none, back, full = (simulate(_cfg(overlap=m), tmp_path / m) for m in ("none", "backward", "full"))
    assert none["bytes_sent_per_step"] == pytest.approx(back["bytes_sent_per_step"], rel=1e-6)
    assert back["bytes_sent_per_step"] == pytest.approx(full["bytes_sent_per_step"], rel=1e-6)
    comm = 2 * 3 / 4 * 44.7e6 / (12.5e6 * 1448 / 1514)
    assert comm < full["step_s_p50"] < back["step_s_p50"] < none["step_s_p50"]
    assert none["step_s_p50"] == pytest.approx(3.0 + comm, rel=0.03)
    assert full["step_s_p50"] < 1.15 * comm  # link-bound: the compute hides under the communication


def test_with_little_to_send_a_step_is_its_compute_and_the_last_units_tail(tmp_path):
    fast = simulate(_cfg(link_rate="100gbit", overlap="backward"), tmp_path / "b")  # (a bucket at the veth's own rate)
    full = simulate(_cfg(link_rate="100gbit", overlap="full"), tmp_path / "f")
    assert 3.0 < fast["step_s_p50"] < 3.05 and 3.0 <= full["step_s_p50"] < 3.02


def test_what_is_not_replayed_yet_is_one_line_and_exit_2(tmp_path):
    for kw in (dict(sync="ps", servers=4, consistency="asp"),
               dict(sync="hierarchical", workers=8, workers_per_host=2, overlap="full")):
        with pytest.raises(ConfigError, match="replays --overlap"):
            check(_cfg(**kw))
    r = subprocess.run([sys.executable, "-m", "psring", "simulate", "--sync", "hierarchical", "--workers", "8",
                        "--workers-per-host", "2", "--compute", "emulated:100", "--overlap", "full",
                        "--out", str(tmp_path / "x")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--overlap full" in r.stderr


def test_the_overlapped_runs_of_results_overlap_are_replayed_within_10_percent():
    """results/simulate/validation.csv: every overlapped run of results/overlap (the PS, the ring and all-reduce,
    backward and full, 100 Mbit and 1 Gbit), replayed with the partitions or chunks it cut, within 10% of its
    measured step time (the reduce family's with the update it measured run before each forward: without it, its
    `full` at N = 4, 1 Gbit read 0.89-0.90), but the PS's `backward` at N = 4, 1 Gbit since its push order is planned
    (0.895: its schedule replays at 1.01x its bound, the rest is the cores'), and within 6% at 100 Mbit."""
    v = pd.read_csv(RESULTS / "simulate" / "validation.csv")
    mine = v[(v["folder"] == "overlap") & (v["overlap"] != "none")]
    assert (mine["replayed"] == "yes").all() and len(mine) >= 40 and mine["link_bound"].all()
    assert set(mine["sync"]) == {"ps", "ring", "allreduce"} and set(mine["overlap"]) == {"backward", "full"}
    ps4 = (mine["sync"] == "ps") & (mine["workers"] == 4) & (mine["link_rate"] == "1gbit") & (mine["overlap"] == "backward")
    assert (mine[~ps4]["step_ratio"] - 1).abs().max() <= 0.10 and mine[ps4]["step_ratio"].between(0.89, 0.90).all()
    assert (mine[mine["link_rate"] == "100mbit"]["step_ratio"] - 1).abs().max() <= 0.06


def test_colocated_servers_share_their_worker_hosts_links(tmp_path):
    """--ps-placement colocated: server s on worker host s, a push to the own host's server free, the rest on the
    shared link: each host link carries 2(H-1)/H of M each way (bounds.host_link_bytes), 1.5 M at H = 4, and the
    sync takes that at the link's rate; the replays of results/topology's colocated and mixed runs are within 1%."""
    from psring import costmodel as cm

    base = dict(sync="ps", servers=4, overlap="none", compute="emulated:100", link_burst="0kb")
    colocated = simulate(_cfg(**base, ps_placement="colocated"), tmp_path / "c")
    rate = cm.Link.from_rate("100mbit", 0.0, cm.TCP_GOODPUT).bandwidth_Bps
    assert colocated["sync_s_p50"] / (1.5 * 44_695_848 / rate) == pytest.approx(1.0, abs=0.05)
    v = pd.read_csv(RESULTS / "simulate" / "validation.csv")
    runs = pd.read_csv(RESULTS / "topology" / "runs.csv").set_index("run_id")
    placed = v[(v["folder"] == "topology") & (v["sync"] == "ps")]
    placed = placed[placed["run_id"].map(lambda r: runs.loc[r, "ps_placement"] != "dedicated")]
    assert len(placed) == 4 and (placed["replayed"] == "yes").all() and (placed["sync_ratio"] - 1).abs().max() < 0.01
