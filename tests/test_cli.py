"""The command line as a user meets it: bad input gets one line and exit 2; a run leaves its outputs;
`psring compare` prints its table; the loss falls over 120 steps of one process (the strategies' own training:
test_convergence, test_equivalence)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest


@pytest.mark.parametrize("args,needle", [
    (["--sync", "gossip"], "--sync must be one of"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--model", "vgg"], "--model must be one of"),
    (["--dataset", "imagenet"], "--dataset must be one of"),
    (["--sync", "allreduce", "--servers", "2"], "--servers only applies to --sync ps"),
    (["--lr", "-1"], "--lr must be > 0"),
    (["--workers", "4", "--batch-size", "64", "--num-samples", "100"], "exceeds the data set"),
    (["--out", "/proc/psring-cannot-write"], "cannot write to output directory"),
    (["--out", ""], "--out is empty: give a folder"),  # (else the run is written into the working directory)
    (["--steps", "nan"], "argument --steps: invalid int value: 'nan' (psring train --help)"),  # argparse's, one line
    (["--seed", "-1"], "--seed must be in [0, 4294967296)"),  # (else a worker fails on it after the start)
    (["--timeout", "inf"], "--timeout must be a finite number, got inf"),
    (["--lr", "inf"], "--lr must be a finite number"),  # (else the loss is nan from the first step)
    (["--link-rate", "10xbit"], "--link-rate must be a number and a unit"),  # on any --net: not into config.json
    (["--link-delay", "5xs"], "--link-delay must be a time"),
    (["--num-samples", "2000000000"], "of synthetic data need about"),  # (else minutes generating, then out of memory)
    (["--resume", str(Path(__file__).resolve().parents[1] / "README.md")], "not a file torch.save wrote whole"),
])
def test_bad_input_is_one_line_and_exit_2(psring, args, needle):
    r = psring.run("train", *args, timeout=60)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_parsing_the_command_line_imports_neither_torch_nor_pandas():
    """Every sub-command's parser is built for any command (``psring --help``, a flag's typo): that must not pay
    for torch's or pandas' import (about 2 s of CPU on this machine, once per process the suite starts)."""
    import subprocess
    import sys

    code = ("import sys; from psring.cli import build_parser; build_parser().parse_args(['train', '--sync', 'ps']); "
            "print(sorted(m for m in ('torch', 'pandas', 'matplotlib') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr[-2000:])


def test_help_lists_the_users_commands_not_the_ones_psring_starts_itself():
    """``psring bench-worker`` (how ``psring bench`` starts its workers) parses, but ``--help`` lists only the
    commands a user runs: ``worker`` and ``server`` are torchrun's and multi-host runs' own."""
    from psring.cli import INTERNAL, build_parser

    p = build_parser()
    text = p.format_help()
    for name in ("train", "worker", "server", "compare", "sweep", "bench", "simulate", "plot", "calibrate"):
        assert f"    {name} " in text and name in text.splitlines()[1], name
    assert INTERNAL == ("bench-worker",) and "bench-worker" not in text
    assert p.parse_args(["bench-worker", "--spec", "s.json"]).spec == "s.json"


def test_more_servers_than_parameters_fails_naming_the_problem(psring, tmp_path):
    r = psring.run("train", "--sync", "ps", "--servers", "600000", "--steps", "2", "--out", str(tmp_path / "r"))
    assert r.returncode == 2  # refused before anything starts (the cnn has 545,098 parameter elements)
    assert "600000 servers for 545098 parameter elements" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_train_writes_its_outputs(psring, tmp_path):
    out = tmp_path / "run"
    r = psring.run("train", "--sync", "ps", "--workers", "2", "--servers", "2", "--steps", "6",
                   "--batch-size", "8", "--num-samples", "256", "--out", str(out))
    assert r.returncode == 0, r.stderr
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["sync"] == "ps" and cfg["workers"] == 2 and len(cfg["ps_addrs"]) == 2
    steps = pd.read_json(out / "steps.jsonl", lines=True)
    assert len(steps) == 12 and set(steps["rank"]) == {0, 1}
    for col in ("rank", "step", "loss", "step_s", "sync_s", "bytes_sent", "bytes_recv"):
        assert col in steps.columns
    assert (steps["bytes_sent"] > 0).all() and (steps["sync_s"] > 0).all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples_per_s"] > 0 and summary["step_s_p50"] > 0
    assert summary["final_loss"] == pytest.approx(steps[steps.step == 5]["loss"].mean())
    import torch

    assert "fc2.weight" in torch.load(out / "model.pt")


# ps: tests/test_convergence.py (digits to 90% at N=4); allreduce, ddp: test_equivalence, test_compressed
@pytest.mark.parametrize("sync,n", [("none", 1)])
def test_loss_falls_over_120_steps(psring, tmp_path, sync, n):
    out = tmp_path / "run"
    args = ["train", "--sync", sync, "--workers", str(n), "--steps", "120", "--batch-size", "32",
            "--num-samples", "4096", "--out", str(out), "--log-every", "60"]
    r = psring.run(*args, timeout=400)
    assert r.returncode == 0, r.stderr
    loss = pd.read_json(out / "steps.jsonl", lines=True).groupby("step")["loss"].mean()
    first, last = loss.iloc[:15].mean(), loss.iloc[-15:].mean()
    assert last < 0.8 * first, f"{sync}: loss {first:.3f} -> {last:.3f}"


def test_compare_prints_its_table(psring, tmp_path):
    r = psring.run("compare", "--net", "loopback", "--out", str(tmp_path / "cmp"), "--steps", "8", timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("strategy"))
    rows = [ln.split() for ln in lines[head + 2:head + 5]]
    assert [row[0] for row in rows] == ["none", "allreduce", "ps"]
    assert [row[1] for row in rows] == ["1", "2", "2"]
    assert rows[0][4] == "1.00x"
    assert all(float(row[3]) > 0 for row in rows)
