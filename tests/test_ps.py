"""Parameter-server tests: sharding, wire format, shard store, and a live server over ZeroMQ on loopback."""
from __future__ import annotations

import functools

import msgpack
import pytest
import torch
import zmq
from conftest import serving

from psring.sync.ps import protocol as P
from psring.sync.ps.client import PSClient, PSError
from psring.sync.ps.server import ParameterServer
from psring.sync.ps.sharding import plan_chunks
from psring.sync.ps.store import ShardStore
from psring.train.models import build_model

LR = 0.1
OPTIM = {"lr": LR, "momentum": 0.0, "weight_decay": 0.0}
TIMEOUT_MS = 10_000


# --- sharding --------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def model_numels(name: str) -> tuple[int, ...]:
    return tuple(p.numel() for p in build_model(name, 0).parameters() if p.requires_grad)[::-1]


@pytest.mark.parametrize("name", ["cnn", "resnet18"])
@pytest.mark.parametrize("servers", [1, 2, 3, 4, 8])
def test_chunks_cover_the_model_once_and_every_server_owns_the_same_bytes(name, servers):
    """The chunks tile the flat parameter vector exactly once, in order, each at most the cap (or one
    parameter); with S > 1 every server owns its share to an element or so, whatever the tensor sizes
    (ResNet-18 at S=8 has three 9.4 MB tensors, which whole-tensor sharding left at 1.7x the share);
    with S = 1 the cuts fall on parameter boundaries; deterministic."""
    sizes, cap = list(model_numels(name)), 4 << 20
    numel = sum(sizes)
    chunks = plan_chunks([sizes], [4], servers, cap)
    assert [c[1] for c in chunks] == [0] + [c[2] for c in chunks[:-1]] and chunks[-1][2] == numel
    assert all(c[0] == 0 and c[2] > c[1] for c in chunks)
    assert [c[3] for c in chunks] == [i % servers for i in range(len(chunks))]
    if servers == 1:
        bounds = {sum(sizes[:i]) for i in range(len(sizes) + 1)}
        assert all(c[1] in bounds and c[2] in bounds for c in chunks)
        assert all((c[2] - c[1]) * 4 <= max(cap, 4 * max(sizes)) for c in chunks)
    else:
        assert all((c[2] - c[1]) * 4 <= cap for c in chunks) and len(chunks) % servers == 0
        loads = [sum(c[2] - c[1] for c in chunks if c[3] == s) for s in range(servers)]
        assert sum(loads) == numel and max(loads) - min(loads) <= len(chunks) // servers
    assert plan_chunks([sizes], [4], servers, cap) == chunks


def test_chunks_are_as_few_as_the_cap_allows_and_spaces_continue_the_round_robin():
    """10 elements of 4 bytes, cap 8 bytes, 2 servers: 5 chunks would do, so 6 (a multiple of S) of 1-2
    elements; a second space (another dtype) continues the round-robin where the first stopped. One
    server: whole parameters up to the cap, a larger one alone."""
    assert plan_chunks([[10]], [4], 2, 8) == [(0, 0, 1, 0), (0, 1, 3, 1), (0, 3, 5, 0), (0, 5, 6, 1),
                                              (0, 6, 8, 0), (0, 8, 10, 1)]
    assert plan_chunks([[1, 2], [4]], [4, 2], 2, 1 << 20) == [(0, 0, 1, 0), (0, 1, 3, 1), (1, 0, 2, 0),
                                                              (1, 2, 4, 1)]
    assert plan_chunks([[3, 2, 9, 1, 1]], [4], 1, 20) == [(0, 0, 5, 0), (0, 5, 14, 0), (0, 14, 16, 0)]


@pytest.mark.parametrize("spaces,servers", [([[1]], 2), ([], 1), ([[4]], 0)])
def test_chunks_reject_impossible_server_counts(spaces, servers):
    """More servers than parameter elements, or fewer than one server, is a ValueError."""
    with pytest.raises(ValueError):
        plan_chunks(spaces, [4] * len(spaces), servers, 1 << 20)


# --- protocol --------------------------------------------------------------------------------------
WIRE_DTYPES = {n: getattr(torch, n)
               for n in "float32 float64 float16 bfloat16 int64 int32 int16 int8 uint8 bool".split()}


