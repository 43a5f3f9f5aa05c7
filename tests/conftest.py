"""Shared helpers: run the ``psring`` CLI as a real subprocess (own process group, hard timeout) and
make sure no process of a test's run survives the test, whatever happened in it."""
from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

# Tests run the suite's processes on loopback; keep torch from oversubscribing the 2-core CI machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The suite runs on two pytest-xdist workers (pyproject's addopts: -n 2 --dist loadfile), a test file at a
# time on one worker, so that a module-scoped fixture (test_equivalence's 23 trainings, the `reference`
# runs it lends to other modules) runs once. These modules build emulated networks (namespaces, veth pairs,
# tc qdiscs), diff `ip netns list` before and after a run (no_new_namespaces), clean up every psring
# namespace and measure link rates: they are one unit, one test at a time on one worker.
NET_MODULES = {"test_net.py", "test_emulated_run.py", "test_big_models_emulated.py", "test_multinode.py",
               "test_topology.py", "test_ps_schedule.py"}
# The longest other files (their tests and module fixtures, minutes each on 2 cores: test_plot's fixture alone 3.9
# min on an AMD EPYC draw, 2026-12-07), handed out right after the net unit, longest first, so that the run's tail
# is short files on both workers rather than one long file on one while the other idles.
LONG_FIRST = ("test_plot.py", "test_equivalence.py", "test_real_code_models.py", "test_ps_compress.py",
              "test_notebooks.py", "test_models.py", "test_own_loop.py", "test_epochs.py")


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile with NET_MODULES as one unit, scheduled first (the longest), then LONG_FIRST. Done here, on
    test ids, because xdist's own grouping (--dist loadgroup) does not group on pytest >= 9.2 (pytest-xdist#1386)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class NetAsOneFile(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "net" if Path(path).name in NET_MODULES else path

        def _assign_work_unit(self, node) -> None:
            for name in reversed(LONG_FIRST):
                for scope in [s for s in self.workqueue if Path(s).name == name]:
                    self.workqueue.move_to_end(scope, last=False)
            if "net" in self.workqueue:  # the longest unit: first, not at the tail
                self.workqueue.move_to_end("net", last=False)
            super()._assign_work_unit(node)

    return NetAsOneFile(config, log)


