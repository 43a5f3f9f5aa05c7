"""``psring sweep --only / --rerun / --list``: a sweep runs the runs it is told to, lists the others in runs.csv,
runs finished ones again only when asked, and never deletes a finished run (it is moved to OUT/replaced/).
On a replayed sweep (``[sweep] simulate = true``): the same code path as a measured one, in seconds."""
from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from psring.sweep import run_sweep

SWEEP = """
[sweep]
name = "picked"
simulate = true
[grid]
sync = ["ring", "ps"]
workers = [2, 4]
[fixed]
servers = "N"
model = "cnn"
compute = "emulated:20"
link_rate = "1gbit"
overlap = "none"
steps = {steps}
warmup = 1
batch_size = 8
"""


def sweep_file(tmp_path, steps=4):
    f = tmp_path / "picked.toml"
    f.write_text(SWEEP.format(steps=steps))
    return f


def statuses(df: pd.DataFrame) -> dict[tuple[str, int], str]:
    return {(r["sync"], r["workers"]): r["status"] for r in df.to_dict("records")}


def test_only_runs_the_selected_runs_and_runs_csv_lists_the_rest(tmp_path, capsys):
    f, out = sweep_file(tmp_path), tmp_path / "out"
    assert run_sweep(str(f), str(out), listing=True, only=["sync=ps"]) is None
    listed = capsys.readouterr().out
    assert re.findall(r": (run|finished earlier, skip)$", listed, re.MULTILINE) == ["run", "run"], listed
    assert "2 of 5 runs selected: 2 to run, 0 finished earlier" in listed  # the none N=1 baseline is added
    assert not out.exists()  # --list writes nothing

    df = run_sweep(str(f), str(out), only=["sync=ps"])
    assert statuses(df) == {("none", 1): "not run", ("ring", 2): "not run", ("ring", 4): "not run",
                            ("ps", 2): "ok", ("ps", 4): "ok"}
    assert df.loc[df["status"] == "not run", "error"].eq("not selected (--only)").all()
    assert df["speedup"].isna().all()  # no baseline yet: no speedup, never another run's
    assert pd.read_csv(out / "runs.csv")["status"].tolist() == df["status"].tolist()

    # values of one key are alternatives, keys must all match; finished runs come back with their figures
    df2 = run_sweep(str(f), str(out), only=["workers=4", "sync=ring", "sync=none"])
    assert statuses(df2) == {("none", 1): "not run", ("ring", 2): "not run", ("ring", 4): "ok", ("ps", 2): "ok",
                             ("ps", 4): "ok"}
    ps = df.set_index("run_id").loc[df2.loc[df2["sync"] == "ps", "run_id"], "step_s_p50"]
    assert (df2.loc[df2["sync"] == "ps", "step_s_p50"].to_numpy() == ps.to_numpy()).all()

    run_sweep(str(f), str(out), listing=True)
    assert "5 of 5 runs selected: 2 to run, 3 finished earlier" in capsys.readouterr().out
    df3 = run_sweep(str(f), str(out))  # the rest, and now every speedup has its baseline
    assert set(df3["status"]) == {"ok"} and df3["speedup"].notna().all()
    assert not (out / "replaced").exists()


