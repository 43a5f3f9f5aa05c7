"""The hand-written ring all-reduce (``psring.sync.ring``): it ends where single-process training on the
global batch ends, and it moves exactly the bytes of the bandwidth-optimal ring, 2(N-1)/N * M per worker
(2(N-1) * M summed over the workers, exactly), in 2(N-1) transfers per bucket per worker.

The direct tests spawn N gloo processes on loopback (a file store: no port to race for); every process
is joined with a timeout and killed in a ``finally``."""
from __future__ import annotations

import datetime
import json
import os
from collections import defaultdict

import pytest
import torch
import torch.multiprocessing as mp
from test_equivalence import SMALL_BUCKETS, STEPS, max_rel_diff, train_args

TOL = 1e-5
JOIN_S = 60  # per process; gloo's own timeout (below) fails a stuck transfer well before
GLOO_TIMEOUT_S = 20


def model_grad_bytes() -> int:
    from psring.train.models import build_model

    return sum(p.numel() * p.element_size() for p in build_model("cnn", 3).parameters() if p.requires_grad)


def step_records(run) -> dict[int, list[dict]]:
    """steps.jsonl: step -> one record per rank."""
    steps = defaultdict(list)
    for line in (run / "steps.jsonl").read_text().splitlines():
        rec = json.loads(line)
        steps[rec["step"]].append(rec)
    return steps


@pytest.mark.parametrize("n,overlap", [(2, True), (3, True), (4, False)], ids=["overlap-2", "overlap-3", "no-overlap-4"])
def test_ring_matches_single_process_and_moves_ring_bytes(psring, tmp_path, reference, n, overlap):
    extra = SMALL_BUCKETS + ("--trace",) + (() if overlap else ("--no-overlap",))
    r = psring.run(*train_args(tmp_path / "run", "ring", n, extra=extra))
    assert r.returncode == 0, r.stderr
    diff = max_rel_diff(torch.load(tmp_path / "run" / "model.pt"), reference(n))
    assert diff <= TOL, f"ring N={n} overlap={overlap}: max relative difference {diff:.2e} > {TOL}"

    m, item = model_grad_bytes(), 4
    steps = step_records(tmp_path / "run")
    assert sorted(steps) == list(range(STEPS))  # (every step's checks below: none skipped for want of records)
    for step, recs in steps.items():
        assert sorted(rec["rank"] for rec in recs) == list(range(n)), f"step {step}"
        for rec in recs:
            names = [name for name, _, _ in rec["messages"]]
            buckets = sum(name.startswith("ring bucket ") for name in names)
            transfers = sum(name.startswith("ring b") and not name.startswith("ring bucket ") for name in names)
            assert buckets >= 3, f"only {buckets} buckets: --bucket-mb too large for this test"
            assert transfers == 2 * (n - 1) * buckets, f"step {step} rank {rec['rank']}: {transfers} transfers"
            # every chunk is M/N up to one element; a rank sends 2(N-1) chunks per bucket
            assert abs(rec["bytes_sent"] - 2 * (n - 1) * m / n) <= 2 * item * buckets
            assert rec["ring_wait_s"] >= 0
        # over all ranks every chunk of every bucket is sent exactly 2(N-1) times
        assert sum(rec["bytes_sent"] for rec in recs) == 2 * (n - 1) * m
        assert sum(rec["bytes_recv"] for rec in recs) == 2 * (n - 1) * m


# ---- direct: N gloo processes, buckets of awkward sizes ---------------------------------------------

SIZES = (2, 7, 1000, 4097)  # fewer elements than ranks (empty chunks), not a multiple of N, larger


def _init(rank: int, world: int, store: str, lanes: int = 1):
    import torch.distributed as dist

    from psring.sync.process_group import ProcessGroupInfo
    from psring.sync.reducer import CommThread
    from psring.sync.ring import RingAllReduce

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
    ring = RingAllReduce(ProcessGroupInfo(rank, world, rank, torch.device("cpu"), "gloo", None))
    ring.use_comm(CommThread(GLOO_TIMEOUT_S), lanes)
    return dist, ring


