"""``psring simulate`` (issue #27, first part): the flow network's sharing, the replay's bytes and plans
from the synchronizers' own planners, its run folder read like a run's, the committed validation against
every emulated run it replays, and bad input in one line."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from psring.bounds import with_bounds
from psring.config import TrainConfig
from psring.simulate.network import Network
from psring.simulate.run import simulate

RESULTS = Path(__file__).resolve().parent.parent / "results"
# link-bound runs the replay misses by more than 10%, each for the reason results/simulate/README.md gives
KNOWN = {("overlap", "ring", "resnet18", "none"), ("compression_sync", "ring", "resnet18", "none"),
         ("compression_sync", "ring", "resnet18", "fp16")}
# overlapped: the PS's backward at N = 4, 1 Gbit since its push order is planned (0.895: the schedule at its bound,
# the cores' 0.7 not in the replay; results/simulate/README.md)
KNOWN_OVERLAPPED = {("overlap", "ps", 4, "1gbit")}


def test_a_downlink_is_shared_fairly_and_an_uplink_sends_in_order():
    net, ends = Network([1e6, 1e6, 1e6]), {}
    net.send(0, 2, 1e6, lambda: ends.setdefault("0->2", net.now))
    net.send(1, 2, 1e6, lambda: ends.setdefault("1->2", net.now))
    net.run()
    assert ends == pytest.approx({"0->2": 2.0, "1->2": 2.0})
    net, ends = Network([1e6, 1e6, 1e6]), {}
    net.send(0, 1, 1e6, lambda: ends.setdefault("first", net.now))
    net.send(0, 2, 1e6, lambda: ends.setdefault("second", net.now))
    net.run()
    assert ends == pytest.approx({"first": 1.0, "second": 2.0})


def test_a_token_bucket_sends_its_burst_at_once_then_the_rate():
    net, ends = Network([1e6, 1e6], burst_bytes=5e5, peak_Bps=1e9), []
    net.send(0, 1, 1.5e6, lambda: ends.append(net.now))
    net.run()
    assert ends[0] == pytest.approx(1.0, abs=2e-3)  # 0.5 MB at 1 GB/s, then 1 MB at 1 MB/s


def _cfg(**kw) -> TrainConfig:
    base = dict(workers=4, model="resnet18", net="emulated", link_rate="100mbit", compute="emulated:200",
                overlap="none", steps=3, warmup=1, batch_size=32)
    return TrainConfig(**{**base, **kw}).validate()


@pytest.mark.parametrize("sync,servers,folder,run_id", [
    ("allreduce", 1, "bandwidth", "sync-allreduce_workers-4_servers-1_link_rate-100mbit"),
    ("ps", 4, "bandwidth", "sync-ps_workers-4_servers-4_link_rate-100mbit")])
def test_the_replay_sends_what_the_run_sent(tmp_path, sync, servers, folder, run_id):
    """Bytes from the same planners: the ring's rounds are 2(N-1)/N*M exactly; the PS's chunks M plus the
    run's headers (a few hundred bytes per message)."""
    s = simulate(_cfg(sync=sync, servers=servers), tmp_path / "sim")
    measured = json.loads((RESULTS / folder / "runs" / run_id / "summary.json").read_text())["bytes_sent_per_step"]
    if sync == "ps":
        assert 0.998 * measured <= s["bytes_sent_per_step"] <= measured
    else:
        assert s["bytes_sent_per_step"] == measured


def test_a_simulated_run_folder_reads_like_a_run(tmp_path):
    s = simulate(_cfg(sync="ps", servers=4, workers=8, steps=4), tmp_path / "sim", jitter="none")
    assert s["simulated"] is True and s["steps_completed"] == 4 and s["timed_steps"] == 3
    steps = pd.read_json(tmp_path / "sim" / "steps.jsonl", lines=True)
    assert len(steps) == 32 and {"step_s", "sync_s", "bytes_sent", "rank"} <= set(steps.columns)
    row = {**TrainConfig.load(tmp_path / "sim" / "config.json").to_dict(), **s}
    b = with_bounds(pd.DataFrame([row]), m_bytes=44_695_848)
    assert 0.95 <= b["over_bound"].iloc[0] <= 1.05  # the pipelined PS's bound


@pytest.mark.parametrize("n,rate,jitter", [(4, "100mbit", "none"), (8, "1gbit", "lognormal:0.1"),
                                            (6, "10gbit", "lognormal:0.05")])
def test_the_vectorized_ring_is_the_flow_replay(tmp_path, n, rate, jitter):
    """The flat ring's numpy replay (vector.py, for thousands of workers) steps exactly as the flow model."""
    cfg = _cfg(sync="ring", workers=n, link_rate=rate, steps=4)
    fast = simulate(cfg, tmp_path / "fast", jitter=jitter)
    flows = simulate(cfg, tmp_path / "flows", jitter=jitter, flows=True)
    a = pd.read_json(tmp_path / "fast" / "steps.jsonl", lines=True)
    b = pd.read_json(tmp_path / "flows" / "steps.jsonl", lines=True)
    assert (a["bytes_sent"] == b["bytes_sent"]).all()
    assert (a["step_s"] - b["step_s"]).abs().max() < 1e-6 and fast["sync_s_p50"] == pytest.approx(flows["sync_s_p50"])


