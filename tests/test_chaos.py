"""Chaos: a BSP run with checkpoints and --max-restarts survives a random worker or server SIGKILLed
three times (psring.launch.chaos), restarts from its checkpoints, and ends with the parameters of a run
that was never interrupted (<= 1e-6 relative) and one record per worker per step."""
from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import torch

from conftest import processes_mentioning
from psring.launch.chaos import Chaos

KILLS, STEPS = 3, 24


def args(sync: str, out) -> list[str]:
    extra = ["--servers", "2"] if sync == "ps" else []
    return ["train", "--sync", sync, *extra, "--workers", "2", "--model", "cnn", "--batch-size", "8",
            "--num-samples", "256", "--steps", str(STEPS), "--no-eval", "--log-every", "1000", "--out", str(out)]


def relative_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).norm() / max(a[k].double().norm(), 1e-30)) for k in a)


@pytest.mark.parametrize("sync", ["ps"])  # (the launcher restarts every strategy alike; ps has the most to restore)
def test_random_kills_are_survived_with_the_uninterrupted_parameters(psring, tmp_path, sync):
    ref = psring.start(*args(sync, tmp_path / "ref"))  # alongside: most of a run is starting processes
    # the straggler only sleeps (the numbers stay the same): it keeps the run long enough for the kills
    out = tmp_path / "chaos"
    p = psring.start(*args(sync, out), "--checkpoint-every", "3", "--max-restarts", str(KILLS),
                     "--straggler", "1:8")
    chaos = Chaos(p.pid, out, workers=2, kills=KILLS, seed=len(sync), max_delay_s=0.3, timeout_s=150)
    chaos.start()
    try:
        _, err = p.communicate(timeout=180)
    finally:
        chaos.stop()
    _, ref_err = ref.communicate(timeout=120)
    assert ref.returncode == 0, ref_err
    assert len(chaos.kills_done) == KILLS, f"only {chaos.kills_done} killed before the run ended\n{err}"
    assert p.returncode == 0, err
    restarts = re.findall(r"^psring: restart (\d+)/3 from the checkpoint after step (\d+) \((\d+) steps? to run "
                          r"again\): (worker|server) \d+ \(pid (\d+)\) failed: killed by SIGKILL", err, re.M)
    assert [int(r[0]) for r in restarts] == [1, 2, 3], err
    assert [int(r[4]) for r in restarts] == [pid for _, pid in chaos.kills_done], err

    summary = json.loads((out / "summary.json").read_text())
    assert summary["restarts"] == KILLS and summary["steps_completed"] == STEPS
    assert summary["steps_recomputed"] == sum(int(r[2]) for r in restarts)
    records = Counter((r["rank"], r["step"]) for r in map(json.loads, (out / "steps.jsonl").read_text().splitlines()))
    assert records == Counter({(r, s): 1 for r in range(2) for s in range(STEPS)})

    a = torch.load(tmp_path / "ref" / "model.pt", weights_only=True)
    b = torch.load(out / "model.pt", weights_only=True)
    assert relative_difference(a, b) <= 1e-6
    assert not list(out.rglob("*.tmp*"))
    assert processes_mentioning(str(out)) == []
