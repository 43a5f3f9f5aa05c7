"""``psring sweep`` and ``psring bench`` as a user runs them: a sweep runs every unique configuration once
and writes one tidy row per run, skips finished runs when run again, records a failed run and goes on;
bad sweep files and bench flags get one line and exit 2; the bench writes consistent figures and
leaves no process behind.

The three long commands (a sweep, a sweep with a failing run, the bench) are started together by the
module's first test and run in the background while the quick checks go on: they share the cores."""
from __future__ import annotations

import json
import re
import subprocess

import pandas as pd
import pytest

from conftest import processes_mentioning

FIXED = """
[fixed]
model = "cnn"
steps = 4
batch_size = 8
num_samples = 256
warmup = 1
log_every = 100
"""
SWEEP = """
[sweep]
name = "tiny"
description = "none and ps at N = 1, 2; S = 1 and S = N"

[grid]
sync = ["none", "ps"]
workers = [1, 2]
servers = [1, "N"]
""" + FIXED
# the product has 8 entries; none ignores servers and S=N=1 equals S=1, which leaves 5 runs
EXPECTED_RUNS = {("none", 1, 1), ("none", 2, 1), ("ps", 1, 1), ("ps", 2, 1), ("ps", 2, 2)}

FAILING = """
[sweep]
name = "failing"

# a --timeout no server can meet: the worker fails waiting for its first reply (README: "a server does
# not answer within --timeout"), and the launcher stops the run's server
[[runs]]
sync = "ps"
workers = 1
servers = 1
timeout_s = 0.000001

# and this one, after it, must still run
[[runs]]
sync = "none"
workers = 1
""" + FIXED

BENCH_N = 2
BENCH_SIZES = [4096, 65536]
RUNS_CSV_COLUMNS = ["run_id", "sync", "workers", "servers", "status", "error", "samples_per_s", "step_s_p50",
                    "step_s_p90", "step_s_p99", "share_sync", "bytes_sent_per_step", "speedup", "efficiency",
                    "cpu_util", "cpu_saturated"]


class Jobs:
    """The module's long psring commands, started together, each waited for (once) when a test needs it."""

    def __init__(self, runner, root):
        self.runner, self.root, self.procs, self.results = runner, root, {}, {}
        self.sweep_file = root / "tiny.toml"
        self.sweep_file.write_text(SWEEP)
        self.sweep_out = root / "sweep-out"
        self.failing_file = root / "failing.toml"
        self.failing_file.write_text(FAILING)
        self.failing_out = root / "failing-out"
        self.bench_out = root / "bench-out"
        self.args = {
            "sweep": ["sweep", str(self.sweep_file), "--out", str(self.sweep_out)],
            "failing": ["sweep", str(self.failing_file), "--out", str(self.failing_out)],
            "bench": ["bench", "--workers", str(BENCH_N), "--sizes", "4K,64K", "--iters", "3",
                      "--warmup", "1", "--out", str(self.bench_out)],
        }
        for name, args in self.args.items():
            self.procs[name] = runner.start(*args)

    def result(self, name: str, timeout: float = 300) -> subprocess.CompletedProcess:
        if name not in self.results:
            p = self.procs[name]
            try:
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.runner.reap()
                pytest.fail(f"psring {' '.join(self.args[name])} did not finish in {timeout} s")
            self.results[name] = subprocess.CompletedProcess(p.args, p.returncode, out, err)
        return self.results[name]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    from conftest import Psring

    root = tmp_path_factory.mktemp("sweepbench")
    runner = Psring(root)
    try:
        yield Jobs(runner, root)
    finally:
        runner.reap()


def read_runs(out) -> pd.DataFrame:
    return pd.read_csv(out / "runs.csv")


# --- bad sweep files and bench flags: one line, exit 2, nothing run ---------------------------------