def sample(dtype: torch.dtype, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Random bit patterns (NaN payloads included); floats also get an explicit NaN and -0.0."""
    n = torch.Size(shape).numel()
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=gen).bool().view(shape)
    t = torch.randint(0, 256, (n * dtype.itemsize,), dtype=torch.uint8, generator=gen).view(dtype)
    if dtype.is_floating_point:
        t[:2] = torch.tensor([-0.0, float("nan")][: min(n, 2)], dtype=dtype)
    return t.view(shape)


def raw(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def test_every_dtype_and_shape_round_trips_bit_exactly():
    """All dtypes x {0-dim, empty, 3-d} in one message: header + bytes-copied frames decode to the same
    keys, dtypes, shapes and bytes (NaN payloads and -0.0 included)."""
    assert P.DTYPES == WIRE_DTYPES
    gen = torch.Generator().manual_seed(0)
    named = [(f"{name}{list(shape)}", sample(dt, shape, gen))
             for name, dt in WIRE_DTYPES.items() for shape in [(), (0, 3), (2, 3, 5)]]
    metas, frames = P.encode_tensors(named)
    header = P.unpack_header(P.pack_header({"tensors": metas}))
    decoded = [(k, t.tensor()) for k, t in P.decode_tensors(header, [bytes(f) for f in frames])]  # from copies
    assert [k for k, _ in decoded] == [k for k, _ in named]
    for (key, a), (_, b) in zip(named, decoded):
        assert (b.dtype, b.shape) == (a.dtype, a.shape), key
        assert torch.equal(raw(a), raw(b)), key
    f32 = dict(decoded)["float32[2, 3, 5]"].reshape(-1)
    assert torch.signbit(f32[0]) and f32[0] == 0 and torch.isnan(f32[1])


def meta(dtype="float32", shape=(2,), key="a"):
    return {"tensors": [[key, dtype, list(shape)]]}


@pytest.mark.parametrize("header,frames", [
    (meta(), [b"\0" * 7]),                                   # frame shorter than dtype x shape
    (meta(), [b"\0" * 9]),                                   # frame longer
    (meta(shape=()), [b""]),                                 # 0-dim needs one element
    (meta(dtype="complex64"), [b"\0" * 16]),                 # unknown dtype
    (meta(shape=(-1,)), [b""]),                              # negative dim
    (meta(shape=(1.5,)), [b"\0" * 4]),                       # non-int dim
    ({"tensors": [["a", "float32", "2"]]}, [b"\0" * 8]),     # shape not a list
    (meta(key=1), [b"\0" * 8]),                              # key not a string
    ({"tensors": [["a", "float32"]]}, [b"\0" * 8]),          # not a triple
    ({"tensors": "a"}, [b"\0" * 8]),                         # tensors not a list
    (meta(), []),                                            # fewer frames than tensors
    (meta(), [b"\0" * 8, b"\0" * 8]),                        # more frames than tensors
    ({}, [b"\0"]),                                           # frame with no tensor described
])
def test_decode_rejects_malformed_tensor_descriptions(header, frames):
    """Every mismatch between the header's descriptions and the frames is a ProtocolError."""
    with pytest.raises(P.ProtocolError):
        P.decode_tensors(P.unpack_header(P.pack_header(header)), frames)


@pytest.mark.parametrize("buf", [b"\xc1", P.pack_header({"op": "push", "tensors": []})[:-1],
                                 msgpack.packb([1, 2]), msgpack.packb(3), msgpack.packb({1: 2}),
                                 b"\x80" + b"\0" * P.MAX_HEADER_BYTES])
def test_unpack_header_rejects_malformed_or_non_map(buf):
    """Invalid msgpack, truncated msgpack, non-map headers, int map keys and oversized headers all raise
    ProtocolError (the one exception the server turns into an error reply)."""
    with pytest.raises(P.ProtocolError):
        P.unpack_header(buf)


@pytest.mark.parametrize("shape", [[0, 2**63], [0, 2**62, 4], [True, 2]])
def test_decode_rejects_overflowing_or_bool_shapes(shape):
    """A shape torch cannot build must be a ProtocolError, not a TypeError/RuntimeError that escapes
    ParameterServer.handle and kills the serve loop."""
    with pytest.raises(P.ProtocolError):
        P.decode_tensors(meta(shape=shape), [b"" if 0 in shape else b"\0" * 8])


# --- shard store -----------------------------------------------------------------------------------
def new_store(workers=2):
    store = ShardStore(workers)
    store.init([("a", torch.ones(3)), ("b", torch.zeros(2, 2))], OPTIM)
    return store


def test_store_version_advances_only_when_every_key_has_every_workers_gradient():
    """Pushes covering some keys (or some workers) leave the version alone; the last one advances it."""
    store = new_store()
    ga, gb = torch.full((3,), 2.0), torch.ones(2, 2)
    assert store.push(0, 0, [("a", ga)]) is False and store.version == 0
    assert store.push(1, 0, [("a", ga)]) is False and store.version == 0  # "a" updated, "b" not yet
    assert store.push(0, 0, [("b", gb)]) is False and store.version == 0
    assert store.push(1, 0, [("b", gb)]) is True and store.version == 1
    assert torch.equal(store.params["a"], torch.ones(3) - LR * ga)
    assert torch.equal(store.params["b"], torch.zeros(2, 2) - LR * gb)
    with pytest.raises(P.ProtocolError, match="step 0"):  # step 0 is closed now
        store.push(0, 0, [("a", ga)])


def test_store_rejected_push_changes_nothing():
    """A push whose first key is fine but second is bad is refused whole: nothing is accumulated."""
    store = new_store()
    with pytest.raises(P.ProtocolError, match="unknown key"):
        store.push(0, 0, [("a", torch.ones(3)), ("zz", torch.ones(1))])
    with pytest.raises(P.ProtocolError, match="expected"):
        store.push(0, 0, [("a", torch.ones(3)), ("b", torch.ones(4))])
    with pytest.raises(P.ProtocolError, match="twice"):
        store.push(0, 0, [("a", torch.ones(3)), ("a", torch.ones(3))])
    assert store.pushed == {"a": set(), "b": set()} and store.count == {"a": 0, "b": 0}
    assert torch.equal(store.params["a"].grad, torch.zeros(3))


def test_store_rejected_init_changes_nothing():
    """An init refused for a non-float tensor must not leave keys that a later good init inherits."""
    store = ShardStore(1)
    with pytest.raises(P.ProtocolError, match="non-float"):
        store.init([("a", torch.zeros(2)), ("i", torch.zeros(2, dtype=torch.int64))], OPTIM)
    store.init([("c", torch.zeros(2))], OPTIM)
    assert list(store.params) == ["c"]
    assert store.push(0, 0, [("c", torch.ones(2))]) is True


# --- live server -----------------------------------------------------------------------------------
@pytest.fixture
def server():
    with serving(ParameterServer(workers=2, port=0)) as srv:
        yield srv
        if srv.thread.is_alive():  # the normal way out: both workers say done
            closer = PSClient([srv.address], worker=0, timeout_s=5)
            try:
                for w in (0, 1):
                    closer.call(0, {"op": "done", "worker": w})
            except PSError:
                pass
            finally:
                closer.close()
            srv.thread.join(5)


@pytest.fixture
def clients(server):
    made = [PSClient([server.address], worker=w, timeout_s=10) for w in (0, 1)]
    try:
        yield made
    finally:
        for c in made:
            c.close()


INIT = [("w", torch.randn(3, 4, generator=torch.Generator().manual_seed(1))), ("b", torch.arange(5.0))]


def grads(seed: int) -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(k, torch.randn(p.shape, generator=gen)) for k, p in INIT]


