"""The numpy replays of the flat ring's ``--overlap backward`` and ``full`` (``simulate/vector_overlap.py``,
``vector_full.py``) against the flow replay they stand in for (``overlapped.OverlapReplay`` on
``network.Network``): the same steps, with one worker a host or G, with tbf's burst or none, with jitter; and
the scale they exist for."""
from __future__ import annotations

import json
import time

import pytest

from psring.config import ConfigError, TrainConfig
from psring.simulate.run import simulate
from psring.simulate.vector_overlap import vector_overlap_of


def _cfg(**kw) -> TrainConfig:
    base = dict(sync="ring", workers=4, model="resnet18", net="emulated", link_rate="100mbit",
                compute="emulated:3000", overlap="backward", steps=4, warmup=1, batch_size=16)
    return TrainConfig(**{**base, **kw}).validate()


def _steps(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "steps.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("kw", [
    dict(),
    dict(sync="allreduce", workers=6, link_rate="1gbit", compute="emulated:400", link_burst="1mb"),
    dict(workers=8, workers_per_host=2, bucket_mb=2.0, link_burst="128kb"),
    dict(workers=6, workers_per_host=3, link_rate="10gbit", compute="emulated:150"),
])
@pytest.mark.parametrize("jitter", ["none", "lognormal:0.1"])
@pytest.mark.parametrize("mode", ["backward", "full"])
def test_the_numpy_replay_is_the_flow_replay(tmp_path, kw, jitter, mode):
    """``backward``: ``vector_overlap``; ``full`` (the priority scheduler's decisions, the gated forward):
    ``vector_full``."""
    cfg = _cfg(**kw, overlap=mode)
    assert vector_overlap_of(cfg, 50e-6) is not None
    fast = simulate(cfg, tmp_path / "vector", jitter=jitter)
    flow = simulate(cfg, tmp_path / "flow", jitter=jitter, flows=True)
    assert fast["step_s_p50"] == pytest.approx(flow["step_s_p50"], rel=1e-6)
    assert fast["bytes_sent_per_step"] == pytest.approx(flow["bytes_sent_per_step"], rel=1e-9)
    a, b = _steps(tmp_path / "vector"), _steps(tmp_path / "flow")
    assert len(a) == len(b) == cfg.steps * cfg.workers
    key = lambda r: (r["step"], r["rank"])  # noqa: E731
    for x, y in zip(sorted(a, key=key), sorted(b, key=key)):
        assert x["step_s"] == pytest.approx(y["step_s"], rel=1e-6, abs=1e-9)
        assert x["sync_s"] == pytest.approx(y["sync_s"], rel=1e-6, abs=1e-9)


def test_what_it_does_not_replay_goes_to_the_flow_network():
    assert vector_overlap_of(_cfg(overlap="none"), 50e-6) is None
    assert vector_overlap_of(_cfg(sync="ps", servers=4), 50e-6) is None


@pytest.mark.parametrize("mode", ["backward", "full"])
def test_it_reaches_hundreds_of_workers(tmp_path, mode):
    """512 workers, 4 a host, ResNet-50's gradients: a few seconds, not hours (the flow replay's cost grows with
    every rank's every round; the time is printed, not asserted); with 30 ms of compute the step is at least the
    forward and what a host link carries, and no more than both plus every bucket's 2(N-1) alphas twice over."""
    cfg = _cfg(workers=512, workers_per_host=4, model="resnet50", link_rate="25gbit", compute="emulated:30",
               bucket_mb=25.0, steps=3, batch_size=64, num_samples=65536, overlap=mode, link_burst="0kb")
    t0 = time.perf_counter()
    s = simulate(cfg, tmp_path / "big", alpha_us=20)
    print(f"512 workers x 3 steps, {mode}: {time.perf_counter() - t0:.1f} s")
    hosts_link = 25e9 / 8 * 1448 / 1514
    comm = 2 * 511 / 512 * 25_557_032 * 4 / hosts_link  # what each host link carries
    assert 0.01 + comm < s["step_s_p50"] < 0.03 + comm + 2 * 8 * 2 * 511 * 20e-6
    assert s["simulated"] is True


@pytest.mark.parametrize("kw", [dict(sync="allreduce", workers=1), dict(sync="ring", workers=1, compress="fp16"),
                                dict(sync="allreduce", workers=1, compress="topk:0.01"),
                                dict(sync="hierarchical", workers=4, workers_per_host=4)])
