"""Parameter-server semantics: the server's optimizers (SGD, Adam), the two designs (server-optimizer,
aggregate), the consistency models (BSP, SSP, ASP) and their staleness records.

Store-level tests feed pushes in chosen orders (a straggler is a worker whose pushes come late); the
end-to-end tests run ``psring train`` (cnn, N = 2..4, a few steps) and compare final parameters with
single-process training on the global batch (BSP), or read the servers' staleness records (SSP/ASP).
"""
from __future__ import annotations

import json
import os
import random

import pytest
import torch
from test_ps import server  # noqa: F401 - a fixture used by name

from psring.config import OptimConfig
from psring.sync.base import make_local_optimizer
from psring.sync.ps import protocol as P
from psring.sync.ps.consistency import Semantics
from psring.sync.ps.optimizers import optim_header
from psring.sync.ps.store import ShardStore

ADAM = {"name": "adam", "lr": 1e-3, "betas": [0.8, 0.99], "eps": 1e-7, "weight_decay": 5e-4}
SGD = {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4}
PLAIN = {"name": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0}


def optim_cfg(d: dict) -> OptimConfig:
    return OptimConfig(**{**d, "betas": tuple(d.get("betas", (0.9, 0.999)))})


# --- server optimizers ------------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [1, 2])
def test_store_adam_matches_torch_adam(workers):
    """Server Adam (one worker: straight from split frames; two: on the mean) equals torch.optim.Adam
    (fused: bit for bit; the default single-tensor one: within 1e-6)."""
    torch.manual_seed(0)
    init = torch.randn(5000)
    store = ShardStore(workers)
    store.init([("w", init)], ADAM)
    ref = {f: torch.nn.Parameter(init.clone()) for f in (True, False)}
    opts = {f: torch.optim.Adam([p], lr=1e-3, betas=(0.8, 0.99), eps=1e-7, weight_decay=5e-4, fused=f)
            for f, p in ref.items()}
    for t in range(5):
        gs = [torch.randn(5000) for _ in range(workers)]
        for w, g in enumerate(gs):
            metas, frames = P.encode_tensors([("w", g)], 4096)
            store.push(w, t, P.decode_tensors({"tensors": metas}, [bytes(f) for f in frames]))
        mean = gs[0].clone() if workers == 1 else (gs[0] + gs[1]).div_(2)
        for f, p in ref.items():
            p.grad = mean.clone()
            opts[f].step()
        assert torch.equal(store.params["w"], ref[True].detach()), t
        assert (store.params["w"] - ref[False].detach()).abs().max() <= 1e-6, t


def test_local_optimizer_follows_the_config():
    """make_local_optimizer: fused SGD or fused Adam with the config's hyper-parameters; grad_divisor
    divides the gradient as the kernel reads it."""
    p = [torch.nn.Parameter(torch.ones(4))]
    sgd = make_local_optimizer(p, optim_cfg(SGD))
    assert isinstance(sgd, torch.optim.SGD) and sgd.defaults["fused"] and sgd.defaults["momentum"] == 0.9
    adam = make_local_optimizer(p, optim_cfg(ADAM), grad_divisor=2)
    assert isinstance(adam, torch.optim.Adam) and adam.defaults["fused"]
    assert adam.defaults["betas"] == (0.8, 0.99) and adam.defaults["eps"] == 1e-7
    ref = torch.nn.Parameter(torch.ones(4))
    p[0].grad, ref.grad = torch.full((4,), 6.0), torch.full((4,), 3.0)
    adam.step()
    torch.optim.Adam([ref], lr=1e-3, betas=(0.8, 0.99), eps=1e-7, weight_decay=5e-4, fused=True).step()
    assert torch.equal(p[0].detach(), ref.detach())


