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


def test_every_run_completed_and_no_point_is_cpu_saturated(runs):
    assert len(runs) == 45 and (runs["status"] == "ok").all()
    assert not runs["cpu_saturated"].astype(bool).any() and runs["step_bound_s"].notna().all()
    # 1 Gbit, ps at N = 4: under the 0.90 flag, but 0.85 of both cores while communicating
    ps4 = at(runs, link_rate="1gbit", sync="ps", workers=4)
    assert (ps4["cpu_util_sync"] >= 0.8).all()


def test_within_10_percent_of_the_bound_at_compute_comm_1(runs):
    one = at(runs, link_rate="100mbit", ratio=1.0)
    overlapped = one[one["overlap"] != "none"]
    ok = overlapped[~((overlapped["workers"] == 8) & (overlapped["sync"] == "ps") & (overlapped["overlap"] == "full")
                      & (overlapped["link_tuning"] == "probe"))]
    assert len(ok) == len(overlapped) - 1 and (ok["step_over_bound"] <= 1.10).all()
    # the README's one exception: ps S=8 with full, the rate hidden, 1.148x in this draw (told: 1.082x)
    full8 = at(overlapped, workers=8, overlap="full", sync="ps").set_index("link_tuning")["step_over_bound"]
    assert 1.10 < full8["probe"] < 1.16 and full8["auto"] <= 1.10
    # the reduce family's new scheduler at N = 8: within 5% (the previous one's ring: 1.14x)
    assert (at(overlapped, workers=8)[lambda d: d["sync"] != "ps"]["step_over_bound"] <= 1.05).all()


def test_full_beats_backward(runs):
    for n in (4, 8):
        grid = at(runs, link_rate="100mbit", ratio=1.0, workers=n)

        def gain(sync, tuning):
            g = at(grid, sync=sync, link_tuning=tuning).set_index("overlap")["step_s_p50"]
            return g["backward"] / g["full"]

        assert gain("allreduce", "probe") >= 1.15 and gain("ring", "probe") >= 1.15 and gain("ps", "auto") >= 1.15
        assert gain("ps", "probe") >= (1.15 if n == 4 else 1.12)


def test_1_gbit_is_where_the_bound_leaves_out_most(runs):
    """The README's 1 Gbit paragraph: backward within 7% for the reduce family and the PS at N = 2; the
    reduce family's full points 1.08-1.09x with its updates (3-4% of a step) in the bound, 1.10-1.12x
    without them; the PS's full points 1.12-1.24x."""
    g = at(runs, link_rate="1gbit")
    back = at(g, overlap="backward")
    assert (back[~((back["sync"] == "ps") & (back["workers"] == 4))]["step_over_bound"] <= 1.07).all()
    full = at(g, overlap="full")
    reduce, ps = full[full["sync"] != "ps"], full[full["sync"] == "ps"]
    assert reduce["step_over_bound"].between(1.07, 1.10).all() and ps["step_over_bound"].between(1.11, 1.25).all()
    unupdated = with_bounds(reduce.drop(columns=["step_bound_s", "step_over_bound"]).assign(update_s_p50=0.0))
    assert unupdated["step_over_bound"].between(1.10, 1.12).all()
    assert (g[g["sync"] != "ps"]["update_s_p50"] / g[g["sync"] != "ps"]["step_bound_s"]).between(0.015, 0.05).all()


def test_repeats_put_the_ps_gain_and_the_n8_points_in_their_spread():
    rep = table("overlap_repeats")
    assert (rep["status"] == "ok").all() and not rep["cpu_saturated"].astype(bool).any()
    ps4 = at(rep, sync="ps", workers=4).pivot(index="seed", columns="overlap", values="step_s_p50")
    gains = ps4["backward"] / ps4["full"]
    assert len(gains) == 3 and gains.median() >= 1.15 and gains.min() >= 1.14
    full8 = at(rep, workers=8, overlap="full").set_index("sync")["step_over_bound"]
    assert full8["ring"] <= 1.05 and 1.08 <= full8["ps"] <= 1.15


def test_the_pss_no_overlap_points_with_the_rate_hidden_stay_at_their_bound():
    hidden = table("bandwidth_hidden")
    assert (hidden["status"] == "ok").all() and (hidden["link_tuning"] == "probe").all()
    bound = hidden[hidden["link_bound"]]
    assert len(bound) == 10 and (bound["over_bound"] <= 1.10).all(), bound[["workers", "servers", "over_bound"]]


