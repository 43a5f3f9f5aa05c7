"""Checkpoint and resume: a BSP run killed after its step-7 checkpoint and resumed from it reaches the
same parameters at step 12 as an uninterrupted run (within 1e-6), for ps (the reduce family: test_compressed); the
launcher says where the last checkpoint is when a run fails; a missing checkpoint is a one-line error."""
from __future__ import annotations

import os
import signal

import pytest
import torch

from conftest import pids_of, processes_mentioning, wait_for
from psring.train.checkpoint import last_step

STEPS, EVERY = 12, 8  # the killed run checkpoints after steps 7, 15, ...


def common(sync: str) -> list[str]:
    extra = ["--servers", "2"] if sync == "ps" else []
    return ["train", "--sync", sync, *extra, "--workers", "2", "--model", "cnn", "--batch-size", "16",
            "--num-samples", "1024", "--log-every", "1000", "--optimizer", "sgd", "--augment"]


@pytest.mark.parametrize("sync", ["ps"])  # (the reducer family: test_compressed resumes ring and allreduce runs)
def test_killed_run_resumed_from_checkpoint_matches_uninterrupted(psring, tmp_path, sync):
    full = tmp_path / "full"
    r = psring.run(*common(sync), "--steps", str(STEPS), "--out", str(full), timeout=240)
    assert r.returncode == 0, r.stderr

    # the same run, far longer, SIGKILLed right after its step-7 checkpoint; a straggler (sleeps only,
    # the numbers are unchanged) keeps it from reaching the next checkpoint before the kill lands
    killed = tmp_path / "killed"
    p = psring.start(*common(sync), "--steps", "100000", "--checkpoint-every", str(EVERY), "--straggler", "1:4",
                     "--out", str(killed))
    wait_for(lambda: (last_step(killed) or -1) >= 7, 240, "the checkpoint after step 7")
    os.kill(p.pid, signal.SIGKILL)
    p.wait(10)
    wait_for(lambda: processes_mentioning(str(killed)) == [], 15, "the run's processes to die")
    step = last_step(killed)
    assert step == 7, f"the kill came too late: checkpoint after step {step}"

    resumed = tmp_path / "resumed"
    r = psring.run(*common(sync), "--steps", str(STEPS), "--resume", str(killed), "--out", str(resumed),
                   timeout=240)
    assert r.returncode == 0, r.stderr
    a = torch.load(full / "model.pt", weights_only=True)
    b = torch.load(resumed / "model.pt", weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6, msg=lambda m, k=k: f"{k} (resumed after step {step}): {m}")


def test_failed_run_names_its_last_checkpoint(psring, tmp_path):
    out = tmp_path / "run"
    p = psring.start(*common("allreduce"), "--steps", "100000", "--checkpoint-every", "2", "--out", str(out))
    wait_for(lambda: last_step(out) is not None, 240, "a checkpoint")
    victim = pids_of(out, "worker", 1)[0]
    os.kill(victim, signal.SIGKILL)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 1 and "last checkpoint after step" in err and f"--resume {out}" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_resume_without_checkpoint_is_one_line_exit_2(psring, tmp_path):
    r = psring.run(*common("allreduce"), "--steps", "5", "--resume", str(tmp_path), "--out", str(tmp_path / "x"),
                   timeout=60)
    assert r.returncode == 2 and "no checkpoint in" in r.stderr and len(r.stderr.strip().splitlines()) == 1
