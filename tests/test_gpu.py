"""The GPU path, run where CUDA is (issue #28): NCCL when every worker has a GPU, tensors kept on the
device, the PS's device-to-host copies through pinned memory. Without CUDA every test here is collected
and skipped with the reason; ``benchmarks/gpu.sh`` runs them on a lent accelerator.

What one GPU allows (NCCL refuses two ranks on one device):
- NCCL at N = 1: allreduce, ring, ddp (``--backend auto`` must pick NCCL: every worker has a GPU);
- N = 2 through gloo (``--backend gloo``) with CUDA tensors: allreduce, ring, hierarchical (xfail while
  psring puts both ranks on the CPU there: ``GLOO_ON_CPU``);
- the PS at N = 2, both designs: pushes leave the GPU through pinned host buffers (rank 0's today: rank 1
  is given device index 1, which a one-GPU machine lacks, so it computes on the CPU);
- ``--overlap full`` on the device (reduce family and PS), and real compute's phase timings.

Every case runs twice, on the GPU and with the GPU hidden (``CUDA_VISIBLE_DEVICES=""``: the same flags,
psring then picks gloo on the CPU), and the two final models must agree to 1e-5 relative on the small CNN
(test_equivalence's measure). GPU runs have TF32 off (``NVIDIA_TF32_OVERRIDE=0``): cuDNN's default TF32
convolutions round to 10 mantissa bits, 1e-3 away from the CPU's float32 before any bug does.

Which device a run used is read from rank 0's ``model.pt``: the trainer saves the state_dict from the
device it trained on, and for the reduce family only the NCCL branch of ``init_process_group`` hands out
a CUDA device, so a CUDA ``model.pt`` under ``--backend auto`` means NCCL. The other ranks' devices
are not recorded anywhere a test can read.
"""
from __future__ import annotations

import json

import pytest
import torch
from test_equivalence import SMALL_BUCKETS, STEPS, TOL, max_rel_diff, train_args
from test_measurement import PHASES, close, records

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available: GPU tests run on a "
                       "machine with a GPU (benchmarks/gpu.sh)"),
    pytest.mark.timeout(600),  # the module's runs (22 short trainings) start in the first test's set-up
]

