"""psring inside a user's own loop (psring/distributed_optimizer.py): examples/own_loop.py, an ordinary
DataLoader/DistributedSampler loop with one changed line, run under torchrun on loopback, ends where
`psring train` ends on the same global batches (1e-5), and writes the same phase columns."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import run_concurrently
from test_equivalence import max_rel_diff

from psring.launch.launcher import free_port

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "own_loop.py"
SYNCS = {"ps": ("--servers", "1"), "allreduce": (), "ring": ()}


def torchrun(sync: str, out: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(EXAMPLE), "--sync", sync, "--out", str(out)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        o, e = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        o, e = p.communicate()
        pytest.fail(f"torchrun {sync} did not finish in {timeout} s\n{e[-3000:]}")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
    return subprocess.CompletedProcess(cmd, p.returncode, o, e)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """{sync: (own loop's folder, psring train's folder)}; psring train's runs beside the torchrun ones."""
    from conftest import Psring

    tmp = tmp_path_factory.mktemp("own_loop")
    runner = Psring(tmp)
    try:
        jobs = {s: ["train", "--sync", s, "--workers", "2", *extra, "--model", "cnn", "--num-samples", "512",
                    "--batch-size", "16", "--epochs", "1", "--seed", "3", "--lr", "0.05", "--no-eval",
                    "--out", str(tmp / f"train-{s}")] for s, extra in SYNCS.items()}
        done = run_concurrently(runner, jobs, at_once=1)
        for s in SYNCS:
            assert done[s].returncode == 0, done[s].stderr
            r = torchrun(s, tmp / f"own-{s}")
            assert r.returncode == 0, r.stderr[-3000:]
        yield {s: (tmp / f"own-{s}", tmp / f"train-{s}") for s in SYNCS}
    finally:
        runner.reap()


@pytest.mark.parametrize("sync", sorted(SYNCS))
def test_own_loop_matches_psring_train(trained, sync):
    own, ref = trained[sync]
    a, b = torch.load(own / "model.pt"), torch.load(ref / "model.pt")
    assert max_rel_diff(a, b) <= 1e-5
    s = json.loads((own / "summary.json").read_text())
    assert s["steps"] == 16 and s["workers"] == 2
    for k in ("forward_s_p50", "backward_s_p50", "sync_s_p50", "update_s_p50", "data_s_p50", "step_s_p50"):
        assert s[k] is not None and s[k] >= 0, (k, s[k])
    assert s["bytes_sent_per_step"] > 0


def test_a_wrong_optimizer_or_strategy_is_one_line():
    from psring.distributed_optimizer import DistributedOptimizer, optim_config
    from psring.options import ConfigError

    m = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError, match="takes torch.optim.SGD or torch.optim.Adam, got RMSprop"):
        optim_config(torch.optim.RMSprop(m.parameters()))
    with pytest.raises(ConfigError, match="nesterov"):
        optim_config(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, nesterov=True))
    assert optim_config(torch.optim.Adam(m.parameters(), lr=1e-3)).name == "adam"
    with pytest.raises(ConfigError, match="DistributedDataParallel itself"):
        DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m, sync="ddp")
    with pytest.raises(ConfigError, match="overlap='backward'"):
        DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m, overlap="full")