def test_a_finished_run_is_moved_aside_never_deleted_when_run_again(tmp_path, capsys):
    f, out = sweep_file(tmp_path), tmp_path / "out"
    run_sweep(str(f), str(out), only=["sync=ps"])
    ps2 = next(p for p in (out / "runs").iterdir() if p.name.startswith("sync-ps_workers-2"))
    first = json.loads((ps2 / "summary.json").read_text())

    run_sweep(str(f), str(out), only=["sync=ps", "workers=2"], listing=True, rerun=True)
    assert "run again (its finished run moved aside first)" in capsys.readouterr().out
    run_sweep(str(f), str(out), only=["sync=ps", "workers=2"], rerun=True)
    assert "its finished run moved to" in capsys.readouterr().out
    kept = list((out / "replaced").iterdir())
    assert [p.name.split(".")[0] for p in kept] == [ps2.name]
    assert json.loads((kept[0] / "summary.json").read_text()) == first  # whole, as it was
    assert (ps2 / "summary.json").exists()

    # the sweep file's settings changed: its finished runs are run under the new ones, the old ones kept
    f = sweep_file(tmp_path, steps=5)
    df = run_sweep(str(f), str(out), only=["sync=ps"])
    assert set(df.loc[df["sync"] == "ps", "steps"]) == {5}
    assert len(list((out / "replaced").iterdir())) == 3
    assert {json.loads((p / "config.json").read_text())["steps"] for p in (out / "replaced").iterdir()} == {4}


