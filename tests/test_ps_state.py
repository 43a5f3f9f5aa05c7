"""PS checkpoints: a shard's ``state`` taken back by ``init`` (optimizer state and starting version)
continues bit for bit like the original (SGD with momentum, Adam; split frames), over ZeroMQ too; bad
state is refused and leaves the store untouched; PSSync's state_dict/resume_from round trip."""
from __future__ import annotations

import contextlib
import io

import pytest
import torch
from conftest import serving
from torch import nn

from psring.config import OptimConfig
from psring.sync.ps import protocol as P
from psring.sync.ps.client import PSClient, PSError
from psring.sync.ps.server import ParameterServer
from psring.sync.ps.store import ShardStore
from psring.sync.ps.synchronizer import make_ps

SGD = {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4}
ADAM = {"name": "adam", "lr": 1e-2, "betas": [0.8, 0.99], "eps": 1e-7, "weight_decay": 5e-4}
PLAIN = {"name": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0}
SHAPES = {"w": (3, 4), "b": (5,), "big": (3000,)}


def wire(named, frame_bytes=1024):
    """``named`` as a server decodes them after a worker sent them in frames of ``frame_bytes``."""
    metas, frames = P.encode_tensors(named, frame_bytes)
    return P.decode_tensors({"tensors": metas}, [bytes(f) for f in frames])


