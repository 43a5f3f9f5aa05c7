"""``psring.plot.ps_step``: one PS step read back from traced step records and server records (the names
of ``transport.parse_message``), its stages, the figure and GIF, and nothing drawn without messages."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from psring import plot
from psring.plot.ps_step import animate_ps_step, figure_ps_step, pick_ps_step, stages, step_bound
from psring.sync.ps.transport import parse_message

T_END = 2_000_000.0
PHASES = {"data_s": 0.001, "forward_s": 0.010, "backward_s": 0.020, "sync_s": 0.030, "update_s": 0.0}
SYNC0 = T_END - sum(PHASES.values()) + 0.031  # wall clock of step 0's sync start
MB = 1.04  # each chunk's push, as the names print it (MiB)


def ps_messages(rank: int, servers: int) -> list:
    """A chunk per server, pushed 10 ms apart from 15 ms before the sync began; replies 25 ms after."""
    msgs = []
    for c in range(servers):
        start = -0.015 + 0.010 * c + 0.001 * rank
        msgs.append([f"push chunk {c} to server {c} ({MB:.2f} MB)", start, 0.002])
        msgs.append([f"params of chunk {c} from server {c}", start + 0.002, 0.025])
    return msgs


def make_run(root: Path, name: str = "ps2", n: int = 2, s: int = 2, steps: int = 5, trace: bool = True,
             server_records: bool = True, **cfg) -> Path:
    d = root / name
    (d / "servers").mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"sync": "ps", "workers": n, "servers": s, "warmup": 3,
                                               "trace": trace, "net": "loopback", "link_rate": "1gbit",
                                               "bucket_mb": 4.0, **cfg}))
    recs = [{"rank": r, "step": k, "step_s": sum(PHASES.values()), **PHASES, "time": T_END + k,
             **({"messages": ps_messages(r, s)} if trace else {})} for k in range(steps) for r in range(n)]
    (d / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    for i in range(s if server_records else 0):
        first = SYNC0 - 0.015 + 0.010 * i + 0.002
        (d / "servers" / f"server{i}.jsonl").write_text("".join(json.dumps(
            {"step": k, "t_first_push": first + k, "t_last_push": first + k + 0.001 * (n - 1),
             "t_done": first + k + 0.001 * (n - 1) + 0.004}) + "\n" for k in range(steps)))
    return d


def test_parse_message_reads_the_producers_names():
    assert parse_message(f"push chunk 7 to server 2 ({MB:.2f} MB)") == ("push", 7, 2, round(MB * 2**20))
    assert parse_message("params of chunk 7 from server 2") == ("reply", 7, 2, None)
    for other in ("ring bucket 0 (0.0 MB)", "push chunk x to server 0 (1 MB)", None, 3):
        assert parse_message(other) is None


def test_pick_aligns_messages_and_servers_on_the_wall_clock(tmp_path):
    ps = pick_ps_step(make_run(tmp_path))
    assert (ps.step, ps.workers, ps.n_servers()) == (3, 2, 2)
    pushes = ps.pushes().set_index(["rank", "chunk"])
    assert pushes.loc[(1, 1), "start"] == pytest.approx(SYNC0 + 3 - 0.015 + 0.010 + 0.001)
    assert pushes.loc[(1, 1), "server"] == 1 and pushes["bytes"].iloc[0] == round(MB * 2**20)
    replies = ps.replies().set_index(["rank", "chunk"])
    assert replies.loc[(0, 0), "end"] == pytest.approx(SYNC0 + 3 - 0.015 + 0.002 + 0.025)
    assert ps.sync_starts == pytest.approx({0: SYNC0 + 3, 1: SYNC0 + 3})
    assert sorted(ps.servers["server"]) == [0, 1]
    assert pick_ps_step(make_run(tmp_path, "p", steps=2)).step == 1  # a short run: its last step


def test_stages_in_order(tmp_path):
    ps = pick_ps_step(make_run(tmp_path))
    frames = stages(ps)
    assert [c.split(":")[0] for c, _ in frames] == ["pushes in flight", "every push in", "updated",
                                                     "replies in"]
    times = [t for _, t in frames]
    assert times == sorted(times) and times[-1] == pytest.approx(ps.msgs["end"].max())
    assert len(stages(pick_ps_step(make_run(tmp_path, "bare", server_records=False)))) == 2


def test_bound_only_on_emulated_links(tmp_path):
    assert step_bound(pick_ps_step(make_run(tmp_path)), None) is None
    b = step_bound(pick_ps_step(make_run(tmp_path, "emu", net="emulated", link_rate="100mbit")), None)
    m = 2 * round(MB * 2**20)  # one worker's pushes
    assert b > 2 * m / 2 / 12.5e6  # at least pushing and pulling its share through its 100 Mbit link


def test_figure_and_gif(tmp_path):
    d = make_run(tmp_path)
    assert figure_ps_step(d).axes
    gif = animate_ps_step(d, tmp_path / "out", "ps")
    with Image.open(gif) as im:
        assert im.n_frames == 4
    assert gif.stat().st_size < 1_000_000


def test_plot_results_draws_ps_step(tmp_path):
    make_run(tmp_path / "res")
    paths = plot.plot_results(tmp_path / "res", out=tmp_path / "a", formats=["png"])
    assert {"ps_step_ps2.png", "ps_step_ps2.gif", "timeline_ps2.png"} <= {p.name for p in paths}


@pytest.mark.parametrize("what", ["no-messages", "no-server-records"])
def test_without_messages_or_servers_no_ps_step(tmp_path, what):
    d = make_run(tmp_path / "res", trace=what != "no-messages", server_records=what != "no-server-records")
    paths = plot.plot_results(tmp_path / "res", out=tmp_path / "a", formats=["png"])
    assert not [p for p in paths if p.stem.startswith("ps_step")]
    if what == "no-messages":
        assert pick_ps_step(d) is None
        with pytest.raises(ValueError, match="no PS push/reply messages"):
            figure_ps_step(d)