@pytest.mark.parametrize("only,needle", [
    ("colour=red", "'colour' is not a setting of a sweep's runs"),
    ("sync", "give KEY=VALUE"),
    ("sync=ddp", "--only sync=ddp selects no run of this sweep (sync takes none, ps, ring)"),
])
def test_bad_only_is_one_line_exit_2_and_touches_nothing(psring, tmp_path, only, needle):
    out = tmp_path / "out"
    r = psring.run("sweep", str(sweep_file(tmp_path)), "--out", str(out), "--only", only, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("psring: error: "), r.stderr
    assert needle in r.stderr and not out.exists()


@pytest.mark.parametrize("text,needle", [
    ("", "no [grid], [[runs]] or [fixed] table: nothing to run"),
    ("grid = 5\n", "[sweep], [grid] and [fixed] are tables, [[runs]] an array of tables"),
    ("runs = [1, 2]\n", "[[runs]] an array of tables"),
    ("[sweep]\nname = 5\n[fixed]\nsteps = 3\n", "[sweep] name and description are text"),
    (b"\xff\xfe[grid]\n", "is not text (UTF-8)"),
    ("[grid]\nworkers = [\"two\"]\n", "--workers must be an integer, got 'two'"),
    ("[grid]\nsteps = [\"3\"]\n", "--steps must be an integer, got '3'"),
    ("[grid]\nlr = [\"fast\"]\n", "--lr must be a finite number, got 'fast'"),
    ("[fixed]\nworkers = \"two\"\nservers = \"N\"\nsync = \"ps\"\n", "--workers must be an integer"),
    ("[fixed]\nlink_rate = \"10xbit\"\n", "--link-rate must be a number and a unit"),
    ("[grid]\nlr = [1" + "0" * 400 + "]\n", "--lr must be a finite number"),  # (an int beyond any float)
    ("[grid]\nworkers = [1979-05-27]\n", "[grid] workers: a setting is text, a number"),
    ("[fixed]\neval = \"yes\"\n", "eval (--no-eval) must be true or false"),
])
def test_a_sweep_file_of_the_wrong_shape_or_types_is_one_line(tmp_path, text, needle):
    from psring.config import ConfigError

    f = tmp_path / "bad.toml"
    f.write_bytes(text) if isinstance(text, bytes) else f.write_text(text)
    with pytest.raises(ConfigError) as e:
        run_sweep(str(f), str(tmp_path / "out"), listing=True)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not (tmp_path / "out").exists()


def test_a_pipe_an_out_that_is_a_file_and_only_that_selects_nothing_are_one_line(tmp_path):
    import os

    from psring.config import ConfigError

    os.mkfifo(tmp_path / "pipe.toml")  # reading it would wait for a writer forever
    with pytest.raises(ConfigError, match="not a regular file"):
        run_sweep(str(tmp_path / "pipe.toml"), str(tmp_path / "out"), listing=True)
    (tmp_path / "afile").write_text("mine")
    with pytest.raises(ConfigError, match="a file is in the way"):
        run_sweep(str(sweep_file(tmp_path)), str(tmp_path / "afile"))
    assert (tmp_path / "afile").read_text() == "mine"
    with pytest.raises(ConfigError, match="select no run together"):
        run_sweep(str(sweep_file(tmp_path)), str(tmp_path / "out"), only=["sync=ps", "workers=1"])
    with pytest.raises(ConfigError, match="--only workers=44 selects no run"):  # a typo beside a good value
        run_sweep(str(sweep_file(tmp_path)), str(tmp_path / "out"), only=["workers=4", "workers=44"], listing=True)
    # a replayed sweep's runs are on the emulated cluster, and --only sees them there
    assert run_sweep(str(sweep_file(tmp_path)), str(tmp_path / "out"), only=["net=emulated"], listing=True) is None


def test_a_replayed_sweep_into_a_measured_sweeps_folder_is_refused_before_writing(tmp_path):
    """The folder's runs.csv and runs stay the measured sweep's: nothing is rewritten as failed."""
    from psring.config import ConfigError
    from psring.sweep import load_sweep, run_id, varying_keys

    f, out = sweep_file(tmp_path), tmp_path / "out"
    _, runs = load_sweep(f)
    measured = out / "runs" / run_id(runs[0], varying_keys([{**r, "net": "emulated"} for r in runs]))
    measured.mkdir(parents=True)
    (measured / "summary.json").write_text(json.dumps({"simulated": False, "steps_completed": 4}))
    (out / "runs.csv").write_text("run_id,status\nmine,ok\n")
    for listing in (True, False):
        with pytest.raises(ConfigError, match=f"holds a measured run \\({measured.name}\\); give this sweep"):
            run_sweep(str(f), str(out), listing=listing)
    assert (out / "runs.csv").read_text() == "run_id,status\nmine,ok\n"
    assert sorted(p.name for p in (out / "runs").iterdir()) == [measured.name]


def test_a_replayed_run_is_held_and_cleared_as_psring_simulate_holds_and_clears_its_out(tmp_path):
    """A replayed sweep's run goes through ``simulate.cli.write_replay``: a folder a running launcher holds is that
    run's failure (one line, the other runs go on), and what an unfinished earlier run left is cleared first."""
    from psring.launch.outdir import RunLock

    f, out = sweep_file(tmp_path), tmp_path / "out"
    ids = {(r["sync"], r["workers"]): r["run_id"] for r in run_sweep(str(f), str(out),
                                                                         only=["sync=none"]).to_dict("records")}
    held, stale = out / "runs" / ids[("ps", 2)], out / "runs" / ids[("ring", 4)]
    (stale / "ranks").mkdir(parents=True)
    (stale / "ranks" / "rank7.jsonl").write_text('{"rank": 7, "step": 0}\n')  # an unfinished N = 8 run's, say
    (stale / "links.jsonl").write_text("{}\n")
    with RunLock(held):
        df = run_sweep(str(f), str(out))
    by = df.set_index("run_id")
    assert by.loc[ids[("ps", 2)], "status"] == "failed" and "in use by a running psring train" in \
        by.loc[ids[("ps", 2)], "error"]
    assert (by.drop(index=ids[("ps", 2)])["status"] == "ok").all()
    assert not (stale / "ranks" / "rank7.jsonl").exists() and not (stale / "links.jsonl").exists()
    assert set(pd.read_json(stale / "steps.jsonl", lines=True)["rank"]) == {0, 1, 2, 3}


def test_a_replayed_sweep_with_a_setting_the_replay_refuses_is_one_line_before_any_run(tmp_path):
    """``[sweep] simulate = true`` with ``checkpoint_every`` (or any setting the simulator does not replay): the
    replay's own checks run on every run first, one line naming the run, and nothing is written."""
    from psring.config import ConfigError

    f = tmp_path / "ckpt.toml"
    f.write_text(SWEEP.format(steps=4) + "checkpoint_every = 2\n")
    with pytest.raises(ConfigError, match=r"^run sync-none_workers-1\S*: psring simulate neither resumes nor writes "):
        run_sweep(str(f), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
