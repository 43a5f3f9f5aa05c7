"""``--epochs E`` instead of ``--steps``: E passes over the training set, each worker over its partition,
so E x the data pipeline's steps per epoch of the global batch N x B (a last partial batch dropped, as
``ShardedBatches`` does). Resolved once by ``TrainConfig.validate`` (the launcher, before any worker
starts; under torchrun every rank, the same way) and written to config.json with the steps it became;
summary.json and runs.csv say both. Bad input is one line (exit 2). Then one real run per strategy, and
one resumed from a checkpoint to more epochs."""
from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from psring import strategies
from psring.cli import build_parser, config_from_args
from psring.config import ConfigError, TrainConfig
from psring.config_checks import epochs_line
from psring.sweep import _setting, flat_config, load_sweep, make_config, run_id, varying_keys
from psring.train.checkpoint import MUST_MATCH, CheckpointError, check_compatible
from psring.train.data import ShardedBatches, SyntheticImages
from psring.train.partition import PARTITIONS


def parse(*args: str, command: str = "train") -> TrainConfig:
    return config_from_args(build_parser().parse_args([command, *args]))


def test_epochs_are_the_data_pipelines_steps_with_the_last_partial_batch_dropped():
    # 250 samples, 2 workers x 32: 3 whole global batches of 64 an epoch, the other 58 samples left out
    cfg = parse("--epochs", "3", "--workers", "2", "-b", "32", "--num-samples", "250")
    assert cfg.steps == 9 and cfg.epochs == 3
    assert epochs_line(cfg) == ("psring: 3 epochs = 9 steps (250 samples, 2 workers x batch 32: 3 steps an "
                                "epoch, 58 samples an epoch left out)")
    whole = parse("--epochs", "2", "--workers", "4", "-b", "8", "--num-samples", "256")
    assert whole.steps == 16 and "left out" not in epochs_line(whole)
    assert parse("--epochs", "1").steps == 10_000 // 32  # the default synthetic set, one worker
    assert parse().steps == 50 and parse().epochs is None  # neither: the default steps


@pytest.mark.parametrize("partition", PARTITIONS)
def test_every_rank_and_the_trainers_batches_agree_on_where_the_epochs_end(partition):
    n, world, b, epochs = 250, 3, 16, 4
    args = ("--epochs", str(epochs), "--workers", str(world), "-b", str(b), "--num-samples", str(n),
            "--partition", partition)
    cfg = parse(*args)
    assert parse(*args, command="worker").steps == cfg.steps  # torchrun: each rank resolves it alike
    data = SyntheticImages(n, 0)
    for rank in range(world):
        batches = ShardedBatches(data, rank, world, b, 0, partition=partition)
        per = [batches.steps_in_epoch(e) for e in range(epochs)]
        assert cfg.steps == sum(per)
        assert batches.epoch_of(cfg.steps - 1) == (epochs - 1, per[-1] - 1)  # the last step ends epoch E
        assert batches.epoch_of(cfg.steps)[0] == epochs
    if partition == "random":  # redrawn shard sizes: the steps of an epoch vary, and the line says so
        assert "steps an epoch, random partition" in epochs_line(cfg)


def test_the_resolved_config_validates_again_unchanged():
    cfg = parse("--epochs", "2", "--workers", "2", "--num-samples", "300")
    d = json.loads(json.dumps(cfg.to_dict()))  # config.json: both epochs and the steps they became
    assert (d["epochs"], d["steps"]) == (2, 8)
    again = TrainConfig.from_dict(d).validate()  # what every worker does with config.json
    assert again == cfg and again.to_dict() == cfg.to_dict()


def one_line_error(*args: str) -> str:
    with pytest.raises(ConfigError) as e:
        parse(*args)
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("args,needle", [
    (["--epochs", "0"], "--epochs must be >= 1, got 0"),
    (["--epochs", "-2"], "--epochs must be >= 1, got -2"),
    (["--epochs", "2", "--steps", "10"], "--steps 10 and --epochs 2 (= 624 steps) disagree: give one of them"),
    (["--epochs", "1", "--dataset", "cifar10", "--data-dir", "/nonexistent"], "CIFAR-10 not found"),
])
def test_bad_epochs_are_one_line(args, needle):
    assert needle in one_line_error(*args)


