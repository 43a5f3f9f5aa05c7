"""``psring simulate --compress fp16|bf16`` (issue #27): the dense codecs' bytes replayed as the code sends them
(the reduce family reduces a 2-byte shadow bucket; the PS pushes 2 bytes an element and replies with the dense
parameters), the other codecs refused in one line, and the committed validation holding the fp16 runs of
results/compression_sync."""
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


def test_fp16_halves_what_the_ring_sends_and_what_the_ps_pushes(tmp_path):
    ring, ring16 = (simulate(_cfg(sync="ring", compress=c), tmp_path / f"r{c}") for c in ("none", "fp16"))
    assert ring16["bytes_sent_per_step"] == pytest.approx(ring["bytes_sent_per_step"] / 2, rel=1e-3)
    assert ring16["sync_s_p50"] < 0.6 * ring["sync_s_p50"]
    ps, ps16 = (simulate(_cfg(sync="ps", servers=4, compress=c), tmp_path / f"p{c}") for c in ("none", "fp16"))
    assert ps16["bytes_sent_per_step"] == pytest.approx(ps["bytes_sent_per_step"] / 2, rel=1e-3)
    assert ps16["bytes_recv_per_step"] == pytest.approx(ps["bytes_recv_per_step"], rel=1e-3)  # dense replies


def test_codecs_that_are_all_gathered_are_refused_in_one_line():
    for spec in ("topk:0.01", "onebit"):
        with pytest.raises(ConfigError, match="dense codecs"):
            check(_cfg(sync="ring", compress=spec))
    with pytest.raises(ConfigError, match="dense codecs"):
        check(_cfg(sync="ring", compress="fp16", overlap="backward"))


def test_the_fp16_runs_of_compression_sync_are_replayed():
    """Within 10% of their sync time but the hand-written ring at 1 Gbit (0.66-0.86, results/simulate/README.md:
    its fp16 casts and adds on this CPU, which its 1 Gbit steps show and the replay does not price)."""
    v = pd.read_csv(RESULTS / "simulate" / "validation.csv")
    fp16 = v[(v["folder"] == "compression_sync") & (v["compress"] == "fp16")]
    assert len(fp16) == 12 and (fp16["replayed"] == "yes").all()
    bound = fp16[fp16["link_bound"]]
    slow_cpu = (bound["sync"] == "ring") & (bound["link_rate"] == "1gbit")
    assert len(bound) == 9 and (bound[~slow_cpu]["sync_ratio"] - 1).abs().max() <= 0.10
    assert bound[slow_cpu]["sync_ratio"].between(0.6, 0.9).all()