@pytest.mark.parametrize("optim,semantics,msg", [
    ({"name": "adagrad"}, {}, "optimizer"),
    ({"name": "sgd", "nesterov": True}, {}, "unknown field"),
    ({"lr": -1.0}, {}, "lr"),
    ({"lr": "fast"}, {}, "lr"),
    ({"name": "adam", "betas": [0.9]}, {}, "betas"),
    ({"name": "adam", "eps": 0.0}, {}, "eps"),
    (SGD, {"design": "gossip"}, "design"),
    (SGD, {"consistency": "eventual"}, "consistency"),
    (SGD, {"consistency": "ssp", "staleness": -1}, "staleness"),
    (SGD, {"consistency": "ssp", "staleness": 1.5}, "staleness"),
    (SGD, {"design": "aggregate", "consistency": "asp"}, "bsp"),
])
def test_init_rejects_unknown_or_bad_settings(optim, semantics, msg):
    """Unknown optimizers, fields, designs and consistency models are protocol errors; the store stays
    uninitialised and a good init still works afterwards."""
    store = ShardStore(2)
    with pytest.raises(P.ProtocolError, match=msg):
        store.init([("w", torch.zeros(3))], optim, semantics)
    assert not store.initialized and store.params == {}
    store.init([("w", torch.zeros(3))], optim_header(optim_cfg(ADAM)), Semantics("aggregate").header())
    assert store.aggregate and store.cfg.name == "adam" and store.cfg.betas == (0.8, 0.99)


# --- aggregate design -------------------------------------------------------------------------------
def test_aggregate_sums_without_updating_and_double_buffers():
    """aggregate: the reply is the sum of the N gradients (split frames too), the parameters never change,
    and step t+1's first push does not overwrite step t's sum (its replies may still be leaving)."""
    store = ShardStore(2)
    store.init([("w", torch.ones(3000)), ("b", torch.zeros(2))], SGD, {"design": "aggregate"})
    sums = []
    for t in range(3):
        gs = [[("w", torch.randn(3000)), ("b", torch.randn(2))] for _ in range(2)]
        for w in (0, 1):
            metas, frames = P.encode_tensors(gs[w], 1024)
            store.push(w, t, P.decode_tensors({"tensors": metas}, [bytes(f) for f in frames]))
            assert store.reply_ready(["w", "b"], t) == (w == 1)
        version, named = store.reply(0, ["w", "b"], t)
        assert version == t + 1 and store.version == t + 1
        expect = {k: torch.zeros_like(a).add_(a).add_(b) for (k, a), (_, b) in zip(*gs)}
        assert all(torch.equal(v, expect[k]) for k, v in named)
        sums.append((named, expect))
        if t:  # the previous step's buffers still hold its sums
            prev, prev_expect = sums[-2]
            assert all(torch.equal(v, prev_expect[k]) for k, v in prev)
    assert torch.equal(store.params["w"], torch.ones(3000)) and torch.equal(store.params["b"], torch.zeros(2))


# --- consistency models -----------------------------------------------------------------------------
KEYS = [("a", torch.zeros(4)), ("b", torch.zeros(3))]


def g(value: float) -> list:
    return [(k, torch.full_like(t, value)) for k, t in KEYS]


def new_async(workers: int, consistency: str, k: int = 2, optim=PLAIN) -> ShardStore:
    store = ShardStore(workers)
    store.init(KEYS, optim, {"consistency": consistency, "staleness": k})
    for w in range(workers):
        store.read_values(w)  # every worker pulls version 0
    return store


def test_asp_applies_each_push_as_is_and_answers_at_once():
    """ASP: every push is its own SGD step with the worker's gradient (no 1/N), answered at once with the
    current values; the version is the slowest worker's clock."""
    store = new_async(3, "asp")
    store.push(0, 0, g(1.0))
    assert store.reply_ready(["a", "b"], 0)
    version, named = store.reply(0, ["a", "b"], 0)
    assert version == 0 and all(torch.equal(t, torch.full_like(t, -0.1)) for _, t in named)
    store.push(0, 1, g(1.0))  # worker 0 runs ahead: not waiting for anyone
    store.push(1, 0, g(2.0))
    assert torch.allclose(store.params["a"], torch.full((4,), -0.4))
    assert store.version == 0 and store.push(2, 0, g(0.0)) is True and store.version == 1
    assert named[0][1].data_ptr() != store.params["a"].data_ptr()  # replies are copies under ASP/SSP
    with pytest.raises(P.ProtocolError, match="step"):
        store.push(1, 0, g(1.0))  # worker 1 is at step 1 now
    with pytest.raises(P.ProtocolError, match="twice"):
        store.push(0, 2, [g(1.0)[0], g(1.0)[0]])