def sgd(params: dict, g0: list, g1: list) -> dict:
    """The server's update, in float32 and in its order: p - lr * ((0 + g0 + g1) / 2)."""
    return {k: params[k].clone().add_(torch.zeros_like(a).add_(a).add_(b).div_(2), alpha=-LR)
            for (k, a), (_, b) in zip(g0, g1)}


def step_both(clients, step: int, g0, g1) -> list[dict]:
    """Both workers push ``step`` and pull ``step + 1``, pipelined like PSSync.step; returns the pulls."""
    reqs = [(c.send(0, {"op": "push", "step": step}, g), c.send(0, {"op": "pull", "version": step + 1}))
            for c, g in zip(clients, (g0, g1))]
    pulled = []
    for c, (push, pull) in zip(clients, reqs):
        c.recv(0, push)
        header, named = c.recv(0, pull)
        assert header["version"] == step + 1
        pulled.append({k: t.owned() for k, t in named})
    return pulled


def test_server_applies_mean_gradient_and_exits_when_all_done(server, clients):
    """init -> two BSP steps -> both workers pull exactly p - lr * mean(grads); 'done' x2 ends serve()."""
    c0, c1 = clients
    c0.call(0, {"op": "init", "optim": OPTIM}, INIT)
    expected = dict(INIT)
    for step in range(2):
        g0, g1 = grads(10 + step), grads(20 + step)
        expected = sgd(expected, g0, g1)
        for pulled in step_both(clients, step, g0, g1):
            assert pulled.keys() == expected.keys()
            assert all(torch.equal(pulled[k], expected[k]) for k in expected)
    c0.call(0, {"op": "done"})
    c1.call(0, {"op": "done"})
    server.thread.join(10)
    assert not server.thread.is_alive() and server.result["rc"] == 0


