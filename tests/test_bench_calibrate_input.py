"""``psring bench`` and ``psring calibrate`` on bad input: one line on stderr and exit 2, before any process
starts or anything is written; a finished bench's or calibration's results are refused, not replaced, unless
``--overwrite``. The refusals run in this process (``psring.cli.main``, ``psring.calibrate.main``: a hang fails at
pytest's timeout); one case of each command, and every case that measures, runs as a user runs it, a subprocess with
a timeout, for the exit code a shell sees."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from psring import calibrate, cli
from psring.bench.runner import parse_size, size_range

TINY = ["--workers", "2", "--strategies", "allreduce", "--iters", "1", "--warmup", "0"]


def one_line_error(r: subprocess.CompletedProcess, prefix: str, *needles: str) -> str:
    """The single stderr line of a refused command (exit 2), which holds every needle."""
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), r.stderr
    for needle in needles:
        assert needle in lines[0], r.stderr
    return lines[0]


def in_process(capsys, main, *args: str) -> subprocess.CompletedProcess:
    """``main(args)`` (``cli.main`` or ``calibrate.main``) in this process, as a finished command: its exit code
    (argparse's ``SystemExit`` too) and what it printed."""
    capsys.readouterr()
    try:
        rc = main(list(args))
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["psring", *args], rc, out, err)


def psring_main(capsys, *args: str) -> subprocess.CompletedProcess:
    """``psring ARGS`` in this process."""
    return in_process(capsys, cli.main, *args)


