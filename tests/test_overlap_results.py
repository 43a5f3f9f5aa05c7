"""results/overlap, results/overlap_repeats and results/bandwidth_hidden (issue #29) read back: what their
READMEs claim is what their runs.csv hold."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from psring.bounds import with_bounds
from psring.train.emulation import parse_compute

RESULTS = Path(__file__).resolve().parents[1] / "results"


def table(name: str) -> pd.DataFrame:
    df = with_bounds(pd.read_csv(RESULTS / name / "runs.csv"))
    df = df[df["workers"] > 1].copy()
    df["ratio"] = (df["compute"].map(parse_compute) / 1000 / df["bound_s"]).round(1)
    return df


@pytest.fixture(scope="module")
def runs() -> pd.DataFrame:
    return table("overlap")


def at(df, **kw) -> pd.DataFrame:
    for k, v in kw.items():
        df = df[df[k] == v]
    return df


def test_every_run_completed_and_every_100mbit_point_is_link_bound(runs):
    assert len(runs) == 39 and (runs["status"] == "ok").all()
    slow = at(runs, link_rate="100mbit")
    assert not slow["cpu_saturated"].astype(bool).any() and slow["step_bound_s"].notna().all()
    # 1 Gbit: the PS's points saturate 2 cores, so no claim rests on them
    assert at(runs, link_rate="1gbit", sync="ps")["cpu_saturated"].astype(bool).all()


def test_within_10_percent_of_the_bound_at_compute_comm_1(runs):
    one = at(runs, link_rate="100mbit", ratio=1.0)
    overlapped = one[one["overlap"] != "none"]
    assert (overlapped[overlapped["workers"] <= 4]["step_over_bound"] <= 1.10).all()
    assert (at(overlapped, workers=8, overlap="backward")["step_over_bound"] <= 1.10).all()
    # N = 8 with full: the README's exceptions, ps S=8 and the ring 1.13-1.14x in the grid's draw
    full8 = at(overlapped, workers=8, overlap="full").set_index(["sync", "link_tuning"])["step_over_bound"]
    assert full8[("allreduce", "probe")] <= 1.10
    assert all(1.10 < full8[k] < 1.15 for k in full8.index if k[0] != "allreduce")


def test_full_beats_backward(runs):
    n4 = at(runs, link_rate="100mbit", ratio=1.0, workers=4)

    def gain(sync, tuning):
        g = at(n4, sync=sync, link_tuning=tuning).set_index("overlap")["step_s_p50"]
        return g["backward"] / g["full"]

    assert gain("allreduce", "probe") >= 1.15 and gain("ring", "probe") >= 1.15
    assert gain("ps", "probe") >= 1.15 and 1.14 <= gain("ps", "auto") < 1.15  # the grid's one draw; see repeats


def test_repeats_put_the_ps_gain_and_the_n8_points_in_their_spread():
    rep = table("overlap_repeats")
    assert (rep["status"] == "ok").all() and not rep["cpu_saturated"].astype(bool).any()
    ps4 = at(rep, sync="ps", workers=4).pivot(index="seed", columns="overlap", values="step_s_p50")
    gains = ps4["backward"] / ps4["full"]
    assert len(gains) == 3 and gains.median() >= 1.15 and gains.min() >= 1.14
    full8 = at(rep, workers=8, overlap="full").set_index("sync")["step_over_bound"]
    assert full8["ring"] <= 1.10 and full8["ps"] <= 1.11


def test_the_pss_no_overlap_points_with_the_rate_hidden_stay_at_their_bound():
    hidden = table("bandwidth_hidden")
    assert (hidden["status"] == "ok").all() and (hidden["link_tuning"] == "probe").all()
    bound = hidden[hidden["link_bound"]]
    assert len(bound) == 10 and (bound["over_bound"] <= 1.10).all(), bound[["workers", "servers", "over_bound"]]
