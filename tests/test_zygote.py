"""The zygote (``psring/launch/zygote.py``, ``forked.py``): the launcher's ``psring worker|server`` children are forks
of one process that imported torch, and behave as the processes ``subprocess.Popen`` started: their command line
in ``ps``, their log, environment, working directory and exit code, a signal's minus; ``PSRING_FORK=0`` and any
other command line start afresh. (Every launching test runs its children this way; these pin the contract, the
environment but through every launch: each worker reads its RANK there.)"""
from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import wait_for
from psring.launch.children import Children
from psring.launch.forked import ForkedProc, forkable

PY = [sys.executable, "-m", "psring"]


def test_forkable_command_lines():
    assert forkable([*PY, "worker", "--config", "c.json"]) == (None, ["worker", "--config", "c.json"])
    assert forkable(["/usr/sbin/ip", "netns", "exec", "h0", *PY, "server", "-n", "2"]) == ("h0", ["server", "-n", "2"])
    assert forkable([*PY, "bench-worker", "--spec", "s.json"]) == (None, ["bench-worker", "--spec", "s.json"])
    for other in ([*PY, "train"], [*PY, "bench"], [sys.executable, "-m", "psring.net.links"], ["python3", "-m", "psring", "worker"],
                  ["ip", "netns", "exec", "h0", "sh", "-c", "true"], PY):
        assert forkable(other) is None, other


def _server(tmp_path: Path, name: str) -> list[str]:
    return [*PY, "server", "--workers", "1", "--port", "0", "--bind", "127.0.0.1", "--port-file",
            str(tmp_path / f"{name}.addr"), "--idle-timeout", "60"]


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()


def test_a_forked_server_looks_and_ends_like_a_started_one(tmp_path, monkeypatch):
    kids = Children()
    try:
        monkeypatch.chdir(tmp_path)
        child = kids.spawn("server 0", _server(tmp_path, "s0"), {"PSRING_PROBE": "x", "PATH": "/usr/bin:/bin"},
                           tmp_path / "logs" / "s0.log")
        assert isinstance(child.proc, ForkedProc)
        wait_for(lambda: (tmp_path / "s0.addr").exists(), 60, "the forked server to listen")
        assert _cmdline(child.proc.pid) == " ".join(_server(tmp_path, "s0"))
        assert Path(f"/proc/{child.proc.pid}/cwd").resolve() == tmp_path.resolve()
        assert child.returncode is None and child.proc.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            child.proc.wait(0.2)
        child.proc.send_signal(signal.SIGKILL)  # (a server turns SIGTERM into exit code 143 itself)
        assert child.proc.wait(30) == -signal.SIGKILL and child.returncode == -signal.SIGKILL
    finally:
        kids.stop_all()


def test_exit_codes_and_logs_of_forked_children(tmp_path):
    kids = Children()
    try:
        bad = kids.spawn("server 1", [*PY, "server", "--workers", "0"], {}, tmp_path / "bad.log")
        assert isinstance(bad.proc, ForkedProc)
        assert bad.proc.wait(30) == 2
        assert "workers" in (tmp_path / "bad.log").read_text()  # its one-line error, in its own log
    finally:
        kids.stop_all()


def test_psring_fork_0_and_other_commands_start_afresh(tmp_path, monkeypatch):
    kids = Children()
    try:
        other = kids.spawn("echo", [sys.executable, "-c", "print('afresh')"], {}, tmp_path / "echo.log")
        assert isinstance(other.proc, subprocess.Popen) and other.proc.wait(30) == 0
        monkeypatch.setenv("PSRING_FORK", "0")
        fresh = kids.spawn("server 2", [*PY, "server", "--workers", "0"], {}, tmp_path / "fresh.log")
        assert isinstance(fresh.proc, subprocess.Popen) and fresh.proc.wait(60) == 2
    finally:
        kids.stop_all()
    assert (tmp_path / "echo.log").read_text() == "afresh\n"


def test_stop_all_stops_forked_children(tmp_path):
    kids = Children()
    try:
        child = kids.spawn("server 3", _server(tmp_path, "s3"), {}, tmp_path / "s3.log")
        wait_for(lambda: (tmp_path / "s3.addr").exists(), 60, "the forked server to listen")
        t0 = time.monotonic()
        kids.stop_all(grace_s=5)
        assert child.returncode is not None and time.monotonic() - t0 < 10
    finally:
        kids.stop_all()  # (again: a no-op unless the test failed before the first)
    assert not Path(f"/proc/{child.proc.pid}").exists() or "zombie" in Path(f"/proc/{child.proc.pid}/status").read_text()