def test_bad_requests_get_errors_and_change_nothing(server, clients):
    """Each bad push is refused with the server's reason; the good workers' steps still come out exact."""
    c0, c1 = clients
    c0.call(0, {"op": "init", "optim": OPTIM}, INIT)
    g0, g1 = grads(1), grads(2)
    w, b = g0
    bad = [
        ({"step": 0}, [w, ("nope", torch.ones(1))], "unknown key"),
        ({"step": 0}, [w, ("b", torch.ones(6))], "expected"),
        ({"step": 0}, [w, ("b", b[1].double())], "expected"),
        ({"step": 1}, g0, "step"),
        ({"step": 0, "worker": 2}, g0, "outside"),
        ({"step": 0, "worker": -1}, g0, "outside"),
    ]
    for extra, named, msg in bad:
        with pytest.raises(PSError, match=msg):
            c0.call(0, {"op": "push", **extra}, named)
    c0.call(0, {"op": "push", "step": 0}, g0)
    with pytest.raises(PSError, match="twice"):
        c0.call(0, {"op": "push", "step": 0}, g0)  # duplicate: must not be added a second time
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.linger = 0
    try:
        dealer.connect(server.address)
        for junk in (b"\xc1\xff", msgpack.packb([1, 2])):
            dealer.send_multipart([junk])
            assert dealer.poll(TIMEOUT_MS), "no reply to a malformed header"
            reply = dealer.recv_multipart()
            assert len(reply) == 1 and P.unpack_header(reply[0])["ok"] is False
    finally:
        dealer.close(linger=0)
        ctx.term()
    c1.call(0, {"op": "push", "step": 0}, g1)
    expected = sgd(dict(INIT), g0, g1)
    for c in clients:
        _, named = c.call(0, {"op": "pull", "version": 1})
        assert all(torch.equal(t.tensor(), expected[k]) for k, t in named) and len(named) == len(expected)
    with pytest.raises(PSError, match="step"):
        c1.call(0, {"op": "push", "step": 0}, g1)  # stale step after the update
    g0, g1 = grads(3), grads(4)
    expected = sgd(expected, g0, g1)
    for pulled in step_both(clients, 1, g0, g1):
        assert all(torch.equal(pulled[k], expected[k]) for k in expected)
    assert server.errors == len(bad) + 4


def test_pull_of_future_version_waits_for_every_worker(server, clients):
    """A pull for version 0 before init, or version 1 before the last push, is parked, not answered;
    the request that reaches the version answers it."""
    c0, c1 = clients
    early = c1.send(0, {"op": "pull", "version": 0})
    assert c1.socks[0].poll(300) == 0, "pull of version 0 answered before init"
    c0.call(0, {"op": "init", "optim": OPTIM}, INIT)
    header, named = c1.recv(0, early)
    assert header["version"] == 0 and all(torch.equal(t.tensor(), dict(INIT)[k]) for k, t in named)
    g0, g1 = grads(5), grads(6)
    c0.call(0, {"op": "push", "step": 0}, g0)
    pull = c0.send(0, {"op": "pull", "version": 1})
    assert c0.socks[0].poll(300) == 0, "pull of version 1 answered before worker 1 pushed"
    c1.call(0, {"op": "push", "step": 0}, g1)
    header, named = c0.recv(0, pull)  # waits up to 10 s
    expected = sgd(dict(INIT), g0, g1)
    assert header["version"] == 1 and all(torch.equal(t.tensor(), expected[k]) for k, t in named)


