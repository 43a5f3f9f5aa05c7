"""results/gpu (benchmarks/gpu.sh on a lent GPU) is what its own files say: every GPU test passed or
xfailed, every step-time run finished, and the README's table is the CSV's."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd

GPU = Path(__file__).resolve().parents[1] / "results" / "gpu"


def test_every_gpu_test_passed_or_xfailed():
    cases = list(ET.parse(GPU / "tests.xml").getroot().iter("testcase"))
    assert len(cases) >= 20
    bad = [c.get("name") for c in cases for e in c
           if e.tag in ("failure", "error") or (e.tag == "skipped" and e.get("type") != "pytest.xfail")]
    assert not bad, f"GPU tests that did not pass: {bad}"


def test_every_step_run_finished_on_the_gpu_it_names():
    runs = pd.read_csv(GPU / "steps" / "runs.csv")
    assert len(runs) == 14 and (runs["status"] == "ok").all()
    assert set(runs["sync"]) == {"none", "allreduce", "ring", "ddp", "ps"}
    env = (GPU / "environment.txt").read_text()
    assert "H200" in env and "NCCL" in env


def test_readme_table_is_the_csv():
    runs = pd.read_csv(GPU / "steps" / "runs.csv")
    readme = (GPU / "README.md").read_text()
    for r in runs.itertuples():
        row = f"| {r.model} | {r.sync} | {r.workers} |"
        line = next(ln for ln in readme.splitlines() if ln.startswith(row) and f"{r.step_s_p50:.4g}" in ln)
        assert f"{r.samples_per_s:.4g}" in line
