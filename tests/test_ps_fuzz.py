"""Fuzzing a live parameter server with malformed and mutated requests.

A server (N = 2 workers, BSP, a shard of three keys, one of them split over frames) is initialised,
then gets >= 10,000 requests built from valid ones (push, pushpull, pull, init, state, done) by random
mutations: bytes flipped, frames dropped, duplicated, truncated or extended, header fields replaced by
random msgpack values (ext types, huge ints, nested containers, ...), tensor descriptions given other
keys, dtypes, huge shapes or frame counts, random header maps, non-map headers, garbage and empty
frames, messages over the server's ``max_message_bytes``, and a few other shapes of nonsense.

Which candidates are sent (the rule): only those a local check proves the server must refuse, so that
every request sent is a rejected one and the server's state must not move. The check is the protocol's
own decoder and the store's ``check_push`` on a scratch ``ShardStore`` initialised like the server's
(the server's store never changes during the fuzz, so the scratch one stays equal to it), plus the
protocol's documented rules: a candidate is *not* sent if it fits in ``max_message_bytes``, decodes
(header and tensors), has an int or no ``req``, protocol 1, and is a push/pushpull that ``check_push``
accepts, or a frame-less pull (version 0..1, valid worker id), state or done with a valid worker id.
Everything else (including any init: the shard is already initialised) is sent.

Asserted: every sent request gets exactly one reply, each ``ok: false``; the server's ``errors`` equals
the number sent; its per-step record counts them in step 0 (all came before that step completed) and a
partial record counts those after the last step; the server thread lives on, a normal BSP step gives
exactly the hand-computed parameters, and ``done`` from both workers ends ``serve()`` with 0.

The same again with a server whose init named a codec (``--compress topk:0.5``): the valid requests are
then encoded pushes (``KEY/indices``, ``KEY/values``; ``encoded``), the mutations reach their parts'
names, dtypes, shapes and frames, and a semantic mutation also moves an index out of range.
"""
from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import msgpack
import pytest
import torch
import zmq
from conftest import serving

from psring.sync.ps import protocol as P
from psring.compress import CodecState, parse
from psring.sync.ps.client import PSClient, PSError
from psring.sync.ps.encoded import encode_push
from psring.sync.ps.server import ParameterServer
from psring.sync.ps.store import ShardStore

SEED = int(os.environ.get("PSRING_FUZZ_SEED", "20240611"))
MESSAGES = 10_000
MAX_MSG = 64 * 1024  # the server's max_message_bytes here; frames stay below it (ZeroMQ would drop the peer)
FRAME = 1024  # "big" (2400 B) travels in 3 frames
OPTIM = {"name": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0}
INIT = [("w", torch.randn(3, 4, generator=torch.Generator().manual_seed(1))), ("b", torch.arange(5.0)),
        ("big", torch.randn(600, generator=torch.Generator().manual_seed(2)))]
SHAPES = {k: list(t.shape) for k, t in INIT}
SOCKETS, BATCH, TIMEOUT_MS = 4, 32, 10_000


# --- building candidates ---------------------------------------------------------------------------
def rand_str(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return rng.choice(["push", "pushpull", "pull", "init", "state", "done", "w", "b", "big", "float32",
                           "int64", "bsp", "adam", "sgd", "aggregate", "", "op", "tensors", "\x00", "w/b"])
    return "".join(chr(rng.randrange(32, 0x2FF)) for _ in range(rng.randrange(0, 24)))


def rand_value(rng: random.Random, depth: int = 0):
    """A random msgpack-able value of any type (ext types, huge ints, NaN, nesting...)."""
    kind = rng.randrange(13 if depth < 3 else 9)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.randint(-3, 5)
    if kind == 3:
        return rng.choice([2**31, 2**40, 2**53 + 1, 2**63 - 1, -2**63, 2**64 - 1, -1])
    if kind == 4:
        return rng.choice([float("nan"), float("inf"), -0.0, 0.5, 1.0, 1e300])
    if kind == 5:
        return rand_str(rng)
    if kind == 6:
        return rng.randbytes(rng.randrange(0, 16))
    if kind == 7:
        return msgpack.ExtType(rng.randrange(0, 128), rng.randbytes(rng.randrange(0, 9)))
    if kind == 8:
        return msgpack.Timestamp(rng.randrange(0, 2**32))
    if kind == 9:
        return [rand_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    if kind == 10:
        return {rand_str(rng): rand_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))}
    if kind == 11:
        return [rand_str(rng), rng.choice(list(P.DTYPES) + ["complex64"]), [rng.randint(-1, 7)]]
    return {rng.randint(-2, 2): rand_value(rng, depth + 1)}  # int map keys: strict_map_key refuses


