"""Models as real code has them (#26 item 4), under every strategy: a frozen layer and tied weights train
exactly as in one process on the global batch (1e-5); a parameter that gets no gradient is refused in one
line naming it, by every strategy."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import Psring, run_concurrently
from test_equivalence import max_rel_diff

MODEL = "tests.real_code_models:tied_frozen"
BF16 = "tests.real_code_models:bf16"
B, STEPS = 8, 4
STRATEGIES = {"ps": ("--servers", "2"), "ps-aggregate": ("--servers", "2", "--ps-design", "aggregate"),
              "allreduce": ("--bucket-mb", "0.05"), "ring": ("--bucket-mb", "0.05"), "ddp": ()}


def args(out, sync: str, n: int, batch: int, model: str = MODEL, extra=()) -> list[str]:
    return ["train", "--sync", sync.partition("-")[0], "--workers", str(n), "--model", model, "--batch-size",
            str(batch), "--steps", str(STEPS), "--seed", "5", "--num-samples", "256", "--out", str(out), *extra]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real_code")
    runner = Psring(tmp)
    jobs = {("ref", n): args(tmp / f"ref{n}", "none", 1, n * B) for n in (2, 3)}
    jobs.update({(s, n): args(tmp / f"{s}{n}", s, n, B, extra=extra) for s, extra in STRATEGIES.items()
                 for n in (2, 3)})
    jobs.update({(s, "unused"): args(tmp / f"{s}-unused", s, 2, B, "tests.real_code_models:with_unused", extra)
                 for s, extra in STRATEGIES.items()})
    try:
        done = run_concurrently(runner, jobs, at_once=3)
        yield tmp, done
    finally:
        runner.reap()


@pytest.mark.parametrize("sync", sorted(STRATEGIES))
@pytest.mark.parametrize("n", [2, 3])
def test_frozen_and_tied_match_one_process(runs, sync, n):
    tmp, done = runs
    for key in (("ref", n), (sync, n)):
        assert done[key].returncode == 0, (key, done[key].stderr[-2000:])
    got, ref = torch.load(tmp / f"{sync}{n}" / "model.pt"), torch.load(tmp / f"ref{n}" / "model.pt")
    assert max_rel_diff(got, ref) <= 1e-5
    from psring.train.models import build_model

    init = build_model(MODEL, 5).state_dict()
    assert torch.equal(got["frozen.weight"], init["frozen.weight"])  # frozen: never updated
    assert not torch.equal(got["a.weight"], init["a.weight"])
    assert torch.equal(got["a.weight"], got["b.weight"])  # still one tensor
    if n == 2:  # each worker sends its gradients once a step: trainable parameters only, the tied one once
        m = sum(p.numel() * 4 for p in build_model(MODEL, 5).parameters() if p.requires_grad)
        sent = json.loads((tmp / f"{sync}{n}" / "summary.json").read_text())["bytes_sent_per_step"]
        assert 0.99 * m <= sent <= 1.05 * m, (sent, m)


@pytest.mark.parametrize("sync", sorted(STRATEGIES))
def test_a_parameter_without_gradient_is_refused_in_one_line(runs, sync):
    _, done = runs
    r = done[(sync, "unused")]
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode != 0 and "parameter 'branch." in last and "got no gradient" in last, r.stderr[-2000:]


def test_the_check_wants_every_gradient_once_a_backward_ran_and_none_without_one():
    """A backward that reaches some parameters and not others is refused; a step with no backward at all
    (the bench writes gradients into the buckets directly) is not."""
    from torch import nn

    from psring.sync.buckets import GradBuckets, UnusedParameterError, flat_layout, param_ranges

    model = nn.ModuleDict({"used": nn.Linear(4, 2), "unused": nn.Linear(4, 2)})
    layout = flat_layout(model.named_parameters())
    buckets = GradBuckets(layout, param_ranges(layout, 1 << 20, 1 << 20), lambda b: None)
    buckets.flush()  # nothing ran backward: the bench's case
    buckets.reset()
    model["used"](torch.ones(1, 4)).sum().backward()
    with pytest.raises(UnusedParameterError, match=r"^parameter 'unused\.(weight|bias)' \(and 1 more\)"):
        buckets.flush()


def test_a_bf16_model_is_refused_in_one_line_before_any_worker(tmp_path):
    """torch's fused CPU SGD (every worker-side update) leaves a bf16 nn.Linear's weight unchanged and the
    servers run the same kernel: psring refuses non-float32 parameters, naming one, for every strategy."""
    import subprocess
    import sys

    from psring.train.models import build_model, check_float32

    for sync in ("none", "allreduce", "ps"):
        n = 1 if sync == "none" else 2
        r = subprocess.run([sys.executable, "-m", "psring", *args(tmp_path / sync, sync, n, B, BF16)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "parameter 'embed.weight' is bfloat16: psring trains float32 parameters" in r.stderr, r.stderr
    with pytest.raises(ValueError, match="is bfloat16"):
        check_float32(build_model("cnn", 0).to(torch.bfloat16))