def run_schedule(store: ShardStore, order: list[int], steps: int, buckets: list[list[int]]) -> list:
    """Drive ``store`` like PSSync workers would: each worker pushes its buckets of step t as pushpulls
    and starts step t+1 only once all of them were answered. ``order`` picks which worker acts next (a
    worker that cannot act, being blocked or finished, is skipped). Returns the (worker, step) order."""
    n = store.workers
    step, nxt, waiting = [0] * n, [0] * n, [[] for _ in range(n)]
    log = []
    for w in order:
        if step[w] >= steps:
            continue
        if nxt[w] < len(buckets):  # push the next bucket of this step
            keys = [KEYS[i][0] for i in buckets[nxt[w]]]
            named = [(k, torch.randn(dict(KEYS)[k].shape)) for k in keys]
            store.push(w, step[w], named)
            waiting[w].append(keys)
            nxt[w] += 1
        still = []
        for keys in waiting[w]:
            if store.reply_ready(keys, step[w]):
                store.reply(w, keys, step[w])
            else:
                still.append(keys)
        waiting[w] = still
        if nxt[w] == len(buckets) and not waiting[w]:
            log.append((w, step[w]))
            step[w], nxt[w] = step[w] + 1, 0
    return log


def straggler_order(workers: int, slow: int, length: int, seed: int) -> list[int]:
    """A random schedule in which worker ``slow`` gets a turn 1/8 as often as each other worker."""
    rng = random.Random(seed)
    weights = [1 if w == slow else 8 for w in range(workers)]
    return rng.choices(range(workers), weights, k=length)


@pytest.mark.parametrize("k", [0, 1, 3])
def test_ssp_bound_holds_under_a_straggler(k):
    """SSP with bound k and a straggler: every applied gradient has staleness <= k (clock units) and
    delay <= (N-1)(2k+1) (updates missed); no worker ever completes a step more than k + 1 ahead of the
    slowest one; the bound is reached (the schedule does exercise it)."""
    n, steps = 4, 12
    store = new_async(n, "ssp", k)
    log = run_schedule(store, straggler_order(n, 3, 4000, seed=k), steps, buckets=[[1], [0]])
    stale, delay = store.take_staleness()
    assert sum(stale.values()) == n * steps * 2 and store.version == steps
    assert max(stale) == k, stale  # reached, never exceeded
    assert max(delay) <= (n - 1) * (2 * k + 1), delay
    done = [0] * n
    for w, t in log:
        done[w] = t + 1
        assert done[w] - min(done) <= k + 1, (w, t, done)


def test_asp_staleness_grows_with_a_straggler_and_bsp_has_none():
    """The same skewed schedule: ASP's staleness far exceeds any small bound; BSP records only zeros."""
    n, steps = 4, 12
    asp = new_async(n, "asp")
    run_schedule(asp, straggler_order(n, 3, 4000, seed=1), steps, buckets=[[1], [0]])
    stale, delay = asp.take_staleness()
    assert sum(stale.values()) == n * steps * 2 and max(stale) >= 4 and max(delay) > (n - 1) * 3, stale
    bsp = ShardStore(n)
    bsp.init(KEYS, PLAIN)
    run_schedule(bsp, straggler_order(n, 3, 4000, seed=1), steps, buckets=[[1], [0]])
    stale, delay = bsp.take_staleness()
    assert stale == {0: n * steps * 2} and delay == {0: n * steps * 2}


def test_ssp_k0_waits_like_bsp():
    """k = 0: a worker's last pushpull of step t is answered only once every worker completed step t."""
    store = new_async(2, "ssp", k=0)
    store.push(0, 0, g(1.0))
    assert not store.reply_ready(["a", "b"], 0)
    store.push(1, 0, g(1.0)[:1])
    assert not store.reply_ready(["a", "b"], 0)
    assert store.push(1, 0, g(1.0)[1:]) is True
    assert store.reply_ready(["a", "b"], 0) and store.reply_ready(["a"], 0)
    assert not store.reply_ready(["a", "b"], 1)


