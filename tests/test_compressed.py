"""``--compress`` through ``psring train`` for the all-reduce family (N=2, the small CNN): fp16/bf16
against uncompressed training, the sparse and 1-bit codecs and PowerSGD converge, ``bytes_sent`` per
step is the codec's formula, and checkpointed top-k and PowerSGD runs with error feedback resume bit for
bit."""
from __future__ import annotations

import json

import pytest
import torch

from psring.compress import parse
from psring.sync.buckets import flat_layout, param_ranges
from psring.train.models import build_model

N, B, STEPS = 2, 16, 5
BUCKETS = ("--bucket-mb", "0.1", "--first-bucket-mb", "0.01")  # several buckets, so the sum is per bucket
# fp16 and bf16 round each gradient once (relative 2^-11 and 2^-8, half an ulp) and the sum once more;
# 5 updates move a parameter by about lr * (sum of gradients), so its error is a few 2^-p of that move,
# a small fraction of the parameter's largest magnitude. Measured max relative differences after 5
# steps: 2.6e-4 (fp16) and 1.4e-3 (bf16); the tolerances leave 4-7x room and stay far below what a
# wrong sum (a factor N, a missing bucket: > 1e-1) gives.
TOLERANCE = {"fp16": 1e-3, "bf16": 1e-2}


def train_args(out, sync, compress=None, steps=STEPS, extra=()):
    args = ["train", "--sync", sync, "--workers", str(N), "--model", "cnn", "--batch-size", str(B), "--steps",
            str(steps), "--seed", "3", "--num-samples", "512", "--lr", "0.05", "--out", str(out), *BUCKETS]
    return args + (["--compress", compress] if compress else []) + list(extra)


def max_rel_diff(a: dict, b: dict) -> float:
    return max(((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-12)).item() for k in a)


def records(run) -> list[dict]:
    return [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines() if line.strip()]


def bucket_numels() -> list[int]:
    layout = flat_layout(build_model("cnn", 0).named_parameters())
    return [r.end - r.start for r in param_ranges(layout, int(0.1 * 2**20), int(0.01 * 2**20))]


