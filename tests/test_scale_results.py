"""results/scale (``psring sweep experiments/scale.toml``, replayed): the claims of its README, read back from
its runs.csv."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from psring.plot.scale import crossovers, jitter_cost, overtakes, scale_table

FOLDER = Path(__file__).resolve().parent.parent / "results" / "scale"


@pytest.fixture(scope="module")
def raw() -> pd.DataFrame:
    return pd.read_csv(FOLDER / "runs.csv")


@pytest.fixture(scope="module")
def runs(raw) -> pd.DataFrame:
    return scale_table(raw)


def test_the_whole_grid_was_replayed(raw, runs):
    assert len(raw) == 962 and (raw["status"] == "ok").all() and raw["simulated"].astype(bool).all()
    # 2 models x 5 arrangements x 8 N x 3 rates x 2 jitters x 2 alphas, and the two N = 1 baselines
    assert len(runs) == 960 and runs.groupby(["model", "arrangement"]).size().eq(96).all()
    assert sorted(runs["workers"].unique()) == [8, 16, 32, 64, 128, 256, 512, 1024]
    assert {p.name for p in (FOLDER / "figures").iterdir()} >= {"scale.png", "scale_jitter.png"}


def _cut(runs, **kw) -> pd.DataFrame:
    sel = runs
    for k, v in kw.items():
        sel = sel[sel[k] == v]
    return sel


def test_one_servers_incast_is_a_constant_number_of_workers(runs):
    s1 = _cut(runs, model="resnet50", rate_gbit=10.0, arrangement="ps S=1", jitter="none")
    s1 = s1[s1["workers"] >= 64]
    assert (s1["efficiency"] * s1["workers"]).between(1.18, 1.22).all()


@pytest.mark.parametrize("alpha,n8,n1024", [(20.0, 0.057, 0.268), (205.0, 0.069, 2.16)])
def test_the_rings_latency_term_grows_with_n(runs, alpha, n8, n1024):
    ring = _cut(runs, model="resnet50", rate_gbit=25.0, alpha_us=alpha, arrangement="all-reduce",
                jitter="none").set_index("workers")["sync_s_p50"]
    assert ring[8] == pytest.approx(n8, abs=0.001) and ring[1024] == pytest.approx(n1024, rel=0.01)


def test_where_the_ring_falls_behind_a_quarter_of_servers(raw):
    o = overtakes(raw, "all-reduce", "ps S=N/4")
    o = o[o["jitter"] == "none"].set_index(["model", "rate_gbit", "alpha_us"])["from_workers"]
    want = {205.0: [128, 64, 16], 20.0: [1024, 512, 128]}  # at 10, 25, 100 Gbit/s; both models
    for model in ("resnet50", "vit_b_16"):
        for alpha, ns in want.items():
            got = [o[(model, rate, alpha)] for rate in (10.0, 25.0, 100.0)]
            assert got == ns, (model, alpha, got)
    # and hierarchical G=8 (the fastest at N <= 16) falls behind it too, later
    h = overtakes(raw, "hierarchical G=8", "ps S=N/4")
    h = h[h["jitter"] == "none"].set_index(["model", "rate_gbit", "alpha_us"])["from_workers"]
    want = {205.0: [1024, 512, 128], 20.0: [math.nan, math.nan, 1024]}
    for model in ("resnet50", "vit_b_16"):
        for alpha, ns in want.items():
            got = [h[(model, rate, alpha)] for rate in (10.0, 25.0, 100.0)]
            assert all((math.isnan(a) and math.isnan(b)) or a == b for a, b in zip(got, ns)), (model, alpha, got)
    # the PS's lead at N = 1,024, 10 Gbit/s, alpha 20 us: 1.11x (ResNet-50), 1.08x (ViT)
    step = scale_table(raw)
    step = step[(step["rate_gbit"] == 10) & (step["alpha_us"] == 20) & (step["jitter"] == "none") &
                (step["workers"] == 1024)].set_index(["model", "arrangement"])["step_s_p50"]
    for model, lead in (("resnet50", 1.11), ("vit_b_16", 1.08)):
        assert step[(model, "all-reduce")] / step[(model, "ps S=N/4")] == pytest.approx(lead, abs=0.005)


def test_hosts_of_eight_lead_until_n_16_then_the_ps_with_s_n(raw):
    c = crossovers(raw)
    assert (c[c["workers"] <= 16]["fastest"] == "hierarchical G=8").all()
    assert (c[c["workers"] >= 32]["fastest"] == "ps S=N").all()
    assert len(c) == 2 * 3 * 2 * 2 * 8  # every N of every panel has all five arrangements


@pytest.mark.parametrize("model,rate,lo,hi", [("resnet50", 10.0, 0.45, 0.51), ("resnet50", 25.0, 0.67, 0.72),
                                              ("resnet50", 100.0, 0.88, 0.91), ("vit_b_16", 10.0, 0.43, 0.47),
                                              ("vit_b_16", 25.0, 0.62, 0.68), ("vit_b_16", 100.0, 0.86, 0.90)])
def test_the_ps_with_as_many_servers_holds_its_efficiency(runs, model, rate, lo, hi):
    eff = _cut(runs, model=model, rate_gbit=rate, arrangement="ps S=N", jitter="none")["efficiency"]
    assert eff.between(lo, hi).all(), eff.describe()


def test_bsp_pays_for_jitter_where_compute_is_most_of_the_step(raw):
    cost = jitter_cost(raw)
    at = cost[cost["workers"] == 1024].groupby("arrangement")["cost"]
    assert at.min()["ps S=N"] >= 1.06 and at.max()["ps S=N"] <= 1.16
    assert at.min()["all-reduce"] >= 1.0 and at.max()["all-reduce"] <= 1.06
    assert at.min()["ps S=1"] >= 0.995 and at.max()["ps S=1"] <= 1.005
    s_n = cost[(cost["arrangement"] == "ps S=N") & (cost["alpha_us"] == 20)]
    growth = s_n.groupby(["model", "rate_gbit"]).apply(lambda g: g.set_index("workers")["cost"])
    assert (growth[1024] > growth[8]).all()  # grows with N, towards E[max of N]


def test_the_fluid_error_the_readmes_state():
    """results/simulate/fluid_check.csv (benchmarks/fluid_check.py): the PS fluid against the flow replay, the
    bands results/scale and results/simulate quote."""
    f = pd.read_csv(FOLDER.parent / "simulate" / "fluid_check.csv")
    assert len(f) == 36 and sorted(f["workers"].unique()) == [8, 16, 32]
    s_n, quarter = f[f["servers"] == f["workers"]], f[f["servers"] < f["workers"]]
    assert s_n[s_n["link_rate"] != "100gbit"]["step_ratio"].between(0.99, 1.01).all()
    assert s_n[s_n["link_rate"] == "100gbit"]["step_ratio"].between(0.95, 0.96).all()
    assert quarter["step_ratio"].between(1.0, 1.20).all() and quarter["step_ratio"].max() > 1.15
    assert quarter["sync_ratio"].max() <= 1.28
    # the drifting fluid (AsyncPS) under BSP: closer at S = N/4, 6-10% fast at S = N
    assert quarter["drifting_ratio"].between(0.94, 0.995).all()
    assert s_n["drifting_ratio"].between(0.89, 0.945).all()


def test_where_the_ps_leads_by_less_than_the_fluid_flatters_it(raw):
    """At 100 Gbit/s with alpha 20 us, S=N's lead over hierarchical at N = 32-64 is under 5%: undecided."""
    c = crossovers(raw)
    c = c[(c["rate_gbit"] == 100) & (c["alpha_us"] == 20) & (c["jitter"] == "none") & c["workers"].isin([32, 64])]
    assert (c["fastest"] == "ps S=N").all() and c["margin"].between(1.0, 1.05).all()


