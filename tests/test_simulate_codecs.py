"""``psring simulate --compress`` (issue #27): each codec's bytes replayed as the code sends them (the reduce family
reduces a 2-byte shadow bucket for fp16/bf16 and all-gathers the sparse and 1-bit encodings; the PS pushes
encodings and replies as its design answers), what is not replayed refused in one line, and the committed
validation holding the codec runs of results/compression_sync."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from psring.config import ConfigError, TrainConfig
from psring.simulate.run import check, simulate

RESULTS = Path(__file__).resolve().parent.parent / "results"


def _cfg(**kw) -> TrainConfig:
    base = dict(workers=4, model="resnet18", net="emulated", link_rate="100mbit", compute="emulated:200",
                overlap="none", steps=3, warmup=1, batch_size=16)
    return TrainConfig(**{**base, **kw}).validate()


@pytest.mark.parametrize("kw", [dict(), dict(workers=8, workers_per_host=2, link_burst="128kb")])
def test_the_rings_fp16_on_numpy_is_its_flow_replay(tmp_path, kw):
    cfg = _cfg(sync="ring", compress="fp16", **kw)
    fast, flow = simulate(cfg, tmp_path / "v"), simulate(cfg, tmp_path / "f", flows=True)
    assert fast["sync_s_p50"] == pytest.approx(flow["sync_s_p50"], rel=1e-6)
    assert fast["bytes_sent_per_step"] == pytest.approx(flow["bytes_sent_per_step"], rel=1e-9)


def test_fp16_halves_what_the_ring_sends_and_what_the_ps_pushes(tmp_path):
    ring, ring16 = (simulate(_cfg(sync="ring", compress=c), tmp_path / f"r{c}") for c in ("none", "fp16"))
    assert ring16["bytes_sent_per_step"] == pytest.approx(ring["bytes_sent_per_step"] / 2, rel=1e-3)
    assert ring16["sync_s_p50"] < 0.6 * ring["sync_s_p50"]
    ps, ps16 = (simulate(_cfg(sync="ps", servers=4, compress=c), tmp_path / f"p{c}") for c in ("none", "fp16"))
    assert ps16["bytes_sent_per_step"] == pytest.approx(ps["bytes_sent_per_step"] / 2, rel=1e-3)
    assert ps16["bytes_recv_per_step"] == pytest.approx(ps["bytes_recv_per_step"], rel=1e-3)  # dense replies


def test_what_is_not_replayed_is_refused_in_one_line():
    for kw in (dict(compress="fp16", overlap="backward"), dict(compress="topk:0.01", overlap="full"),
               dict(compress="powersgd:4")):
        with pytest.raises(ConfigError, match="with --overlap none only"):
            check(_cfg(sync="allreduce", **kw))


@pytest.mark.parametrize("sync", ["ring", "allreduce"])
@pytest.mark.parametrize("spec", ["topk:0.01", "randomk:0.05", "onebit"])
def test_all_gathered_codecs_send_n_minus_1_encodings_and_both_replays_agree(tmp_path, sync, spec):
    """``sync/compressed.py``: every rank's encoding all-gathered, part by part (``wire_bytes``: (N - 1) of them);
    the numpy replay (``run.vector_of``: the ring in ``codec_bytes.gathered_rounds``) equals the flow network's."""
    from psring.compress.codecs import parse
    from psring.simulate.plans import bucket_numels, layout_of

    cfg = _cfg(sync=sync, compress=spec, workers=6, link_burst="128kb")
    fast = simulate(cfg, tmp_path / "v")
    flow = simulate(cfg, tmp_path / "f", flows=True)
    codec, layout = parse(spec), layout_of(cfg)
    want = 5 * sum(codec.wire_bytes(n) for n in bucket_numels(cfg, layout))
    assert fast["bytes_sent_per_step"] == pytest.approx(want, rel=1e-9) == flow["bytes_sent_per_step"]
    assert fast["sync_s_p50"] == pytest.approx(flow["sync_s_p50"], rel=1e-6)
    dense = simulate(_cfg(sync=sync, workers=6, link_burst="128kb"), tmp_path / "d")
    assert fast["sync_s_p50"] < dense["sync_s_p50"]  # at 6 workers each codec sends less than the ring's 2M


