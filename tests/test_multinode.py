"""Multi-node launch, run for real: the README's torchrun commands ("Several hosts"), as written, on two
emulated hosts (network namespaces with hostnames of their own), c10d rendezvous, 2 nodes x 2 workers,
each node with its own output folder (not shared): rank 0's folder ends with every rank's records,
and the result equals the same run under ``psring train``. Nothing is left behind: every process is
in a session of its own, killed at the end whatever happened, and the namespaces go with the network."""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import processes_mentioning
from test_emulated_run import needs_net, no_new_namespaces  # noqa: F401 (a fixture)

from psring.net import EmulatedNetwork

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 180


def readme_commands() -> list[str]:
    """The shell commands of the README's multi-host section, continuation lines joined."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Several hosts (torchrun)"):]
    section = section[:section.index("\n### ", 1)]
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        cmds += [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]
    return [" ".join(c.split()) for c in cmds]


def pick(sync: str) -> tuple[list[tuple[int, str]], str]:
    """(server commands by host, the torchrun command) of one README recipe."""
    cmds = readme_commands()
    runs = [c for c in cmds if c.startswith("torchrun ")]
    if sync == "hierarchical":
        return [], runs[0]
    servers = [(int(c[4]), c.split("$ ", 1)[1]) for c in cmds if re.match(r"HOST\d\$ ", c)]
    return (servers, runs[1]) if sync == "ps" else ([], runs[2])


def on_host(cmd: str, net: EmulatedNetwork, out: Path, node: int) -> list[str]:
    """The command as host ``node`` runs it: HOSTi are the hosts' addresses (their hostnames), torchrun
    and psring this interpreter's, and runs/ a folder of this node's own."""
    for i, h in enumerate(net.hosts):
        cmd = cmd.replace(f"HOST{i}", h.addr)
    argv = shlex.split(cmd.replace("runs/", f"{out}/node{node}/"))
    exe = {"torchrun": [sys.executable, "-m", "torch.distributed.run"], "psring": [sys.executable, "-m", "psring"]}
    return net.exec_prefix(node, hostname=True) + exe[argv[0]] + argv[1:]


def worker_flags(cmd: str) -> list[str]:
    """What follows ``-m psring worker``: the run's own flags."""
    return shlex.split(cmd.split("-m psring worker", 1)[1])


@needs_net
# (--sync allreduce, "runs the same way": the same torchrun path as hierarchical's recipe, whose collectives
# are its subgroups')
@pytest.mark.parametrize("sync", ["hierarchical", "ps", "ps-colocated"])
def test_readme_torchrun_on_two_hosts_equals_psring_train(no_new_namespaces, psring, tmp_path, sync):
    servers, run = pick(sync)
    assert "--nnodes 2 --nproc-per-node 2 --rdzv-backend c10d" in run
    flags = worker_flags(run)
    if "--ps-addrs" in flags:  # psring train starts its own servers
        i = flags.index("--ps-addrs")
        del flags[i:i + 2]
    ref = tmp_path / "ref"
    flags[flags.index("--out") + 1] = str(ref)
    reference = psring.start("train", *flags)  # on loopback, while torchrun runs on the two hosts
    procs: list[subprocess.Popen] = []
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
    env.pop("PSRING_LAUNCHER", None)
    try:
        with EmulatedNetwork(2, "1gbit") as net:
            for node, cmd in servers:
                procs.append(subprocess.Popen(on_host(cmd, net, tmp_path, node), env=env, start_new_session=True,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            nodes = [subprocess.Popen(on_host(run, net, tmp_path, n), env=env, start_new_session=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for n in (0, 1)]
            procs += nodes
            logs = [p.communicate(timeout=TIMEOUT_S)[0] for p in nodes]
            for p, log in zip(nodes, logs):
                assert p.returncode == 0, log[-3000:]
            for p in procs[:len(servers)]:  # hand-started servers exit once every worker said done
                assert p.wait(timeout=30) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    out = tmp_path / "node0" / worker_flags(run)[worker_flags(run).index("--out") + 1].split("/")[-1]
    steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    n_steps = int(worker_flags(run)[worker_flags(run).index("--steps") + 1])
    assert {(r["rank"], r["step"]) for r in steps} == {(r, s) for r in range(4) for s in range(n_steps)}
    assert not (tmp_path / "node1" / out.name / "steps.jsonl").exists()  # rank 0's folder has them all

    _, err = reference.communicate(timeout=TIMEOUT_S)
    assert reference.returncode == 0, err
    a, b = torch.load(out / "model.pt"), torch.load(ref / "model.pt")
    got, want = (json.loads((d / "summary.json").read_text()) for d in (out, ref))
    assert got["link_tuning"] == "probe" and got["probe_rate_Bps"] > 0  # across hosts the link is measured
    if not sync.startswith("ps"):
        # the same collectives in the same order: bit for bit, where both measured links cut the same
        # partitions; else the sums' order differs within a bucket, by rounding only
        if got["partition_bytes"] == want.get("partition_bytes"):
            assert all(torch.equal(a[k], b[k]) for k in a)
        else:
            diff = max((a[k] - b[k]).abs().max().item() for k in a) / max(b[k].abs().max().item() for k in a)
            assert diff <= 1e-4, f"{sync}: partitions {got['partition_bytes']} and {want.get('partition_bytes')}: {diff:.2e}"
    # The PS sums pushes in arrival order, so any two PS runs differ in the last bits, and 20 steps
    # amplify that (measured after 20 steps: up to 3e-5 against parameters up to 0.2; a small bias tensor's
    # own largest element is then 1.7e-3 off, so test_equivalence's per-tensor measure is no use here). A run that
    # lost or doubled a rank's gradients is off by far more than this, and its losses too.
    diff = max((a[k] - b[k]).abs().max().item() for k in a) / max(b[k].abs().max().item() for k in a)
    assert diff <= 1e-3, f"{sync}: torchrun on two hosts and psring train differ by {diff:.2e} of the largest parameter"
    ref_loss = {(x["rank"], x["step"]): x["loss"] for x in map(json.loads, (ref / "steps.jsonl").read_text().splitlines())}
    assert all(abs(x["loss"] - ref_loss[x["rank"], x["step"]]) <= 1e-4 for x in steps)
    if sync == "ps-colocated":  # each node's server, started by its local rank 0, and its records
        assert sorted(p.name for p in (out.parent / out.name / "servers").glob("server*.jsonl")) == \
            ["server0.jsonl", "server1.jsonl"]
    assert not processes_mentioning(str(tmp_path)), "processes left behind"