def test_bsp_ssp_asp_at_scale_claims():
    """results/scale_consistency's README: N = 8-1,024; ASP leads BSP by 1.4-1.5x with 5% jitter on the same fluid
    (the workers' drift overlaps one's communication with others' compute) and by up to 2.3x with 20% (2.8x
    against the lockstep fluid's BSP, which the rows had before), growing with N; SSP slightly ahead of ASP with 5%,
    behind it from 64 workers with 20%; BSP loses with N and spread, ASP gains; bsp_drifting.csv is BSP on both
    fluids, its drifting column what runs.csv now holds."""
    folder = FOLDER.parent / "scale_consistency"
    raw = pd.read_csv(folder / "runs.csv")
    assert len(raw) == 49 and (raw["status"] == "ok").all() and raw["simulated"].astype(bool).all()
    one = raw.loc[raw["sync"] == "none", "worker_samples_per_s"].iloc[0]
    ps = raw[raw["sync"] == "ps"].assign(eff=lambda d: d["worker_samples_per_s"] / (d["workers"] * one))
    eff = ps.pivot_table(index=["jitter", "workers"], columns="consistency", values="eff")
    drift = pd.read_csv(folder / "bsp_drifting.csv").set_index(["jitter", "workers"])
    bsp_rows = ps[ps["consistency"] == "bsp"].set_index(["jitter", "workers"]).loc[drift.index, "worker_samples_per_s"]
    assert ((drift["async_fluid"] / bsp_rows - 1).abs() < 1e-12).all()  # psring simulate's BSP at S = N/4 now
    eff["bsp_lockstep"] = drift["vector_ps"] / (drift.index.get_level_values("workers") * one)
    lead, lead_lock = eff["asp"] / eff["bsp"], eff["asp"] / eff["bsp_lockstep"]
    assert lead.loc["lognormal:0.05"].between(1.38, 1.53).all()
    assert lead_lock.loc["lognormal:0.05"].between(1.4, 1.91).all()
    assert lead.loc["lognormal:0.2"].is_monotonic_increasing and lead_lock.loc["lognormal:0.2"].is_monotonic_increasing
    assert 2.3 < lead.loc[("lognormal:0.2", 1024)] < 2.4 and 2.75 < lead_lock.loc[("lognormal:0.2", 1024)] < 2.85
    assert (eff["bsp"] >= eff["bsp_lockstep"] * 0.99).all()  # the lockstep fluid's BSP reads low (async_check.csv)
    bsp_sync = ps[ps["consistency"] == "bsp"]["sync_s_p50"]
    assert bsp_sync.between(0.13, 0.215).all()
    ahead = eff.loc["lognormal:0.05", "ssp"] / eff.loc["lognormal:0.05", "asp"]
    assert ahead.between(1.0, 1.035).all()
    behind = eff.loc["lognormal:0.2", "ssp"] / eff.loc["lognormal:0.2", "asp"]
    assert (behind[behind.index >= 64] < 0.97).all()
    assert eff.loc[("lognormal:0.2", 1024), "bsp"] < eff.loc[("lognormal:0.2", 8), "bsp"]
    assert eff.loc[("lognormal:0.2", 1024), "asp"] > eff.loc[("lognormal:0.2", 8), "asp"]
    # under BSP both counts agree; under ASP samples_per_s takes each step's slowest worker
    bsp = ps[ps["consistency"] == "bsp"]
    assert ((bsp["worker_samples_per_s"] / bsp["samples_per_s"] - 1).abs() < 1e-9).all()