FULL = ("--overlap", "full")
GLOO = ("--backend", "gloo")  # flags of the GPU run only: the CPU run of a case keeps psring's default
# name: (sync, N, S, flags of both runs, flags of the GPU run alone)
CASES = {
    "allreduce-nccl": ("allreduce", 1, 1, (), ()),
    "ring-nccl": ("ring", 1, 1, (), ()),
    "ddp-nccl": ("ddp", 1, 1, (), ()),
    "allreduce-nccl-full": ("allreduce", 1, 1, SMALL_BUCKETS + FULL, ()),
    "allreduce-gloo": ("allreduce", 2, 1, (), GLOO),
    "ring-gloo": ("ring", 2, 1, (), GLOO),
    # one host of two: a reduce-scatter and an all-gather inside it
    "hierarchical-gloo": ("hierarchical", 2, 1, ("--workers-per-host", "2"), GLOO),
    "ring-gloo-full": ("ring", 2, 1, SMALL_BUCKETS + FULL, GLOO),
    "ps-server-optimizer": ("ps", 2, 2, ("--ps-design", "server-optimizer"), ()),
    "ps-aggregate": ("ps", 2, 2, ("--ps-design", "aggregate"), ()),
    "ps-aggregate-full": ("ps", 2, 2, SMALL_BUCKETS + FULL + ("--ps-design", "aggregate"), ()),
}
GLOO_CASES = [name for name, case in CASES.items() if GLOO == case[4]]
FULL_CASES = [name for name, case in CASES.items() if "full" in case[3]]
# the environment of each batch: GPU runs in full float32, CPU runs with no GPU to see
ENV = {"gpu": {"NVIDIA_TF32_OVERRIDE": "0"}, "cpu": {"CUDA_VISIBLE_DEVICES": ""}}
# What psring does today with two workers on one GPU (psring/sync/process_group.py): the launcher gives
# rank r device index r, local_device() finds no GPU r on a one-GPU machine and returns the CPU, and the
# gloo branch of init_process_group returns the CPU for every rank anyway.
GLOO_ON_CPU = ("psring keeps gloo workers on the CPU (issue #28): process_group.init_process_group's gloo "
               "branch returns the CPU device, and local_device(r) falls back to the CPU past the GPU count")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{(where, name): (CompletedProcess, out dir)} for where in gpu, cpu: every case's GPU run, four
    at a time, then its CPU run (the environment of a batch is that of the processes it starts)."""
    from conftest import Psring, run_concurrently

    tmp = tmp_path_factory.mktemp("gpu")
    runner = Psring(tmp)
    done = {}
    try:
        for where, env in ENV.items():
            outs = {name: tmp / f"{where}-{name}" for name in CASES}
            jobs = {name: train_args(outs[name], sync, n, s, extra=both + (own if where == "gpu" else ()))
                    for name, (sync, n, s, both, own) in CASES.items()}
            with pytest.MonkeyPatch.context() as mp:
                for k, v in env.items():
                    mp.setenv(k, v)
                got = run_concurrently(runner, jobs, at_once=4, timeout=280)
            done.update({(where, name): (got[name], outs[name]) for name in CASES})
        yield done
    finally:
        runner.reap()


def final_model(runs, where: str, name: str) -> dict:
    """Rank 0's final state_dict, tensors where the run left them (a GPU run's on the GPU)."""
    r, out = runs[where, name]
    assert r.returncode == 0, f"{where} run of {name} failed:\n{r.stderr[-3000:]}"
    return torch.load(out / "model.pt")


@pytest.mark.parametrize("name", CASES)
def test_gpu_run_matches_the_cpu_run(runs, name):
    gpu = {k: v.cpu() for k, v in final_model(runs, "gpu", name).items()}
    cpu = final_model(runs, "cpu", name)
    diff = max_rel_diff(gpu, cpu)
    assert diff <= TOL, f"{name}: GPU and CPU runs differ by {diff:.2e} relative > {TOL}"
    from psring.train.models import build_model

    assert max_rel_diff(cpu, build_model("cnn", 3).state_dict()) > 1e-3  # both really trained


@pytest.mark.parametrize("name", CASES)
def test_rank0_trained_on_the_gpu(runs, name):
    """NCCL cases: auto chose NCCL (the only branch giving a CUDA device); PS cases: rank 0's pushes went
    through the pinned device-to-host copies; gloo cases: the tensors stayed on the GPU."""
    devices = {str(t.device) for t in final_model(runs, "gpu", name).values()}
    if name in GLOO_CASES and devices == {"cpu"}:
        pytest.xfail(GLOO_ON_CPU)
    assert devices == {"cuda:0"}, f"{name}: rank 0 trained on {devices}, not the GPU"


def test_real_compute_timings_recorded(runs):
    """Phases timed with the device synchronized at every reading: real forward and backward times, and
    the phases add up to the step (test_measurement's rule, 5% or 1 ms)."""
    r, out = runs["gpu", "allreduce-nccl"]
    assert r.returncode == 0, r.stderr[-3000:]
    recs = records(out)
    assert len(recs) == STEPS and all(rec["forward_s"] > 0 and rec["backward_s"] > 0 for rec in recs)
    for rec in recs:
        assert all(rec[ph] >= 0 for ph in PHASES), rec
        assert close(sum(rec[ph] for ph in PHASES), rec["step_s"]), rec
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step_s_p50"] > 0 and summary["samples_per_s"] > 0


@pytest.mark.parametrize("name", FULL_CASES)
def test_full_overlap_records_every_step(runs, name):
    """With --overlap full a step's communication ends in the next forward: every rank still records
    every step, with forward's waits as gate_s."""
    n = CASES[name][1]
    r, out = runs["gpu", name]
    assert r.returncode == 0, r.stderr[-3000:]
    recs = records(out)
    assert sorted((x["rank"], x["step"]) for x in recs) == [(k, t) for k in range(n) for t in range(STEPS)]
    assert all(x["gate_s"] >= 0 and x["sync_s"] >= 0 for x in recs)
    if n > 1:
        assert all(x["bytes_sent"] > 0 for x in recs)
