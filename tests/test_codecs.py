"""The codecs alone (no processes): round trips, the exact bytes of every encoding against
``wire_bytes``, error feedback's bookkeeping, reproducible random-k, and one-line errors for bad specs."""
from __future__ import annotations

import math

import pytest
import torch

from psring.compress import CodecState, parse

SPECS = ("none", "fp16", "bf16", "topk:0.1", "randomk:0.1", "onebit")


def grad(n: int = 1001, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("n", [1, 7, 8, 1001])
def test_encoding_bytes_are_the_formula(spec, n):
    c = parse(spec)
    enc = c.encode(grad(n), CodecState())
    assert enc.nbytes == c.wire_bytes(n)
    assert c.decode(enc, n).shape == (n,)


def test_formulas():
    n = 1001
    assert parse("none").wire_bytes(n) == 4 * n
    assert parse("fp16").wire_bytes(n) == parse("bf16").wire_bytes(n) == 2 * n
    assert parse("topk:0.1").wire_bytes(n) == parse("randomk:0.1").wire_bytes(n) == 8 * math.ceil(0.1 * n)
    assert parse("onebit").wire_bytes(n) == math.ceil(n / 8) + 4


def test_dense_round_trips_within_their_precision():
    x = grad()
    assert torch.equal(parse("none").decode(parse("none").encode(x, CodecState()), x.numel()), x)
    for spec, eps in (("fp16", 2**-11), ("bf16", 2**-8)):  # half a unit in the last place, relative
        c = parse(spec)
        y = c.decode(c.encode(x, CodecState()), x.numel())
        assert y.dtype == torch.float32 and ((y - x).abs() <= eps * x.abs() + 1e-7).all(), spec


def test_topk_keeps_the_largest_magnitudes_exactly():
    x = grad()
    c = parse("topk:0.1", error_feedback=False)
    y = c.decode(c.encode(x, CodecState()), x.numel())
    k = math.ceil(0.1 * x.numel())
    kept = y != 0
    assert kept.sum() == k and torch.equal(y[kept], x[kept])
    assert x[~kept].abs().max() <= x[kept].abs().min()


def test_onebit_is_signs_times_mean_magnitude():
    x = grad(13)
    c = parse("onebit", error_feedback=False)
    y = c.decode(c.encode(x, CodecState()), 13)
    torch.testing.assert_close(y, torch.where(x >= 0, 1.0, -1.0) * x.abs().mean())


def test_randomk_is_reproducible_per_seed_and_step_and_varies_with_them():
    c, x = parse("randomk:0.1", error_feedback=False), grad()
    a, b, other = CodecState(seed=5), CodecState(seed=5), CodecState(seed=6)
    first = c.encode(x, a).parts["indices"]
    assert torch.equal(first, c.encode(x, b).parts["indices"])
    assert not torch.equal(first, c.encode(x, other).parts["indices"])
    assert not torch.equal(first, c.encode(x, a).parts["indices"])  # the next step draws anew
    assert first.unique().numel() == first.numel()  # without replacement
    # a state restored from its state_dict draws what the original draws next
    restored = CodecState()
    restored.load_state_dict(b.state_dict())
    assert torch.equal(c.encode(x, b).parts["indices"], c.encode(x, restored).parts["indices"])


@pytest.mark.parametrize("spec", ["topk:0.1", "randomk:0.1", "onebit"])
def test_error_feedback_loses_nothing_only_delays_it(spec):
    """After every step: sum of the gradients = sum of what was transmitted + the residual."""
    c, st = parse(spec), CodecState(seed=1)
    grads = [grad(seed=s) for s in range(6)]
    sent = torch.zeros_like(grads[0])
    for t, g in enumerate(grads):
        sent += c.decode(c.encode(g, st), g.numel())
        torch.testing.assert_close(sum(grads[:t + 1]), sent + st.residual, rtol=0, atol=1e-5)


def test_without_error_feedback_no_residual_is_kept():
    c, st = parse("topk:0.1", error_feedback=False), CodecState()
    c.encode(grad(), st)
    assert st.residual is None


@pytest.mark.parametrize("spec", ["topk:0", "topk:2", "topk:x", "topk:-0.1", "topk", "zip", "fp16:1",
                                  "onebit:3", ""])
def test_bad_specs_are_one_line_value_errors(spec):
    with pytest.raises(ValueError, match="codec") as e:  # (psring's own message: not a bare float() error)
        parse(spec)
    assert "\n" not in str(e.value) and str(e.value)
