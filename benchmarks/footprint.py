"""Measure the memory each process of a run takes: the figures behind the launcher's resource check
(psring/launch/resources.py keeps them in a table).

    python benchmarks/footprint.py [--steps 4] [--models cnn,resnet18_narrow,resnet18]

For each model it runs short real runs (``psring train``, and one ``psring bench`` for the bench's
processes) and samples every child's /proc/PID/status every 50 ms, keeping per role (worker, server,
bench worker, echo server) the largest RssAnon (memory of that process alone: heap, tensors, ZeroMQ
buffers) and the largest RssFile (mapped files: mostly torch's shared libraries, which every process
maps from the same page cache, so they count once per machine, not once per process). Every model at
32 x 32 (the table's size; the launcher scales other sizes' activations by their pixels).

  workers at batch 32 and 128 (allreduce and ps, N=2, the larger of the two): a per-model base and a
    per-sample term (activations grow with the batch);
  servers with S=1 and S=2 (ps, N=2): a base plus a term per byte of the server's shard;
  bench workers, echo servers and --floor's SGD echo servers (N=2, S=2) at 4 KB and 32 MB: a base plus
    a term per byte of message (SGD echo: per byte of the parameters it updates, half a message each).

Not a test: it runs a few minutes of CPU-heavy jobs; run it alone on a quiet machine.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROLES = {b"psring.bench.echo": "echo", b"psring.bench.worker": "bench_worker", b"worker": "worker",
         b"server": "server"}


def role_of(pid: int) -> str | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    for key, role in ROLES.items():  # the bench's modules first: their names contain worker too
        if key in argv:
            if role == "echo" and argv[argv.index(b"--update-bytes") + 1] != b"0":
                return "sgd_echo"  # --floor's echo servers: they import torch and hold 2x their part
            return role
    return None


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        kids = children.get(pid, [])
        found += kids
        todo += kids
    return found


def rss(pid: int) -> tuple[int, int]:
    """(RssAnon, RssFile) of ``pid`` in bytes; (0, 0) once it is gone."""
    values = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("RssAnon", "RssFile"):
                values[key] = int(rest.split()[0]) * 1024
    except OSError:
        return 0, 0
    return values.get("RssAnon", 0), values.get("RssFile", 0)


def peaks(argv: list[str], timeout_s: float = 600) -> dict[str, tuple[int, int]]:
    """Run ``psring ARGV``; the largest (RssAnon, RssFile) any process of each role reached."""
    p = subprocess.Popen([sys.executable, "-m", "psring", *argv], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    best: dict[str, tuple[int, int]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while p.poll() is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"psring {' '.join(argv)} did not finish in {timeout_s:.0f} s")
            for pid in descendants(p.pid):
                role = role_of(pid)
                if role is not None:
                    anon, file = rss(pid)
                    old = best.get(role, (0, 0))
                    best[role] = (max(old[0], anon), max(old[1], file))
            time.sleep(0.05)
    finally:
        if p.poll() is None:
            p.kill()
        _, err = p.communicate(timeout=30)
    if p.returncode != 0:
        raise RuntimeError(f"psring {' '.join(argv)} failed: {err.strip()}")
    return best


def train(tmp: Path, name: str, sync: str, model: str, batch: int, steps: int, servers: int = 1) -> dict:
    argv = ["train", "--sync", sync, "--workers", "2", "--model", model, "--batch-size", str(batch),
            "--steps", str(steps), "--image-size", "32", "--num-samples", str(max(256, 2 * batch)),
            "--threads", "1", "--no-eval", "--warmup", "0", "--log-every", "1000", "--out", str(tmp / name)]
    return peaks(argv + (["--servers", str(servers)] if sync == "ps" else []))


def mb(x: float) -> str:
    return f"{x / 2**20:.1f} MiB"


def main() -> int:
    from psring.train.models import build_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--models", default="cnn,resnet18_narrow,resnet18", help="'' for the bench's processes only")
    a = ap.parse_args()
    files = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for model in [m for m in a.models.split(",") if m]:
            nbytes = sum(p.numel() * 4 for p in build_model(model, 0).parameters())
            w = {}
            for batch in (32, 128):
                runs = [train(tmp, f"{model}-{s}-{batch}", s, model, batch, a.steps) for s in ("allreduce", "ps")]
                w[batch] = max(r["worker"][0] for r in runs)
                files += [r[k][1] for r in runs for k in r]
            s1 = train(tmp, f"{model}-s1", "ps", model, 32, a.steps, servers=1)["server"]
            s2 = train(tmp, f"{model}-s2", "ps", model, 32, a.steps, servers=2)["server"]
            per_byte = (s1[0] - s2[0]) / (nbytes / 2)  # S=1 holds the whole model, S=2 half of it
            print(f"{model}: {nbytes:,d} B of parameters; worker {mb(w[32])} at batch 32, "
                  f"{(w[128] - w[32]) / 96 / 1024:.1f} KiB per sample; server S=1 {mb(s1[0])}, S=2 {mb(s2[0])} "
                  f"-> base {mb(s1[0] - per_byte * nbytes)} + {per_byte:.2f} B per shard byte", flush=True)
        small, big = (peaks(["bench", "--workers", "2", "--strategies", "ps", "--sizes", size, "--iters", "3",
                             "--warmup", "1", "--floor", "--out", str(tmp / f"bench-{size}")]) for size in ("4K", "32M"))
        for role, nbytes in (("bench_worker", 32 << 20), ("echo", 32 << 20), ("sgd_echo", 16 << 20)):
            per = (big[role][0] - small[role][0]) / nbytes
            print(f"{role}: {mb(small[role][0])} at 4 KB, {mb(big[role][0])} at 32 MB -> {per:.2f} B per "
                  f"{'parameter' if role == 'sgd_echo' else 'message'} byte", flush=True)
        files += [v[1] for v in (*small.values(), *big.values())]
    print(f"mapped files (shared by all processes, largest seen): {mb(max(files))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