def test_jitter_makes_bsp_wait_for_the_slowest(tmp_path):
    even = simulate(_cfg(sync="ring", workers=8, steps=12), tmp_path / "even")
    jittered = simulate(_cfg(sync="ring", workers=8, steps=12), tmp_path / "jit", jitter="lognormal:0.2")
    assert jittered["step_s_p50"] > even["step_s_p50"] + 0.02  # E[max of 8 draws] > the mean


def test_every_link_bound_replayed_run_within_10_percent_but_the_known_ones():
    v = pd.read_csv(RESULTS / "simulate" / "validation.csv")
    done = v[(v["replayed"] == "yes") & v["link_bound"]]
    assert len(done) >= 110, len(done)
    # overlapped runs are held on their step: their sync is only what the overlap left unhidden (0.1-3 s)
    hidden = done["overlap"] != "none"
    out = done[hidden & ((done["step_ratio"] - 1).abs() > 0.10)]
    assert hidden.sum() >= 45 and {(r.folder, r.sync, r.workers, r.link_rate) for r in out.itertuples()} <= \
        KNOWN_OVERLAPPED, out[["folder", "run_id", "step_ratio"]]
    done = done[~hidden]
    out = done[(done["sync_ratio"] - 1).abs() > 0.10]
    assert {(r.folder, r.sync, r.model, r.compress) for r in out.itertuples()} <= KNOWN, \
        out[["folder", "run_id", "sync_ratio"]]
    for run in v.itertuples():  # every run folder it reads is in the table, and the others say why not
        assert run.replayed == "yes" or run.replayed.startswith("no: ")


def test_the_replay_runs_each_reduce_runs_measured_update_and_no_ps_update():
    """validation.csv: every replayed run of a local optimizer (the reduce family, `none`) ran the update it
    measured (`update_s_p50` of its runs.csv), before each forward; the PS's workers have none (0)."""
    v = pd.read_csv(RESULTS / "simulate" / "validation.csv")
    v = v[v["replayed"] == "yes"]
    ps = v["sync"] == "ps"
    assert (v[ps]["update_s"] == 0).all()
    for folder, rows in v[~ps].groupby("folder"):
        runs = pd.read_csv(RESULTS / folder / "runs.csv").set_index("run_id")
        assert rows["update_s"].to_numpy() == pytest.approx(runs.loc[rows["run_id"], "update_s_p50"].to_numpy()), folder
    assert (v[~ps]["update_s"] > 0.005).mean() > 0.9


def test_an_update_delays_the_step_by_itself_without_overlap_and_at_most_that_with_it(tmp_path):
    """--update-ms: without overlap the step grows by the update and the sync stays; with `full` the update runs
    in the gates, each parameter's share after its units are back, so a step grows by at most the update."""
    base = simulate(_cfg(sync="ring", link_burst="0kb"), tmp_path / "a")
    slow = simulate(_cfg(sync="ring", link_burst="0kb"), tmp_path / "b", update_s=0.05)
    assert slow["step_s_p50"] - base["step_s_p50"] == pytest.approx(0.05, abs=1e-6)
    assert slow["sync_s_p50"] == pytest.approx(base["sync_s_p50"]) and slow["update_s_p50"] == pytest.approx(0.05)
    kw = dict(sync="ring", overlap="full", link_rate="1gbit", compute="emulated:400")
    full = simulate(_cfg(**kw), tmp_path / "c")
    full_slow = simulate(_cfg(**kw), tmp_path / "d", update_s=0.05)
    assert 0.0 < full_slow["step_s_p50"] - full["step_s_p50"] <= 0.05 + 1e-6


