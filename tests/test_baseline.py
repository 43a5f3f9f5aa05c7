"""One baseline for every speedup: each run's samples/s over one worker training alone without
communication (``none`` at N=1) with the same settings but communication ones; a sweep that lacks it
gets it added, and a run without one has no speedup (never the strategy's own N=1 run). No processes:
synthetic run tables and sweep files only."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from psring.plot.common import spread_baselines
from psring.plot.speedup import compute_time, figure_speedup, split_series
from psring.sweep import (COMM_KEYS, add_scaling, flat_config, is_baseline, load_sweep, make_config, run_id,
                          varying_keys)

EMULATED = """
[grid]
link_rate = ["100mbit", "1gbit"]
sync = ["allreduce", "ps"]
workers = [1, 2]

[fixed]
net = "emulated"
compute = "emulated:200"
model = "cnn"
batch_size = 8
steps = 5
timeout_s = 300
"""


def table(sweep_text: str, tmp_path, sps) -> pd.DataFrame:
    """The runs.csv rows ``run_sweep`` would write for a sweep file, with samples/s from ``sps(run)``."""
    f = tmp_path / "sweep.toml"
    f.write_text(sweep_text)
    _, runs = load_sweep(f)
    keys = varying_keys(runs)
    rows = [{"run_id": run_id(r, keys), **flat_config(make_config(r, tmp_path / run_id(r, keys))),
             "status": "ok", "error": "", "samples_per_s": sps(r)} for r in runs]
    return add_scaling(pd.DataFrame(rows))


def rows(*specs, **common) -> pd.DataFrame:
    """A run table from (sync, workers, samples/s[, other settings]) tuples."""
    out = []
    for sync, n, sps, *extra in specs:
        out.append({"sync": sync, "workers": n, "servers": 1, "status": "ok", "samples_per_s": sps,
                    "model": "cnn", "compute": "real", "batch_size": 32, "link_rate": "1gbit",
                    "bucket_mb": 4.0 if sync == "ps" else 25.0, **common, **(extra[0] if extra else {})})
    return pd.DataFrame(out)


def test_every_strategy_is_over_the_none_n1_run(tmp_path):
    sps = {("none", 1): 100.0, ("allreduce", 1): 95.0, ("allreduce", 2): 150.0, ("ps", 1): 60.0,
           ("ps", 2): 120.0}
    sweep = '[grid]\nsync = ["none", "allreduce", "ps"]\nworkers = [1, 2]\n[fixed]\nmodel = "cnn"\n'
    df = table(sweep, tmp_path, lambda r: sps.get((r["sync"], r["workers"]), 170.0))
    assert len(df) == 6  # the sweep has its baseline: nothing added
    for r in df.to_dict("records"):
        assert r["speedup"] == pytest.approx(r["samples_per_s"] / 100.0), r["run_id"]
        assert r["efficiency"] == pytest.approx(r["speedup"] / r["workers"])
    ps1 = df[(df["sync"] == "ps") & (df["workers"] == 1)].iloc[0]
    assert ps1["speedup"] == pytest.approx(0.6)  # the PS pays a push+pull at N=1: not 1.0


def test_no_baseline_means_no_speedup():
    df = add_scaling(rows(("ps", 1, 60.0), ("ps", 2, 120.0), ("allreduce", 1, 95.0)))
    assert df["speedup"].isna().all() and df["efficiency"].isna().all()
    failed = rows(("none", 1, 100.0, {"status": "failed"}), ("ps", 2, 120.0))
    assert add_scaling(failed)["speedup"].isna().all()  # a failed baseline is no baseline


def test_communication_settings_do_not_keep_a_run_from_its_baseline():
    df = add_scaling(rows(("none", 1, 100.0, {"net": "loopback", "timeout_s": 120.0}),
                          ("ps", 2, 150.0, {"net": "emulated", "link_rate": "100mbit", "timeout_s": 300.0,
                                            "consistency": "ssp", "straggler": "1:3"}),
                          ("allreduce", 4, 200.0, {"net": "emulated", "backend": "gloo", "overlap": False})))
    assert df["speedup"].tolist() == pytest.approx([1.0, 1.5, 2.0])


@pytest.mark.parametrize("setting,value", [("model", "resnet18"), ("compute", "emulated:200"),
                                           ("batch_size", 16), ("lr", 0.1), ("num_samples", 512)])
def test_a_different_training_setting_is_another_baseline(setting, value):
    df = add_scaling(rows(("none", 1, 100.0), ("ps", 2, 150.0, {setting: value}), ("ps", 2, 120.0)))
    assert math.isnan(df["speedup"].iloc[1]) and df["speedup"].iloc[2] == pytest.approx(1.2)


def test_the_first_matching_baseline_serves_all():
    df = add_scaling(rows(("none", 1, 100.0, {"link_rate": "100mbit"}), ("none", 1, 80.0),
                          ("allreduce", 2, 160.0)))
    assert df["speedup"].tolist() == pytest.approx([1.0, 0.8, 1.6])


def test_load_sweep_adds_the_missing_baseline_first_without_communication_settings(tmp_path):
    f = tmp_path / "emulated.toml"
    f.write_text(EMULATED)
    _, runs = load_sweep(f)
    assert len(runs) == 1 + 2 * 2 * 2
    base = runs[0]
    assert base == {"compute": "emulated:200", "model": "cnn", "batch_size": 8, "steps": 5,
                    "sync": "none", "workers": 1, "servers": 1}  # loopback, default timeout: no root needed
    assert not any(is_baseline(r) for r in runs[1:])
    assert not set(base) & COMM_KEYS
    make_config(base, tmp_path / "b")  # a valid run


def test_adding_the_baseline_keeps_the_sweeps_run_ids(tmp_path):
    """A sweep run before baselines were added finds its finished runs under the same ids."""
    f = tmp_path / "emulated.toml"
    f.write_text(EMULATED)
    _, runs = load_sweep(f)
    keys = varying_keys(runs)
    assert keys == ["sync", "workers", "servers", "link_rate"]  # not net/timeout_s: the baseline lacks them
    ids = [run_id(r, keys) for r in runs]
    assert ids[0] == "sync-none_workers-1_servers-1"  # not named after a link it never used
    assert "sync-ps_workers-2_servers-1_link_rate-100mbit" in ids and len(set(ids)) == len(ids)


def test_one_baseline_per_combination_of_training_settings_deduplicated(tmp_path):
    f = tmp_path / "two.toml"
    f.write_text('[grid]\nmodel = ["cnn", "resnet18_narrow"]\nsync = ["ps"]\nworkers = [2]\n'
                 'servers = [1, "N"]\nbucket_mb = [1.0, 4.0]\n[fixed]\nsteps = 3\n')
    _, runs = load_sweep(f)
    base = [r for r in runs if is_baseline(r)]
    assert [b["model"] for b in base] == ["cnn", "resnet18_narrow"] and len(runs) == 2 + 2 * 2 * 2
    keys = varying_keys(runs)
    assert len({run_id(r, keys) for r in runs}) == len(runs)
    # a none N=1 run that sets communication settings is a baseline all the same: nothing added
    f.write_text('[[runs]]\nsync = "none"\nnet = "emulated"\n[[runs]]\nsync = "ps"\nworkers = 2\n'
                 '[fixed]\nnet = "emulated"\nsteps = 3\n')
    assert [r["sync"] for r in load_sweep(f)[1]] == ["none", "ps"]


def test_emulated_sweep_speedups_over_the_added_baseline(tmp_path):
    df = table(EMULATED, tmp_path, lambda r: 100.0 if is_baseline(r) else 50.0 * r["workers"])
    base = df[df["sync"] == "none"].iloc[0]
    assert base["net"] == "loopback" and base["speedup"] == 1.0
    assert df["speedup"].tolist() == pytest.approx((df["samples_per_s"] / 100.0).tolist())


def test_plots_show_the_baseline_in_every_panel_and_take_compute_from_it():
    base = {"net": "loopback", "forward_s_p50": 0.1, "backward_s_p50": 0.2, "update_s_p50": 0.05}
    others = [(s, n, 50.0 * n, {"net": "emulated", "link_rate": rate, "sync_s_p50": 0.01,
                                "forward_s_p50": 0.5, "backward_s_p50": 0.5, "update_s_p50": 0.5})
              for rate in ("100mbit", "10gbit") for s in ("allreduce", "ps") for n in (1, 2)]
    runs = add_scaling(rows(("none", 1, 100.0, base), *others))
    spread = spread_baselines(runs)
    none = spread[spread["sync"] == "none"]
    assert sorted(none["link_rate"]) == ["100mbit", "10gbit"] and set(none["net"]) == {"emulated"}
    assert len(figure_speedup(runs).axes) == 2 * 2  # a row of panels per link rate, none for loopback
    series = [s for s in split_series(spread) if s.sync == "ps"]
    assert compute_time(spread, series[0]) == pytest.approx(0.35)  # the baseline's, not ps N=1's 1.5
    alone = runs[runs["sync"] != "none"]
    assert compute_time(alone, split_series(alone)[0]) is None  # no fallback to the series' N=1 run


def test_a_run_made_before_an_option_existed_is_still_finished_at_that_options_default(tmp_path):
    import json

    from psring.config import TrainConfig
    from psring.sweep import is_finished

    cfg = TrainConfig(sync="ps", workers=2, servers=2, out=str(tmp_path)).validate()
    old = cfg.to_dict()
    del old["ps_window"]  # config.json of a run made before --ps-window existed
    (tmp_path / "config.json").write_text(json.dumps(old))
    (tmp_path / "summary.json").write_text("{}")
    assert is_finished(tmp_path, cfg)
    cfg.ps_window = 2  # not the default: that run did not run with it
    assert not is_finished(tmp_path, cfg)
