"""CPU utilisation of every run: /proc/stat's aggregate line is parsed into (busy, total) jiffies, the
step log stamps every record with them, summarize() turns rank 0's samples over the timed steps into
``cpu_util`` and ``cpu_saturated``, and the speedup figure draws saturated runs hollow."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from psring.metrics import cpu, steps
from psring.metrics.steps import StepLog, StepRecord
from psring.metrics.summary import summarize
from psring.plot.common import HOLLOW_NOTE
from psring.plot.speedup import figure_speedup

# user nice system idle iowait irq softirq steal guest guest_nice
STAT = """cpu  1000 50 300 8000 200 10 40 7 500 5
cpu0 500 25 150 4000 100 5 20 3 250 2
cpu1 500 25 150 4000 100 5 20 4 250 3
intr 12345 0 0
ctxt 67890
"""


def test_parse_stat_sums_all_cores_without_double_counting_guest():
    total = 1000 + 50 + 300 + 8000 + 200 + 10 + 40 + 7  # guest time is inside user/nice already
    assert cpu.parse_stat(STAT) == (total - 8000 - 200, total)
    assert cpu.parse_stat("cpu0 1 2 3 4\nintr 1\n") is None  # no aggregate line
    assert cpu.parse_stat("cpu  1 2 x 4\n") is None


def test_cpu_times_reads_the_file_and_is_none_without_it(tmp_path):
    f = tmp_path / "stat"
    f.write_text(STAT)
    assert cpu.cpu_times(f) == cpu.parse_stat(STAT)
    assert cpu.cpu_times(tmp_path / "absent") is None


def test_step_log_stamps_every_record_and_the_opening_sample_into_the_first(tmp_path, monkeypatch):
    samples = iter([(10, 100), (40, 200), (90, 300)])
    monkeypatch.setattr(steps, "cpu_times", lambda: next(samples))
    with StepLog(tmp_path / "rank0.jsonl") as log:  # takes (10, 100) as it opens
        for step in range(2):
            log.write(StepRecord(0, step, 1.0, 0.1, 0.0, 0.05, 0.05, 0.0, 0.0, 0, 0, 8, 0.0))
    recs = [json.loads(line) for line in (tmp_path / "rank0.jsonl").read_text().splitlines()]
    assert [(r["step"], r["cpu_busy"], r["cpu_total"]) for r in recs] == [(0, 40, 200), (1, 90, 300)]
    assert (recs[0]["cpu_busy0"], recs[0]["cpu_total0"]) == (10, 100) and "cpu_busy0" not in recs[1]

    monkeypatch.setattr(steps, "cpu_times", lambda: None)  # no /proc/stat: the fields are null
    with StepLog(tmp_path / "none.jsonl") as log:
        log.write(StepRecord(0, 0, 1.0, 0.1, 0.0, 0.05, 0.05, 0.0, 0.0, 0, 0, 8, 0.0))
    rec = json.loads((tmp_path / "none.jsonl").read_text())
    assert rec["cpu_busy"] is None and rec["cpu_total0"] is None


def records(busy: list[int], total: list[int], workers: int = 2, opening=(0, 0)) -> pd.DataFrame:
    """Step records of ``workers`` ranks; rank 0 carries the CPU samples given per step (the others'
    would be different, and must not be used)."""
    out = []
    for step, (b, t) in enumerate(zip(busy, total)):
        for rank in range(workers):
            r = {"rank": rank, "step": step, "loss": 1.0, "step_s": 0.1, "data_s": 0.0, "forward_s": 0.05,
                 "backward_s": 0.05, "sync_s": 0.0, "update_s": 0.0, "bytes_sent": 0, "bytes_recv": 0,
                 "samples": 8, "cpu_busy": b if rank == 0 else 0, "cpu_total": t if rank == 0 else 1}
            if step == 0:
                r["cpu_busy0"], r["cpu_total0"] = opening if rank == 0 else (0, 0)
            out.append(r)
    return pd.DataFrame(out)


def test_cpu_util_is_over_the_timed_steps_of_rank_0():
    # warm-up steps 0, 1 ran at 100% (busy == total); the timed steps 2..4 at (350 - 200) / (800 - 200)
    busy, total = [100, 200, 250, 300, 350], [100, 200, 400, 600, 800]
    s = summarize(records(busy, total), workers=2, warmup=2)
    assert s["cpu_util"] == pytest.approx(150 / 600) and s["cpu_saturated"] is False
    # without warm-up the interval starts at the log's opening sample
    s = summarize(records(busy, total, opening=(20, 50)), workers=2, warmup=0)
    assert s["cpu_util"] == pytest.approx((350 - 20) / (800 - 50))


@pytest.mark.parametrize("busy_end,saturated", [(190, True), (189, False), (210, True)])
def test_cpu_saturated_from_90_percent_of_all_cores(busy_end, saturated):
    s = summarize(records([0, 10, busy_end], [0, 100, 300], workers=1), workers=1, warmup=2)
    assert s["cpu_util"] == pytest.approx((busy_end - 10) / 200) and s["cpu_saturated"] is saturated


def test_cpu_util_is_none_for_records_without_samples():
    old = records([0, 0, 0], [0, 0, 0]).drop(columns=["cpu_busy", "cpu_total", "cpu_busy0", "cpu_total0"])
    s = summarize(old, workers=2, warmup=1)
    assert s["cpu_util"] is None and s["cpu_saturated"] is None
    nulls = records([0, 0, 0], [0, 0, 0]).astype({"cpu_busy": object})
    nulls["cpu_busy"] = None
    assert summarize(nulls, workers=2, warmup=1)["cpu_util"] is None


def runs_table(saturated: list | None) -> pd.DataFrame:
    rows = [("none", 1, 1.0), ("allreduce", 1, 0.9), ("allreduce", 2, 1.6), ("allreduce", 4, 2.5)]
    df = pd.DataFrame([{"sync": s, "workers": n, "servers": 1, "speedup": sp, "sync_s_p50": 0.01 * n}
                       for s, n, sp in rows])
    if saturated is not None:
        df["cpu_saturated"] = saturated
    return df


def hollow_points(fig) -> list[tuple]:
    return [(tuple(ln.get_xdata()), tuple(ln.get_ydata()), ln.get_markeredgecolor())
            for ax in fig.axes for ln in ax.lines
            if ln.get_markerfacecolor() == "none" and len(ln.get_xdata())]


def legend_texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]


def test_speedup_figure_draws_saturated_runs_hollow():
    # as read back from runs.csv: a bool column with a gap where a run recorded nothing
    fig = figure_speedup(runs_table([False, False, None, True]))
    speed_ax, sync_ax = fig.axes[:2]
    assert hollow_points(fig) == [((4,), (2.5,), "tab:blue"), ((4,), (40.0,), "tab:blue")]
    filled = next(ln for ln in speed_ax.lines if ln.get_label() == "all-reduce (measured)")
    assert filled.get_markevery() == [True, True, False]  # no filled marker under the hollow one
    assert legend_texts(fig).count(HOLLOW_NOTE) == 1


@pytest.mark.parametrize("saturated", [None, [False] * 4], ids=["no-column", "none-saturated"])
def test_speedup_figure_without_saturation_is_drawn_as_before(saturated):
    fig = figure_speedup(runs_table(saturated))
    assert hollow_points(fig) == [] and HOLLOW_NOTE not in legend_texts(fig)
    assert all(ln.get_markevery() is None for ax in fig.axes for ln in ax.lines)


def test_sync_phase_utilisation_decides_saturation_when_long_enough():
    """A step that waits out emulated compute dilutes the whole-step figure; the sync phase's own
    samples (start and end of Synchronizer.step) say whether the communication ran CPU-bound."""
    df = records([0, 40, 80, 120], [0, 200, 400, 600], workers=1)  # whole steps: 20% busy
    df["cpu_sync"] = [[0, 0, 19, 20], [40, 100, 96, 160], [80, 300, 137, 360], [120, 500, 177, 560]]
    s = summarize(df, workers=1, warmup=1)
    assert s["cpu_util"] == pytest.approx(0.2)
    assert s["cpu_util_sync"] == pytest.approx((56 + 57 + 57) / 180)
    assert s["cpu_saturated"] is True
    df["cpu_sync"] = [[0, 0, 1, 2], [40, 100, 41, 102], [80, 300, 81, 302], [120, 500, 121, 502]]
    s = summarize(df, workers=1, warmup=1)  # 6 ticks of sync: too short to tell, the whole step decides
    assert s["cpu_util_sync"] is None and s["cpu_saturated"] is False


def test_the_cpu_while_communicating_decides_saturation_too():
    """``cpu_util_comm`` (the launcher's, from the link samples) counts as the other two do."""
    from psring.metrics.summary import saturated

    assert saturated({"cpu_util": 0.5, "cpu_util_sync": None, "cpu_util_comm": 0.93}) is True
    assert saturated({"cpu_util": 0.5, "cpu_util_sync": 0.6, "cpu_util_comm": 0.89}) is False
    assert saturated({"cpu_util": 0.5}) is False  # a run without link samples: as before
    assert saturated({"cpu_util": None, "cpu_util_sync": None, "cpu_util_comm": None}) is None


def test_the_timed_window_is_rank_0s_from_the_last_warm_up_step_to_the_end():
    from psring.metrics.summary import timed_window

    recs = [{"rank": r, "step": s, "time": 10.0 * s + r, "step_s": 2.0} for s in range(4) for r in (0, 1)]
    assert timed_window(recs, 2) == (10.0, 30.0)  # from the end of step 1 to the end of step 3
    assert timed_window(recs, 0) == (-2.0, 30.0)  # no warm-up: from the start of the first step
    assert timed_window([r for r in recs if r["rank"] == 1], 2) is None
