"""Nothing lost, nothing overcommitted: a finished run is never replaced unless asked (--overwrite), a
running one never; the default output folder is new for every run; a run this machine cannot hold is
refused before anything starts, with the largest N and S that fit; a full disk is named in one line and
leaves no temporary file, and earlier complete files stay intact."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from conftest import processes_mentioning, wait_for
from psring.config import ConfigError, TrainConfig

# one process: most of these tests are about the launcher, and each worker costs a torch import
SMALL = ["--sync", "allreduce", "--workers", "1", "--batch-size", "8", "--num-samples", "256", "--log-every", "1000",
         "--no-eval"]


def tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder``: its digest."""
    return {str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(folder.rglob("*")) if f.is_file()}


def one_line(r) -> str:
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r.stderr.strip()


def test_a_finished_run_is_kept_unless_overwrite(psring, tmp_path):
    out = tmp_path / "run"
    r = psring.run("train", *SMALL, "--steps", "3", "--checkpoint-every", "2", "--out", str(out), timeout=120)
    assert r.returncode == 0, r.stderr
    before = tree(out)
    assert {"summary.json", "steps.jsonl", "model.pt", "config.json", "logs/worker0.log"} <= set(before)

    r = psring.run("train", *SMALL, "--steps", "4", "--out", str(out), timeout=60)
    assert r.returncode == 2 and "holds a finished run" in one_line(r) and "--overwrite" in r.stderr, r.stderr
    assert tree(out) == before  # byte for byte, and nothing added

    # a link schedule an earlier run tuned there (tuned.json) must not be read into this run's summary
    (out / "tuned.json").write_text(json.dumps({"partition_bytes": 12345}) + "\n")
    r = psring.run("train", *SMALL, "--steps", "4", "--out", str(out), "--overwrite", timeout=120)
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps_completed"] == 4 and "partition_bytes" not in summary, summary
    assert not (out / "checkpoint").exists()  # the replaced run's checkpoint went with it


def test_default_output_folder_is_new_for_every_run(psring, tmp_path):
    folders = []
    for _ in range(2):
        p = psring.start("train", *SMALL, "--steps", "2", cwd=tmp_path)
        stdout, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        folders.append(re.search(r"^psring: output: (\S+)$", stdout, re.M).group(1))
    assert folders[0] != folders[1] and all(f.startswith("runs/") for f in folders), folders
    assert all((tmp_path / f / "summary.json").exists() for f in folders)


def test_default_out_names_time_strategy_and_n(tmp_path):
    from psring.launch.outdir import default_out

    first = default_out("ps", 4, tmp_path, now=0)
    assert re.fullmatch(r".*/\d{8}-\d{6}-ps-n4", first)
    Path(first).mkdir()
    assert default_out("ps", 4, tmp_path, now=0) == first + "-2"  # the same second: still a new folder


def test_an_unfinished_run_with_a_checkpoint_is_continued_in_place(psring, tmp_path):
    """A run killed after its checkpoint (here: its summary removed) is refused as a new run's --out, and
    --resume DIR alone continues it there, keeping its records up to the checkpoint."""
    out, two = tmp_path / "run", [*SMALL, "--workers", "2"]
    r = psring.run("train", *two, "--steps", "6", "--checkpoint-every", "2", "--out", str(out), timeout=120)
    assert r.returncode == 0, r.stderr
    (out / "summary.json").unlink()
    r = psring.run("train", *two, "--steps", "6", "--out", str(out), timeout=60)
    assert r.returncode == 2 and f"checkpoint after step 3: continue it with --resume {out}" in one_line(r)

    r = psring.run("train", *two, "--steps", "6", "--resume", str(out), timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"results in {out}" in r.stdout
    records = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert Counter((x["rank"], x["step"]) for x in records) == Counter({(k, s): 1 for k in range(2) for s in range(6)})


def test_a_running_run_is_never_replaced(psring, tmp_path):
    out = tmp_path / "run"
    p = psring.start("train", *SMALL, "--steps", "100000", "--out", str(out))
    try:
        wait_for(lambda: (out / "ranks" / "rank0.jsonl").exists(), 120, "the first run's steps")
        r = psring.run("train", *SMALL, "--steps", "2", "--out", str(out), "--overwrite", timeout=60)
        assert r.returncode == 2 and "in use by a running psring train" in one_line(r)
        assert f"pid {p.pid}" in r.stderr
        assert p.poll() is None
    finally:
        p.kill()
        p.wait(10)
    wait_for(lambda: processes_mentioning(str(out)) == [], 15, "the run's processes to die")


# --- resources ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags,limit", [(["--sync", "ps", "--servers", "9999"], r"--servers (\d+) with --workers 1"),
                                         (["--workers", "5000", "--batch-size", "1"], r"--workers (\d+)\b")])
