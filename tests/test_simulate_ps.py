"""The numpy replays for hundreds of workers held to the flow replay they stand in for: the PS's fluids
(simulate/vector_ps.py at S = 1 and S = N, vector_async.py where 1 < S < N) and hierarchical's rings as one over
the hosts (vector.VectorHierarchy)."""
from __future__ import annotations

import pandas as pd
import pytest

from psring.config import TrainConfig
from psring.simulate.run import simulate, vector_of


def _cfg(**kw) -> TrainConfig:
    base = dict(sync="ps", workers=4, servers=4, model="resnet18", net="emulated", link_rate="100mbit",
                compute="emulated:3000", overlap="none", steps=4, warmup=1, batch_size=32, link_burst="0kb")
    return TrainConfig(**{**base, **kw}).validate()


def _both(tmp_path, cfg, jitter):
    fast = simulate(cfg, tmp_path / "fast", jitter=jitter)
    flows = simulate(cfg, tmp_path / "flows", jitter=jitter, flows=True)
    return fast, flows


@pytest.mark.parametrize("kw,jitter", [
    (dict(), "none"), (dict(servers=1), "lognormal:0.1"), (dict(workers=8, servers=2), "lognormal:0.1"),
    (dict(workers=8, servers=8), "lognormal:0.1"), (dict(link_rate="10gbit", compute="emulated:30"), "none")])
def test_the_ps_fluid_steps_as_the_flow_replay(tmp_path, kw, jitter):
    """At N <= 8: step within 3% and sync within 5% of the flow replay, the same bytes (the same chunk plan and
    window). Past that, with one credit per server and several chunks each, it strays further (the flow
    replay's server answers its workers one after the other, the fluid all at once): benchmarks/fluid_check.py
    measures by how much (results/simulate/fluid_check.csv, read back by tests/test_scale_results.py)."""
    cfg = _cfg(**kw)  # S = N or 1: VectorPS; 1 < S < N: the drifting fluid (run.vector_of)
    assert type(vector_of(cfg, 205e-6)).__name__ == ("AsyncPS" if 1 < cfg.servers < cfg.workers else "VectorPS")
    fast, flows = _both(tmp_path, cfg, jitter)
    assert fast["step_s_p50"] == pytest.approx(flows["step_s_p50"], rel=0.03)
    assert fast["sync_s_p50"] == pytest.approx(flows["sync_s_p50"], rel=0.05)
    assert fast["bytes_sent_per_step"] == pytest.approx(flows["bytes_sent_per_step"], rel=1e-9)


def test_the_ps_fluid_waits_for_the_slowest_worker(tmp_path):
    """BSP: a straggler's late pushes hold every reply back, so every worker's step stretches."""
    even = simulate(_cfg(workers=8, servers=8), tmp_path / "even")
    slow = simulate(_cfg(workers=8, servers=8, straggler="3:1.5"), tmp_path / "slow")
    steps = pd.read_json(tmp_path / "slow" / "steps.jsonl", lines=True)
    assert slow["step_s_p50"] > even["step_s_p50"] + 1.4  # + half of 3 s of compute
    assert steps.groupby("step")["time"].nunique().max() == 1  # all hold the last reply at once


def test_a_tbf_burst_keeps_the_ps_on_the_flow_network(tmp_path):
    assert vector_of(_cfg(link_burst="1mb"), 205e-6) is None


@pytest.mark.parametrize("n,g,rate,jitter,burst", [(8, 2, "100mbit", "lognormal:0.1", "1mb"),
                                                    (16, 4, "10gbit", "none", "0kb")])
def test_hierarchical_as_one_ring_over_the_hosts_is_the_flow_replay(tmp_path, n, g, rate, jitter, burst):
    cfg = _cfg(sync="hierarchical", servers=1, workers=n, workers_per_host=g, link_rate=rate, link_burst=burst,
               compute="emulated:300" if rate == "10gbit" else "emulated:3000")
    assert type(vector_of(cfg, 205e-6)).__name__ == "VectorHierarchy"
    fast, flows = _both(tmp_path, cfg, jitter)
    assert fast["step_s_p50"] == pytest.approx(flows["step_s_p50"], rel=0.03)
    assert fast["bytes_sent_per_step"] == pytest.approx(flows["bytes_sent_per_step"], rel=1e-6)


def test_a_simulated_sweep_replays_its_grid_with_jitter_and_quarter_servers(tmp_path):
    """``[sweep] simulate = true``: psring sweep replays every run (jitter and alpha_us are settings, ``servers =
    "N/4"`` a quarter of N), names runs by them, adds the N=1 baseline and skips finished runs when rerun."""
    from psring.sweep import run_sweep

    (tmp_path / "s.toml").write_text("""
[sweep]
name = "s"
simulate = true
[grid]
workers = [8]
jitter = ["none", "lognormal:0.2"]
[[runs]]
sync = "ps"
servers = "N/4"
[fixed]
model = "resnet18"
compute = "emulated:100"
link_rate = "10gbit"
link_burst = "0kb"
overlap = "none"
steps = 6
warmup = 1
batch_size = 8
alpha_us = 20
""")
    df = run_sweep(str(tmp_path / "s.toml"), str(tmp_path / "out"))
    assert list(df["status"]) == ["ok"] * 3 and list(df["servers"]) == [1, 2, 2]
    ps = df[df["sync"] == "ps"].set_index("jitter")
    assert set(ps.index) == {"none", "lognormal:0.2"} and (ps["alpha_us"] == 20).all()
    assert ps.loc["lognormal:0.2", "step_s_p50"] > ps.loc["none", "step_s_p50"]
    assert ps["speedup"].between(1, 8).all()
    again = run_sweep(str(tmp_path / "s.toml"), str(tmp_path / "out"))
    assert (again["step_s_p50"] == df["step_s_p50"]).all()


def test_a_train_sweep_refuses_simulate_settings(tmp_path):
    from psring.config import ConfigError
    from psring.sweep import load_sweep

    (tmp_path / "s.toml").write_text('[grid]\njitter = ["none"]\n')
    with pytest.raises(ConfigError, match="unknown key.*jitter"):
        load_sweep(tmp_path / "s.toml")


def test_sweep_settings_that_are_no_setting_are_one_line(tmp_path):
    from psring.config import ConfigError
    from psring.simulate.sweep_runs import other_kind, sim_settings
    from psring.sweep import load_sweep

    for bad in ('"N/0"', '"n/4"', '"N/x"'):
        (tmp_path / "s.toml").write_text(f'[grid]\nworkers = [8]\n[fixed]\nsync = "ps"\nservers = {bad}\n')
        with pytest.raises(ConfigError, match="N/K"):
            load_sweep(tmp_path / "s.toml")
    for run, says in [({"alpha_us": -1}, "alpha_us"), ({"alpha_us": "x"}, "alpha_us"), ({"jitter": "g:1"}, "--jitter")]:
        with pytest.raises(ConfigError, match=says):
            sim_settings(run)
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "summary.json").write_text('{"steps_completed": 3}')
    assert other_kind(tmp_path / "r", simulated=True) == "a measured"  # a replay never overwrites a measured run
    assert other_kind(tmp_path / "r", simulated=False) is None