def expected_bytes(spec: str) -> int:
    """Per worker and step: dense, a ring all-reduce of 2-byte elements (2(N-1)/N * M); sparse and 1-bit,
    an all-gather of N-1 encodings."""
    c = parse(spec)
    if c.dense:
        return sum(2 * (N - 1) * 2 * n // N for n in bucket_numels())
    return sum((N - 1) * c.wire_bytes(n) for n in bucket_numels())


@pytest.fixture(scope="module")
def uncompressed(tmp_path_factory):
    from conftest import Psring

    tmp = tmp_path_factory.mktemp("plain")
    runner = Psring(tmp)
    try:
        r = runner.run(*train_args(tmp / "run", "allreduce"))
        assert r.returncode == 0, r.stderr
        return torch.load(tmp / "run" / "model.pt")
    finally:
        runner.reap()


@pytest.mark.parametrize("sync,codec", [("allreduce", "fp16"), ("ring", "bf16")])  # one path per codec and reducer
def test_low_precision_matches_uncompressed_and_counts_its_bytes(psring, tmp_path, uncompressed, sync, codec):
    run = tmp_path / "run"
    r = psring.run(*train_args(run, sync, codec))
    assert r.returncode == 0, r.stderr
    diff = max_rel_diff(torch.load(run / "model.pt"), uncompressed)
    assert 0 < diff <= TOLERANCE[codec], f"{sync} {codec}: max relative difference {diff:.2e}"
    for rec in records(run):
        assert rec["bytes_sent"] == rec["bytes_recv"] == expected_bytes(codec), rec


@pytest.mark.parametrize("sync,codec,extra", [
    ("ring", "topk:0.1", ()), ("allreduce", "randomk:0.1", ("--lr", "0.02")),  # (allreduce's topk: randomk's path)  # at 0.05 its delayed residuals diverge
    ("allreduce", "onebit", ("--no-error-feedback",)),  # (ring's onebit: the same all-gather as its topk)
])
def test_sparse_and_onebit_train_and_count_their_bytes(psring, tmp_path, sync, codec, extra):
    run = tmp_path / "run"
    args = train_args(run, sync, codec, steps=30, extra=("--dataset", "digits", "--no-eval", *extra))
    args[args.index("--num-samples"):args.index("--num-samples") + 2] = []  # the whole digits set
    r = psring.run(*args)
    assert r.returncode == 0, r.stderr
    recs = records(run)
    for rec in recs:
        assert rec["bytes_sent"] == rec["bytes_recv"] == expected_bytes(codec), rec
    loss = [sum(x["loss"] for x in recs if x["step"] == s) / N for s in range(30)]
    first, last = sum(loss[:3]) / 3, sum(loss[-5:]) / 5
    assert last < first - 0.2, f"{sync} {codec} {extra}: loss {first:.3f} -> {last:.3f}"


def test_topk_with_error_feedback_resumes_bit_for_bit(psring, tmp_path):
    """The residuals of every rank are in the checkpoint after step 3; resuming from it ends where the
    uninterrupted run (which wrote it) ends."""
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    r = psring.run(*train_args(whole, "ring", "topk:0.1", steps=8, extra=("--checkpoint-every", "4")))
    assert r.returncode == 0, r.stderr
    ckpt = torch.load(whole / "checkpoint" / "checkpoint.pt", weights_only=True)
    assert ckpt["step"] == 3 and ckpt["sync"]["compress"]["buckets"][0]["residuals"].shape[0] == N
    r = psring.run(*train_args(resumed, "ring", "topk:0.1", steps=8, extra=("--resume", str(whole))))
    assert r.returncode == 0, r.stderr
    a, b = torch.load(whole / "model.pt"), torch.load(resumed / "model.pt")
    for k in a:
        assert torch.equal(a[k], b[k]), k


def powersgd_bytes(rank: int) -> int:
    """Per worker and step at N=2 (a ring moves 2(N-1)/N = 1 times what it reduces): per bucket, the P
    shadow (n x r per matrix that 2r(n + m) < nm compresses, every other parameter as it is) and, where
    it has matrices, the Q shadow (m x r each); float32."""
    model = build_model("cnn", 0)
    layout = flat_layout(model.named_parameters())
    shapes = {p.data_ptr(): p.shape for p in model.parameters()}
    total = 0
    for r in param_ranges(layout, int(0.1 * 2**20), int(0.01 * 2**20)):
        p_el = q_el = 0
        for _, p, off in layout[r.space].members:
            if not r.start <= off < r.end:
                continue
            shape = shapes[p.data_ptr()]
            n = shape[0] if len(shape) >= 2 else 0
            m = p.numel() // n if n else 0
            if n and 2 * rank * (n + m) < n * m:
                p_el, q_el = p_el + n * rank, q_el + m * rank
            else:
                p_el += p.numel()
        total += 4 * (p_el + q_el)
    return total


@pytest.mark.parametrize("sync,spec", [("ring", "powersgd:2")])  # (allreduce's: the resume test below)
def test_powersgd_on_the_reducers_learns_and_counts_its_bytes(psring, tmp_path, sync, spec):
    run = tmp_path / "run"
    args = train_args(run, sync, spec, steps=30, extra=("--dataset", "digits", "--no-eval"))
    args[args.index("--num-samples"):args.index("--num-samples") + 2] = []
    r = psring.run(*args)
    assert r.returncode == 0, r.stderr
    recs = records(run)
    want = powersgd_bytes(int(spec.partition(":")[2]))
    assert want < expected_bytes("fp16")  # a real reduction: below even fp16's half
    for rec in recs:
        assert rec["bytes_sent"] == rec["bytes_recv"] == want, rec
    loss = [sum(x["loss"] for x in recs if x["step"] == s) / N for s in range(30)]
    assert sum(loss[-5:]) / 5 < sum(loss[:3]) / 3 - 0.2, f"{sync} {spec}: loss {loss[:3]} -> {loss[-5:]}"


def test_powersgd_with_error_feedback_resumes_bit_for_bit(psring, tmp_path):
    """Every rank's error and the shared warm-start Qs are in the checkpoint after step 3."""
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    r = psring.run(*train_args(whole, "allreduce", "powersgd:1", steps=8, extra=("--checkpoint-every", "4")))
    assert r.returncode == 0, r.stderr
    ckpt = torch.load(whole / "checkpoint" / "checkpoint.pt", weights_only=True)
    assert ckpt["sync"]["powersgd"]["errors"][0].shape[0] == N and ckpt["sync"]["powersgd"]["qs"]
    r = psring.run(*train_args(resumed, "allreduce", "powersgd:1", steps=8, extra=("--resume", str(whole))))
    assert r.returncode == 0, r.stderr
    a, b = torch.load(whole / "model.pt"), torch.load(resumed / "model.pt")
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert len(r.stderr.strip().splitlines()) <= 2, r.stderr  # the output folder's line, then the error


def test_bad_spec_is_refused_in_one_line(psring, tmp_path):
    r = psring.run(*train_args(tmp_path / "run", "allreduce", "topk:2"))
    assert r.returncode == 2 and "RATIO" in r.stderr, r.stderr
