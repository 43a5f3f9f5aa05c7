"""``psring simulate``'s bad input: an --out that holds a run it must not replace (an unfinished psring train
run with a checkpoint, one in use by a running launcher, a finished one), that is a file or cannot be made,
rates of zero, a link delay, ``--from`` a folder that holds no run. Each is one line, exit 2, with nothing
written and what was there byte for byte as it was."""
from __future__ import annotations

import dataclasses
import fcntl
import json
import os
from pathlib import Path

import pytest

from psring.config import ConfigError, TrainConfig
from psring.simulate.checks import check, check_rate

RESULTS = Path(__file__).resolve().parent.parent / "results"
TINY = ["simulate", "--model", "cnn", "--steps", "3", "--warmup", "1", "--batch-size", "8", "--workers", "2",
        "--compute", "emulated:20"]


def files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too) and its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line_exit_2(r, needle: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("psring: error: "), r.stderr
    assert needle in lines[0] and "Traceback" not in r.stderr, r.stderr


@pytest.fixture
def unfinished(tmp_path) -> Path:
    """What ``psring train`` leaves when stopped after a checkpoint: config, records, checkpoint, no summary."""
    import torch

    run = tmp_path / "unfinished"
    (run / "checkpoint").mkdir(parents=True)
    (run / "ranks").mkdir()
    torch.save({"step": 4, "model": {}, "sync": {}, "config": {}}, run / "checkpoint" / "checkpoint.pt")
    (run / "config.json").write_text('{"sync": "ring", "workers": 4}\n')
    (run / "steps.jsonl").write_text('{"step": 0, "rank": 0}\n')
    (run / "ranks" / "rank3.jsonl").write_text('{"step": 0, "rank": 3}\n')
    return run


def test_an_unfinished_train_run_with_a_checkpoint_is_refused_and_kept(psring, unfinished):
    before = files(unfinished)
    r = psring.run(*TINY, "--out", str(unfinished), timeout=60)
    one_line_exit_2(r, "checkpoint after step 4")
    assert "--resume" in r.stderr and files(unfinished) == before


def test_overwrite_replaces_it_whole_no_checkpoint_or_rank_of_it_left(psring, unfinished):
    r = psring.run(*TINY, "--out", str(unfinished), "--overwrite", timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(files(unfinished)) == ["config.json", "ranks/rank0.jsonl", "ranks/rank1.jsonl", "steps.jsonl",
                                         "summary.json"]
    assert json.loads((unfinished / "summary.json").read_text())["simulated"] is True
    ranks = {json.loads(line)["rank"] for line in (unfinished / "steps.jsonl").read_text().splitlines()}
    assert ranks == {0, 1}  # the old run's rank3 is not merged into the replay's steps


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_a_folder_in_use_by_a_running_launcher_is_refused_whatever_the_flags(psring, tmp_path, overwrite):
    out = tmp_path / "busy"
    out.mkdir()
    fd = os.open(out / ".psring.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"4242\n")
        fcntl.flock(fd, fcntl.LOCK_EX)  # as launch.outdir.RunLock holds it
        before = files(out)
        r = psring.run(*TINY, "--out", str(out), *overwrite, timeout=60)
    finally:
        os.close(fd)
    one_line_exit_2(r, "in use by a running psring train (launcher pid 4242)")
    assert files(out) == before


def test_a_finished_run_is_still_refused(psring, tmp_path):
    out = tmp_path / "done"
    out.mkdir()
    (out / "summary.json").write_text('{"steps_completed": 9}\n')
    (out / "steps.jsonl").write_text("measured\n")
    before = files(out)
    one_line_exit_2(psring.run(*TINY, "--out", str(out), timeout=60), "holds a finished run")
    assert files(out) == before


@pytest.mark.parametrize("where, needle", [("afile", "a file is in the way"), ("afile/below", "--out"),
                                           ("/proc/psring-x", "cannot make the folder"), ("", "--out is empty")])
def test_an_out_that_is_a_file_or_cannot_be_made_is_one_line(psring, tmp_path, where, needle):
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    out = where if where.startswith("/") or not where else str(tmp_path / where)
    one_line_exit_2(psring.run(*TINY, f"--out={out}", timeout=60), needle)
    assert afile.read_text() == "mine\n" and sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.parametrize("flags, needle", [(["--link-rate", "0mbit"], "--link-rate"),
                                           (["--link-rate=-5mbit"], "--link-rate"),
                                           (["--link-rate", "1e999gbit"], "--link-rate"),
                                           (["--sync", "ps", "--server-link-rate", "0mbit"], "--server-link-rate"),
                                           (["--link-delay", "bogus"], "--link-delay"),
                                           (["--link-delay", "5ms"], "--link-delay")])
def test_a_rate_of_zero_or_a_link_delay_is_one_line_before_anything_is_written(psring, tmp_path, flags, needle):
    one_line_exit_2(psring.run(*TINY, *flags, "--out", str(tmp_path / "r"), timeout=60), needle)
    assert not (tmp_path / "r").exists()


def test_the_replays_own_checks_refuse_zero_and_endless_rates_and_any_delay():
    """The replay's checks (``--from``'s configs and ``psring sweep``'s replays pass through them too)."""
    for rate in ("0mbit", "0GB/s", "1e400gbit", 0, float("nan"), -1.0, "fast"):
        with pytest.raises(ConfigError, match="--server-link-rate"):
            check_rate("--server-link-rate", rate)
    check_rate("--link-rate", "1gbit")
    check_rate("--server-link-rate", None)  # unset: the workers' rate
    cfg = TrainConfig(model="cnn", workers=2, compute="emulated:20", net="emulated", link_rate="1gbit")
    assert check(cfg) == pytest.approx(0.02)
    for delay in ("5ms", "bogus"):
        cfg.link_delay = delay
        with pytest.raises(ConfigError, match="does not replay --link-delay"):
            check(cfg)
    cfg.link_delay = None
    for field, flag, value in (("resume", "--resume", "runs/earlier"), ("checkpoint_every", "--checkpoint-every", 5)):
        with pytest.raises(ConfigError, match=f"neither resumes nor writes checkpoints \\(got {flag} {value}\\)"):
            check(dataclasses.replace(cfg, **{field: value}))


def test_a_run_that_resumed_and_checkpointed_is_replayed_from_step_0(tmp_path, capsys):
    """``--from`` a run whose config has ``--resume`` and ``--checkpoint-every``: replayed (from step 0, writing
    no checkpoint), not refused for flags its user never gave psring simulate."""
    import shutil

    from psring import cli

    src = RESULTS / "bandwidth" / "runs" / "sync-allreduce_workers-4_servers-1_link_rate-100mbit"
    run = tmp_path / "res" / "runs" / src.name
    run.mkdir(parents=True)
    shutil.copy(RESULTS / "bandwidth" / "calibration.json", tmp_path / "res")
    shutil.copy(src / "summary.json", run)
    cfg = json.loads((src / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**cfg, "resume": str(run), "checkpoint_every": 2}))
    assert cli.main(["simulate", "--from", str(run), "--out", str(tmp_path / "r")]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["steps_completed"] == cfg["steps"]
    assert not (tmp_path / "r" / "checkpoint").exists()


@pytest.mark.parametrize("what, needle", [("empty", "holds no run (no config.json"), ("missing", "no such folder"),
                                          ("afile", "a file, not a folder"), ("", "--from is empty")])
def test_from_a_folder_that_holds_no_run_says_so(psring, tmp_path, what, needle):
    (tmp_path / "empty").mkdir()
    (tmp_path / "afile").write_text("x\n")
    src = str(tmp_path / what) if what else ""
    one_line_exit_2(psring.run(*TINY, f"--from={src}", "--out", str(tmp_path / "r"), timeout=60), needle)
    assert not (tmp_path / "r").exists() and files(tmp_path / "empty") == {}


def test_a_replay_refused_in_the_folder_it_made_leaves_none_and_a_write_error_is_one_line(tmp_path):
    """``write_replay``: the folder it made for a replay that fails (a check only the replay makes, a full disk)
    is gone again, and an output file that cannot be written is a ConfigError (one line), not a traceback."""
    from psring.fileio import WriteError
    from psring.simulate.cli import write_replay

    def refused():
        raise ConfigError("the replay's own check")

    def disk_full():
        raise WriteError("no space left on device writing x/summary.json")

    for replay, needle in ((refused, "own check"), (disk_full, "no space left")):
        with pytest.raises(ConfigError, match=needle):
            write_replay(tmp_path / "new", replay)
        assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    with pytest.raises(ConfigError):
        write_replay(kept, refused)
    assert kept.is_dir()  # the user's (empty) folder stays