def test_async_check_claims():
    """results/simulate/async_check.csv: the drifting fluid within 0.97-1.03 of the flow replay for SSP and ASP at
    N = 16 and 32 (0.90-0.97 at N = 8) and for BSP at every N; VectorPS's BSP 0.86-0.89 at S = N/4 from N = 16."""
    df = pd.read_csv(FOLDER.parent / "simulate" / "async_check.csv")
    assert len(df) == 18
    wide = df[df["workers"] >= 16]
    assert wide["async_ratio"].between(0.97, 1.03).all()
    small = df[(df["workers"] == 8) & (df["consistency"] != "bsp")]
    assert small["async_ratio"].between(0.89, 0.98).all()
    bsp = df[df["consistency"] == "bsp"]
    assert bsp["async_ratio"].between(0.98, 1.03).all()
    assert bsp.loc[bsp["workers"] >= 16, "vector_ps_ratio"].between(0.85, 0.90).all()


def test_scale_overlap_claims():
    """results/scale_overlap's README: with overlap the PS with S = N stays ahead of the ring at a smaller margin;
    full lifts both most at 10 Gbit/s; the ring's full loses to its backward at 25 Gbit/s; S = N/4 is server-bound
    (backward and full the same step)."""
    df = pd.read_csv(FOLDER.parent / "scale_overlap" / "runs.csv")
    assert (df["status"] == "ok").all() and df["simulated"].astype(bool).all() and len(df) == 43
    one = df.loc[df["workers"] == 1, "samples_per_s"].iloc[0]
    df = df[df["workers"] > 1].assign(eff=lambda d: d["samples_per_s"] / (d["workers"] * one))
    df["arr"] = ["ring" if s == "allreduce" else f"ps/{n // k}" for s, n, k in zip(df["sync"], df["workers"], df["servers"])]
    eff = df.pivot_table(index=["link_rate", "arr", "workers"], columns="overlap", values="eff")
    best = eff.max(axis=1)
    for rate, lead_none, leads in (("10gbit", (1.15, 1.30), {8: (1.04, 1.10), 16: (1.10, 1.15)}),
                                   ("25gbit", (1.08, 1.2), {8: (1.0, 1.04), 16: (1.0, 1.04)})):
        for n, lead_best in leads.items():
            ps, ring = eff.loc[(rate, "ps/1", n)], eff.loc[(rate, "ring", n)]
            assert lead_none[0] < ps["none"] / ring["none"] < lead_none[1]
            assert lead_best[0] < best[(rate, "ps/1", n)] / best[(rate, "ring", n)] < lead_best[1]
            assert eff.loc[(rate, "ps/4", n), "backward"] == pytest.approx(eff.loc[(rate, "ps/4", n), "full"], rel=0.01)
            assert eff.loc[(rate, "ps/4", n)].max() < 0.6
    ring10 = eff.xs(("10gbit", "ring"))
    assert (ring10["full"] / ring10["none"]).between(1.4, 1.6).all()
    ring25 = eff.xs(("25gbit", "ring"))
    assert (ring25["full"] < ring25["backward"]).all() and (ring25["backward"] > 0.88).all()