def pushed(named: list, codec: str | None) -> list:
    """A push's tensors: as they are, or each key's encoding with ``codec``."""
    if codec is None:
        return named
    c = parse(codec)
    return [part for k, t in named for part in encode_push(c, k, t.reshape(-1), CodecState())]


def valid(rng: random.Random, req: int, codec: str | None = None) -> tuple[dict, list]:
    """(header, named) of a valid request of a random op, as a PSClient would send it."""
    op = rng.choice(["push", "pushpull", "push", "pushpull", "pull", "init", "state", "done"])
    header = {"protocol": P.PROTOCOL, "req": req, "worker": rng.randrange(2), "op": op}
    named = []
    if op in ("push", "pushpull"):
        header["step"] = 0
        keys = rng.sample(list(SHAPES), rng.randint(1, 3))
        named = pushed([(k, torch.randn(SHAPES[k])) for k in keys], codec)
    elif op == "init":
        header["optim"] = OPTIM
        named = [(k, t.clone()) for k, t in INIT]
    elif op == "pull":
        header["version"] = rng.randrange(2)
    return header, named


def encode(header: dict, named: list) -> tuple[dict, list]:
    metas, frames = P.encode_tensors(named, FRAME)
    return {**header, "tensors": metas}, [bytes(f) for f in frames]


def semantic(rng: random.Random, header: dict, named: list) -> list:
    """A mutation that keeps the request decodable but wrong for the shard (or, by chance, right)."""
    what = rng.randrange(9)
    idx = [i for i, (k, _) in enumerate(named) if k.endswith("/indices")]
    if what == 8 and idx:  # an encoded push's index out of range
        i = rng.choice(idx)
        t = named[i][1].clone()
        t[rng.randrange(t.numel())] = rng.choice([-1, 600, 2**31 - 1, -2**31])
        named[i] = (named[i][0], t)
    elif what == 0:
        header["step"] = rng.choice([1, -1, 2, 2**53, 2**63 - 1])
    elif what == 1:
        header["worker"] = rng.choice([2, -1, 99, 2**40])
    elif what == 2 and named:  # a key twice
        named = named + [named[rng.randrange(len(named))]]
    elif what == 3 and named:  # a key the shard does not have
        i = rng.randrange(len(named))
        named[i] = (rng.choice(["zz", "W", "w ", "big/0", ""]), named[i][1])
    elif what == 4 and named:  # same bytes per element, other shape
        i = rng.randrange(len(named))
        k, t = named[i]
        named[i] = (k, t.reshape(-1) if t.dim() > 1 else t.reshape(1, -1) if rng.random() < 0.5 else t[:-1])
    elif what == 5 and named:  # another dtype, frames consistent with it
        i = rng.randrange(len(named))
        named[i] = (named[i][0], named[i][1].to(rng.choice([torch.float64, torch.float16, torch.bfloat16,
                                                             torch.int32, torch.uint8, torch.bool])))
    elif what == 6:
        named = []  # an empty push
    else:
        header["op"] = rng.choice(["pull", "state", "done", "init", "Push", "pushpull "])
    header, frames = encode(header, named)
    return [P.pack_header(header), *frames]


def mutate_meta(rng: random.Random, metas: list) -> None:
    if not metas or rng.random() < 0.2:
        metas.append([rng.choice(list(SHAPES)), "float32", rng.choice(list(SHAPES.values()))])
        return
    m = metas[rng.randrange(len(metas))]
    if not isinstance(m, list) or not m:
        return
    what = rng.randrange(6)
    if what == 0:
        m[0] = rng.choice([rand_str(rng), "zz", rng.choice(list(SHAPES)), 7])
    elif what == 1 and len(m) > 1:
        m[1] = rng.choice(list(P.DTYPES) + ["complex64", 3, None])
    elif what == 2 and len(m) > 2:
        m[2] = rng.choice([[2**40], [2**20, 2**20], [0, 2**40], [2**62, 4], [-1], [1.5], "12", [12], [2, 6],
                           [4, 3], [], [True, 3], [1] * 17, [rng.randint(0, 3000)]])
    elif what == 3:
        if len(m) == 4:
            m[3] = rng.choice([0, 1, 2, 5, 2**21, -1, "3", None])
        else:
            m.append(rng.choice([1, 2, 3, 4, 0]))
    elif what == 4:
        m.pop()
    else:
        metas.remove(m)


