"""The PS's link schedule: chunks fitted to the link, a window of credits per server, one server's
tensors split too; and that training with them still equals single-process training."""
from __future__ import annotations

import json
import math

import pytest
import torch
from test_equivalence import max_rel_diff, train_args

from psring.costmodel import ps as ps_model
from psring.net import NetError, check_available
from psring.sync.ps.sharding import (
    MIN_CHUNK_BYTES,
    chunk_bytes,
    chunks_per_server,
    cores_chunks,
    default_window,
    drain_chunks,
    fitted_chunk_bytes,
    plan_chunks,
)
from psring.train.models import build_model

M = 44_695_848  # ResNet-18's gradients
MBIT100, GBIT = 12.5e6, 125e6


def test_window_spreads_a_fixed_number_of_chunks_in_flight_over_the_servers():
    assert [default_window(s, True) for s in (1, 2, 3, 4, 8)] == [4, 2, 2, 1, 1]
    assert default_window(4, False) == 0  # loopback: no link to schedule, everything at once


def test_fitted_chunks_grow_with_the_link_and_stay_within_bounds():
    slow = fitted_chunk_bytes(M, 8, 8, MBIT100, MBIT100, 4 << 20)
    fast = fitted_chunk_bytes(M, 8, 8, GBIT, GBIT, 4 << 20)
    assert MIN_CHUNK_BYTES <= slow < fast <= 4 << 20
    # k = sqrt(T / (N * cost)) chunks per server: a 10x faster link wants sqrt(10)x fewer, larger ones
    assert fast / slow == pytest.approx(math.sqrt(10), rel=0.1)
    assert fitted_chunk_bytes(M, 2, 2, 1e3, 1e3, 4 << 20) == MIN_CHUNK_BYTES  # never below the floor
    assert fitted_chunk_bytes(M, 1, 1, 1e12, 1e12, 1 << 20) == 1 << 20  # never above the cap
    assert chunk_bytes(M, 8, 8, None, 4 << 20) == 4 << 20  # unknown link: the cap


def test_full_overlap_under_credits_fits_smaller_chunks_where_the_shared_cores_have_room():
    # --overlap full with credits: the last replies lag about four chunk times (the drain), so the fit
    # halves the chunk (k = sqrt(4T / (N m))); results/overlap_chunks measured that gain at these points
    assert drain_chunks("full", None, (GBIT, GBIT), 2, 2) == 4
    assert drain_chunks("backward", None, (GBIT, GBIT), 2, 2) == 1  # no next forward waiting on the drain
    assert drain_chunks("full", None, (GBIT, GBIT), 4, 1) == 1  # S = 1: no default credits (FIFO)
    assert drain_chunks("full", 0.0, (GBIT, GBIT), 4, 4) == 1 and drain_chunks("full", 1.0, None, 4, 1) == 4
    for n, rate in ((2, GBIT), (4, MBIT100)):
        plain = fitted_chunk_bytes(M, n, n, rate, rate, 4 << 20)
        full = fitted_chunk_bytes(M, n, n, rate, rate, 4 << 20, drain_chunks=4, shared_cores=2)
        assert full == pytest.approx(plain / 2, rel=0.05)
    # N = 4 at 1 Gbit on 2 cores: the bytes alone take most of the cores, so no more messages than the plain fit
    assert cores_chunks(M, 4, 4, M / GBIT, 2) < M / (4 * fitted_chunk_bytes(M, 4, 4, GBIT, GBIT, 4 << 20))
    assert fitted_chunk_bytes(M, 4, 4, GBIT, GBIT, 4 << 20, drain_chunks=4, shared_cores=2) == \
        fitted_chunk_bytes(M, 4, 4, GBIT, GBIT, 4 << 20)
    # N = 4, 500 Mbit: between the two, as many chunks as the cores' share allows
    mbit500 = GBIT / 2
    plain, drained = (fitted_chunk_bytes(M, 4, 4, mbit500, mbit500, 4 << 20, drain_chunks=d) for d in (1, 4))
    capped = fitted_chunk_bytes(M, 4, 4, mbit500, mbit500, 4 << 20, drain_chunks=4, shared_cores=2)
    assert drained < capped < plain
    # hosts of their own (a torchrun cluster, the simulator): the drain alone decides
    assert fitted_chunk_bytes(M, 4, 4, GBIT, GBIT, 4 << 20, drain_chunks=4) < \
        fitted_chunk_bytes(M, 4, 4, GBIT, GBIT, 4 << 20)