# --- live server ------------------------------------------------------------------------------------
def test_live_asp_answers_at_once(server):  # noqa: F811
    """Over ZeroMQ: an ASP pushpull is answered while the other worker has pushed nothing, with the
    values after this worker's own update; init's semantics fields reach the store."""
    from psring.sync.ps.client import PSClient, PSError

    c0, c1 = PSClient([server.address], 0, 10), PSClient([server.address], 1, 10)
    try:
        c0.call(0, {"op": "init", "optim": PLAIN, "consistency": "asp"}, KEYS)
        with pytest.raises(PSError, match="already"):
            c1.call(0, {"op": "init", "optim": PLAIN, "design": "aggregate"}, KEYS)
        c1.call(0, {"op": "pull", "version": 0})
        header, named = c0.call(0, {"op": "pushpull", "step": 0}, g(1.0))
        assert header["version"] == 0 and all(torch.equal(t.tensor(), torch.full_like(t.tensor(), -0.1)) for _, t in named)
        header, _ = c0.call(0, {"op": "pushpull", "step": 1}, g(1.0))  # runs ahead of worker 1
        assert server.store.semantics.consistency == "asp" and server.store.clocks.clock == [2, 0]
    finally:
        c0.close()
        c1.close()


def test_live_aggregate_answers_with_sums_and_refuses_later_pulls(server):  # noqa: F811
    """Over ZeroMQ, design aggregate: both pushpulls are answered with the sum of the two gradients;
    the server holds only the initial parameters, so a pull of version 1 is refused."""
    from psring.sync.ps.client import PSClient, PSError

    c0, c1 = PSClient([server.address], 0, 10), PSClient([server.address], 1, 10)
    try:
        c0.call(0, {"op": "init", "optim": optim_header(optim_cfg(ADAM)), "design": "aggregate"}, KEYS)
        reqs = [(c, c.send(0, {"op": "pushpull", "step": 0}, g(v))) for c, v in ((c0, 1.0), (c1, 2.5))]
        for c, req in reqs:
            header, named = c.recv(0, req)
            assert header["version"] == 1 and all(torch.equal(t.tensor(), torch.full_like(t.tensor(), 3.5)) for _, t in named)
        with pytest.raises(PSError, match="aggregate"):
            c0.call(0, {"op": "pull", "version": 1})
        _, named = c1.call(0, {"op": "pull", "version": 0})
        assert all(torch.equal(t.tensor(), dict(KEYS)[k]) for k, t in named)
    finally:
        c0.close()
        c1.close()


# --- end to end -------------------------------------------------------------------------------------
B, STEPS = 16, 4
TOL = 1e-5
# Adam: elements whose gradient is rounding noise (terms that cancel) get a full-size update of either
# sign, whichever way the noise falls, so a few elements may differ by up to ~lr per step. Allowed: that
# many (<= 1e-4 of a tensor) beyond TOL, none beyond ADAM_MAX. A wrong update (say, gradients not divided
# by N) moves most elements by 1e-3..3e-1 relative.
ADAM_FEW, ADAM_MAX = 1e-4, 1e-2


def train_args(out, sync, n, batch=B, steps=STEPS, s=1, extra=()):
    args = ["train", "--sync", sync, "--workers", str(n), "--model", "cnn", "--batch-size", str(batch),
            "--steps", str(steps), "--seed", "3", "--num-samples", "256", "--no-eval", "--log-every", "100",
            "--threads", "1", "--out", str(out)]
    return args + (["--servers", str(s)] if sync == "ps" else []) + list(extra)


ADAM_FLAGS = ("--optimizer", "adam", "--lr", "0.001")
SGD_FLAGS = ("--lr", "0.05")
FLAG_OPTIM = {ADAM_FLAGS: OptimConfig(name="adam", lr=0.001), SGD_FLAGS: OptimConfig(lr=0.05)}


def rel_diffs(a: dict, b: dict) -> dict:
    """Per tensor: elementwise |a - b| relative to the largest |b| of that tensor."""
    assert a.keys() == b.keys()
    return {k: (a[k] - b[k]).abs() / b[k].abs().max().clamp_min(1e-12) for k in a}


def max_rel_diff(a: dict, b: dict) -> float:
    return max(d.max().item() for d in rel_diffs(a, b).values())