def test_the_ps_at_n8_with_full_sits_at_its_target_and_is_not_cpu_bound():
    """results/overlap_ps8's README: the default credits 1.096-1.104x (median 1.103) in three draws, four chunks
    no faster (median 1.130), and the same point at 50 Mbit 1.09x with half the CPU."""
    df = table("overlap_ps8")
    assert (df["status"] == "ok").all() and not df["cpu_saturated"].astype(bool).any() and len(df) == 8
    fast = at(df, link_rate="100mbit")
    default, four = fast[fast["ps_credit_mb"].isna()], fast[fast["ps_credit_mb"] == 0.435]
    assert len(default) == len(four) == 3
    assert default["step_over_bound"].between(1.09, 1.105).all() and 1.10 <= default["step_over_bound"].median() < 1.105
    assert four["step_over_bound"].median() > default["step_over_bound"].median()
    half = at(df, link_rate="50mbit")
    assert len(half) == 2 and half["step_over_bound"].between(1.08, 1.10).all()
    assert half["cpu_util_sync"].max() < default["cpu_util_sync"].min()


def test_overlap_chunks_claims():
    """results/overlap_chunks' README: under --overlap full, chunks smaller than the fitted one bring ps N=2
    at 1 Gbit inside 1.10x (and full over backward past 1.15x), and N=4 at 100 Mbit closer, in both rounds;
    at N=4, 1 Gbit (CPU-bound) they do not help."""
    df = table("overlap_chunks")
    df = df.assign(fitted=df["bucket_mb"] == 4.0)
    assert (df["status"] == "ok").all() and len(df) == 24

    def ratios(n, rate, mode, fitted):
        got = at(df, workers=n, link_rate=rate, overlap=mode)
        got = got[got["fitted"] == fitted]
        return got.sort_values("bucket_mb")

    fitted, small = ratios(2, "1gbit", "full", True), ratios(2, "1gbit", "full", False)
    assert (fitted["step_over_bound"] > 1.10).all() and (small["step_over_bound"] < 1.08).all()
    assert small.groupby("bucket_mb")["step_over_bound"].max().max() < fitted["step_over_bound"].min()
    back = ratios(2, "1gbit", "backward", False)
    smallest = small[small["bucket_mb"] == back["bucket_mb"].iloc[0]]
    assert back["step_s_p50"].median() / smallest["step_s_p50"].median() > 1.15
    assert ratios(2, "1gbit", "backward", True)["step_s_p50"].median() / fitted["step_s_p50"].median() < 1.15
    f4, s4 = ratios(4, "100mbit", "full", True), ratios(4, "100mbit", "full", False)
    assert s4["step_over_bound"].max() < f4["step_over_bound"].min()
    g4, h4 = ratios(4, "1gbit", "full", True), ratios(4, "1gbit", "full", False)
    assert h4["step_over_bound"].median() > g4["step_over_bound"].median() > 1.15
    assert (at(df, workers=4, link_rate="1gbit")["cpu_util_sync"].fillna(0.9) > 0.75).all()


def test_overlap_n8_1gbit_claims():
    """results/overlap_n8_1gbit's README: the PS CPU-saturated; the ring's full slower than its backward and
    past the cores at its bound; all-reduce's backward within 1.10x, its full 1.21x."""
    df = table("overlap_n8_1gbit")
    assert (df["status"] == "ok").all() and len(df) == 6
    at_bound = df["cpu_at_bound"]
    assert (at_bound - df["cpu_util"] * df["step_s_p50"] / df["step_bound_s"]).abs().max() < 1e-12
    ps, ring, ar = (at(df, sync=s).set_index("overlap") for s in ("ps", "ring", "allreduce"))
    assert ps["cpu_saturated"].astype(bool).all()
    assert ring.loc["full", "step_s_p50"] > ring.loc["backward", "step_s_p50"]
    assert at_bound[(df["sync"] == "ring") & (df["overlap"] == "full")].iloc[0] > 1.5
    assert ar.loc["backward", "step_over_bound"] < 1.10 < ar.loc["full", "step_over_bound"] < 1.25
    assert 1.0 < ar.loc["backward", "step_s_p50"] / ar.loc["full", "step_s_p50"] < 1.15