# These quick checks come first and let the module's long commands start in the background meanwhile.
@pytest.mark.usefixtures("jobs")
@pytest.mark.parametrize("text,needle", [
    ("[grid\nsync = [\"none\"]\n", "is not valid TOML"),
    ("[fixed]\nmodel = \"cnn\"\ncolour = \"red\"\n", "unknown key(s) in [fixed]: colour"),
    ("[sweeps]\nname = \"x\"\n", "unknown table(s) sweeps"),
    ("[grid]\nworkers = 2\n", "[grid] workers must be a non-empty list"),
])
def test_bad_sweep_file_is_one_line_and_exit_2(psring, tmp_path, text, needle):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    out = tmp_path / "out"
    r = psring.run("sweep", str(f), "--out", str(out), timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("psring: error:") and needle in r.stderr, r.stderr
    assert not (out / "runs.csv").exists()


@pytest.mark.parametrize("text,needle", [
    ("[[runs]]\nsync = \"none\"\nsteps_per_epoch = 3\n", "unknown key(s) in [runs]: steps_per_epoch"),
    ("[grid]\nworker = [1, 2]\n", "unknown key(s) in [grid]: worker"),
    ("[grid]\nworkers = []\n", "[grid] workers must be a non-empty list"),
    (None, "cannot read sweep file"),
])
def test_load_sweep_rejects_more_bad_files(tmp_path, text, needle):
    """The same checks in-process (no subprocess needed): ConfigError is what the CLI turns into exit 2."""
    from psring.config import ConfigError
    from psring.sweep import load_sweep

    f = tmp_path / "bad.toml"
    if text is not None:
        f.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_sweep(f)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_load_sweep_resolves_servers_and_drops_duplicates(tmp_path):
    from psring.sweep import load_sweep

    f = tmp_path / "tiny.toml"
    f.write_text(SWEEP)
    meta, runs = load_sweep(f)
    assert meta["name"] == "tiny"
    assert [(r["sync"], r["workers"], r["servers"]) for r in runs] == \
        [("none", 1, 1), ("none", 2, 1), ("ps", 1, 1), ("ps", 2, 1), ("ps", 2, 2)]
    assert all(r["model"] == "cnn" and r["steps"] == 4 for r in runs)


@pytest.mark.usefixtures("jobs")
@pytest.mark.parametrize("args,needle", [
    (["--sizes", "4Q"], "cannot read size '4Q'"),
    (["--strategies", "gossip"], "--strategies takes allreduce and/or ps"),
    (["--strategies", "ps", "--compress", "powersgd:1"], "ps cannot bench it"),
    (["--compress", "topk:2"], "RATIO"),
])
def test_bad_bench_args_are_one_line_and_exit_2(psring, tmp_path, args, needle):
    out = tmp_path / "bench"
    r = psring.run("bench", *args, "--out", str(out), timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("psring: error:") and needle in r.stderr, r.stderr
    assert not (out / "bench.csv").exists()


# --- a sweep runs every unique configuration once ------------------------------------------------

def test_sweep_runs_every_unique_configuration(jobs):
    r = jobs.result("sweep")
    assert r.returncode == 0, r.stdout + r.stderr
    n = len(EXPECTED_RUNS)
    progress = re.findall(r"^\[(\d+)/(\d+)\] (\S+): running", r.stdout, re.M)
    assert [(int(i), int(k)) for i, k, _ in progress] == [(i, n) for i in range(1, n + 1)], r.stdout
    assert "sweep done" in r.stdout

    df = read_runs(jobs.sweep_out)
    for col in RUNS_CSV_COLUMNS:
        assert col in df.columns, col
    assert len(df) == n
    assert set(zip(df["sync"], df["workers"], df["servers"])) == EXPECTED_RUNS
    assert df["run_id"].is_unique and sorted(df["run_id"]) == sorted(i for _, _, i in progress)
    assert (df["status"] == "ok").all(), df[["run_id", "status", "error"]]
    assert df["error"].isna().all()  # written as "", read back as NaN
    assert (df["model"] == "cnn").all() and (df["steps"] == 4).all() and (df["batch_size"] == 8).all()

    # every row carries its run's summary
    for row in df.to_dict("records"):
        summary = json.loads((jobs.sweep_out / "runs" / row["run_id"] / "summary.json").read_text())
        for key in ("sync", "workers", "servers"):
            assert summary[key] == row[key], (row["run_id"], key)
        for key in ("samples_per_s", "step_s_p50", "step_s_p90", "step_s_p99", "bytes_sent_per_step"):
            assert row[key] == pytest.approx(summary[key], rel=1e-12), (row["run_id"], key)
        assert row["samples_per_s"] > 0
        assert row["step_s_p50"] <= row["step_s_p90"] <= row["step_s_p99"]
        assert 0 <= row["share_sync"] <= 1
        assert (row["bytes_sent_per_step"] == 0) == (row["sync"] == "none")
        if not pd.isna(row["cpu_util"]):  # None where the timed steps took less than a jiffy (10 ms)
            assert 0 <= row["cpu_util"] <= 1 and row["cpu_saturated"] == (row["cpu_util"] >= 0.9), row
    assert df["cpu_util"].notna().any()

    # every strategy's speedup is over the one none N=1 run (this sweep has it, so none was added)
    base = df[(df["sync"] == "none") & (df["workers"] == 1)]
    assert len(base) == 1 and base["speedup"].iloc[0] == 1.0
    assert df["speedup"].notna().all()
    for row in df.to_dict("records"):
        assert row["speedup"] == pytest.approx(row["samples_per_s"] / base["samples_per_s"].iloc[0], rel=1e-9)
        assert row["efficiency"] == pytest.approx(row["speedup"] / row["workers"], rel=1e-12)


def test_sweep_again_skips_finished_runs(jobs, psring):
    first = jobs.result("sweep")
    assert first.returncode == 0, first.stderr
    before = read_runs(jobs.sweep_out)
    summaries = sorted((jobs.sweep_out / "runs").glob("*/summary.json"))
    assert len(summaries) == len(EXPECTED_RUNS)
    mtimes = {p: p.stat().st_mtime_ns for p in summaries}

    r = psring.run(*jobs.args["sweep"], timeout=120)
    assert r.returncode == 0, r.stderr
    skipped = re.findall(r"^\[(\d+)/(\d+)\] (\S+): finished earlier, skipped$", r.stdout, re.M)
    assert len(skipped) == len(EXPECTED_RUNS), r.stdout
    assert "running" not in r.stdout
    assert {p: p.stat().st_mtime_ns for p in summaries} == mtimes

    after = read_runs(jobs.sweep_out)
    assert len(after) == len(EXPECTED_RUNS) and (after["status"] == "ok").all()
    cols = ["run_id", "sync", "workers", "servers", "samples_per_s", "step_s_p50", "speedup", "efficiency"]
    pd.testing.assert_frame_equal(after[cols], before[cols])


def test_results_load_runs_of_a_sweep(jobs):
    from psring import results

    assert jobs.result("sweep").returncode == 0
    runs = results.load_runs(jobs.sweep_out)
    assert len(runs) == len(EXPECTED_RUNS) and "speedup" in runs.columns
    assert len(results.load_runs(jobs.sweep_out / "runs.csv")) == len(EXPECTED_RUNS)
    dirs = results.run_dirs(jobs.sweep_out)
    assert set(dirs) == set(runs["run_id"])
    assert all((d / "steps.jsonl").exists() for d in dirs.values())
    with pytest.raises(FileNotFoundError):
        results.load_runs(jobs.root / "no-such-sweep")


def test_run_ids_name_the_values_the_runs_use(tmp_path):
    from psring.sweep import load_sweep, make_config, run_id, varying_keys

    f = tmp_path / "lr.toml"
    f.write_text('[[runs]]\nsync = "none"\n\n[[runs]]\nsync = "none"\nlr = 0.1\n')
    _, runs = load_sweep(f)
    keys = varying_keys(runs)
    ids = [run_id(r, keys) for r in runs]
    assert [make_config(r, tmp_path / i).optim.lr for r, i in zip(runs, ids)] == [0.05, 0.1]
    assert ids == ["sync-none_workers-1_servers-1_lr-0.05", "sync-none_workers-1_servers-1_lr-0.1"]


# --- a failed run is recorded and the sweep goes on ------------------------------------------------

def test_a_failed_run_is_recorded_and_the_others_still_run(jobs):
    r = jobs.result("failing")
    assert r.returncode == 1, r.stdout + r.stderr
    df = read_runs(jobs.failing_out).set_index("run_id")
    assert len(df) == 2
    bad = df[df["sync"] == "ps"].iloc[0]
    good = df[df["sync"] == "none"].iloc[0]
    assert bad["status"] == "failed"
    assert isinstance(bad["error"], str) and bad["error"].strip()
    assert "worker 0" in bad["error"] and "did not answer within" in bad["error"], bad["error"]
    assert pd.isna(bad["samples_per_s"]) and pd.isna(bad["speedup"])
    assert good["status"] == "ok" and good["samples_per_s"] > 0 and good["speedup"] == 1.0
    assert (jobs.failing_out / "runs" / good.name / "summary.json").exists()
    assert f"{bad.name}: FAILED" in r.stdout and f"{good.name}: running" in r.stdout
    assert f"psring: run {bad.name} failed:" in r.stderr
    assert processes_mentioning(str(jobs.failing_out)) == []


# --- bench -----------------------------------------------------------------------------------------------

def test_bench_writes_consistent_figures_and_leaves_nothing_running(jobs):
    r = jobs.result("bench")
    out = jobs.bench_out
    assert r.returncode == 0, r.stdout + r.stderr
    assert processes_mentioning(str(out)) == []

    lines = r.stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("strategy"))
    table = [ln.split() for ln in lines[head + 2:] if ln.strip() and not ln.startswith("efficiency")]
    assert {row[0] for row in table} == {"allreduce", "ps", "raw_allreduce", "raw_zmq_echo"}, r.stdout

    df = pd.read_csv(out / "bench.csv")
    assert len(table) == len(df)
    assert set(df["strategy"]) == {"allreduce", "ps", "raw_allreduce", "raw_zmq_echo"}
    assert sorted(set(df["size_bytes"])) == BENCH_SIZES
    assert (df["workers"] == BENCH_N).all() and (df["iters"] == 3).all()
    # per size: all-reduce and its raw transport once, the PS and its echo at S=1 and S=N
    groups = df.groupby(["strategy", "size_bytes"]).size().to_dict()
    for size in BENCH_SIZES:
        assert groups[("allreduce", size)] == groups[("raw_allreduce", size)] == 1
        assert groups[("ps", size)] == groups[("raw_zmq_echo", size)] == 2
    assert sorted(df[df["strategy"] == "ps"]["servers"].unique()) == [1, BENCH_N]
    assert df[df["strategy"].isin(["allreduce", "raw_allreduce"])]["servers"].isna().all()

    assert (df["time_s"] > 0).all()
    for row in df.to_dict("records"):
        algbw = row["size_bytes"] / row["time_s"] / 1e9
        assert row["algbw_GBps"] == pytest.approx(algbw, rel=1e-9), row
        if row["strategy"] in ("allreduce", "raw_allreduce"):
            factor = 2 * (BENCH_N - 1) / BENCH_N
        else:
            factor = max(1.0, BENCH_N / row["servers"])
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * factor, rel=1e-9), row

    raw_of = {"allreduce": "raw_allreduce", "ps": "raw_zmq_echo"}
    for row in df.to_dict("records"):
        if row["strategy"] in raw_of:
            ref = df[(df["strategy"] == raw_of[row["strategy"]]) & (df["size_bytes"] == row["size_bytes"])]
            if row["strategy"] == "ps":
                ref = ref[ref["servers"] == row["servers"]]
            assert len(ref) == 1, row
            assert row["efficiency"] == pytest.approx(ref["time_s"].iloc[0] / row["time_s"], rel=1e-9), row
        else:
            assert pd.isna(row["efficiency"]), row
