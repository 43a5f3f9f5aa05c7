"""``psring.plot.ring_steps``: the ring replayed from recorded transfers (``Transfer.from_message``), its
rounds' times beside alpha + (M/N)/B, the figure and GIF, and ``timeline``'s readiness ticks."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from psring import plot
from psring.costmodel import TCP_GOODPUT, Link, save_calibration
from psring.plot.common import new_figure
from psring.plot.ring_steps import animate_ring_steps, figure_ring_steps, pick_ring_step, replay, round_times
from psring.plot.timeline import LABELS, draw_timeline, ready_marks
from psring.sync.ring import ALL_GATHER, REDUCE_SCATTER, Transfer, chunk_sizes, schedule

T_END = 1_000_000.0  # wall clock of every step's end (s)
PHASES = {"data_s": 0.001, "forward_s": 0.010, "backward_s": 0.020, "sync_s": 0.050, "update_s": 0.002}
ROUND = 0.004  # s between the starts of consecutive rounds; a rank's round lasts ROUND * (0.5 + rank / 10)


def sync_start(step: int) -> float:
    return T_END + step - sum(PHASES.values()) + PHASES["data_s"] + PHASES["forward_s"] + PHASES["backward_s"]


def ring_messages(rank: int, n: int, buckets: dict[int, int]) -> list:
    """What a traced rank writes: a summary per bucket and a Transfer message per round (offsets in s)."""
    msgs = []
    for b, numel in buckets.items():
        msgs.append([f"ring bucket {b} ({numel * 4 / 2**20:.1f} MB)", -0.01, 0.02])
        sizes = chunk_sizes(numel, n)
        for i, (phase, k, out, _) in enumerate(schedule(rank, n)):
            start = b * 0.1 + i * ROUND
            t = Transfer(b, phase, k, rank, (rank + 1) % n, out, sizes[out] * 4, start,
                         start + ROUND * (0.5 + rank / 10))
            msgs.append(t.message())
    return msgs


def make_run(root: Path, name: str = "ring4", n: int = 4, steps: int = 5, buckets=None, trace: bool = True,
             ready: bool = False, **cfg) -> Path:
    """A run folder in the real formats: config.json and steps.jsonl (every rank, every step)."""
    buckets = {0: 1000, 1: 100_000} if buckets is None else buckets
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"sync": "ring", "workers": n, "servers": 1, "warmup": 3,
                                               "trace": trace, "net": "loopback", "link_rate": "1gbit", **cfg}))
    lines = []
    for step in range(steps):
        for rank in range(n):
            r = {"rank": rank, "step": step, "step_s": sum(PHASES.values()), **PHASES, "time": T_END + step}
            if trace:
                r["messages"] = ring_messages(rank, n, buckets)
            if ready:
                r["ready"] = [[b, -0.015 + 0.005 * b + 0.01 * (rank == n - 1)] for b in buckets]
            lines.append(json.dumps(r))
    (d / "steps.jsonl").write_text("\n".join(lines) + "\n")
    return d


def full(state, n: int) -> bool:
    return all(c == frozenset(range(n)) for row in state for c in row)


def test_transfer_message_round_trip():
    t = Transfer(3, REDUCE_SCATTER, 2, 1, 2, 0, 524_288, 1.25, 1.5)
    back = Transfer.from_message(t.message())
    assert abs(back.bytes - t.bytes) <= 50
    assert (back.bucket, back.phase, back.step, back.src, back.dst, back.chunk) == (3, REDUCE_SCATTER, 2, 1, 2, 0)
    assert back.start == pytest.approx(1.25) and back.end == pytest.approx(1.5)
    g = Transfer(0, ALL_GATHER, 0, 7, 0, 11, 1400, 0.0, 0.001)
    assert Transfer.from_message(g.message()) == g  # 1.4 kB is exact in the name
    for other in (["ring bucket 1 (2.0 MB)", 0.0, 1.0], ["push chunk 0 to server 0 (1.04 MB)", 0, 1], None,
                  [3, 0.0, 1.0], ["ring b0 reduce-scatter 0: 0->1 chunk 0 (1.4 kB)", 0.0]):
        assert Transfer.from_message(other) is None


@pytest.mark.parametrize("n", [2, 3, 5])
def test_replay_of_recorded_transfers_sums_every_chunk_over_all_workers(tmp_path, n):
    rs = pick_ring_step(make_run(tmp_path, n=n), bucket=1)
    rounds = rs.rounds()
    assert [(ph, k) for ph, k, _ in rounds] == [(REDUCE_SCATTER, k) for k in range(n - 1)] + \
        [(ALL_GATHER, k) for k in range(n - 1)]
    states = replay(rounds, n)
    assert len(states) == 2 * (n - 1) and full(states[-1], n)
    after_rs = states[n - 2]  # reduce-scatter's end: rank r holds chunk r + 1 summed over all N
    assert all(len(after_rs[r][(r + 1) % n]) == n for r in range(n))
    assert max(len(c) for c in states[0][0]) == 2  # one hop: two workers' gradients at most


def test_replay_sees_a_wrong_transfer(tmp_path):
    rs = pick_ring_step(make_run(tmp_path, n=4), bucket=1)
    rounds = rs.rounds()
    ph, k, ts = rounds[1]
    bad = [Transfer(t.bucket, t.phase, t.step, t.src, t.dst, (t.chunk + 1) % 4, t.bytes, t.start, t.end)
           if t.src == 0 else t for t in ts]
    assert not full(replay([*rounds[:1], (ph, k, bad), *rounds[2:]], 4)[-1], 4)
    assert not full(replay(rounds[:-1], 4)[-1], 4)  # a round short


def test_pick_defaults_first_step_after_warmup_largest_bucket(tmp_path):
    d = make_run(tmp_path)
    rs = pick_ring_step(d)
    assert (rs.step, rs.bucket, rs.workers, len(rs.transfers)) == (3, 1, 4, 4 * 6)
    assert rs.bucket_bytes == 400_000  # 4 chunks of 25 000 floats
    assert pick_ring_step(d, step=0, bucket=0).bucket_bytes == 4000
    assert rs.transfers[0].start == pytest.approx(sync_start(3) + 0.1)  # wall clock: sync start + offset
    with pytest.raises(ValueError, match="no ring transfers at step 99"):
        pick_ring_step(d, step=99)


def test_round_times_measured_and_model(tmp_path):
    d = make_run(tmp_path)
    save_calibration(Link(1e-4, 1e8), d / "calibration.json")
    rs = pick_ring_step(d)
    df = round_times(rs, Link(1e-4, 1e8))
    assert len(df) == 6
    assert df["span_s"].tolist() == pytest.approx([ROUND * 0.8] * 6)  # rank 3's round ends last
    assert df["median_s"].tolist() == pytest.approx([ROUND * 0.65] * 6)  # median of 0.5, 0.6, 0.7, 0.8
    assert df["model_s"].tolist() == pytest.approx([1e-4 + 100_000 / 1e8] * 6)  # alpha + (M/N)/B
    assert round_times(rs, None)["model_s"].isna().all()
    emu = pick_ring_step(make_run(tmp_path, "emu", net="emulated", link_rate="100mbit"))
    from psring.plot.ring_steps import ring_link

    link = ring_link(json.loads((tmp_path / "emu" / "config.json").read_text()), Link(2e-4, 1e9))
    assert round_times(emu, link)["model_s"].iloc[0] == pytest.approx(2e-4 + 100_000 / (12.5e6 * TCP_GOODPUT))


def test_figure_and_gif_one_frame_per_round(tmp_path):
    d = make_run(tmp_path, n=3)
    fig = figure_ring_steps(d)
    assert len(fig.axes) == 2 * 2 + 1 + 1  # rounds, times, colorbar
    gif = animate_ring_steps(d, tmp_path / "out", "ring")
    with Image.open(gif) as im:
        assert im.n_frames == 4
    assert gif.stat().st_size < 1_000_000


def test_plot_results_draws_ring_steps_deterministically(tmp_path):
    make_run(tmp_path / "res", n=3, steps=4)
    a = plot.plot_results(tmp_path / "res", out=tmp_path / "a", formats=["png"])
    b = plot.plot_results(tmp_path / "res", out=tmp_path / "b", formats=["png"])
    names = {p.name for p in a}
    assert {"ring_steps_ring4.png", "ring_steps_ring4.gif", "timeline_ring4.png"} <= names
    for pa, pb in zip(a, b):
        assert pa.read_bytes() == pb.read_bytes(), pa.name


def test_no_messages_no_ring_figure(tmp_path):
    d = make_run(tmp_path / "res", trace=False)
    assert pick_ring_step(d) is None
    paths = plot.plot_results(tmp_path / "res", out=tmp_path / "out", formats=["png"])
    assert not [p for p in paths if p.stem.startswith("ring_steps")]
    with pytest.raises(ValueError, match="no ring transfers"):
        figure_ring_steps(d)


def test_timeline_ticks_when_buckets_ready(tmp_path):
    d = make_run(tmp_path, n=3, ready=True)
    marks = ready_marks(d)
    assert len(marks) == 5 * 3 * 2
    late = marks[(marks["step"] == 3) & (marks["bucket"] == 0)].set_index("row")["t"]
    assert late["worker 0"] == pytest.approx(sync_start(3) - 0.015)
    assert late["worker 2"] - late["worker 0"] == pytest.approx(0.01)  # the straggler's, late
    _, axes = new_figure(8, 3)
    draw_timeline(axes[0, 0], d)
    ticks = [ln for ln in axes[0, 0].lines if ln.get_label() == LABELS["ready"]]
    assert len(ticks) == 1 and len(ticks[0].get_xdata()) == 2 * 3 * 2  # steps 3 and 4 drawn
    _, axes = new_figure(8, 3)
    draw_timeline(axes[0, 0], make_run(tmp_path, "plain", n=3))
    assert not [ln for ln in axes[0, 0].lines if ln.get_label() == LABELS["ready"]]


def test_the_figure_counts_the_buckets_beside_one_on_the_other_lane():
    """The committed traced runs: the ring's `full` run since two lanes (results/overlap) had other buckets' rounds
    beside the one drawn; visible's ring, run when the ring had one comm thread, had none."""
    results = Path(__file__).resolve().parents[1] / "results"
    two = pick_ring_step(results / "overlap" / "runs" / ("sync-ring_workers-4_servers-1_compute-emulated:5608_link_rate-"
                                                        "100mbit_link_tuning-auto_overlap-full_steps-8_trace-True_warmup-3"))
    one = pick_ring_step(results / "visible" / "runs" / "sync-ring_workers-4_servers-1_straggler-None")
    assert two.beside >= 1 and one.beside == 0
