"""results/overlap, results/overlap_repeats and results/bandwidth_hidden (issue #29) read back: what their
READMEs claim is what their runs.csv hold."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from psring.bounds import with_bounds
from psring.train.compute_spec import parse_compute

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
    # 1 Gbit, ps at N = 4: under the 0.90 flag, but 0.78 of both cores while communicating (`backward`; `full`'s
    # sync phases too short to sample)
    ps4 = at(runs, link_rate="1gbit", sync="ps", workers=4)
    assert (ps4["cpu_util_sync"].dropna() >= 0.75).all() and ps4["cpu_util_sync"].notna().any()


def test_within_10_percent_of_the_bound_at_compute_comm_1(runs):
    one = at(runs, link_rate="100mbit", ratio=1.0)
    overlapped = one[one["overlap"] != "none"]
    assert len(overlapped) == 20 and (overlapped["step_over_bound"] <= 1.10).all()
    # the PS's full points with the full-aware chunk fit (a drain of four chunk times): N = 4 within 5%, N = 2 2%
    ps_full = at(overlapped, sync="ps", overlap="full")
    assert (ps_full["chunk_drain"] == 4).all() and (ps_full["chunk_cores"] == 2).all()
    assert (at(ps_full, workers=4)["step_over_bound"] <= 1.05).all() and (at(ps_full, workers=2)["step_over_bound"] <= 1.02).all()
    # the reduce family's new scheduler at N = 8: within 5% (the previous one's ring: 1.14x; rerun 2026-12-05 with
    # the partitions' floor from the shared cores, 430-560 KB against the link's 370 KB: the ring's full 1.050x;
    # with the order kept after two steps 1.023x; with the aligned cut 1.028x)
    assert (at(overlapped, workers=8)[lambda d: d["sync"] != "ps"]["step_over_bound"] <= 1.051).all()
    # full within 3%, but the ring at N = 2 (1.036x in the 2026-12-06 rerun, a draw: 4.59-4.62 s in its A/B pairs)
    reduce_full = at(overlapped, overlap="full")[lambda d: d["sync"] != "ps"].set_index("workers")["step_over_bound"]
    assert (reduce_full.drop(2) <= 1.03).all() and reduce_full.loc[2] < 1.04


def test_full_beats_backward(runs):
    for n in (4, 8):
        grid = at(runs, link_rate="100mbit", ratio=1.0, workers=n)

        def gain(sync, tuning):
            g = at(grid, sync=sync, link_tuning=tuning).set_index("overlap")["step_s_p50"]
            return g["backward"] / g["full"]

        assert gain("allreduce", "probe") >= 1.15 and gain("ring", "probe") >= 1.15
        assert gain("ps", "auto") >= 1.15 and gain("ps", "probe") >= 1.15


def test_full_over_backward_at_1_gbit_in_alternating_pairs():
    """results/overlap/full_over_backward_ab.csv: at N = 4 both reduce strategies' `full` beats their `backward`
    by >= 1.15x in every pair, each mode within 1.10x of its bound; at N = 8 neither gain reaches 1.15x and
    `full` stays 1.15-1.17x its bound (the misses the README lists)."""
    ab = pd.read_csv(RESULTS / "overlap" / "full_over_backward_ab.csv")
    assert not ab["cpu_saturated"].any()
    for (sync, n), g in ab.groupby(["sync", "workers"]):
        p = g.pivot(index="pair", columns="overlap", values="step_s_p50")
        gain, over = p["backward"] / p["full"], g.groupby("overlap")["step_over_bound"].median()
        first = g[g["overlap"] == "backward"].sort_values("pair")["order"].tolist()
        assert len(p) >= 4 and first == [i % 2 for i in range(len(p))], (sync, n)  # the modes' order alternates
        if n == 4:
            assert gain.min() >= 1.15 and (over <= 1.10).all(), (sync, gain.min(), over)
        else:
            assert gain.median() < 1.15 and 1.15 <= over["full"] <= 1.17 and over["backward"] <= 1.06, (sync, over)


def test_1_gbit_is_where_the_bound_leaves_out_most(runs):
    """The README's 1 Gbit paragraph: backward within 7% for the reduce family and the PS at N = 2; the
    reduce family's full points 1.04-1.09x with its updates (3-6% of a step) in the bound (2026-12-06's slower draw
    of the machine; 1.03-1.05x on the draw before), more without them; the PS's full point at N = 2 1.08x with the
    chunk fitted for full, at N = 4 1.19x with the cores it would need at its bound near 0.8."""
    g = at(runs, link_rate="1gbit")
    back = at(g, overlap="backward")
    assert (back[~((back["sync"] == "ps") & (back["workers"] == 4))]["step_over_bound"] <= 1.07).all()
    full = at(g, overlap="full")
    reduce, ps = full[full["sync"] != "ps"], full[full["sync"] == "ps"]
    assert reduce["step_over_bound"].between(1.04, 1.095).all()
    ps_by_n = ps.set_index("workers")
    assert ps_by_n.loc[2, "step_over_bound"] < 1.10 and ps_by_n.loc[2, "chunk_drain"] == 4
    assert 1.15 < ps_by_n.loc[4, "step_over_bound"] < 1.25 and ps_by_n.loc[4, "cpu_at_bound"] > 0.75
    unupdated = with_bounds(reduce.drop(columns=["step_bound_s", "step_over_bound"]).assign(update_s_p50=0.0))
    assert (unupdated["step_over_bound"] > reduce["step_over_bound"] + 0.01).all()
    assert (g[g["sync"] != "ps"]["update_s_p50"] / g[g["sync"] != "ps"]["step_bound_s"]).between(0.015, 0.06).all()


def test_repeats_put_the_ps_gain_and_the_n8_points_in_their_spread():
    rep = table("overlap_repeats")
    assert (rep["status"] == "ok").all() and not rep["cpu_saturated"].astype(bool).any()
    ps4 = at(rep, sync="ps", workers=4).pivot(index="seed", columns="overlap", values="step_s_p50")
    gains = ps4["backward"] / ps4["full"]
    assert len(gains) == 3 and gains.min() >= 1.15  # the full-aware chunk fit: 1.18-1.20 (before: 1.145-1.171)
    assert (at(rep, sync="ps", workers=4, overlap="full")["step_over_bound"] <= 1.06).all()
    full8 = at(rep, workers=8, overlap="full").set_index("sync")["step_over_bound"]
    assert full8["ring"] <= 1.05 and full8["ps"] <= 1.10  # ps: 65 KB chunks, four credits (1.095)


def test_the_pss_no_overlap_points_with_the_rate_hidden_stay_at_their_bound():
    hidden = table("bandwidth_hidden")
    assert (hidden["status"] == "ok").all() and (hidden["link_tuning"] == "probe").all()
    bound = hidden[hidden["link_bound"]]
    assert len(bound) == 10 and (bound["over_bound"] <= 1.10).all(), bound[["workers", "servers", "over_bound"]]


def test_the_ps_at_n8_with_full_sits_at_its_target_and_is_not_cpu_bound():
    """results/overlap_ps8's README: with 65 KB chunks the default credits (four chunks) read 1.075-1.107x
    (median 1.090) in three draws, two chunks within 1% of them, and the same point at 50 Mbit 1.06-1.07x with
    less CPU."""
    df = table("overlap_ps8")
    assert (df["status"] == "ok").all() and not df["cpu_saturated"].astype(bool).any() and len(df) == 8
    assert (df["chunk_drain"] == 4).all() and (df["chunk_bytes"] < 66_000).all()
    fast = at(df, link_rate="100mbit")
    default, two = fast[fast["ps_credit_mb"].isna()], fast[fast["ps_credit_mb"] == 0.1239]
    assert len(default) == len(two) == 3
    assert default["step_over_bound"].between(1.07, 1.11).all() and default["step_over_bound"].median() <= 1.10
    assert abs(two["step_over_bound"].median() - default["step_over_bound"].median()) < 0.01
    half = at(df, link_rate="50mbit")
    assert len(half) == 2 and half["step_over_bound"].between(1.05, 1.08).all()
    assert half["cpu_util_sync"].max() < default["cpu_util_sync"].min()


def test_overlap_chunks_claims():
    """results/overlap_chunks' README: under --overlap full, chunks smaller than the fitted one bring ps N=2
    at 1 Gbit inside 1.10x (and full over backward past 1.15x), and N=4 at 100 Mbit closer, in both rounds;
    at N=4, 1 Gbit (CPU-bound) they do not help."""
    df = table("overlap_chunks")
    df = df.assign(fitted=df["bucket_mb"] == 4.0)
    assert (df["status"] == "ok").all() and len(df) == 30

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
    # the CPU model the full-aware fit caps the chunks with (sharding.cores_chunks) is these runs' own
    from psring.sync.ps.sharding import CORE_SHARE, CPU_PER_BYTE_S, CPU_PER_MESSAGE_S

    m = 44_695_848
    cpu_s = df["cpu_util"] * 2 * df["step_s_p50"]  # both cores' seconds a step
    model = CPU_PER_BYTE_S * 2 * df["workers"] * m + CPU_PER_MESSAGE_S * df["workers"] * m / df["chunk_bytes"]
    slow = df["link_rate"] == "500mbit"  # fitted to the 24 others; these take more than it says
    assert (model / cpu_s)[~slow].between(0.85, 1.15).all() and (model / cpu_s)[slow].between(0.7, 1.0).all()
    # at 500 Mbit the chunk between the old cap's (349 KB, fitted) and the saturating one gains in both rounds;
    # CORE_SHARE lies between the model's share of the cores (over M/B) of the gaining chunk and the losing ones
    share = model / (2 * m / (500e6 / 8))
    f5 = ratios(4, "500mbit", "full", True)
    mid, low = (ratios(4, "500mbit", "full", False).query(f"bucket_mb == {b}") for b in (0.2, 0.14))
    assert mid["step_s_p50"].max() < f5["step_s_p50"].min() and (mid["step_over_bound"] < 1.13).all()
    assert low["cpu_saturated"].astype(bool).all()
    assert share[mid.index].max() <= CORE_SHARE < share[low.index].min()
    g4_share = model[g4.index] / (2 * m / 125e6)
    assert CORE_SHARE < g4_share.min()


def test_overlap_n8_1gbit_claims():
    """results/overlap_n8_1gbit's README: the PS CPU-saturated; the reduce family's partitions at least the floor
    from the shared cores. Its rows (306ca2b, each plan priced by the steadiest step; 2026-12-06's slower draw of the
    machine): all-reduce's `backward` 1.06x and `full` 1.18x on 29 partitions, the ring's 1.06x and 1.17x on 16,
    `full` 1.10-1.12x faster than `backward`. Over four starts
    (steady_probe_starts.csv, one lane) the medians 1.05, 1.10, 1.09 and 1.14x, `full` 1.13x or more faster than
    `backward` in every start; the ring's four starts with two lanes (ring_lanes_starts.csv) 1.03x and 1.12x, `full`
    1.10-1.14x faster. The studies beside them are read back in test_overlap_n8_studies.py."""
    df = table("overlap_n8_1gbit")
    assert (df["status"] == "ok").all() and len(df) == 6
    at_bound = df["cpu_at_bound"]
    assert (at_bound - df["cpu_util"] * df["step_s_p50"] / df["step_bound_s"]).abs().max() < 1e-12
    ps, ring, ar = (at(df, sync=s).set_index("overlap") for s in ("ps", "ring", "allreduce"))
    assert ps["cpu_saturated"].astype(bool).all()
    reduce = df[df["sync"] != "ps"]
    part = reduce["partition_bytes"]
    assert (part == reduce[["cores_partition_bytes", "link_partition_bytes"]].max(axis=1)).all() and (part > 1.5e6).all()
    assert ring.loc["backward", "step_over_bound"] < 1.06 and ar.loc["backward", "step_over_bound"] < 1.06
    assert 1.16 < ring.loc["full", "step_over_bound"] < 1.17 and 1.18 < ar.loc["full", "step_over_bound"] < 1.19
    m = 44_695_848
    assert 28 <= m / ar.loc["full", "partition_bytes"] < 29 and 16 <= m / ring.loc["full", "partition_bytes"] < 17
    gain = (df.set_index(["sync", "overlap"])["step_s_p50"].unstack())
    assert (gain.loc[["ring", "allreduce"], "backward"] / gain.loc[["ring", "allreduce"], "full"]).between(1.09, 1.13).all()
    assert (reduce["update_s_p50"] > 0.04).all()  # this draw of the machine: the updates about twice the last's
    starts = pd.read_csv(RESULTS / "overlap_n8_1gbit" / "steady_probe_starts.csv")
    assert len(starts) == 16 and starts.groupby(["sync", "overlap"]).size().eq(4).all()
    med = starts.groupby(["sync", "overlap"])["step_over_bound"].median()
    assert med[("allreduce", "backward")] < 1.05 and med[("ring", "backward")] < 1.10
    assert 1.09 < med[("allreduce", "full")] < 1.11 and 1.14 < med[("ring", "full")] < 1.15
    parts = (m / starts["partition_bytes"]).groupby([starts["sync"], starts["overlap"]])
    assert parts.min()[("ring", "full")] > 10 and parts.max()[("allreduce", "full")] < 15
    w = starts.pivot_table(index=["sync", "start"], columns="overlap", values="step_s_p50")
    assert (w["backward"] / w["full"]).min() > 1.13
    lanes = pd.read_csv(RESULTS / "overlap_n8_1gbit" / "ring_lanes_starts.csv")
    assert len(lanes) == 8 and lanes.groupby("overlap").size().eq(4).all()
    med = lanes.groupby("overlap")["step_over_bound"].median()
    assert med["backward"] < 1.035 and 1.11 < med["full"] < 1.13 and lanes["step_over_bound"].max() < 1.16
    w = lanes.pivot_table(index="start", columns="overlap", values="step_s_p50")
    assert (w["backward"] / w["full"]).between(1.09, 1.15).all()


def test_overlap_n8_1gbit_partition_ladder_claims():
    """results/overlap_n8_1gbit's partition ladder: 1.15 MiB CPU-bound at about twice the step of 5 MiB, the best size
    still above 1.10x its bound; the probe's six starts spread over 1.2-6.2 MB with their fit's intercept."""
    lad = pd.read_csv(RESULTS / "overlap_n8_1gbit" / "partition_ladder.csv")
    assert len(lad) == 15 and (lad["timed_steps"] == 8).all() and lad.groupby("bucket_mb").size().to_dict() == \
        {1.15: 3, 2.0: 3, 3.5: 3, 5.0: 3, 7.0: 3}
    med = lad.groupby("bucket_mb")["step_s_p50"].median()
    assert med.idxmin() == 5.0 and 1.15 < med[5.0] / 0.812 < 1.25
    assert med[1.15] > 1.5 * med[5.0] and lad[lad["bucket_mb"] == 1.15]["cpu_util_sync"].min() > 0.9
    assert (lad.groupby("bucket_mb")["cpu_util"].median().diff().dropna() < 0).all()  # fewer calls, less CPU
    probes = pd.read_csv(RESULTS / "overlap_n8_1gbit" / "probe_starts.csv")
    assert len(probes) == 6 and probes["partition_bytes"].min() < 1.3e6 and probes["partition_bytes"].max() > 6e6
    assert probes.sort_values("probe_fixed_ms")["partition_bytes"].is_monotonic_increasing


def test_overlap_n8_1gbit_learned_order_claims():
    """results/overlap_n8_1gbit's A/B of the priority scheduler's order (kept after two steps against agreed on at
    every step, alternating, four pairs per strategy): the kept order is faster in 7 of 8 pairs, by a median of
    3% (all-reduce) and 6% (the ring) a step; all-reduce takes less of the cores, the ring about the same a step."""
    ab = pd.read_csv(RESULTS / "overlap_n8_1gbit" / "learned_order_ab.csv")
    assert len(ab) == 16 and ab.groupby(["sync", "arm"]).size().eq(4).all()
    wide = ab.pivot_table(index=["sync", "pair"], columns="arm", values=["step_s_p50", "cpu_util"])
    ratio = wide["step_s_p50"]["learned"] / wide["step_s_p50"]["consensus"]
    assert (ratio < 1).sum() == 7
    med = ratio.groupby("sync").median()
    assert 0.95 < med["allreduce"] < 0.98 and 0.92 < med["ring"] < 0.96, med
    cpu = wide["cpu_util"].groupby("sync").median()
    assert cpu.loc["allreduce", "learned"] < 0.9 * cpu.loc["allreduce", "consensus"], cpu
    per_step = (wide["cpu_util"] * wide["step_s_p50"]).groupby("sync").median()
    assert per_step.loc["ring", "learned"] == pytest.approx(per_step.loc["ring", "consensus"], rel=0.05), per_step


def test_overlap_n8_1gbit_aligned_cut_claims():
    """results/overlap_n8_1gbit's aligned cut: against equal slices faster in every pair at 9 partitions and in every
    probed pair; at fixed partitions 13 of them put both strategies at 1.10-1.12x their bound, 9 (the ring) and 22
    (all-reduce) above 1.13x."""
    ab = pd.read_csv(RESULTS / "overlap_n8_1gbit" / "aligned_partitions_ab.csv")
    wide = ab.pivot_table(index=["strategy", "bucket_mb", "pair"], columns="cut", values="step_s_p50")
    kept = wide.dropna(subset=["aligned"])
    assert len(kept) == 4 and (kept.xs("5", level="bucket_mb")["aligned"] < 0.96).all()
    assert (kept["aligned"] / kept["equal"]).xs("5", level="bucket_mb").lt(0.97).all()
    probed = wide.xs("probed", level="bucket_mb").dropna(subset=["whole_groups"])
    assert len(probed) == 6 and (probed["whole_groups"] < probed["equal"]).all()
    lad = pd.read_csv(RESULTS / "overlap_n8_1gbit" / "aligned_partition_ladder.csv")
    assert len(lad) == 10 and lad.groupby(["sync", "bucket_mb"]).size().eq(2).all()
    worst = lad.groupby(["sync", "partitions"])["step_over_bound"].max()
    assert worst[("allreduce", 13)] < 1.11 and worst[("ring", 13)] < 1.12
    assert lad.groupby(["sync", "partitions"])["step_over_bound"].min()[[("ring", 9), ("allreduce", 22)]].gt(1.13).all()


def test_overlap_rate_ladder_claims():
    """results/overlap_rate_ladder's README: the 1 Gbit points that miss 1.10x close on their bounds as the rate
    (and the CPU a second) falls (the PS's step by step; the reduce family's single draws of the partition below 1 Gbit
    either way); at 250 Mbit within 1.10x with full beating backward by 1.12x or more; at 500 Mbit
    all-reduce's full within 1.10x, the ring's 1.105x in the 2026-12-06 draw, the PS's at 1.12x; the reduce
    family's partitions floored by the shared cores (its rows rerun), every backward within 1.04x below 1 Gbit and 1.09x
    at it; at 1 Gbit the PS's
    full needs the whole machine at its bound."""
    df = table("overlap_rate_ladder")
    assert (df["status"] == "ok").all() and len(df) == 18
    rates = ["1gbit", "500mbit", "250mbit"]
    for sync in ("ps", "ring", "allreduce"):
        full = at(df, sync=sync, overlap="full").set_index("link_rate").loc[rates, "step_over_bound"]
        assert (full.is_monotonic_decreasing if sync == "ps" else full.iloc[0] > full.iloc[1:].max()), (sync, full)
        assert full.iloc[0] > (1.15 if sync == "ps" else 1.10), (sync, full)
        slow = at(df, sync=sync, link_rate="250mbit").set_index("overlap")
        assert (slow["step_over_bound"] <= 1.10).all()
        assert slow.loc["backward", "step_s_p50"] / slow.loc["full", "step_s_p50"] >= 1.12
    reduce = df[df["sync"] != "ps"]
    assert (reduce["partition_bytes"] >= reduce["cores_partition_bytes"]).all()
    assert (reduce["cores_partition_bytes"] > reduce["link_partition_bytes"]).sum() >= 9
    back = at(reduce, overlap="backward")
    assert (back[back.link_rate != "1gbit"]["step_over_bound"] < 1.04).all() and (back["step_over_bound"] < 1.09).all()
    mid = at(df, link_rate="500mbit", overlap="full").set_index("sync")
    # all-reduce within 1.10x; the ring's draw (2026-12-06) 1.105x on 1.47 MB partitions and 0.89 of the cores
    assert 1.03 < mid.loc["allreduce", "step_over_bound"] < 1.07 and mid.loc["allreduce", "cpu_at_bound"] < 0.8
    assert 1.10 < mid.loc["ring", "step_over_bound"] < 1.11 and mid.loc["ring", "cpu_at_bound"] > 0.85
    ab = pd.read_csv(RESULTS / "overlap_rate_ladder" / "learned_order_500mbit.csv")
    wide = ab.pivot_table(index=["sync", "pair"], columns="arm", values=["step_s_p50", "cpu_util"])
    ratio = (wide["step_s_p50"]["learned"] / wide["step_s_p50"]["consensus"]).groupby("sync").median()
    assert len(ab) == 12 and ratio["ring"] < 0.98 and abs(ratio["allreduce"] - 1) < 0.01, ratio
    assert (wide["cpu_util"]["learned"] < wide["cpu_util"]["consensus"]).all()
    gig = at(df, link_rate="1gbit", overlap="full").set_index("sync")["cpu_at_bound"]
    assert gig["ps"] > 1.0 and gig["ring"] < 0.8 and gig["allreduce"] < 0.8
    # not all of it is the CPU: the PS's full at 500 Mbit (its chunk fitted with CORE_SHARE 0.85) is 1.12x with
    # three quarters of the cores at its bound
    mid = at(df, sync="ps", link_rate="500mbit", overlap="full").iloc[0]
    assert 1.10 < mid["step_over_bound"] < 1.13 and mid["cpu_at_bound"] < 0.8 and mid["chunk_bytes"] < 210_000


def test_overlap_cpu_claims():
    """results/overlap_cpu's README: the CPU while the links carry traffic (``cpu_util_comm``), recomputed from the
    committed link samples, puts the PS at N = 4 just under the flag and the reduce family at half the cores;
    the PS at N = 8 is CPU-saturated."""
    from psring.config import TrainConfig
    from psring.metrics.jsonl import read_jsonl
    from psring.metrics.summary import timed_window
    from psring.net import links
    from psring.plot.links import host_rates

    df = table("overlap_cpu")
    assert (df["status"] == "ok").all() and len(df) == 12 and df["cpu_util_comm"].notna().all()
    recomputed = 0
    for run in sorted((RESULTS / "overlap_cpu" / "runs").glob("*overlap-*")):
        if not (run / links.FILE).is_file():
            continue
        s = json.loads((run / "summary.json").read_text())
        cfg = TrainConfig.load(run / "config.json")
        rows, window = links.load(run / links.FILE), timed_window(read_jsonl(run / "steps.jsonl"), cfg.warmup)
        rates = [8 * r for r in host_rates(cfg)]
        assert links.comm_cpu(rows, rates, *window) == pytest.approx(s["cpu_util_comm"], abs=1e-9), run.name
        recomputed += 1
    assert recomputed == 6  # the N = 4 runs keep their samples
    n4, n8 = at(df, workers=4), at(df, workers=8)
    ps4 = at(n4, sync="ps")
    assert ps4["cpu_util_comm"].between(0.85, 0.90).all() and not ps4["cpu_saturated"].astype(bool).any()
    assert (ps4["step_over_bound"] > 1.10).all()
    reduce4 = n4[n4["sync"] != "ps"]
    assert (reduce4["cpu_util_comm"] < 0.6).all() and (reduce4["step_over_bound"] < 1.10).all()
    assert at(n8, sync="ps")["cpu_saturated"].astype(bool).all()
    assert (at(n8, sync="ps")["cpu_util_comm"] > 0.95).all()
    # bin by bin (100 ms): while some link runs at half its rate or more, the PS's cores are as full as its links
    ps = busy_bins(RESULTS / "overlap_cpu" / "runs" / "sync-ps_workers-4_servers-4_compute-emulated:374_overlap-full")
    ar = busy_bins(RESULTS / "overlap_cpu" / "runs" /
                   "sync-allreduce_workers-4_servers-1_compute-emulated:561_overlap-full")
    assert ps["cpu"] > 0.9 and ar["cpu"] < 0.6 and ps["link"] > 0.9 and ar["link"] > 0.9, (ps, ar)
    assert (ps["busy"], ps["bins"], ar["busy"], ar["bins"]) == (41, 49, 51, 64)


def busy_bins(run: Path, bin_s: float = 0.1) -> dict:
    """Over a run's timed steps in ``bin_s`` bins: the medians, over the bins in which some host's link ran at
    half its rate or more, of the machine's CPU and of each host's busier direction (averaged over hosts)."""
    import numpy as np

    from psring.metrics.jsonl import read_jsonl
    from psring.metrics.summary import timed_window
    from psring.net import links

    start, end = timed_window(read_jsonl(run / "steps.jsonl"), 4)
    rows = [r for r in links.load(run / links.FILE) if start < r["time"] <= end]
    idx = [int((r["time"] - rows[0]["time"]) / bin_s) for r in rows]
    n, hosts = idx[-1] + 1, len(rows[0]["up"])
    moved, cpu, dt = np.zeros((n, hosts)), np.zeros(n), np.zeros(n)
    for i, r in zip(idx, rows):
        moved[i] += np.maximum(r["up"], r["down"])
        cpu[i] += r["cpu"] * r["dt"]
        dt[i] += r["dt"]
    util = moved / (125e6 * dt[:, None])  # 1 Gbit
    busy = util.max(axis=1) >= 0.5
    return {"cpu": float(np.median(cpu[busy] / dt[busy])), "link": float(np.median(util[busy].mean(axis=1))),
            "busy": int(busy.sum()), "bins": n}
