"""The PS fluid under BSP, SSP and ASP (``simulate/vector_async.py``): within 5% of the flow replay where that is
cheap, and each consistency's waits as ``sync/ps/consistency.py`` defines them."""
from __future__ import annotations

import numpy as np
import pytest

from psring.config import TrainConfig
from psring.simulate.run import check, compute_times, parse_jitter, simulate, vector_of
from psring.simulate.vector_async import AsyncPS, async_of

PS = dict(sync="ps", model="resnet50", compute="emulated:100", link_rate="25gbit", link_burst="0kb", overlap="none",
          net="emulated", bucket_mb=4.0, batch_size=32, num_samples=65536, staleness=2)


def cfg_of(n: int, consistency: str, **kw) -> TrainConfig:
    return TrainConfig(**{**PS, "workers": n, "servers": max(1, n // 4), "consistency": consistency, "steps": 12,
                          "warmup": 4, **kw})


def fluid(cfg: TrainConfig, jitter: str = "none"):
    return async_of(cfg, 20e-6).run(compute_times(cfg, check(cfg), parse_jitter(jitter)))


@pytest.mark.parametrize("consistency", ["bsp", "ssp", "asp"])
def test_within_five_percent_of_the_flow_replay_at_n16(consistency, tmp_path):
    """ps S = N/4 at N = 16 with 20% jitter: the fluid's throughput (every worker at its own pace) within 5% of
    the flow network's (``results/simulate/async_check.csv`` has N = 8-32 in both jitters)."""
    cfg = cfg_of(16, consistency)
    flows = simulate(cfg, tmp_path / "flows", "lognormal:0.2", 20.0, flows=True)
    cfg_fluid = cfg_of(16, consistency)
    assert isinstance(vector_of(cfg_fluid, 20e-6), AsyncPS)  # BSP too: S = N/4, several workers a server
    replayed = simulate(cfg_fluid, tmp_path / "fluid", "lognormal:0.2", 20.0)
    assert replayed["worker_samples_per_s"] == pytest.approx(flows["worker_samples_per_s"], rel=0.05)


def test_each_consistency_waits_as_it_should():
    """A straggler at 3x: under ASP the others never wait for it (steps as if it were absent); under SSP (k = 2)
    they run at most k + 1 steps ahead of it; under BSP every step ends within 10 ms on every worker (the last
    replies, a few chunks at 25 Gbit/s, against 300 ms of the straggler's compute)."""
    runs = {c: fluid(cfg_of(8, c, straggler="0:3")) for c in ("bsp", "ssp", "asp")}
    _, _, asp_end = runs["asp"]
    _, _, alone_end = fluid(cfg_of(8, "asp"))
    assert asp_end[-1, 1:].max() <= alone_end[-1, 1:].max() * 1.01  # not paced by rank 0 at all
    assert asp_end[-1, 0] > 1.3 * asp_end[-1, 1:].max()  # which falls behind
    _, _, ssp_end = runs["ssp"]
    for s in range(ssp_end.shape[0]):  # when any fast worker ends step s, the straggler has ended step s - k - 1
        slow_done = int((ssp_end[:, 0] <= ssp_end[s, 1:].min()).sum())
        assert slow_done >= s - 2, (s, slow_done)
    assert ssp_end[-1, 1:].max() < asp_end[-1, 0]  # but they are not held to its pace either
    _, _, bsp_end = runs["bsp"]
    assert (bsp_end.max(axis=1) - bsp_end.min(axis=1)).max() < 0.01
    assert bsp_end[-1].min() > asp_end[-1, 1:].max()


def test_async_runs_and_bsp_with_several_workers_a_server_take_the_drifting_fluid():
    """SSP and ASP always; BSP where 1 < S < N (a server's FIFO answers its workers in turn, which VectorPS's replies
    all at once miss: results/simulate/fluid_check.csv); BSP at S = N and S = 1 keeps VectorPS (within 1% at S = N;
    the drifting fluid takes minutes a run at S = 1, N = 1,024)."""
    from psring.simulate.vector_ps import VectorPS

    assert isinstance(vector_of(cfg_of(32, "asp"), 20e-6), AsyncPS)
    assert isinstance(vector_of(cfg_of(32, "bsp"), 20e-6), AsyncPS)
    assert isinstance(vector_of(cfg_of(32, "bsp", servers=32), 20e-6), VectorPS)
    assert isinstance(vector_of(cfg_of(32, "bsp", servers=1), 20e-6), VectorPS)
    assert vector_of(cfg_of(32, "asp", link_burst="1mb"), 20e-6) is None  # a tbf burst: the flow network
    with pytest.raises(ValueError, match="consistency"):
        AsyncPS(4, [(0, 100)], 1, 1e9, 1e9, 0.0, "eventual", 0)
    _, _, end = fluid(cfg_of(4, "ssp", staleness=0))
    assert np.isfinite(end).all()