def check_close(got: dict, ref: dict, adam: bool, what: str) -> None:
    diffs = rel_diffs(got, ref)
    worst = max(d.max().item() for d in diffs.values())
    if not adam:
        assert worst <= TOL, f"{what}: max relative difference {worst:.2e} > {TOL}"
        return
    few = max((d > TOL).float().mean().item() for d in diffs.values())
    assert few <= ADAM_FEW and worst <= ADAM_MAX, f"{what}: {few:.2e} of a tensor beyond {TOL}, max {worst:.2e}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Final parameters of ``--sync none --workers 1 --batch-size 2B``: the trainer's own loop, run in
    this process (a subprocess would spend most of its time importing torch)."""
    from psring.config import TrainConfig
    from psring.sync.none import NoSync
    from psring.train.trainer import run_steps

    cache = {}

    def get(flags):
        if flags not in cache:
            out = tmp_path_factory.mktemp("ref")
            cfg = TrainConfig(sync="none", workers=1, model="cnn", batch_size=2 * B, steps=STEPS, seed=3,
                              num_samples=256, eval=False, log_every=100, threads=1, optim=FLAG_OPTIM[flags],
                              out=str(out)).validate()
            threads = torch.get_num_threads()
            torch.set_num_threads(1)  # as the workers (--threads 1)
            try:
                run_steps(cfg, NoSync(0, 1, torch.device("cpu"), cfg.optim), 0, 1, out)
            finally:
                torch.set_num_threads(threads)
            cache[flags] = torch.load(out / "model.pt")
        return cache[flags]

    return get


@pytest.mark.parametrize("sync,flags,s,extra", [
    ("ps", ADAM_FLAGS, 2, ()),
    ("ps", SGD_FLAGS, 1, ("--ps-design", "aggregate")),
    ("ps", ADAM_FLAGS, 1, ("--ps-design", "aggregate", "--frame-kb", "16")),
    ("allreduce", ADAM_FLAGS, 1, ()),
])
def test_bsp_matches_single_process_on_global_batch(psring, tmp_path, reference, sync, flags, s, extra):
    """BSP, N = 2: both designs, with SGD and Adam, end where single-process training on the global batch
    ends (SGD: every element within 1e-5 relative; Adam: see ADAM_FEW)."""
    r = psring.run(*train_args(tmp_path / "run", sync, 2, s=s, extra=flags + extra), timeout=120)
    assert r.returncode == 0, r.stderr
    got = torch.load(tmp_path / "run" / "model.pt")
    check_close(got, reference(flags), "adam" in flags, f"{sync} {flags} {extra}")
    from psring.train.models import build_model

    assert max_rel_diff(got, build_model("cnn", 3).state_dict()) > 1e-3  # it did train
    if sync == "ps":
        steps = [json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
        aggregate = "aggregate" in extra
        assert all((r["update_s"] > 0) == aggregate for r in steps)  # who runs the optimizer


def server_records(out) -> list[list[dict]]:
    files = sorted((out / "servers").glob("server*.jsonl"))
    return [[json.loads(line) for line in f.read_text().splitlines()] for f in files]


@pytest.mark.parametrize("consistency,n,s,k", [("ssp", 4, 1, 1), ("asp", 3, 2, 2)])
def test_async_runs_finish_and_record_staleness(psring, tmp_path, consistency, n, s, k):
    """SSP (k = 1) with N = 4 and ASP with N = 3: every worker finishes, the servers exit 0, every round
    has a record, and every push of every worker is in a staleness record; SSP's never exceed k."""
    out = tmp_path / "run"
    steps = 6
    r = psring.run(*train_args(out, "ps", n, batch=8, steps=steps, s=s,
                               extra=("--consistency", consistency, "--staleness", str(k), "--lr", "0.02")),
                   timeout=120)
    assert r.returncode == 0, r.stderr
    assert all((out / "ranks" / f"rank{w}.done").exists() for w in range(n))
    logs = [(out / "logs" / f"server{i}.log").read_text() for i in range(s)]
    assert all("done:" in log and " 0 rejected" in log for log in logs), logs
    every = server_records(out)
    assert len(every) == s  # (each server's checks below: none skipped for want of its records)
    for recs in every:
        assert [rec["step"] for rec in recs] == list(range(steps))
        pushes = sum(rec["pushes"] for rec in recs)
        assert pushes == sum(v for rec in recs for v in rec["staleness"].values()) >= n * steps
        assert all(rec["staleness_max"] == max(map(int, rec["staleness"]), default=0) for rec in recs)
        if consistency == "ssp":
            assert max(rec["staleness_max"] for rec in recs) <= k
            assert max(rec["delay_max"] for rec in recs) <= (n - 1) * (2 * k + 1)
    assert os.path.exists(out / "model.pt")