def test_a_run_beyond_the_machine_is_refused_before_anything_starts(psring, tmp_path, flags, limit):
    out = tmp_path / "run"
    t0 = time.monotonic()
    r = psring.run("train", *flags, "--steps", "2", "--out", str(out), timeout=60)
    line = one_line(r)
    assert r.returncode == 2 and "of memory" in line and "this machine holds at most" in line, line
    assert 1 <= int(re.search(limit, line).group(1)) < 5000, line
    assert not out.exists() and processes_mentioning(str(out)) == []  # nothing touched, nothing started
    assert time.monotonic() - t0 < 30


def test_the_sweeps_own_runs_pass_and_oversubscribed_cores_only_warn(monkeypatch, capsys):
    from psring.launch import resources

    monkeypatch.setattr(resources, "available_bytes", lambda: 20 * 2**30)
    monkeypatch.setattr(resources, "cores", lambda: 2)
    cfg = TrainConfig(sync="ps", workers=8, servers=8, model="resnet18").validate()  # experiments/bandwidth.toml
    resources.check_train(cfg)
    assert "16 processes on 2 cores" in capsys.readouterr().err
    big = TrainConfig(sync="ps", workers=8, servers=8, model="resnet18", batch_size=1024).validate()
    with pytest.raises(ConfigError, match="this machine holds at most --workers 3 with --servers 8"):
        resources.check_train(big)
    resources.check_train(big, force=True)


def test_the_footprint_table_knows_every_model():
    from psring.config import MODELS
    from psring.launch import resources
    from psring.train.models import build_model

    for m in MODELS:
        assert m in resources.WORKER_MIB and m in resources.SERVER
        assert resources.MODEL_BYTES[m] == sum(p.numel() * 4 for p in build_model(m, 0).parameters())


# --- a full disk ------------------------------------------------------------------------------------------

def test_a_failed_write_leaves_the_earlier_file_and_no_temporary(tmp_path, monkeypatch):
    from psring.fileio import WriteError, write_atomic

    f = tmp_path / "summary.json"
    f.write_text("complete\n")

    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(WriteError, match=f"^no space left on device writing {f}$"):
        write_atomic(f, "new\n")
    assert f.read_text() == "complete\n" and sorted(tmp_path.iterdir()) == [f]


def test_an_empty_log_on_a_full_disk_is_named(tmp_path, monkeypatch):
    from psring.launch import watch
    from psring.launch.children import Child

    log = tmp_path / "run" / "logs" / "worker0.log"
    log.parent.mkdir(parents=True)
    log.touch()
    proc = subprocess.Popen(["false"])
    proc.wait(10)
    monkeypatch.setattr(watch, "disk_full", lambda path: True)
    with pytest.raises(watch.LaunchError, match=r"worker 0 .* exit code 1: no space left on device writing .*run"):
        watch.check_alive([Child("worker 0", proc, log)])


@pytest.fixture
def tiny_disk(tmp_path):
    """A tmpfs of 3 MiB (root only): the cnn's model.pt (2.1 MB) fits once, its checkpoint (4.4 MB) never."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True, text=True,
                       timeout=20)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=20)


@pytest.mark.parametrize("what,flags", [("model.pt", ["--steps", "2"]),
                                        ("checkpoint/checkpoint.pt", ["--steps", "4", "--checkpoint-every", "2"])])
def test_a_full_disk_is_named_in_one_line_and_leaves_no_temporary(psring, tiny_disk, what, flags):
    (tiny_disk / "filler").write_bytes(b"\0" * (1 << 20))  # leaves ~2 MiB: the records fit, model.pt does not
    out = tiny_disk / "run"
    r = psring.run("train", *SMALL, *flags, "--out", str(out), timeout=120)
    line = one_line(r)
    assert r.returncode == 1 and f"no space left on device writing {out / what}" in line, line
    assert not [f for f in tiny_disk.rglob("*") if ".tmp" in f.name]
    assert processes_mentioning(str(out)) == []


def test_the_store_port_is_free_and_outside_the_ephemeral_range(tmp_path):
    """``launcher.free_port``: below the range outgoing connections draw from, so concurrent runs' gloo connections
    cannot take rank 0's port before it listens (the EADDRINUSE CI once hit with bind(0)); still free when returned."""
    import socket

    from psring.launch.launcher import ephemeral_low, free_port

    low = ephemeral_low()
    ports = {free_port() for _ in range(20)}
    assert all(1024 <= p < low for p in ports) and len(ports) > 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))
    (tmp_path / "range").write_text("40000\t60999\n")
    assert ephemeral_low(str(tmp_path / "range")) == 40000 and ephemeral_low(str(tmp_path / "none")) == 32768