def mutate(rng: random.Random, header: dict, named: list) -> list:
    """A semantic mutation (for a third of pushes), or one to three random ones, of a valid (header,
    named); returns the message's frames."""
    if header["op"] in ("push", "pushpull") and rng.random() < 0.33:
        return semantic(rng, header, named)
    header, frames = encode(header, named)
    head = None  # packed header bytes once a byte-level mutation touched it
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(12)
        if head is None and kind <= 3:  # structured: on the header map
            if kind == 0:
                header[rng.choice(["op", "req", "worker", "step", "version", "protocol", "tensors", "optim",
                                   "design", "consistency", "staleness", "opt_state"])] = rand_value(rng)
            elif kind == 1:
                mutate_meta(rng, header["tensors"]) if isinstance(header.get("tensors"), list) else None
            elif kind == 2:
                header = {rand_str(rng): rand_value(rng) for _ in range(rng.randrange(0, 6))}
                if rng.random() < 0.5:
                    header["op"] = rng.choice(["push", "pushpull", "pull", "state", "done", "init"])
            else:
                header.pop(rng.choice(list(header) or ["op"]), None)
            continue
        if kind <= 3:
            kind = rng.randrange(6, 12)  # the header is bytes by now: a byte-level mutation instead
        msg = [head if head is not None else P.pack_header(header), *frames]
        i = rng.randrange(len(msg))
        if kind == 4 and not msg[i]:
            kind = 8
        if kind == 4:  # flip bytes
            b = bytearray(msg[i])
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            msg[i] = bytes(b)
        elif kind == 5:  # drop a frame (the header too: a data frame becomes it)
            if len(msg) > 1:
                del msg[i]
            else:
                msg = [b""]
        elif kind == 6:  # duplicate a frame
            msg.insert(i, msg[i])
        elif kind == 7:  # truncate a frame
            msg[i] = msg[i][: rng.randrange(len(msg[i]) + 1)]
        elif kind == 8:  # extend a frame
            msg[i] = msg[i] + rng.randbytes(rng.randint(1, 9))
        elif kind == 9:  # garbage frame
            msg.insert(i, rng.randbytes(rng.randrange(0, 64)))
        elif kind == 10:  # a header that is no map, or an odd map
            msg[0] = msgpack.packb(rng.choice([[1, 2], 3, "push", None, b"\x00", {1: 2}, [{"op": "push"}],
                                               msgpack.ExtType(1, b"x"), {"op": "push", "deep": [[[[[[[]]]]]]]}]),
                                   use_bin_type=True)
        elif rng.random() < 0.2:  # oversized in all (frames each under the limit)
            msg = [msg[0], bytes(MAX_MSG // 2 + 1), bytes(MAX_MSG // 2 + 1)]
        else:  # absurd headers
            msg = rng.choice([
                [b"\x91" * 5000 + b"\xc0"],  # nesting deeper than msgpack's stack
                [b"\xdd\xff\xff\xff\xff"],  # an array declaring 4 G items
                [b"\xdb\x00\x01\x00\x01" + b"a" * 100],  # a string longer than the limit, truncated
                [b""],  # an empty message
                msg + [b""] * rng.randint(1, 50),
            ])
        head, frames = msg[0], msg[1:]
    return [head if head is not None else P.pack_header(header), *frames]


def must_be_refused(msg: list, scratch: ShardStore) -> bool:
    """The test's rule (module docstring): True when the server is bound to refuse ``msg``."""
    if sum(len(f) for f in msg) > MAX_MSG:
        return True
    try:
        header = P.unpack_header(msg[0])
        req, protocol, op = header.get("req"), header.get("protocol", P.PROTOCOL), header.get("op")
        if (req is not None and type(req) is not int) or type(protocol) is not int or protocol != P.PROTOCOL:
            return True
        if op in ("push", "pushpull"):
            scratch.check_push(header.get("worker"), header.get("step"), P.decode_tensors(header, msg[1:]))
            return False
    except P.ProtocolError:
        return True
    if op not in ("pull", "state", "done") or len(msg) > 1:
        return True  # unknown ops, init (a second one), frames where none belong
    worker, version = header.get("worker"), header.get("version")
    if not (type(worker) is int and 0 <= worker < 2):
        return True
    return op == "pull" and not (type(version) is int and 0 <= version <= 1)


# --- the live server --------------------------------------------------------------------------------
@pytest.fixture
def fuzz_server(tmp_path):
    with serving(ParameterServer(workers=2, port=0, frame_bytes=FRAME, max_message_bytes=MAX_MSG,
                                 metrics_path=str(tmp_path / "server.jsonl"))) as srv:
        yield srv


def send_batches(addr: str, batches: list[list[list[bytes]]], seed: int) -> tuple[int, int]:
    """Send each batch spread over DEALER sockets and wait for one reply per message before the next
    batch (queues stay short); returns (error replies, ok replies)."""
    ctx = zmq.Context()
    socks = []
    errors = oks = 0
    try:
        for _ in range(SOCKETS):
            s = ctx.socket(zmq.DEALER)
            s.linger = 0
            s.sndhwm = s.rcvhwm = 4 * BATCH
            s.connect(addr)
            socks.append(s)
        for batch in batches:
            owed = [0] * SOCKETS
            for i, msg in enumerate(batch):
                socks[i % SOCKETS].send_multipart(msg)
                owed[i % SOCKETS] += 1
            for s, n in zip(socks, owed):
                for _ in range(n):
                    assert s.poll(TIMEOUT_MS), f"no reply within {TIMEOUT_MS} ms (seed {seed})"
                    reply = s.recv_multipart()
                    header = P.unpack_header(reply[0])
                    assert len(reply) == 1, f"an error reply carries no frames (seed {seed})"
                    oks += header["ok"] is True
                    errors += header["ok"] is False
            for s in socks:
                assert s.poll(0) == 0, f"more replies than requests (seed {seed})"
    finally:
        for s in socks:
            s.close(linger=0)
        ctx.term()
    return errors, oks


def make_candidates(rng: random.Random, count: int, codec: str | None = None) -> tuple[list[list[bytes]], int]:
    scratch = ShardStore(2)
    scratch.init(INIT, OPTIM, **({"codec": codec} if codec else {}))
    sent, skipped = [], 0
    while len(sent) < count:
        header, named = valid(rng, rng.randrange(1 << 20), codec)
        msg = mutate(rng, header, named)
        if must_be_refused(msg, scratch):
            sent.append(msg)
        else:
            skipped += 1
    return sent, skipped


@pytest.mark.parametrize("codec,messages", [(None, MESSAGES), ("topk:0.5", MESSAGES // 2)])
def test_fuzzed_requests_are_all_refused_and_change_nothing(fuzz_server, codec, messages):
    srv, seed = fuzz_server, SEED
    t0 = time.perf_counter()
    c0, c1 = PSClient([srv.address], 0, 10, FRAME), PSClient([srv.address], 1, 10, FRAME)
    try:
        c0.call(0, {"op": "init", "optim": OPTIM, **({"codec": codec} if codec else {})}, INIT)
        rng = random.Random(seed)
        msgs, skipped = make_candidates(rng, messages, codec)
        batches = [msgs[i:i + BATCH * SOCKETS] for i in range(0, len(msgs), BATCH * SOCKETS)]
        errors, oks = send_batches(srv.address, batches, seed)
        assert srv.thread.is_alive(), f"server died (seed {seed})"
        assert (errors, oks) == (len(msgs), 0), f"replies: {errors} errors, {oks} ok for {len(msgs)} (seed {seed})"
        assert srv.errors == len(msgs), f"server counted {srv.errors} of {len(msgs)} (seed {seed})"
        assert srv.store.version == 0 and not srv.parked and not srv.waiting, f"state moved (seed {seed})"
        fuzz_s = time.perf_counter() - t0

        # a normal BSP step: exact, as if nothing had happened
        g = [[(k, torch.randn(SHAPES[k], generator=torch.Generator().manual_seed(10 * w + i)))
              for i, k in enumerate(SHAPES)] for w in (0, 1)]
        reqs = [(c, c.send(0, {"op": "push", "step": 0}, pushed(gw, codec)), c.send(0, {"op": "pull", "version": 1}))
                for c, gw in ((c0, g[0]), (c1, g[1]))]
        if codec:  # what the server sums is what the encodings stand for
            c = parse(codec)
            g = [[(k, c.decode(c.encode(t.reshape(-1), CodecState()), t.numel()).view(t.shape)) for k, t in gw]
                 for gw in g]
        expected = {k: p.clone().add_(torch.zeros_like(p).add_(a).add_(b).div_(2), alpha=-OPTIM["lr"])
                    for (k, p), (_, a), (_, b) in zip(INIT, g[0], g[1])}
        for c, push, pull in reqs:
            c.recv(0, push)
            header, named = c.recv(0, pull)
            got = {k: v.tensor() for k, v in named}
            assert header["version"] == 1 and got.keys() == expected.keys()
            assert all(torch.equal(got[k], expected[k]) for k in expected), f"wrong parameters (seed {seed})"

        late, _ = make_candidates(random.Random(seed + 1), 10, codec)  # rejections after the last step
        assert send_batches(srv.address, [late], seed) == (10, 0)
        c0.call(0, {"op": "done"})
        c1.call(0, {"op": "done"})
        srv.thread.join(10)
        assert not srv.thread.is_alive() and srv.result["rc"] == 0
    finally:
        c0.close()
        c1.close()
    recs = [json.loads(line) for line in Path(srv.metrics_path).read_text().splitlines()]
    assert [(r["step"], r["errors"], r.get("partial", False)) for r in recs] == \
        [(0, len(msgs), False), (1, 10, True)], f"metrics records (seed {seed})"
    print(f"fuzz seed {seed} codec {codec}: {len(msgs)} sent ({skipped} valid candidates skipped), {srv.errors} errors "
          f"counted, {fuzz_s:.1f} s for the fuzz, {time.perf_counter() - t0:.1f} s in all")


class _NoBuffer:
    pass


@pytest.mark.parametrize("header,frames", [
    (_NoBuffer(), []),                                        # a header that is not bytes-like
    (P.pack_header({"op": "push", "worker": 0, "step": 0, "tensors": [["w", "float32", [3, 4]]]}), [_NoBuffer()]),
    (P.pack_header({"op": "init", "tensors": [["w", "float32", [8]]]}), [memoryview(b"\0" * 8).cast("f")]),
    (P.pack_header({"op": "pull", "version": 0, "worker": 0, "req": [1]}), []),
    (P.pack_header({"op": {"a": 1}}), []),
    (P.pack_header({"op": "pull", "version": 2**64 - 1, "worker": 0}), []),
    (P.pack_header({"op": "done", "worker": 1}), [b"x"]),
    (msgpack.packb({"op": "push", "t": msgpack.Timestamp(1)}), []),
    (b"", []),
])
def test_handle_answers_anything_without_raising(header, frames):
    """``handle`` (no serve loop, no peer): odd Python objects and malformed requests each count one
    error and raise nothing (the reply to the unknown peer is dropped, and counted as such)."""
    srv = ParameterServer(workers=2, port=0)
    try:
        srv.handle(b"nobody", header, frames)
        assert (srv.errors, srv.unexpected, srv.dropped) == (1, 0, 1)
    finally:
        srv.close()


def test_oversized_messages_are_refused_or_dropped_by_zeromq():
    """Frames adding up to more than max_message_bytes: an error reply, counted, nothing decoded. A single
    frame over it: ZeroMQ (MAXMSGSIZE) drops the sender's connection before the server sees anything, so
    the sender times out; the server serves on."""
    with serving(ParameterServer(workers=2, port=0, max_message_bytes=4096)) as srv:
        c = PSClient([srv.address], 0, timeout_s=1.0)
        try:
            with pytest.raises(PSError, match="max_message_bytes"):
                c.call(0, {"op": "init", "optim": OPTIM}, [("a", torch.zeros(600)), ("b", torch.zeros(600))])
            with pytest.raises(PSError, match="did not answer"):
                c.call(0, {"op": "init", "optim": OPTIM}, [("a", torch.zeros(2000))])
        finally:
            c.close()
        c = PSClient([srv.address], 0, timeout_s=10)
        try:
            c.call(0, {"op": "init", "optim": OPTIM}, [("a", torch.zeros(600))])
            assert c.call(0, {"op": "pull", "version": 0})[0]["version"] == 0
        finally:
            c.close()
        assert srv.errors == 1


def test_pulls_too_far_ahead_or_too_many_are_refused():
    """Before init pulls are parked, at most max_parked; at init those beyond what BSP allows (one step
    ahead) are refused; afterwards a pull more than one step ahead is refused at once."""
    with serving(ParameterServer(workers=2, port=0)) as srv:
        c = PSClient([srv.address], 0, timeout_s=10)
        try:
            parked = [c.send(0, {"op": "pull", "version": 5}) for _ in range(srv.max_parked)]
            with pytest.raises(PSError, match="wait"):
                c.call(0, {"op": "pull", "version": 0})
            c.call(0, {"op": "init", "optim": OPTIM}, INIT)
            for req in parked:
                with pytest.raises(PSError, match="too far ahead"):
                    c.recv(0, req)
            with pytest.raises(PSError, match="too far ahead"):
                c.call(0, {"op": "pull", "version": 2})
            assert c.call(0, {"op": "pull", "version": 0})[0]["version"] == 0
            assert srv.errors == srv.max_parked + 2 and not srv.parked
        finally:
            c.close()