def test_a_forked_worker_imports_a_model_from_its_own_working_directory(tmp_path, monkeypatch):
    """``--model MODULE:FACTORY`` from the directory the run starts in (``train.factory`` looks in the working
    directory), though the zygote started elsewhere: a fork works where its launcher does, not where the zygote
    began."""
    from psring.config import TrainConfig
    from psring.launch.launcher import free_port

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "cwdmodel.py").write_text("from torch import nn\n\n\ndef build():\n"
                                          "    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # (for this process's check of the config only)
    cfg = TrainConfig(model="cwdmodel:build", sync="none", workers=1, steps=2, out=str(tmp_path / "out")).validate()
    cfg.save(tmp_path / "config.json")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    kids = Children()
    try:
        monkeypatch.chdir(tmp_path / "elsewhere")  # where the zygote starts, if no test before started it
        kids.spawn("server 4", [*PY, "server", "--workers", "0"], {}, tmp_path / "warm.log").proc.wait(60)
        monkeypatch.chdir(tmp_path)
        child = kids.spawn("worker 0", [*PY, "worker", "--config", str(tmp_path / "config.json")], env,
                           tmp_path / "worker.log")
        assert isinstance(child.proc, ForkedProc)
        assert child.proc.wait(120) == 0, (tmp_path / "worker.log").read_text()[-2000:]
    finally:
        kids.stop_all()
    assert "step     1/2" in (tmp_path / "worker.log").read_text()


def test_a_zygote_that_cannot_start_leaves_children_to_start_afresh(tmp_path, monkeypatch):
    from psring.launch import forked

    tries = []

    def no_socket_pair():
        tries.append(1)
        raise OSError("no SOCK_SEQPACKET here")

    monkeypatch.setattr(forked, "_zygote", None)  # (this process's own one is put back afterwards)
    monkeypatch.delenv(forked.SHARED_ENV, raising=False)
    monkeypatch.setattr(forked, "Zygote", no_socket_pair)
    kids = Children()
    try:
        for i in range(2):  # the failed start is remembered: not tried again for the second child
            child = kids.spawn(f"server {i}", [*PY, "server", "--workers", "0"], {}, tmp_path / f"s{i}.log")
            assert isinstance(child.proc, subprocess.Popen) and child.proc.wait(60) == 2
        assert forked._zygote is False and len(tries) == 1
    finally:
        kids.stop_all()


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_launchers_share_a_listening_zygote_each_through_a_fork_of_its_own(tmp_path):
    """``python -m psring.launch.zygote --listen PATH`` (``PSRING_ZYGOTE``): each launcher that connects gets a fork
    of it as its zygote, which forks its children and ends with its connection; a second one on the same path is
    refused in one line (exit 2); it removes its socket when it ends, and a launcher then finds none."""
    from psring.launch import forked

    sock = tmp_path / "z.sock"
    hub = subprocess.Popen([sys.executable, "-m", "psring.launch.zygote", "--listen", str(sock)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    zygotes = []
    try:
        wait_for(sock.exists, 60, "the shared zygote to listen")
        again = subprocess.run([sys.executable, "-m", "psring.launch.zygote", "--listen", str(sock)],
                               check=False, capture_output=True, text=True, timeout=120)
        assert again.returncode == 2 and again.stderr.count("\n") == 1 and "cannot listen" in again.stderr
        zygotes = [forked.Zygote(str(sock)) for _ in range(2)]
        assert all(z.ready for z in zygotes) and len({z.proc.pid for z in zygotes}) == 2
        assert {_ppid(z.proc.pid) for z in zygotes} == {hub.pid}
        bad = zygotes[0].spawn(["server", "--workers", "0"], dict(os.environ), tmp_path / "bad.log", False, None)
        assert _ppid(bad.pid) == zygotes[0].proc.pid and bad.wait(60) == 2
        assert "workers" in (tmp_path / "bad.log").read_text()
        first = zygotes[0].proc.pid
        zygotes[0].close()  # its zygote ends (the shared one reaps it); the other serves on
        wait_for(lambda: not Path(f"/proc/{first}").exists(), 30, "the first launcher's zygote to end")
        assert zygotes[1].alive() and hub.poll() is None
        hub.terminate()
        assert hub.wait(30) == 0 and not sock.exists()
        wait_for(lambda: zygotes[1].collect(0.1) or not zygotes[1].alive(), 30, "the fork's end to show")
        assert forked._connect(str(sock)) is None and forked._connect(None) is None
    finally:
        for z in zygotes:
            z.close()
        hub.kill()
        hub.wait()


def test_a_shared_zygote_that_never_says_ready_is_left_unharmed_and_unused(tmp_path, monkeypatch):
    """A socket that takes the connection but never answers (or closes it): the launcher gives up on it after
    ``READY_TIMEOUT_S`` and starts its own zygote, signalling nothing (its pid is unknown: not ``kill(0)``, which
    would be this process's own group)."""
    import socket

    from psring.launch import forked

    monkeypatch.setattr(forked, "READY_TIMEOUT_S", 0.5)
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        mute.bind(str(tmp_path / "mute.sock"))
        mute.listen(4)
        assert forked._connect(str(tmp_path / "mute.sock")) is None  # (queued, never accepted)
        t = threading.Thread(target=lambda: mute.accept()[0].close(), daemon=True)
        t.start()
        assert forked._connect(str(tmp_path / "mute.sock")) is None  # accepted and closed: gone at once
        t.join(5)
    finally:
        mute.close()


def test_a_launcher_where_no_shared_zygote_listens_starts_its_own(tmp_path, monkeypatch):
    from psring.launch import forked

    monkeypatch.setattr(forked, "_zygote", None)  # (this process's own one is put back afterwards)
    monkeypatch.setenv(forked.SHARED_ENV, str(tmp_path / "none.sock"))
    kids = Children()
    try:
        bad = kids.spawn("server 5", [*PY, "server", "--workers", "0"], {}, tmp_path / "bad.log")
        assert isinstance(bad.proc, ForkedProc) and isinstance(forked._zygote.proc, subprocess.Popen)
        assert _ppid(bad.proc.pid) == forked._zygote.proc.pid and _ppid(forked._zygote.proc.pid) == os.getpid()
        assert bad.proc.wait(60) == 2
    finally:
        kids.stop_all()
        if forked._zygote:
            forked._zygote.close()


def test_the_zygote_imports_what_a_request_asks_before_its_fork(tmp_path, monkeypatch):
    """``PSRING_PRELOAD`` in a child's environment: the zygote imports it once before the fork (and freezes it
    for the children's collections); a torch built for a GPU imports nothing there. The launcher asks for
    torch._dynamo for the workers of every strategy that builds a torch.optim optimizer, not for the PS's."""
    import gc
    import types

    import torch

    from psring.config import TrainConfig
    from psring.launch import launcher, zygote
    from psring.launch.placement import Placement

    (tmp_path / "zyg_mark.py").write_text("MARK = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        monkeypatch.setattr(torch.version, "cuda", "12.8")
        zygote._preload("zyg_mark")
        assert "zyg_mark" not in sys.modules
        monkeypatch.setattr(torch.version, "cuda", None)
        zygote._preload("zyg_mark,no_such_module_zyg")  # one that fails is left to the child
        assert "zyg_mark" in sys.modules and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        sys.modules.pop("zyg_mark", None)

    envs = {}
    kids = types.SimpleNamespace(spawn=lambda name, argv, env, log, stdout_to_terminal: envs.setdefault(name, env))
    for sync, extra in (("allreduce", {}), ("ps", {"servers": 2})):
        envs.clear()
        cfg = TrainConfig(sync=sync, workers=2, steps=2, out=str(tmp_path / sync), **extra).validate()
        launcher.start_workers(cfg, tmp_path / sync, kids, Placement(cfg), echo=False)
        asked = {env.get(zygote.PRELOAD_ENV) for env in envs.values()}
        assert asked == ({None} if sync == "ps" else {"torch._dynamo"}), (sync, asked)


def test_the_first_request_that_asks_for_an_import_waits_as_long_as_the_zygotes_start(tmp_path, monkeypatch):
    """A fork's pid comes within ``REPLY_TIMEOUT_S``, but the first request with a new ``PSRING_PRELOAD`` also waits
    for the zygote's import (a loaded machine: ``READY_TIMEOUT_S``): a zygote slow there must not be killed with the
    children of other runs it serves."""
    import threading
    import types

    from psring.launch import forked

    waited = []
    z = object.__new__(forked.Zygote)
    z.sock, z.lock, z.pids, z.procs, z.exits, z.preloads = None, threading.Lock(), [], {}, {}, set()
    z.proc = types.SimpleNamespace(kill=lambda: None)
    monkeypatch.setattr(forked.socket, "send_fds", lambda *a: None)
    monkeypatch.setattr(z, "_wait_for", lambda done, timeout: waited.append(timeout))
    data = {"PSRING_PRELOAD_DATA": '[{"name": "synthetic"}]'}
    for env in ({"PSRING_PRELOAD": "torch._dynamo"}, {"PSRING_PRELOAD": "torch._dynamo"}, {}, {}, data, data):
        with pytest.raises(OSError, match="forked no child"):
            z.spawn(["worker"], env, tmp_path / "log", False, None)
    assert waited == [forked.READY_TIMEOUT_S] + [forked.REPLY_TIMEOUT_S] * 3 + \
        [forked.READY_TIMEOUT_S, forked.REPLY_TIMEOUT_S]  # a data set to build: as an import


def test_the_zygote_builds_a_runs_data_sets_once_before_forking_its_workers(tmp_path, monkeypatch):
    """``PSRING_PRELOAD_DATA`` in a worker's environment: the zygote builds those sets before the fork, so the
    worker's ``build_dataset`` finds them (shared with the run's other workers) instead of generating its own; the
    launcher asks for the run's training set, and its test set where the run evaluates; what is not a list of
    sets is ignored (the worker builds its own)."""
    import types

    from psring.config import TrainConfig
    from psring.launch import launcher, zygote
    from psring.launch.placement import Placement
    from psring.train import datasets

    def request(env: dict) -> dict:
        return {"cwd": str(tmp_path), "env": {**os.environ, **env}}

    here = os.getcwd()
    try:
        zygote._prebuild(request({zygote.PRELOAD_DATA_ENV: "not json"}))
        zygote._prebuild(request({zygote.PRELOAD_DATA_ENV: '{"name": "synthetic"}'}))
        assert datasets._prebuilt == {}
        envs = {}
        kids = types.SimpleNamespace(spawn=lambda name, argv, env, log, stdout_to_terminal: envs.setdefault(name, env))
        for evaluate in (True, False):
            envs.clear()
            cfg = TrainConfig(sync="ring", workers=2, steps=2, num_samples=48, batch_size=8, seed=3, eval=evaluate,
                              out=str(tmp_path / f"{evaluate}")).validate()
            launcher.start_workers(cfg, tmp_path, kids, Placement(cfg), echo=False)
            asked = {env.get(zygote.PRELOAD_DATA_ENV) for env in envs.values()}
            assert len(asked) == 1
            zygote._prebuild(request({zygote.PRELOAD_DATA_ENV: asked.pop()}))
            train = datasets.build_dataset(cfg.dataset, cfg.num_samples, cfg.seed, cfg.data_dir,
                                           image_size=cfg.input_size)  # as trainer.worker_batches calls it
            made = [id(d) for d in datasets._prebuilt.values()]
            assert id(train) in made and len(train) == 48
            test = datasets.build_dataset(cfg.dataset, None, cfg.seed, cfg.data_dir, "test", cfg.input_size)
            assert (id(test) in made) == evaluate and len(made) == 1 + evaluate
        # a folder (or a file, or CIFAR-10) is found by the worker's own directory and environment: not asked for
        cfg = TrainConfig(sync="ring", workers=2, steps=2, dataset=f"folder:{tmp_path}", batch_size=1,
                          out=str(tmp_path / "folder"))
        assert launcher.worker_datasets(cfg) == []
        env, cwd = dict(os.environ), os.getcwd()
        zygote._prebuild(request({zygote.PRELOAD_DATA_ENV: json.dumps({"run": "r", "sets": [{"name": "synthetic"}]})}))
        assert dict(os.environ) == env and os.getcwd() == cwd  # (a child's title takes the environment's room)
        [made] = datasets._prebuilt.values()
        zygote._prebuild(request({zygote.PRELOAD_DATA_ENV: json.dumps({"run": "r", "sets": [{"name": "synthetic"}]})}))
        assert list(datasets._prebuilt.values()) == [made]  # the launch's next worker
        zygote._prebuild(request({zygote.PRELOAD_DATA_ENV: json.dumps({"run": "s", "sets": [{"name": "synthetic"}]})}))
        assert next(iter(datasets._prebuilt.values())) is not made  # the next launch's own
    finally:
        os.chdir(here)
        datasets.prebuild([])
        gc.unfreeze()