def test_an_update_for_a_ps_or_below_zero_is_one_line_exit_2(tmp_path):
    for flags in (["--sync", "ps", "--update-ms", "5"], ["--sync", "ring", "--update-ms", "-1"]):
        r = subprocess.run([sys.executable, "-m", "psring", "simulate", "--workers", "4", "--compute", "emulated:100",
                            *flags, "--out", str(tmp_path / "x")], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--update-ms" in r.stderr, r.stderr


def test_congestion_control_explains_the_rings_misses():
    """results/simulate/congestion.csv (benchmarks/congestion.py): under cubic every strategy meets its replay at
    the point where the hand-written ring missed it; under bbr, the machine's default, the ring pays most."""
    c = pd.read_csv(RESULTS / "simulate" / "congestion.csv")
    assert (c["link_cc"] == c["ran_cc"]).all() and set(c["link_cc"]) == {"cubic", "bbr"}
    assert c.groupby(["sync", "link_cc"]).size().min() >= 3
    med = c.groupby(["sync", "link_cc"])["sync_over_replay"].median()
    assert all(0.99 <= med[(s, "cubic")] <= 1.01 for s in ("ring", "allreduce", "ps")), med
    assert med[("ring", "bbr")] >= 1.05 and med[("ring", "bbr")] > med[("allreduce", "bbr")] > med[("ps", "bbr")]
    ring_rows = c[(c["sync"] == "ring") & (c["link_cc"] == "bbr")]
    assert ring_rows["sync_over_replay"].min() > c[(c["sync"] == "ring") & (c["link_cc"] == "cubic")][
        "sync_over_replay"].max()  # every bbr run of the ring slower than every cubic one
    v = pd.read_csv(RESULTS / "simulate" / "validation.csv")
    assert c["replay_sync_s"][c["sync"] == "ring"].iloc[0] == pytest.approx(
        v[(v.folder == "compression_sync") & (v.sync == "ring") & (v.workers == 4) & (v.link_rate == "100mbit")
          & (v.compress == "none")]["sim_sync_s"].iloc[0])


def test_the_rings_traced_rounds_run_at_the_links_pace_and_the_gap_lies_outside_them():
    """results/simulate/ring_rounds.csv (benchmarks/ring_rounds.py): at 1 Gbit the hand-written ring's gradient
    rounds take their bytes' link time (what the replay prices); the first bucket's tiny rounds, the time between
    rounds and fp16's casts make most of what the replay misses, and they grow with N."""
    r = pd.read_csv(RESULTS / "simulate" / "ring_rounds.csv")
    assert len(r) == 6 and set(r["compress"]) == {"none", "fp16"} and set(r["workers"]) == {2, 4, 8}
    assert (r["rounds_s"] / r["link_s"]).between(0.95, 1.03).all()
    assert (r["sim_sync_s"] / r["sync_s"] - r["sync_ratio"]).abs().max() < 1e-9
    gap = r["sync_s"] - r["sim_sync_s"]
    outside = r["first_bucket_s"] + r["between_s"] + r["outside_s"] + r["rounds_s"] - r["link_s"]
    missed = r["sync_ratio"] < 0.93  # (fp32 at N = 2 and 4: within 5%, where tbf's burst speeds the rounds)
    assert missed.sum() == 4 and (outside / gap)[missed].between(0.8, 1.0).all(), outside / gap
    for _, c in r.sort_values("workers").groupby("compress"):
        assert c["first_bucket_s"].is_monotonic_increasing and c["sync_ratio"].is_monotonic_decreasing
    fp16 = r[r["compress"] == "fp16"]
    assert (fp16["sync_ratio"] < 0.9).all() and (r[r["compress"] == "none"]["sync_ratio"] >= 0.9).all()
    assert (fp16["outside_s"].to_numpy() > r[r["compress"] == "none"]["outside_s"].to_numpy()).all()  # the casts


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    """Bad flags, and ``--from`` a folder that is no run or a run without a calibration (results/overlap has
    none: its folder never calibrated its link)."""
    base = ["simulate", "--sync", "allreduce", "--workers", "4", "--compute", "emulated:100", "--overlap", "none",
            "--out", str(tmp_path / "x")]
    uncalibrated = next((RESULTS / "overlap" / "runs").iterdir())
    on_loopback = next(p for p in (RESULTS / "scaling" / "runs").iterdir() if (p / "config.json").exists())
    for extra, says in [(["--workers", "0"], "--workers"), (["--link-rate", "fast"], "--link-rate"),
                        (["--jitter", "gauss:1"], "--jitter"), (["--compute", "real"], "--compute emulated"),
                        (["--link-burst", "3x"], "--link-burst"), (["--from", str(tmp_path)], "no config.json"),
                        (["--from", str(uncalibrated)], "no calibration.json"),
                        (["--from", str(on_loopback)], "no emulated links")]:
        r = subprocess.run([sys.executable, "-m", "psring", *base, *extra], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and says in r.stderr, (extra, r.stderr)


def test_the_committed_speed_benchmark_meets_the_target():
    """benchmarks/simulate_speed.py's own figures (a benchmark, not a timed test): 1,024 x 100 steps <= 60 s."""
    doc = json.loads((RESULTS / "simulate" / "speed.json").read_text())
    rows = {r["workers"]: r for r in doc["rows"]}
    assert doc["target_met"] is True and rows[1024]["steps"] == 100 and rows[1024]["wall_s"] <= doc["target_s"]
    assert [rows[n]["ms_per_simulated_step"] for n in sorted(rows)] == sorted(r["ms_per_simulated_step"] for r in rows.values())


def test_a_run_replayed_from_its_folder_takes_its_calibrations_alpha_and_its_update(tmp_path):
    run = RESULTS / "bandwidth" / "runs" / "sync-allreduce_workers-4_servers-1_link_rate-100mbit"
    r = subprocess.run([sys.executable, "-m", "psring", "simulate", "--from", str(run), "--out", str(tmp_path / "r")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    alpha = json.loads((RESULTS / "bandwidth" / "calibration.json").read_text())["alpha_s"] * 1e6
    assert s["alpha_us"] == pytest.approx(alpha) and s["workers"] == 4 and s["simulated"] is True
    measured = json.loads((run / "summary.json").read_text())["update_s_p50"]
    assert measured > 0 and s["update_s_p50"] == pytest.approx(measured)