def test_scale_codecs_claims():
    """results/scale_codecs's README: an all-gathered codec's bytes grow with N (1-bit ties the uncompressed ring at
    N = 64 = 2M/e, top-k 1% is ahead at 64 and behind from 128, at both rates); fp16 halves the ring's bytes and
    leads at every N; at 8 workers top-k and 1-bit lead by about 2x at 10 Gbit/s."""
    from psring.plot.scale_codecs import behind

    raw = pd.read_csv(FOLDER.parent / "scale_codecs" / "runs.csv")
    assert (raw["status"] == "ok").all() and raw["simulated"].astype(bool).all() and len(raw) == 65
    df = scale_table(raw).assign(compress=lambda d: d["compress"].fillna("none"))
    assert len(df) == 64 and sorted(df["workers"].unique()) == [8, 16, 32, 64, 128, 256, 512, 1024]
    first = behind(df).set_index(["rate_gbit", "compress"])["behind_from"]
    for rate in (10.0, 25.0):
        assert first[(rate, "onebit")] == 64 and first[(rate, "topk:0.01")] == 128
        assert math.isnan(first[(rate, "fp16")])
    eff = df.pivot_table(index=["rate_gbit", "compress"], columns="workers", values="efficiency")
    assert eff.loc[(10.0, "onebit"), 64] == pytest.approx(eff.loc[(10.0, "none"), 64], rel=0.002)  # the tie
    assert eff.loc[(10.0, "topk:0.01"), 8] > 2 * eff.loc[(10.0, "none"), 8]
    sent = df.pivot_table(index="compress", columns="workers", values="bytes_sent_per_step")
    assert sent.loc["fp16"].div(sent.loc["none"]).between(0.49, 0.51).all()
    assert sent.loc["topk:0.01", 1024] / sent.loc["topk:0.01", 8] == pytest.approx(1023 / 7, rel=1e-6)
    assert {p.name for p in (FOLDER.parent / "scale_codecs" / "figures").iterdir()} == {"scale_codecs.png",
                                                                                          "scale_codecs.svg"}


def test_scale_overlap_ring_claims():
    """results/scale_overlap_ring's README: the numpy replays carry the ring's modes to 1,024 workers, equal to the
    flow replay's rows at N <= 32; with the priority order planned after two steps, full leads backward at every N at
    10 Gbit/s, and at 25 Gbit/s trails it up to 128 and leads from 256 to 1,024; overlap's gain over none shrinks."""
    raw = pd.read_csv(FOLDER.parent / "scale_overlap_ring" / "runs.csv")
    assert (raw["status"] == "ok").all() and raw["simulated"].astype(bool).all() and len(raw) == 49
    df = raw[raw["workers"] > 1]
    eff = df.pivot_table(index=["link_rate", "workers"], columns="overlap", values="efficiency")
    flow = pd.read_csv(FOLDER.parent / "scale_overlap" / "runs.csv")
    flow = flow[flow["sync"] == "allreduce"].pivot_table(index=["link_rate", "workers"], columns="overlap",
                                                         values="step_s_p50")
    mine = df.pivot_table(index=["link_rate", "workers"], columns="overlap", values="step_s_p50")
    assert (mine.loc[flow.index] - flow).abs().max().max() < 1e-6
    ten, quarter = eff.xs("10gbit"), eff.xs("25gbit")
    assert (ten["full"] > ten["backward"]).all()
    few, many = [8, 16, 32, 64, 128], [256, 512, 1024]
    assert (quarter.loc[few, "full"] < quarter.loc[few, "backward"]).all()
    assert (quarter.loc[many, "full"] > quarter.loc[many, "backward"]).all()
    gain = eff["backward"] / eff["none"]
    for rate in ("10gbit", "25gbit"):
        assert gain[(rate, 8)] > 1.3 and gain[(rate, 1024)] < 1.25