@pytest.fixture(scope="session", autouse=True)
def shared_zygote():
    """One zygote for every ``psring`` command this test process starts (``PSRING_ZYGOTE``: each command's launcher
    forks its children from a fork of it, ``launch/zygote.py``), so that the suite's few hundred commands do not each
    import torch in a zygote of their own. It ends with this process; a command that finds none starts its own."""
    import shutil
    import tempfile

    from psring.launch.forked import SHARED_ENV

    where = Path(tempfile.mkdtemp(prefix="psring-zygote-"))
    with open(where / "zygote.log", "w") as log:
        hub = subprocess.Popen([sys.executable, "-m", "psring.launch.zygote", "--listen", str(where / "zygote.sock")],
                               stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 60  # it listens before it imports: at once, but on a busy machine
    while not (where / "zygote.sock").exists() and hub.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.environ[SHARED_ENV] = str(where / "zygote.sock")
    try:
        yield
    finally:
        del os.environ[SHARED_ENV]
        hub.terminate()
        try:
            hub.wait(30)
        except subprocess.TimeoutExpired:
            hub.kill()
            hub.wait()
        shutil.rmtree(where, ignore_errors=True)


def pytest_configure(config):
    config.addinivalue_line("markers", "alone: a measurement that needs the machine to itself: under xdist, "
                                       "the other workers finish their current test and wait while it runs")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under xdist every test holds the machine shared, from its setup (module fixtures included) to its
    teardown; an ``alone`` test holds it exclusively, and once it waits no other test starts (the gate)."""
    base = item.config.option.basetemp  # a worker's: <this run's root>/popen-gwN
    if not os.environ.get("PYTEST_XDIST_WORKER") or not base:
        yield
        return
    alone = item.get_closest_marker("alone") is not None
    mode = fcntl.LOCK_EX if alone else fcntl.LOCK_SH
    root = Path(base).parent
    with open(root / "machine.gate", "a") as gate, open(root / "machine.lock", "a") as machine:
        fcntl.flock(gate, mode)
        fcntl.flock(machine, mode)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield


def pids_of(out: Path, role: str, index: int) -> list[int]:
    """PIDs of ``worker i`` / ``server i`` of the run writing to ``out``, started afresh or forked from the zygote
    (``launch.chaos.role_of`` tells them apart)."""
    from psring.launch.chaos import role_of

    return [pid for pid in processes_mentioning(str(out)) if role_of(pid) == f"{role} {index}"]


def processes_mentioning(text: str) -> list[int]:
    """PIDs of live processes whose command line contains ``text`` (e.g. a run's unique out dir)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next((ln for ln in (d / "status").read_text().splitlines() if ln.startswith("State:")), "")
        except OSError:
            continue
        if text in cmd and "zombie" not in state:
            pids.append(int(d.name))
    return pids


def kill_mentioning(text: str) -> None:
    for pid in processes_mentioning(text):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Psring:
    """Start ``python -m psring ...`` in its own session; ``reap`` kills whatever is left of it."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.procs: list[subprocess.Popen] = []

    def start(self, *args: str, **kw) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-m", "psring", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def run(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
        p = self.start(*args)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            pytest.fail(f"psring {' '.join(args)} did not finish in {timeout} s\n{out}\n{err}")
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    def reap(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:  # (stuck in the kernel: the others are reaped all the same)
                    pass
        kill_mentioning(str(self.tmp))


def run_concurrently(runner: Psring, jobs: dict, at_once: int = 3, timeout: float = 300) -> dict:
    """``psring`` runs of ``jobs`` ({key: args}), ``at_once`` at a time: most of a short run is starting
    processes and waiting for peers, which overlap. {key: CompletedProcess}; output goes to files (a pipe
    nobody reads could fill). ``runner.reap()`` kills what is left."""
    pending, running, done = list(jobs.items()), {}, {}
    deadline = time.monotonic() + timeout
    while pending or running:
        while pending and len(running) < at_once:
            key, args = pending.pop(0)
            log = runner.tmp / f"concurrent-{len(done) + len(running)}-{os.getpid()}"
            out, err = open(f"{log}.out", "w+"), open(f"{log}.err", "w+")
            p = subprocess.Popen([sys.executable, "-m", "psring", *args], stdout=out, stderr=err, text=True,
                                 start_new_session=True)
            runner.procs.append(p)
            running[key] = (p, args, out, err)
        for key, (p, args, out, err) in list(running.items()):
            if p.poll() is not None:
                texts = []
                for f in (out, err):
                    f.seek(0)
                    texts.append(f.read())
                    f.close()
                done[key] = subprocess.CompletedProcess(args, p.returncode, *texts)
                del running[key]
        if time.monotonic() > deadline:
            pytest.fail(f"runs {sorted(map(str, running))} did not finish within {timeout} s")
        time.sleep(0.05)
    return done


@pytest.fixture
def psring(tmp_path):
    runner = Psring(tmp_path)
    yield runner
    runner.reap()


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """``reference(n)``: the parameters single-process training on the global batch ends with (``none`` at
    N=1 on batch n*B, test_equivalence's settings), the model every synchronizer at N=n must match. Trained
    once per n for the whole run: test_equivalence, test_ring, test_ddp_compress, test_ps_schedule and
    test_topology all ask, and under xdist the first worker to ask for an n trains it into the workers'
    shared temporary folder while a worker asking at the same time waits on its lock."""
    import torch
    from test_equivalence import B, train_args

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # xdist: this run's root
    cache = {}

    def get(n: int) -> dict:
        if n not in cache:
            model = shared / f"reference-n{n}.pt"
            with open(shared / f"reference-n{n}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
                if not model.exists():
                    tmp = tmp_path_factory.mktemp(f"ref{n}")
                    runner = Psring(tmp)
                    try:
                        r = runner.run(*train_args(tmp / "run", "none", 1, batch=n * B))
                        assert r.returncode == 0, r.stderr
                    finally:
                        runner.reap()
                    (tmp / "run" / "model.pt").rename(model)
            cache[n] = torch.load(model)
        return cache[n]

    return get


def wait_for(cond, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


@contextlib.contextmanager
def serving(srv):
    """Run a ``ParameterServer``'s ``serve()`` in a thread (``srv.thread``; its exit code lands in
    ``srv.result["rc"]``). However the test ends, make the loop return (idle timeout forced: it returns
    after its next 0.5 s poll), join it and close the server."""
    srv.result = {}
    srv.thread = threading.Thread(target=lambda: srv.result.setdefault("rc", srv.serve()), daemon=True)
    srv.thread.start()
    try:
        yield srv
    finally:
        srv.idle_timeout_s = -1
        srv.thread.join(10)
        srv.close()
        assert not srv.thread.is_alive(), "server thread did not end"