def test_gathered_bytes_grow_with_n_where_the_rings_do_not(tmp_path):
    """Top-k's all-gather: (N - 1) x 8k a rank, against the ring's 2(N-1)/N x 4n: equal near N = n/k, behind after."""
    small = simulate(_cfg(sync="allreduce", compress="topk:0.05", workers=8), tmp_path / "8")
    big = simulate(_cfg(sync="allreduce", compress="topk:0.05", workers=64, num_samples=4096), tmp_path / "64")
    assert big["bytes_sent_per_step"] == pytest.approx(small["bytes_sent_per_step"] * 63 / 7, rel=1e-9)
    ring = simulate(_cfg(sync="allreduce", workers=64, num_samples=4096), tmp_path / "r")
    assert big["bytes_sent_per_step"] > ring["bytes_sent_per_step"]  # 63 x 0.4 n > 2 x 4 n x 63/64


@pytest.mark.parametrize("design", ["server-optimizer", "aggregate"])
def test_the_ps_pushes_encodings_and_replies_as_its_design_answers(tmp_path, design):
    from psring.simulate.codec_bytes import sparse_union

    n, m = 11_173_962, 44_695_848  # ResNet-18 at 10 classes: elements, bytes
    one = simulate(_cfg(sync="ps", servers=4, compress="onebit", ps_design=design), tmp_path / "o")
    assert one["bytes_sent_per_step"] == pytest.approx(n / 8, rel=0.01)
    assert one["bytes_recv_per_step"] == pytest.approx(m, rel=0.01)  # dense either way
    top = simulate(_cfg(sync="ps", servers=4, compress="topk:0.01", ps_design=design), tmp_path / "t")
    assert top["bytes_sent_per_step"] == pytest.approx(8 * 0.01 * n, rel=0.01)
    want = m if design == "server-optimizer" else 8 * sparse_union(n, n // 100, 4)
    assert top["bytes_recv_per_step"] == pytest.approx(want, rel=0.02)


def test_the_fp16_runs_of_compression_sync_are_replayed():
    """Within 10% of their sync time but the hand-written ring at 1 Gbit (0.75-0.88 at N = 2, 4 and 8,
    results/simulate/README.md: its casts, adds and lockstep rounds on this CPU, which the replay does not
    price)."""
    v = pd.read_csv(RESULTS / "simulate" / "validation.csv")
    fp16 = v[(v["folder"] == "compression_sync") & (v["compress"] == "fp16")]
    assert len(fp16) == 12 and (fp16["replayed"] == "yes").all()
    bound = fp16[fp16["link_bound"]]
    slow_cpu = (bound["sync"] == "ring") & (bound["link_rate"] == "1gbit")
    assert len(bound) == 9 and (bound[~slow_cpu]["sync_ratio"] - 1).abs().max() <= 0.10
    assert bound[slow_cpu]["sync_ratio"].between(0.7, 0.9).all() and slow_cpu.sum() == 3


def test_the_all_gathered_codec_runs_are_replayed_and_the_link_bound_ones_held():
    """The PS's 1-bit runs the links decide (a dense reply of M each way: 100 Mbit at N = 2, 4, 8 and 1 Gbit at
    N = 2) within 5%; every other top-k or 1-bit run is CPU-decided (``cpu_at_replay`` >= 0.9 or CPU-saturated),
    the replay leaving their encode, decode and sum out (0.003-0.63 of their sync)."""
    v = pd.read_csv(RESULTS / "simulate" / "validation.csv")
    codecs = v[(v["folder"] == "compression_sync") & v["compress"].isin(["topk:0.01", "onebit"])]
    assert len(codecs) == 24 and (codecs["replayed"] == "yes").all()
    bound = codecs[codecs["link_bound"]]
    assert set(bound["sync"]) == {"ps"} and set(bound["compress"]) == {"onebit"} and len(bound) == 4
    assert (bound["sync_ratio"] - 1).abs().max() <= 0.05
    rest = codecs[~codecs["link_bound"]]
    assert (rest["sync_ratio"] <= 0.65).all()  # the CPU they spend is what the replay lacks
    ring = rest[rest["sync"] == "ring"]
    assert len(ring) == 12 and ((ring["cpu_at_replay"] >= 0.9) | ring["sync_ratio"].lt(0.31)).all()
