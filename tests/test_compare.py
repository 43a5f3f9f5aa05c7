"""``psring compare``'s choice of network, its table beside the model, and its picture (the runs
themselves: tests/test_cli.py on loopback; the emulated preset's figures: results/compare)."""
from __future__ import annotations

import pandas as pd
import pytest

from psring import compare
from psring.net import NetError
from psring.sweep import load_sweep


def test_without_root_it_falls_back_to_loopback_and_says_why_in_one_line(monkeypatch):
    def refuse():
        raise NetError("--net emulated needs root (run as root or use --net loopback)")

    monkeypatch.setattr("psring.net.check_available", refuse)
    net, why = compare.choose_net(None)
    assert net == "loopback" and len(why.splitlines()) == 1
    assert "needs root" in why and "sudo psring compare" in why
    assert compare.choose_net("loopback") == ("loopback", None)
    with pytest.raises(NetError):  # asked for by name: the error itself, not a fallback
        compare.choose_net("emulated")


def test_the_emulated_preset_is_the_classic_picture():
    _, runs = load_sweep(compare.EMULATED)
    got = sorted((r["sync"], r["workers"], r.get("servers", 1) if r["sync"] == "ps" else 1) for r in runs)
    assert got == [("allreduce", 2, 1), ("allreduce", 4, 1), ("none", 1, 1),
                   ("ps", 2, 1), ("ps", 2, 2), ("ps", 4, 1), ("ps", 4, 4)]
    assert all(r.get("net") == "emulated" for r in runs if r["workers"] > 1)
    assert all(r.get("overlap") is False for r in runs if r["workers"] > 1), "sync = all of the communication, as the model bounds"


def table() -> pd.DataFrame:
    row = dict(status="ok", error="", samples_per_s=100.0, sync_share=0.5, cpu_util=0.4, link_rate="50mbit")
    return pd.DataFrame([
        {**row, "sync": "none", "workers": 1, "servers": 1, "speedup": 1.0, "sync_s_p50": 0.0,
         "bound_s": float("nan"), "over_bound": float("nan")},
        {**row, "sync": "allreduce", "workers": 2, "servers": 1, "speedup": 0.8, "sync_s_p50": 0.30,
         "bound_s": 0.35, "over_bound": 0.30 / 0.35},
        {**row, "sync": "ps", "workers": 4, "servers": 1, "speedup": 0.4, "sync_s_p50": 1.40,
         "bound_s": 1.30, "over_bound": 1.40 / 1.30, "step_s_p50": 1.9, "step_over_bound": 1.9 / 1.8},
        {**row, "sync": "ps", "workers": 4, "servers": 4, "speedup": 1.5, "sync_s_p50": 0.26,
         "bound_s": 0.25, "over_bound": 0.26 / 0.25}])


def test_the_table_puts_each_sync_time_beside_its_model():
    lines = compare.format_table(table()).splitlines()
    assert "sync ms model ms  ratio  step ms step/bound" in lines[0]
    ps1 = lines[4].split()
    assert ps1[:3] == ["ps", "4", "1"] and ps1[-6:] == ["1400", "1300", "1.08", "1900", "1.06", "40%"]
    assert lines[3].split()[-6:] == ["300", "350", "0.86", "-", "-", "40%"], "no step bound: none given"
    assert lines[3].split()[2] == "-", "no servers column for all-reduce"
    assert lines[2].split()[-6:] == ["0", "-", "-", "-", "-", "40%"], "no model without communication"


def test_series_and_figure():
    df = table()
    assert [compare.series(r) for r in df.to_dict("records")] == ["none", "allreduce", "ps S=1", "ps S=N"]
    from psring.plot.compare import figure_compare

    fig = figure_compare(df)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["allreduce: measured", "allreduce: model", "ps S=1: measured", "ps S=1: model",
                      "ps S=N: measured", "ps S=N: model"]


def test_an_out_in_a_files_way_is_one_line_before_any_run(tmp_path):
    from psring.compare import run_compare
    from psring.config import ConfigError

    (tmp_path / "afile").write_text("mine")
    with pytest.raises(ConfigError, match="a file is in the way"):
        run_compare(str(tmp_path / "afile"), steps=2, net="loopback")
    assert (tmp_path / "afile").read_text() == "mine"