def test_both_flags_exit_2_in_one_line(psring, tmp_path):
    r = psring.run("train", "--epochs", "1", "--steps", "5", "--out", str(tmp_path / "r"), timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--steps 5 and --epochs 1" in r.stderr and not (tmp_path / "r").exists()


def test_resuming_an_epochs_run_counts_its_steps():
    done = parse("--epochs", "1", "--num-samples", "320").to_dict()  # 10 steps
    ckpt = {"step": 9, "config": {k: done[k] for k in MUST_MATCH}}
    with pytest.raises(CheckpointError, match=r"nothing left of --epochs 1 \(= 10 steps\)$"):
        check_compatible(ckpt, done, "runs/x")
    check_compatible(ckpt, parse("--epochs", "2", "--num-samples", "320").to_dict(), "runs/x")  # 10 more


def test_a_sweep_sets_epochs_and_its_rows_say_the_steps(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('[grid]\nsync = ["none", "allreduce"]\nworkers = [2]\n'
                 '[fixed]\nepochs = 1\nnum_samples = 256\nbatch_size = 32\n')
    _, runs = load_sweep(f)
    cfgs = {r["sync"] + str(r["workers"]): make_config(r, tmp_path / "r") for r in runs}
    assert {k: c.steps for k, c in cfgs.items()} == {"none1": 8, "none2": 4, "allreduce2": 4}
    assert all(flat_config(c)["epochs"] == 1 for c in cfgs.values())  # runs.csv's columns
    plain = [{"sync": "none", "steps": 7}, {"sync": "none"}]  # ids of runs without epochs are unchanged
    assert [run_id(r, varying_keys(plain)) for r in plain] == ["sync-none_workers-1_servers-1_steps-7",
                                                              "sync-none_workers-1_servers-1_steps-50"]
    assert _setting({"epochs": 2}, "steps") is None  # left to validate(), which counts them


SAMPLES, B = 200, 32  # 6 steps an epoch at N=1, 3 at N=2 (8 samples an epoch left out)


def workers_of(sync: str) -> int:
    return 1 if strategies.is_baseline(sync) else 2


def run_args(sync: str, out, epochs: int = 1) -> list[str]:
    # hierarchical: 2 hosts of 1 worker, so its all-reduce across hosts runs (not one host's alone)
    per_host = ["--workers-per-host", "1"] if strategies.get(sync).cost_model == "two_level" else []
    return ["train", "--sync", sync, "--workers", str(workers_of(sync)), *per_host, "--epochs", str(epochs),
            "--num-samples", str(SAMPLES), "-b", str(B), "--model", "cnn", "--no-eval", "--log-every", "100",
            "--out", str(out)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One run of every strategy, all started at once: on 2 cores one run's waits (rendezvous, servers,
    the launcher's polling) overlap the others' work (about 30 s for all, against 45 s one after another).
    The baseline's (N=1, the quickest) checkpoints after step 3 of its 6; once it is done, a copy of it is
    resumed in place with --epochs 2 while the others still run (key ``"resumed"``)."""
    from conftest import Psring

    tmp = tmp_path_factory.mktemp("epochs")
    runner = Psring(tmp)
    base = strategies.baseline_name()
    try:
        procs = {s: runner.start(*run_args(s, tmp / s), *(["--checkpoint-every", "2"] if s == base else []))
                 for s in strategies.names()}
        done = {base: finish(procs.pop(base), tmp / base)}
        if done[base][0] == 0:
            shutil.copytree(tmp / base, tmp / "resumed")
            procs["resumed"] = runner.start(*run_args(base, tmp / "resumed", epochs=2),
                                            "--resume", str(tmp / "resumed"))
        done.update({s: finish(p, tmp / s) for s, p in procs.items()})
        yield done
    finally:
        runner.reap()


def finish(p, out):
    stdout, stderr = p.communicate(timeout=180)
    return p.returncode, stdout, stderr, out


@pytest.mark.parametrize("sync", strategies.names())
def test_one_epoch_of_every_strategy(runs, sync):
    rc, stdout, stderr, out = runs[sync]
    assert rc == 0, stderr
    n = workers_of(sync)
    want = SAMPLES // (B * n)
    assert f"psring: 1 epoch = {want} steps ({SAMPLES} samples, " in stdout, stdout
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["epochs"], summary["steps"], summary["steps_completed"]) == (1, want, want)
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["epochs"], cfg["steps"]) == (1, want)
    steps = pd.read_json(out / "steps.jsonl", lines=True)
    assert steps.groupby("rank")["step"].apply(sorted).to_dict() == {r: list(range(want)) for r in range(n)}
    assert set(steps["epoch"]) == {0}


def test_an_epochs_run_resumes_to_more_epochs(runs):
    """Resumed after step 3 of 1 epoch (6 steps) with --epochs 2: on to step 11, the records whole."""
    assert "resumed" in runs, "the run to resume failed (test_one_epoch_of_every_strategy says why)"
    rc, stdout, stderr, out = runs["resumed"]
    assert rc == 0, stderr
    assert "psring: 2 epochs = 12 steps" in stdout, stdout
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["epochs"], summary["steps"], summary["steps_completed"]) == (2, 12, 12)
    steps = pd.read_json(out / "steps.jsonl", lines=True)
    assert list(steps["step"]) == list(range(12)) and list(steps["epoch"]) == [0] * 6 + [1] * 6