def _bucket(i: int, numel: int, rank: int):
    from psring.sync.buckets import Bucket

    return Bucket(i, 0, 0, numel, [], torch.arange(numel, dtype=torch.float32) * (rank + 1) + rank)


def _reduce_worker(rank: int, world: int, store: str, out: str, lanes: int = 1) -> None:
    """Reduce the SIZES buckets (launched all at once, as --no-overlap does) and save what came out."""
    dist, ring = _init(rank, world, store, lanes)
    try:
        buckets = [_bucket(i, n, rank) for i, n in enumerate(SIZES)]
        for h in [ring.launch(b) for b in buckets]:
            h.wait()
        transfers = ring.take_transfers()
        torch.save({"flat": [b.flat for b in buckets], "wire": [ring.wire_bytes(b) for b in buckets],
                    "transfers": [vars(t) for t in transfers], "left": ring.take_transfers(),
                    "threads": len({id(t) for t in ring.lanes})}, os.path.join(out, f"rank{rank}.pt"))
    finally:
        ring.comm.close()
        ring.use_comm(None)  # closes the other lanes' threads
        dist.destroy_process_group()


def _reduce_worker_2_lanes(rank: int, world: int, store: str, out: str) -> None:
    """``_reduce_worker`` with two buckets at once (``--overlap backward`` and ``full``)."""
    _reduce_worker(rank, world, store, out, lanes=2)


def _dead_peer_worker(rank: int, world: int, store: str, out: str) -> None:
    """Rank 1 leaves after the barrier; rank 0's reduction must fail in the trainer, not hang."""
    dist, ring = _init(rank, world, store)
    dist.barrier()
    if rank == 1:
        os._exit(0)
    try:
        ring.launch(_bucket(0, 4097, rank)).wait()
        result = "no error"
    except Exception as e:  # noqa: BLE001 - what the test looks at
        result = f"{type(e).__name__}: {e}"
    with open(os.path.join(out, "rank0.txt"), "w") as f:
        f.write(result)
    os._exit(0)  # the group lost a member: skip teardown, which would wait for it