# --- tensors split over several frames --------------------------------------------------------------
def test_large_tensors_split_over_frames_round_trip_exactly():
    """With ``max_frame``, a tensor larger than it travels as several frames (zero-copy slices) and is
    rebuilt bit-exactly: joined, added into, or copied into a destination."""
    t = torch.randn(1000)
    small = torch.arange(6, dtype=torch.float64).view(2, 3)
    metas, frames = P.encode_tensors([("big", t), ("small", small)], max_frame=1000)
    assert metas[0][3] == 4 and len(metas[1]) == 3 and len(frames) == 5  # 4000 B -> 4 frames of <= 1000 B
    header = P.unpack_header(P.pack_header({"tensors": metas}))
    (k1, big), (k2, sm) = P.decode_tensors(header, [bytes(f) for f in frames])
    assert (k1, k2) == ("big", "small") and big.nframes > 1 and torch.equal(sm.tensor(), small)
    assert big.shape == t.shape and big.dtype == t.dtype
    assert torch.equal(big.tensor(), t)
    acc = torch.ones(1000)
    big.add_into(acc)
    assert torch.equal(acc, torch.ones(1000) + t)
    dst = torch.empty(1000)
    big.copy_into(dst)
    assert torch.equal(dst, t)


@pytest.mark.parametrize("split,nframes", [([400, 400, 400], 3), ([4000], 2), ([1000, 1000, 1000, 999, 1], 5)])
def test_split_frames_that_do_not_add_up_are_refused(split, nframes):
    """Frames of a split tensor must hold exactly its items, each a whole number of items."""
    header = {"tensors": [["big", "float32", [1000], nframes]]}
    frames = [b"\0" * n for n in split]
    with pytest.raises(P.ProtocolError):
        P.decode_tensors(header, frames)


def test_live_server_aggregates_split_tensors_exactly(server):
    """A server with 1 KB frames: pushes and pulls of tensors split over many frames give exact results."""
    server.frame_bytes = 1024
    init = torch.randn(3000)
    c0, c1 = PSClient([server.address], 0, 10, frame_bytes=1024), PSClient([server.address], 1, 10, frame_bytes=1024)
    try:
        c0.call(0, {"op": "init", "optim": OPTIM}, [("w", init)])
        g0, g1 = torch.randn(3000), torch.randn(3000)
        reqs = [(c, c.send(0, {"op": "push", "step": 0}, [("w", g)]), c.send(0, {"op": "pull", "version": 1}))
                for c, g in ((c0, g0), (c1, g1))]
        for c, push, pull in reqs:
            c.recv(0, push)
            _, [(key, got)] = c.recv(0, pull)
            assert key == "w" and got.nframes > 1
            expected = init.clone().add_((torch.zeros(3000) + g0 + g1).div_(2), alpha=-LR)  # the server's sums
            assert torch.equal(got.tensor(), expected)
    finally:
        c0.close()
        c1.close()


def test_store_sgd_is_bit_exact_with_torch_sgd():
    """The server's in-place SGD (momentum, weight decay) equals torch.optim.SGD bit for bit over steps."""
    torch.manual_seed(0)
    init, grads = torch.randn(1000), [torch.randn(1000) for _ in range(4)]
    store = ShardStore(1)
    store.init([("w", init)], {"lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4})
    p = torch.nn.Parameter(init.clone())
    opt = torch.optim.SGD([p], lr=0.05, momentum=0.9, weight_decay=5e-4)
    for t, g in enumerate(grads):
        store.push(0, t, [("w", g)])
        p.grad = g.clone()
        opt.step()
        assert torch.equal(store.params["w"], p.detach()), f"step {t}"


def test_sends_to_a_server_that_is_gone_fail_in_the_timeout_not_never():
    """zmq queues a DEALER's messages for a server that is not (or no longer) there until 1,000 wait; the next
    send blocked for good (a pump with no window sends every chunk of a step at once). Now: ``PSError`` after
    ``timeout_s``."""
    import time

    from psring.launch.launcher import free_port

    c = PSClient([f"tcp://127.0.0.1:{free_port()}"], worker=0, timeout_s=0.3)
    try:
        t0 = time.monotonic()
        with pytest.raises(PSError, match="did not answer within"):
            for _ in range(1500):
                c.send(0, {"op": "pull", "version": 0})
        assert time.monotonic() - t0 < 5
    finally:
        c.close()


def test_a_timeout_beyond_zmqs_int_is_capped_not_an_overflow():
    """``--timeout`` is any number of seconds above 0; zmq's send timeout is a C int of milliseconds."""
    from psring.launch.launcher import free_port
    from psring.sync.ps.client import MAX_TIMEOUT_MS

    c = PSClient([f"tcp://127.0.0.1:{free_port()}"], worker=0, timeout_s=1e10)
    try:
        assert c.timeout_ms == MAX_TIMEOUT_MS == c.socks[0].sndtimeo
        c.set_timeout(5.0)
        assert c.timeout_ms == 5000 == c.socks[0].sndtimeo
    finally:
        c.close()