@pytest.mark.parametrize("mode", ["none", "backward"])
def test_nothing_to_cross_is_a_step_of_compute(tmp_path, kw, mode):
    """One rank, or every rank on one host: nothing crosses a link, so each step is its compute."""
    s = simulate(_cfg(**kw, overlap=mode), tmp_path / "x")
    assert s["step_s_p50"] == pytest.approx(3.0, rel=1e-9) and s["sync_s_p50"] == pytest.approx(0.0, abs=1e-9)


def test_flops_readiness_follows_the_layers_multiply_adds_and_both_replays_agree(tmp_path):
    """``--readiness flops`` (``simulate/profile.py``): VGG-16's fully connected layers hold 89% of its bytes and
    about 1% of its multiply-adds, so backward makes most of its bytes at once by compute and last by bytes; the
    numpy and flow replays take the same plan."""
    from psring.simulate.profile import param_weights

    cfg = _cfg(model="psring.train.zoo:vgg16", image_size=224, num_samples=65536)
    w = param_weights(cfg, "flops")
    fc = sum(v for k, v in w.items() if k.startswith("classifier"))
    assert 0.003 < fc / sum(w.values()) < 0.02
    assert all(v == 0 for k, v in w.items() if k.endswith("bias"))
    assert param_weights(cfg, "bytes") is None
    small = _cfg(link_rate="1gbit", compute="emulated:400")
    fast = simulate(small, tmp_path / "v", readiness="flops")
    flow = simulate(small, tmp_path / "f", readiness="flops", flows=True)
    assert fast["step_s_p50"] == pytest.approx(flow["step_s_p50"], rel=1e-6) and fast["readiness"] == "flops"
    assert "readiness" not in simulate(small, tmp_path / "b")  # the default left out (sweeps' finished runs)


@pytest.mark.parametrize("argv,msg", [
    (["--readiness", "time"], "invalid choice: 'time'"),
    (["--readiness", "flops", "--model", "vit_b_16"], "is a weight matrix of neither: use --readiness bytes"),
])
def test_bad_readiness_is_one_line(psring, tmp_path, argv, msg):
    r = psring.run("simulate", "--sync", "ring", "--workers", "4", "--compute", "emulated:100", "--overlap",
                   "backward", "--out", str(tmp_path / "x"), *argv, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and msg in r.stderr, r.stderr


def test_hierarchical_backward_is_one_ring_over_the_hosts(tmp_path):
    """``hierarchical --overlap backward`` (numpy only): without jitter the G ranks of a host are alike, so 8
    workers 2 a host step as the flat ring of the 4 hosts, each rank sending half its host's bytes; it moves the
    bytes of its ``--overlap none`` replay and hides some of their time."""
    same = dict(link_burst="0kb", bucket_mb=4.0)  # (not the probe's cut: its fixed cost counts every rank's alphas)
    hosts = simulate(_cfg(sync="allreduce", workers=4, **same), tmp_path / "hosts")
    pairs = simulate(_cfg(sync="hierarchical", workers=8, workers_per_host=2, **same), tmp_path / "pairs")
    assert pairs["step_s_p50"] == pytest.approx(hosts["step_s_p50"], rel=1e-9)
    assert pairs["bytes_sent_per_step"] == pytest.approx(hosts["bytes_sent_per_step"] / 2, rel=1e-9)
    kw = dict(sync="hierarchical", workers=8, workers_per_host=2, link_rate="1gbit", compute="emulated:600")
    back = simulate(_cfg(**kw), tmp_path / "back")
    none = simulate(_cfg(**kw, overlap="none"), tmp_path / "none")
    assert back["bytes_sent_per_step"] == pytest.approx(none["bytes_sent_per_step"], rel=1e-9)
    assert 0.6 < back["step_s_p50"] < none["step_s_p50"]
    with pytest.raises(ConfigError, match="no hierarchical overlap"):
        simulate(_cfg(**kw), tmp_path / "flow", flows=True)
    with pytest.raises(ConfigError, match="hierarchical's backward"):
        simulate(_cfg(**{**kw, "overlap": "full"}), tmp_path / "full")


def test_results_topologys_hierarchical_backward_run_is_replayed_within_5_percent():
    """results/simulate/validation.csv: the one overlapped hierarchical run (results/topology, 8 workers, 2 a host,
    50 Mbit), replayed by ``VectorHierarchy.units``."""
    from pathlib import Path

    import pandas as pd

    v = pd.read_csv(Path(__file__).resolve().parent.parent / "results" / "simulate" / "validation.csv")
    row = v[(v["sync"] == "hierarchical") & (v["overlap"] == "backward")]
    assert len(row) == 1 and row["replayed"].iloc[0] == "yes" and bool(row["link_bound"].iloc[0])
    assert abs(float(row["step_ratio"].iloc[0]) - 1) <= 0.05
