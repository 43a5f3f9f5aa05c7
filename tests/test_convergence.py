"""Accuracy on real images: BSP ``ps`` (the server-optimizer design) learns scikit-learn's handwritten digits to at
least 90% held-out accuracy at N=4 within 5 epochs (the aggregate design and ``allreduce``: the comments below)."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("sklearn", reason="the digits data set needs scikit-learn (pip install 'psring[digits]')")

EPOCHS, N, B = 5, 4, 16
STEPS = EPOCHS * (1438 // (N * B))  # 1,438 training images; drop_last


# (the aggregate design is the all-reduce's optimizer on the PS's sums: test_equivalence and
# test_ps_semantics check it equals single-process training, so its convergence is all-reduce's)
# (allreduce's convergence: results/compression_precision, 16 seeds; its arithmetic: test_equivalence)
@pytest.mark.parametrize("extra", [["--sync", "ps", "--servers", "2", "--ps-design", "server-optimizer"]],
                         ids=["ps-server-optimizer"])
def test_digits_reach_90_percent_at_n4(psring, tmp_path, extra):
    out = tmp_path / "run"
    r = psring.run("train", *extra, "--workers", str(N), "--dataset", "digits", "--model", "cnn",
                   "--batch-size", str(B), "--steps", str(STEPS), "--log-every", "1000", "--out", str(out),
                   timeout=280)
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["epochs_evaluated"] == EPOCHS
    assert s["final_test_acc"] >= 0.90, s["final_test_acc"]
    accs = [json.loads(line)["test_acc"] for line in (out / "steps.jsonl").read_text().splitlines()
            if json.loads(line)["rank"] == 0 and json.loads(line)["test_acc"] is not None]
    assert len(accs) == EPOCHS and accs[0] < accs[-1], accs  # it learned, epoch over epoch