def init_values(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [(k, torch.randn(s, generator=gen)) for k, s in SHAPES.items()]


def grads(seed):
    gen = torch.Generator().manual_seed(seed)
    return [(k, torch.randn(s, generator=gen)) for k, s in SHAPES.items()]


def run_steps(store, steps):
    for t in steps:
        for w in range(store.workers):
            store.push(w, t, wire(grads(100 * t + w)))


def state_of(store):
    st = store.state()
    return {k: t for k, t in st["params"] + st["opt_state"]}


@pytest.mark.parametrize("optim", [SGD, ADAM, PLAIN], ids=["sgd-momentum", "adam", "sgd-plain"])
def test_state_then_init_continues_bit_exactly(optim):
    """Original shard: 3 steps; a new shard inited from its state at version 3 and the original then take
    the same 3 more steps (split frames, two workers): parameters and optimizer state equal bit for bit
    after every step. A shard given only the parameters (fresh optimizer state) differs, so the state
    matters (SGD with momentum, Adam)."""
    orig = ShardStore(2)
    orig.init(init_values(), optim)
    run_steps(orig, range(3))
    st = orig.state()
    assert st["version"] == 3 and st["clocks"] is None
    kinds = {n.partition("/")[0] for n, _ in st["opt_state"]}
    expect = {"exp_avg", "exp_avg_sq", "step"} if optim["name"] == "adam" else \
        {"momentum_buffer"} if optim["momentum"] else set()
    assert kinds == expect and len(st["opt_state"]) == len(expect) * len(SHAPES)
    assert all(t.data_ptr() != p.data_ptr() for (_, t), p in zip(st["params"], orig.params.values()))  # copies
    restored, fresh = ShardStore(2), ShardStore(2)
    restored.init(wire(st["params"]), optim, None, wire(st["opt_state"]), version=3)
    fresh.init(st["params"], optim, None, None, version=3)
    assert restored.version == 3 and state_of(restored).keys() == state_of(orig).keys()
    for t in range(3, 6):
        for store in (orig, restored, fresh):
            run_steps(store, [t])
        a, b = state_of(orig), state_of(restored)
        assert all(torch.equal(a[k], b[k]) for k in a), t
    if optim is not PLAIN:
        assert not torch.equal(orig.params["big"], fresh.params["big"])
    with pytest.raises(P.ProtocolError, match="step 3"):
        restored.push(0, 3, grads(0))  # steps before the resumed version are closed


def test_state_is_refused_mid_step_and_before_init():
    store = ShardStore(2)
    with pytest.raises(P.ProtocolError, match="before init"):
        store.state()
    store.init(init_values(), SGD)
    gs = grads(1)
    store.push(0, 0, gs)
    assert store.state()["version"] == 0  # partial sums are not state: fine between steps
    store.push(1, 0, gs[:1])  # "w" updated for step 0, the others not yet
    with pytest.raises(P.ProtocolError, match="mid-step"):
        store.state()
    store.push(1, 0, gs[1:])
    assert store.state()["version"] == 1


def test_aggregate_and_async_resume_at_their_version():
    """aggregate: no optimizer state, pushes of the resumed step are summed; SSP: every worker's clock
    starts at the version, the first pushes have staleness 0, a push beyond k ahead is refused."""
    agg = ShardStore(2)
    agg.init(init_values(), ADAM, {"design": "aggregate"}, [], version=4)
    assert agg.state()["opt_state"] == [] and agg.base == 4
    run_steps(agg, [4])
    version, named = agg.reply(0, ["b"], 4)
    assert version == 5 and torch.equal(named[0][1], torch.zeros(5).add_(grads(400)[1][1]).add_(grads(401)[1][1]))
    ssp = ShardStore(2)
    ssp.init(init_values(), PLAIN, {"consistency": "ssp", "staleness": 1}, version=7)
    assert ssp.state()["clocks"] == [7, 7] and ssp.version == 7
    ssp.push(0, 7, grads(1))
    ssp.push(0, 8, grads(2))  # 1 ahead of the slowest worker (at 7): within k = 1
    with pytest.raises(P.ProtocolError, match="ahead"):
        ssp.push(0, 9, grads(3))  # 2 ahead
    stale, _ = ssp.take_staleness()
    assert stale[0] >= 1


def good_state(optim=ADAM):
    store = ShardStore(2)
    store.init(init_values(), optim)
    run_steps(store, range(2))
    return store.state()


@pytest.mark.parametrize("change,msg", [
    (lambda p, o: (p, o[1:]), "incomplete"),                                           # one missing
    (lambda p, o: (p, o + o[:1]), "twice"),                                            # one twice
    (lambda p, o: (p, o + [("momentum_buffer/w", torch.zeros(3, 4))]), "KIND/KEY"),   # SGD's kind, Adam run
    (lambda p, o: (p, o + [("exp_avg/zz", torch.zeros(3))]), "does not carry"),        # unknown key
    (lambda p, o: (p, [(n, t.reshape(-1) if n == "exp_avg/w" else t) for n, t in o]), "expected"),  # shape
    (lambda p, o: (p, [(n, t.double() if n == "exp_avg_sq/b" else t) for n, t in o]), "expected"),  # dtype
    (lambda p, o: (p, [(n, t.reshape(1) if n == "step/b" else t) for n, t in o]), "expected"),      # step not 0-dim
    (lambda p, o: (p, [(n.replace("/", ":"), t) for n, t in o]), "KIND/KEY"),          # not KIND/KEY
    (lambda p, o: (p[1:], o), "does not carry"),                                       # state of a key not inited
])
def test_inconsistent_optimizer_state_is_refused(change, msg):
    """Every inconsistency between the init's parameters, its optimizer and the state is a ProtocolError
    raised before the store changes: a good init afterwards works."""
    st = good_state()
    params, opt_state = change(st["params"], st["opt_state"])
    store = ShardStore(2)
    with pytest.raises(P.ProtocolError, match=msg):
        store.init(params, ADAM, None, opt_state, version=2)
    assert not store.initialized and store.params == {}
    store.init(st["params"], ADAM, None, st["opt_state"], version=2)
    assert store.version == 2


@pytest.mark.parametrize("optim,semantics", [(PLAIN, {}), (ADAM, {"design": "aggregate"})])
def test_state_for_an_optimizer_without_state_is_refused(optim, semantics):
    """SGD without momentum and the aggregate design keep no server optimizer state: any is refused."""
    st = good_state(SGD)
    with pytest.raises(P.ProtocolError, match="KIND/KEY"):
        ShardStore(2).init(st["params"], optim, semantics, st["opt_state"])


@pytest.mark.parametrize("version", [-1, 1.5, True, "3", 2**60])
def test_bad_version_is_refused(version):
    with pytest.raises(P.ProtocolError, match="version"):
        ShardStore(2).init(init_values(), SGD, None, None, version)


# --- over ZeroMQ ------------------------------------------------------------------------------------
def live_server(workers=2, **kw):
    """A ParameterServer serving in a thread; ended and closed however the test ends (conftest.serving)."""
    return serving(ParameterServer(workers=workers, port=0, **kw))


@contextlib.contextmanager
def clients(addr, n=2, frame_bytes=1024):
    made = [PSClient([addr], w, 10, frame_bytes=frame_bytes) for w in range(n)]
    try:
        yield made
    finally:
        for c in made:
            c.close()


def bsp_step(cs, t):
    reqs = [c.send(0, {"op": "pushpull", "step": t}, grads(100 * t + w)) for w, c in enumerate(cs)]
    out = []
    for c, req in zip(cs, reqs):
        header, named = c.recv(0, req)
        assert header["version"] == t + 1
        out.append({k: v.owned() for k, v in named})
    return out


def test_state_op_and_init_with_state_over_zeromq():
    """Server A: Adam, 2 steps over pushpull (1 KB frames); its ``state`` reply inits server B at version 2
    (state and parameters split over frames too); A and B then answer 2 more steps identically. ``state``
    with frames, from a bad worker id, or before init is refused; the reply's header names the run."""
    with live_server(frame_bytes=1024) as a, live_server(frame_bytes=1024) as b, \
            clients(a.address) as ca, clients(b.address) as cb:
        with pytest.raises(PSError, match="before init"):
            ca[0].call(0, {"op": "state"})
        ca[0].call(0, {"op": "init", "optim": ADAM}, init_values())
        for t in range(2):
            bsp_step(ca, t)
        header, params = ca[1].call(0, {"op": "state"})
        assert header["version"] == 2 and header["clocks"] is None and header["optim"]["name"] == "adam"
        assert (header["design"], header["consistency"]) == ("server-optimizer", "bsp")
        assert [k for k, _ in params] == list(SHAPES) and len(header["opt_state"]) == 3 * len(SHAPES)
        assert dict(params)["big"].nframes > 1  # split over frames on the way out
        opt_state = [(k, v.owned()) for k, v in header["opt_state"]]
        params = [(k, v.owned()) for k, v in params]
        with pytest.raises(PSError, match="no tensor frames"):
            ca[0].call(0, {"op": "state"}, [("w", torch.zeros(1))])
        with pytest.raises(PSError, match="outside"):
            ca[0].call(0, {"op": "state", "worker": 5})
        with pytest.raises(PSError, match="incomplete"):
            cb[0].call(0, {"op": "init", "optim": ADAM, "version": 2}, params, opt_state[1:])
        cb[0].call(0, {"op": "init", "optim": ADAM, "version": 2}, params, opt_state)
        _, pulled = cb[1].call(0, {"op": "pull", "version": 2})
        assert all(torch.equal(v.tensor(), dict(params)[k]) for k, v in pulled)
        for t in (2, 3):
            ra, rb = bsp_step(ca, t), bsp_step(cb, t)
            assert all(torch.equal(ra[w][k], rb[w][k]) for w in (0, 1) for k in SHAPES), t
        assert a.errors == 3 and b.errors == 1


# --- PSSync -----------------------------------------------------------------------------------------
class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(8, 3)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def train(sync, model, steps):
    for t in steps:
        gen = torch.Generator().manual_seed(t)
        x, y = torch.randn(4, 6, generator=gen), torch.randint(0, 3, (4,), generator=gen)
        loss = nn.functional.cross_entropy(model(x), y)
        model.zero_grad(set_to_none=False)
        loss.backward()
        sync.step(t)


@pytest.mark.parametrize("optim,design", [(ADAM, "server-optimizer"), (SGD, "server-optimizer"), (ADAM, "aggregate")])
@pytest.mark.parametrize("servers,chunk_mb", [(2, 0.0001), (3, 0.00005), (1, 1.0)])
def test_pssync_state_dict_and_resume_continue_exactly(optim, design, servers, chunk_mb):
    """One worker, two servers, chunks of 26 elements (parameters split over chunks and servers): 5 steps
    straight vs 3 steps, state_dict (saved and loaded with weights_only=True), then a new PSSync on new
    servers resumed at step 3 from it (model loaded from the first run's parameters) for steps 3-4: the
    same parameters bit for bit, also when the resumed run has another number of servers and another
    chunking (state is kept per parameter, not per chunk)."""
    cfg = OptimConfig(**{**optim, "betas": tuple(optim.get("betas", (0.9, 0.999)))})

    def make(addrs, mb=0.0001):
        return make_ps(0, 1, torch.device("cpu"), addrs, cfg, timeout_s=10, bucket_mb=mb, design=design)

    with live_server(1) as s0, live_server(1) as s1:
        sync = make([s0.address, s1.address])
        try:
            ref = sync.attach(Tiny())
            train(sync, ref, range(5))
            expect = {k: v.detach().clone() for k, v in ref.state_dict().items()}
        finally:
            sync.close()
    with live_server(1) as s0, live_server(1) as s1:
        sync = make([s0.address, s1.address])
        try:
            model = sync.attach(Tiny())
            train(sync, model, range(3))
            state = sync.state_dict()
            weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        finally:
            sync.close()
    buf = io.BytesIO()  # as checkpoint.save/load write and read it: tensors and plain values only
    torch.save(state, buf)
    state = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    assert len(state["servers"]) == 2 and ("optimizer" in state) == (design == "aggregate")
    assert all(srv["version"] == 3 for srv in state["servers"])
    with contextlib.ExitStack() as stack:
        live = [stack.enter_context(live_server(1)) for _ in range(servers)]
        sync = make([srv.address for srv in live], chunk_mb)
        try:
            model = Tiny()
            model.load_state_dict(weights)
            sync.resume_from(state, 3)
            model = sync.attach(model)
            assert getattr(sync, "reducer", sync).tr.step == 3 and all(srv.store.version == 3 for srv in live)
            train(sync, model, range(3, 5))
            got = model.state_dict()
        finally:
            sync.close()
    assert all(torch.equal(got[k], expect[k]) for k in expect)