def test_chunks_per_server_is_what_plan_chunks_cuts():
    for servers, cap in ((1, 300_000), (2, 1 << 20), (8, 116_395), (3, 4 << 20)):
        numel = M // 4
        chunks = plan_chunks([[numel]], [4], servers, cap, split=True)
        per_server = [sum(1 for c in chunks if c[3] == s) for s in range(servers)]
        assert per_server == [chunks_per_server(M, servers, cap)] * servers


def test_one_server_splits_tensors_only_when_asked():
    sizes = [2_000_000, 10, 500_000]  # one tensor far above the cap
    whole = plan_chunks([sizes], [4], 1, 1 << 20)
    assert [e - s for _, s, e, _ in whole] == sizes  # whole parameters, however large
    split = plan_chunks([sizes], [4], 1, 1 << 20, split=True)
    lengths = [e - s for _, s, e, _ in split]
    assert max(lengths) * 4 <= 1 << 20 and max(lengths) - min(lengths) <= 1 and sum(lengths) == sum(sizes)


def test_pipelined_bound_lies_between_the_line_rate_and_the_sequential_formula():
    from psring.costmodel import Link

    link = Link(2e-4, MBIT100)
    t = M / MBIT100
    seq = ps_model(8, 8, M, link)
    for k in (1, 4, 48):
        piped = ps_model(8, 8, M, link, chunks_per_server=k)
        assert piped == pytest.approx(2 * link.alpha_s + t * (1 + 1 / k))
        assert t < piped <= seq
    assert ps_model(8, 1, M, link, chunks_per_server=10) == pytest.approx(4e-4 + 8 * t * 1.1)


@pytest.mark.parametrize("n,s,extra", [
    (3, 2, ("--ps-window", "1", "--bucket-mb", "0.05")),  # one chunk at a time per server, many chunks
])
def test_windowed_ps_matches_single_process(psring, tmp_path, reference, n, s, extra):
    r = psring.run(*train_args(tmp_path / "run", "ps", n, s, extra=extra))
    assert r.returncode == 0, r.stderr
    diff = max_rel_diff(torch.load(tmp_path / "run" / "model.pt"), reference(n))
    assert diff <= 1e-5, f"ps N={n} S={s} {extra}: max relative difference {diff:.2e}"


def test_ps_on_an_emulated_link_fits_chunks_splits_one_servers_tensors_and_matches(psring, tmp_path,
                                                                                  reference):
    try:
        check_available()
    except NetError as e:
        pytest.skip(f"no emulated network here: {e}")
    extra = ("--net", "emulated", "--link-rate", "100mbit")  # cnn: 2.2 MB, chunks fitted to ~0.1 MB
    r = psring.run(*train_args(tmp_path / "run", "ps", 2, 1, extra=extra))
    assert r.returncode == 0, r.stderr
    diff = max_rel_diff(torch.load(tmp_path / "run" / "model.pt"), reference(2))
    assert diff <= 1e-5, f"ps N=2 S=1 on an emulated link: max relative difference {diff:.2e}"
    chunk = json.loads((tmp_path / "run" / "summary.json").read_text())["chunk_bytes"]
    largest = max(p.numel() * 4 for p in build_model("cnn", 0).parameters())
    assert chunk < largest < 4 << 20, (chunk, largest)  # fitted below the 4 MiB default, and splitting a tensor
