"""What results/visible, results/compare_emulated and results/link_sampling claim, read back from their
committed data: the ring's rounds replay to a full sum at the model's pace, one PS server's link is the
saturated one, the sampled links add up to the kernel's counters, a straggler's readiness marks come
late, psring compare shows the classic picture, and sampling costs nothing measurable."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from psring.bounds import with_bounds
from psring.plot.links import step_window, utilisation
from psring.plot.ring_steps import _link_of, pick_ring_step, replay, round_times
from psring.plot.timeline import ready_marks

ROOT = Path(__file__).resolve().parent.parent
VISIBLE = ROOT / "results" / "visible" / "runs"
RING = VISIBLE / "sync-ring_workers-4_servers-1_straggler-None"
PS1 = VISIBLE / "sync-ps_workers-4_servers-1_straggler-None"
PS4 = VISIBLE / "sync-ps_workers-4_servers-4_straggler-None"
STRAGGLER = VISIBLE / "sync-allreduce_workers-4_servers-1_straggler-2:3"


def test_the_ring_replays_to_every_chunk_summed_over_all_workers_at_the_models_pace():
    rs = pick_ring_step(RING)
    states = replay(rs.rounds(), rs.workers)
    assert len(states) == 2 * (rs.workers - 1)
    everyone = frozenset(range(rs.workers))
    assert all(c == everyone for row in states[-1] for c in row)
    after_rs = states[rs.workers - 2]  # after reduce-scatter each worker holds one chunk summed over all
    assert all(sum(c == everyone for c in row) == 1 for row in after_rs)
    t = round_times(rs, _link_of(RING, None))
    assert ((t["median_s"] / t["model_s"]).iloc[1:].between(0.95, 1.05)).all(), t
    # the first round is faster: tbf's 128 KB of credit, refilled since the last step, crosses at once
    assert 0.7 < t["median_s"].iloc[0] / t["model_s"].iloc[0] < 1.0, t


@pytest.mark.parametrize("run", [RING, PS1, PS4, STRAGGLER], ids=lambda p: p.name)
def test_sampled_links_add_up_to_the_kernels_counters(run):
    s = json.loads((run / "summary.json").read_text())
    assert abs(s["links_up_vs_kernel"] - 1) < 0.02 and abs(s["links_down_vs_kernel"] - 1) < 0.02
    assert s["links_worst_host_error"] < 0.02 and 15 <= s["links_interval_ms"] <= 25


def mean_utilisation(run: Path) -> pd.DataFrame:
    """Each host's and direction's bytes over what its rate allowed in the steps drawn (link heatmaps)."""
    start, end, _ = step_window(run)
    u = utilisation(run, start, end).assign(weighted=lambda d: d["utilisation"] * d["dt"])
    g = u.groupby(["label", "direction"])
    return (g["weighted"].sum() / g["dt"].sum()).unstack()


def test_one_servers_link_is_the_saturated_one_and_the_ring_spreads_its_load():
    ps1 = mean_utilisation(PS1)
    workers = [lab for lab in ps1.index if lab.startswith("worker")]
    assert (ps1.loc["server 0"] > 0.7).all(), ps1  # its 4 M each way (the steps' compute gaps included)
    assert (ps1.loc[workers] < 0.3).all().all(), ps1  # M each: a quarter of the server's
    ring = mean_utilisation(RING)
    assert (ring > 0.6).all().all() and ring.max().max() / ring.min().min() < 1.4, ring


def test_the_stragglers_buckets_are_ready_late():
    m = ready_marks(STRAGGLER)
    m = m[m["step"] >= 2]
    last = m.groupby(["step", "row"])["t"].max().unstack()
    others = last.drop(columns="worker 2").max(axis=1)
    assert ((last["worker 2"] - others) > 0.1).all(), last  # 3x of 100 ms compute: 200 ms later


def test_psring_compare_shows_the_classic_picture():
    df = with_bounds(pd.read_csv(ROOT / "results" / "compare_emulated" / "runs.csv"))
    sync = {(r.sync, r.workers, r.servers): r.sync_s_p50 for r in df.itertuples()}
    assert sync[("ps", 4, 1)] > 1.8 * sync[("ps", 2, 1)], "one server's link carries N * M"
    assert sync[("allreduce", 4, 1)] < 1.7 * sync[("allreduce", 2, 1)], "the ring's 2(N-1)/N * M"
    assert sync[("ps", 4, 4)] <= 1.05 * sync[("allreduce", 4, 1)]
    ratios = df["over_bound"].dropna()
    assert len(ratios) == 6 and ratios.between(0.85, 1.15).all(), ratios
    assert (df["cpu_util"] < 0.5).all(), "link-bound, not CPU-bound"


def test_sampling_costs_the_workers_nothing_measurable():
    s = json.loads((ROOT / "results" / "link_sampling" / "summary.json").read_text())
    for name, c in s["configs"].items():
        assert abs(c["on_over_off"] - 1) <= max(c["spread_within_a_setting"], 0.01), (name, c)
        assert c["sampler_cpu_share_of_one_core"] < 0.05, (name, c)