def spawn(fn, world: int, tmp_path) -> list[int]:
    """Run ``fn(rank, world, store, out)`` in ``world`` spawned processes; their exit codes."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=fn, args=(r, world, str(tmp_path / "store"), str(tmp_path)), daemon=True)
             for r in range(world)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(JOIN_S)
        return [p.exitcode for p in procs]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)


def chunk_elems(numel: int, n: int, c: int) -> int:
    return len(torch.tensor_split(torch.empty(numel), n)[c])


@pytest.mark.parametrize("n,lanes", [(2, 1), (3, 1), (4, 1), (3, 2), (4, 2)])
def test_transfers_of_one_reduction(tmp_path, n, lanes):
    """Every bucket summed with the schedule's transfers, also with two buckets at once: launch i on lane
    i mod 2, each lane's buckets in launch order, their messages apart by tag."""
    assert spawn(_reduce_worker if lanes == 1 else _reduce_worker_2_lanes, n, tmp_path) == [0] * n
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(n)]
    for r, g in enumerate(got):
        assert g["left"] == [], "take_transfers did not empty the list"
        assert g["threads"] == lanes
        by_bucket = defaultdict(list)
        for t in g["transfers"]:
            by_bucket[t["bucket"]].append(t)
        for lane in range(lanes):
            mine = [t["bucket"] for t in g["transfers"] if t["bucket"] % lanes == lane]
            assert mine == sorted(mine), f"lane {lane}'s buckets did not run in launch order"
        for i, numel in enumerate(SIZES):
            expect = torch.arange(numel, dtype=torch.float32) * (n * (n + 1) // 2) + n * (n - 1) // 2
            assert torch.equal(g["flat"][i], expect), f"rank {r} bucket {i}: not the sum"
            ts = by_bucket[i]
            assert len(ts) == 2 * (n - 1)
            # the schedule of Patarasuk & Yuan: chunk r-k (reduce-scatter), then r+1-k (all-gather)
            assert [(t["phase"], t["step"], t["chunk"]) for t in ts] == \
                [("reduce-scatter", k, (r - k) % n) for k in range(n - 1)] + \
                [("all-gather", k, (r + 1 - k) % n) for k in range(n - 1)]
            assert all(t["src"] == r and t["dst"] == (r + 1) % n and t["end"] >= t["start"] for t in ts)
            assert all(t["bytes"] == 4 * chunk_elems(numel, n, t["chunk"]) for t in ts)
            sent = sum(t["bytes"] for t in ts)
            assert g["wire"][i][0] == sent
            assert abs(sent - 2 * (n - 1) * 4 * numel / n) <= 2 * 4
    for i, numel in enumerate(SIZES):  # over the ring: each chunk sent 2(N-1) times, all received
        assert sum(g["wire"][i][0] for g in got) == sum(g["wire"][i][1] for g in got) == 2 * (n - 1) * 4 * numel


def test_dead_neighbour_raises_in_the_trainer(tmp_path):
    spawn(_dead_peer_worker, 2, tmp_path)
    result = (tmp_path / "rank0.txt").read_text()
    assert result != "no error" and "RuntimeError" in result, result


def test_single_worker_is_a_no_op():
    from psring.sync.process_group import ProcessGroupInfo
    from psring.sync.reducer import CommThread
    from psring.sync.ring import RingAllReduce

    ring = RingAllReduce(ProcessGroupInfo(0, 1, 0, torch.device("cpu"), "gloo", None))
    ring.use_comm(CommThread(5))
    try:
        b = _bucket(0, 10, 0)
        before = b.flat.clone()
        ring.launch(b).wait()
        assert torch.equal(b.flat, before) and ring.wire_bytes(b) == (0, 0) and ring.take_messages() == []
    finally:
        ring.comm.close()


@pytest.mark.parametrize("backend,lanes", [("gloo", 2), ("nccl", 1)])
def test_two_lanes_on_gloo_only(backend, lanes):
    """NCCL pairs point-to-point calls by their order on the communicator, not by tag: there the ring keeps one
    lane whatever ReduceSync offers (no process group is needed to see it)."""
    from psring.sync.process_group import ProcessGroupInfo
    from psring.sync.reducer import CommThread
    from psring.sync.ring import OVERLAP_LANES, RingAllReduce

    ring = RingAllReduce(ProcessGroupInfo(0, 2, 0, torch.device("cpu"), backend, None))
    ring.use_comm(CommThread(5), OVERLAP_LANES)
    try:
        assert len({id(t) for t in ring.lanes}) == lanes and ring.lanes[0] is ring.comm
    finally:
        ring.comm.close()
        ring.use_comm(None)
    assert ring.lanes == []


def test_a_failure_on_one_lane_fails_the_other_lanes_next_bucket_at_once():
    """The lanes share one failure state: once a reduction failed on one lane, a bucket queued on the other is
    not started (its collectives would no longer line up with the ranks'), it fails at once with that error."""
    from psring.sync.process_group import ProcessGroupInfo
    from psring.sync.reducer import CommThread
    from psring.sync.ring import OVERLAP_LANES, RingAllReduce

    ring = RingAllReduce(ProcessGroupInfo(0, 2, 0, torch.device("cpu"), "gloo", None))
    ring.use_comm(CommThread(5), OVERLAP_LANES)
    first, second = ring.lanes
    ran = []
    try:
        def broken():
            raise RuntimeError("peer 1 went away")
        with pytest.raises(RuntimeError, match="peer 1 went away"):
            second.submit(broken).wait()
        with pytest.raises(RuntimeError, match="earlier bucket's reduction failed: peer 1 went away"):
            first.submit(lambda: ran.append("started")).wait()
        assert ran == [] and first.failed is second.failed
    finally:
        ring.comm.close()
        ring.use_comm(None)
