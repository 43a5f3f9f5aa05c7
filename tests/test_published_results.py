"""results/published_horovod (``psring sweep experiments/published_horovod.toml``, replayed): Horovod's published
scaling efficiencies beside their replay; the claims of its README, read back from runs.csv and published.csv."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from psring.plot.published import load_published, replay_table

FOLDER = Path(__file__).resolve().parent.parent / "results" / "published_horovod"


@pytest.fixture(scope="module")
def runs() -> pd.DataFrame:
    return replay_table(pd.read_csv(FOLDER / "runs.csv"))


@pytest.fixture(scope="module")
def published() -> pd.DataFrame:
    return load_published(FOLDER)


def _eff(runs, name, readiness, alpha, n) -> float:
    sel = runs[(runs["name"] == name) & (runs["readiness"] == readiness) & (runs["alpha_us"] == alpha)
               & (runs["workers"] == n)]
    assert len(sel) == 1
    return float(sel["efficiency"].iloc[0])


def test_the_grid_was_replayed_and_the_published_points_are_sourced(runs, published):
    # 3 models x 7 N x 2 readinesses x 3 alphas, every one replayed, 4 a host
    assert len(runs) == 126 and runs["simulated"].astype(bool).all() and (runs["workers_per_host"] == 4).all()
    assert set(runs["workers"]) == {8, 16, 32, 64, 128, 256, 512}
    assert (runs["overlap"] == "backward").all() and (runs["bucket_mb"] == 64).all()
    assert set(published["name"] if "name" in published else published["model"]) == {"inception_v3", "resnet101", "vgg16"}
    assert published["source"].str.contains("horovod/horovod").all() and set(published["gpus"]) == {128, 512}
    assert {p.name for p in (FOLDER / "figures").iterdir()} == {"published.png", "published.svg"}


def test_vgg16_by_compute_with_a_20us_ring_lands_within_0025_of_both_published_points(runs, published):
    for n in (128, 512):
        want = float(published[(published["model"] == "vgg16") & (published["gpus"] == n)]["efficiency"].iloc[0])
        assert abs(_eff(runs, "vgg16", "flops", 20, n) - want) <= 0.025
    # the drop from 128 to 512 is the ring's latency: small at 2 us, the published size at 20 us
    drop = {a: _eff(runs, "vgg16", "flops", a, 128) - _eff(runs, "vgg16", "flops", a, 512) for a in (2, 20)}
    assert drop[2] < 0.03 and 0.09 < drop[20] < 0.14


def test_readiness_decides_vgg16_and_not_resnet101_or_inception_v3(runs):
    for n in (128, 512):
        for a in (2, 5, 20):
            assert _eff(runs, "vgg16", "bytes", a, n) < _eff(runs, "vgg16", "flops", a, n) - 0.09
            assert _eff(runs, "vgg16", "bytes", a, n) < 0.60
            for name in ("resnet101", "inception_v3"):
                assert _eff(runs, name, "bytes", a, n) == pytest.approx(_eff(runs, name, "flops", a, n), abs=1e-3)


def test_resnet101_is_replayed_a_little_above_horovods_090(runs):
    for n in (128, 512):
        for a in (2, 5, 20):
            assert 0.90 <= _eff(runs, "resnet101", "flops", a, n) <= 0.95


def test_inception_v3_is_replayed_above_horovods_090_by_its_last_bucket(runs, published):
    """Horovod's 90% at 128 and 512 GPUs; the replay reads 0.95-0.96 at 128 and 0.92-0.96 at 512 (its last 64 MB
    bucket, 28.5 MB of the stem and the first blocks, ready only when backward ends, plus 2(N-1) alphas)."""
    assert set(published[published["model"] == "inception_v3"]["efficiency"]) == {0.90}
    for n in (128, 512):
        for a in (2, 5, 20):
            assert 0.91 <= _eff(runs, "inception_v3", "flops", a, n) <= 0.97
    assert _eff(runs, "inception_v3", "flops", 20, 512) < _eff(runs, "inception_v3", "flops", 20, 128) - 0.02


def test_efficiency_falls_with_n_and_alpha(runs):
    for (name, ready, alpha), g in runs.groupby(["name", "readiness", "alpha_us"]):
        eff = g.sort_values("workers")["efficiency"].to_numpy()
        assert (eff[1:] <= eff[:-1] + 1e-9).all(), (name, ready, alpha)
    for name in ("inception_v3", "resnet101", "vgg16"):
        assert _eff(runs, name, "flops", 2, 512) >= _eff(runs, name, "flops", 5, 512) >= \
            _eff(runs, name, "flops", 20, 512)
