"""Correct before fast: every synchronizer must end where single-process training on the global batch
ends. Small CNN (no BatchNorm), 5 steps, same seed; `none` at N=1 with batch N*B is the reference."""
from __future__ import annotations

import pytest
import torch

B, STEPS = 16, 5
TOL = 1e-5


def train_args(out, sync, n, s=1, batch=B, extra=()):
    args = ["train", "--sync", sync, "--workers", str(n), "--model", "cnn", "--batch-size", str(batch),
            "--steps", str(STEPS), "--seed", "3", "--num-samples", "512", "--lr", "0.05", "--out", str(out)]
    return args + (["--servers", str(s)] if sync == "ps" else []) + list(extra)


def max_rel_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-12)).item() for k in a)


SMALL_BUCKETS = ("--bucket-mb", "0.1", "--first-bucket-mb", "0.01")  # many buckets, launched mid-backward


CASES = [
    # (ps 2x2 and allreduce at N=3 with default buckets: their variants below cover them)
    ("ps", 2, 1, ()), ("allreduce", 2, 1, ()), ("ddp", 2, 1, ()), ("ps", 3, 2, ()),
    ("allreduce", 3, 1, SMALL_BUCKETS), ("ps", 3, 2, SMALL_BUCKETS),
    ("allreduce", 2, 1, ("--no-overlap",)), ("ps", 2, 2, ("--no-overlap",)),
    ("ps", 2, 2, ("--frame-kb", "4")),  # every large tensor split over many frames
]
CREDITS = ("--ps-credit-mb", "0.05")  # the PS's priority scheduler, on its own thread (sync/ps/comm.py)
FULL = ("--overlap", "full")  # the next forward waits per module for its own buckets/chunks (sync.overlap)
FULL_CASES = [
    ("allreduce", 2, 1, SMALL_BUCKETS + FULL + ("--trace",)), ("allreduce", 3, 1, SMALL_BUCKETS + FULL),
    ("ring", 2, 1, SMALL_BUCKETS + FULL), ("ring", 3, 1, SMALL_BUCKETS + FULL),
    ("hierarchical", 4, 1, SMALL_BUCKETS + FULL + ("--workers-per-host", "2")),
    ("ps", 2, 2, SMALL_BUCKETS + FULL + ("--trace",)), ("ps", 3, 2, SMALL_BUCKETS + FULL + CREDITS),
    ("ps", 2, 2, SMALL_BUCKETS + FULL + ("--ps-design", "aggregate")),
    ("ps", 3, 2, SMALL_BUCKETS + FULL + CREDITS + ("--ps-design", "aggregate")),
    ("ps", 3, 2, SMALL_BUCKETS + CREDITS),  # the priority scheduler with --overlap backward
    # the planned push order (--ps-order planned: sync/ps/transport.push_order) from step 2 on, on the link the
    # probe measured (S = N: credits)
    ("ps", 3, 3, SMALL_BUCKETS + FULL + ("--link-tuning", "probe", "--ps-order", "planned")),
]
PROBE = ("--link-tuning", "probe")  # partitions, chunks and credits cut to the link measured at start
PROBE_CASES = [("allreduce", 3, 1, FULL + PROBE), ("ring", 2, 1, PROBE), ("ps", 3, 2, FULL + PROBE),
               ("ps", 2, 2, PROBE + ("--ps-design", "aggregate"))]
CASES += FULL_CASES + PROBE_CASES


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every case's run, three at a time (each is mostly starting processes and waiting for peers):
    {case: (CompletedProcess, its out dir)}."""
    from conftest import Psring, run_concurrently

    tmp = tmp_path_factory.mktemp("equivalence")
    runner = Psring(tmp)
    outs = {c: tmp / f"run{i}" for i, c in enumerate(CASES)}
    try:
        done = run_concurrently(runner, {c: train_args(outs[c], *c[:3], extra=c[3]) for c in CASES}, at_once=3)
        yield {c: (done[c], outs[c]) for c in CASES}
    finally:
        runner.reap()


@pytest.mark.parametrize("sync,n,s,extra", CASES)
def test_matches_single_process_on_global_batch(runs, reference, sync, n, s, extra):
    r, out = runs[(sync, n, s, extra)]
    assert r.returncode == 0, r.stderr
    got = torch.load(out / "model.pt")
    ref = reference(n)
    diff = max_rel_diff(got, ref)
    assert diff <= TOL, f"{sync} N={n} S={s}: max relative difference {diff:.2e} > {TOL}"
    # and the run really trained: parameters moved away from the initial ones
    from psring.train.models import build_model

    init = build_model("cnn", 3).state_dict()
    assert max_rel_diff(got, init) > 1e-3


@pytest.mark.parametrize("sync,n,s,extra", [c for c in FULL_CASES if "--trace" in c[3]])
def test_full_overlap_records_every_steps_traffic(runs, sync, n, s, extra):
    """With --overlap full a step's communication finishes in the next step's forward; its record still
    carries its own bytes and messages (written once drained), and the forward's waits as gate_s."""
    import json

    r, out = runs[(sync, n, s, extra)]
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert sorted((x["rank"], x["step"]) for x in recs) == [(k, t) for k in range(n) for t in range(STEPS)]
    assert len({x["bytes_sent"] for x in recs if x["rank"] == 0}) == 1 and recs[0]["bytes_sent"] > 0
    assert all(x["messages"] and "gate_s" in x and x["gate_s"] >= 0 and x["sync_s"] >= 0 for x in recs)


@pytest.mark.parametrize("sync,n,s,extra", PROBE_CASES)
def test_probed_runs_record_the_link_they_measured_and_what_they_cut(runs, sync, n, s, extra):
    import json

    r, out = runs[(sync, n, s, extra)]
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["link_tuning"] == "probe" and summary["probe_rate_Bps"] > 0 and summary["probe_fixed_ms"] > 0
    cut = summary["chunk_bytes"] if sync == "ps" else summary["partition_bytes"]
    assert 0 < cut <= 25 << 20