def calibrate_module(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -m psring.calibrate ...`` (what ``psring calibrate --net emulated`` runs): every flag it has."""
    return subprocess.run([sys.executable, "-m", "psring.calibrate", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, start_new_session=True)


# --- the sizes: no overflow, no endless range -------------------------------------------------------------

@pytest.mark.parametrize("text", ["1e400", "inf", "-inf", "nan", "bogus", "", "0", "-5", "63"])
def test_parse_size_refuses_what_is_no_size_with_a_value_error(text):
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


def test_size_range_refuses_a_range_that_is_upside_down():
    # (a factor below 2, or 0 as the smallest size, never ended, filling memory: only checked where it cannot
    # hang this process, in test_bad_bench_sizes_and_counts_are_one_line's subprocess with its timeout)
    with pytest.raises(ValueError, match="no size range"):
        size_range(1 << 20, 4096, 4)


def test_size_range_still_ends_at_the_largest_size():
    assert size_range(4096, 1 << 20, 4) == [4096, 16384, 65536, 262144, 1 << 20]
    assert size_range(4096, 4096, 4) == [4096]


# --- psring bench: bad flags -----------------------------------------------------------------------------

def test_a_refused_bench_exits_2_with_one_line_in_a_shell(psring, tmp_path):
    out = tmp_path / "bench"
    r = psring.run("bench", *TINY, "--factor", "1", "--min-size", "4K", "--max-size", "16K", "--out", str(out),
                   timeout=30)  # (a factor below 2 used to hang: in a subprocess, which the timeout kills)
    one_line_error(r, "psring: error:", "--factor must be >= 2, got 1")
    assert not out.exists()


@pytest.mark.parametrize("args,needle", [
    (["--sizes", "1e400"], "--sizes: size '1e400' is not a finite number"),
    (["--sizes", ""], "--sizes is empty"),
    (["--min-size", "1M", "--max-size", "4K"], "the smallest size 1M (--min-size) is above the largest 4K"),
    (["--sizes", "8K", "--chunk", "1e400"], "--chunk: size '1e400'"),
])
def test_bad_bench_sizes_and_counts_are_one_line(capsys, tmp_path, args, needle):
    out = tmp_path / "bench"
    r = psring_main(capsys, "bench", *TINY, *args, "--out", str(out))
    one_line_error(r, "psring: error:", needle)
    assert not out.exists()


def test_bench_out_at_a_file_or_where_no_folder_can_be_made_is_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # where an --out '' would write, were it not refused
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    for out, needle in ((afile, "a file is in the way"), (afile / "sub", "cannot make the folder"),
                        ("/proc/psring-test-bench", "cannot make the folder"), ("", "--out is empty")):
        r = psring_main(capsys, "bench", *TINY, "--sizes", "8K", "--out", str(out))
        one_line_error(r, "psring: error:", needle)
    assert afile.read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # (--out '': nothing in the cwd either)


# --- psring bench: a finished bench is refused unless --overwrite -------------------------------------------

@pytest.mark.parametrize("done", ["bench.csv", "bench.txt"])
def test_bench_refuses_a_folder_holding_a_finished_bench(capsys, tmp_path, done):
    out = tmp_path / "earlier"
    out.mkdir()
    earlier = b"strategy,workers,size_bytes,time_s\nallreduce,2,8192,0.001\n"
    (out / done).write_bytes(earlier)
    r = psring_main(capsys, "bench", *TINY, "--sizes", "8K", "--out", str(out))
    one_line_error(r, "psring: error:", str(out), done, "another --out", "--overwrite")
    assert (out / done).read_bytes() == earlier
    assert [p.name for p in out.iterdir()] == [done]  # no spec, no log, no worker: nothing started


def test_bench_overwrite_replaces_the_earlier_bench(psring, tmp_path):
    out = tmp_path / "earlier"
    out.mkdir()
    (out / "bench.csv").write_text("strategy\nearlier\n")
    r = psring.run("bench", "--workers", "1", "--strategies", "allreduce", "--sizes", "4K", "--iters", "1",
                   "--warmup", "0", "--out", str(out), "--overwrite", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    csv = (out / "bench.csv").read_text()
    assert "earlier" not in csv and "raw_allreduce" in csv and "allreduce" in csv
    assert not list(out.glob("*.tmp*"))


# --- psring bench FILE: a bench file that cannot be read, or a key of the wrong kind ---------------------------

@pytest.mark.parametrize("content,needles", [
    (b"\xff\xfe[bench]\nworkers = 2\n", ["not text (UTF-8)"]),
    (b'[bench]\nworkers = "two"\n', ["[bench] workers must be a whole number, got 'two'"]),
    (b"bench = 5\n", ["bench must be a table", "bench = 5"]),
    (b'[bench]\nfactor = "x"\n', ["[bench] factor must be a whole number, got 'x'"]),
    (b"[bench]\nfactor = 1\n", ["[bench] factor must be >= 2, got 1"]),
    (b'[bench]\nmin_size = "1M"\nmax_size = "4K"\n', ["[bench] min_size", "[bench] max_size", "swap them"]),
    (b"[grid]\nsync = ['ps']\n", ["no [bench] table"]),
    (b"[bench\n", ["not valid TOML"]),
])
def test_bad_bench_file_is_one_line_naming_the_file_and_key(capsys, tmp_path, content, needles):
    file, out = tmp_path / "bench.toml", tmp_path / "bench"
    file.write_bytes(content)
    r = psring_main(capsys, "bench", str(file), "--out", str(out))
    one_line_error(r, "psring: error:", str(file), *needles)
    assert not out.exists()


def test_a_flag_still_wins_over_the_bench_file(psring, tmp_path):
    file, out = tmp_path / "bench.toml", tmp_path / "bench"
    file.write_text("[bench]\nfactor = 1\n")  # overridden below: only the flag's value is checked
    r = psring.run("bench", str(file), "--factor", "0", "--out", str(out), timeout=30)  # (in a subprocess: as above)
    line = one_line_error(r, "psring: error:", "--factor must be >= 2, got 0")
    assert str(file) not in line


# --- psring calibrate ------------------------------------------------------------------------------------

@pytest.mark.parametrize("args,needle", [
    (["--sizes", "bogus"], "--sizes: cannot read size 'bogus'"),
    (["--sizes", "0"], "--sizes: size '0' is below 64 bytes"),
    (["--sizes=-5"], "--sizes: size '-5' is below 64 bytes"),
    (["--sizes", "1e400"], "--sizes: size '1e400' is not a finite number"),
    (["--sizes", "64,99999999999999"], "does not fit in this machine's memory"),
    (["--sizes", "64"], "at least two different sizes"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--sizes", ""], "--sizes is empty"),
])
def test_bad_calibrate_flags_are_one_line(capsys, tmp_path, args, needle):
    out = tmp_path / "cal"
    r = psring_main(capsys, "calibrate", "--out", str(out), *args)
    one_line_error(r, "psring: error:", needle)  # (checked by psring calibrate before any network is built)
    assert not out.exists()


@pytest.mark.parametrize("args,needle", [
    (["--sizes", ""], "--sizes is empty"),
    (["--frame-bytes", "1e400"], "--frame-bytes: size '1e400'"),
    (["--timeout", "nan"], "--timeout must be a number of seconds above 0"),
    (["--warmup", "-1"], "--warmup must be >= 0"),
])
def test_bad_calibrate_module_flags_are_one_line(capsys, tmp_path, args, needle):
    out = tmp_path / "cal"
    r = in_process(capsys, calibrate.main, "--out", str(out), *args)
    one_line_error(r, "psring calibrate: error:", needle)
    assert not out.exists()


def test_calibrate_out_at_a_file_or_where_no_folder_can_be_made_is_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    for out, needle in ((afile, "a file is in the way"), ("/proc/psring-test-calibrate", "cannot make the folder"),
                        ("", "--out is empty")):
        r = psring_main(capsys, "calibrate", "--out", str(out), "--sizes", "64,4K", "--repeats", "1")
        one_line_error(r, "psring: error:", needle)  # (psring calibrate makes --out before any network)
    assert afile.read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_calibrate_refuses_a_folder_holding_a_calibration(psring, tmp_path):
    out = tmp_path / "earlier"
    out.mkdir()
    earlier = b'{"alpha_s": 1e-05, "bandwidth_Bps": 1e9}\n'
    (out / "calibration.json").write_bytes(earlier)
    r = psring.run("calibrate", "--out", str(out), "--repeats", "3", timeout=60)
    one_line_error(r, "psring: error:", str(out), "calibration.json", "another --out", "--overwrite")
    assert (out / "calibration.json").read_bytes() == earlier
    assert [p.name for p in out.iterdir()] == ["calibration.json"]
    # (64 B to 32 MB: a busy machine's milliseconds cannot turn the fit's slope negative, as they did to 64 B-64 KB
    # in a CI run on 2026-12-07, "not physical")
    r = psring.run("calibrate", "--out", str(out), "--repeats", "3", "--sizes", "64,32M", "--overwrite", timeout=120)
    assert r.returncode == 0, r.stderr  # asked: replaced by a loopback calibration
    assert json.loads((out / "calibration.json").read_text())["alpha_s"] != 1e-05


def test_calibrate_overwrite_gets_past_the_refusal(tmp_path):
    """With --overwrite the check lets it measure: here against an address where nothing echoes, so it gives
    up at once (one line), and the earlier calibration, which only a finished one replaces, is still whole."""
    from psring.launch.launcher import free_port

    out = tmp_path / "earlier"
    out.mkdir()
    earlier = b'{"alpha_s": 1e-05, "bandwidth_Bps": 1e9}\n'
    (out / "calibration.json").write_bytes(earlier)
    r = calibrate_module("--out", str(out), "--overwrite", "--sizes", "64,4K", "--repeats", "1",
                         "--address", f"tcp://127.0.0.1:{free_port()}", "--timeout", "0.3")
    one_line_error(r, "psring calibrate: error:", "no echo")
    assert (out / "calibration.json").read_bytes() == earlier
