"""``--compress`` with ``--sync ps`` (both designs): fp16/bf16 training against uncompressed PS training,
the sparse and 1-bit codecs converge, every step's bytes are the codec's formula over the chunks; in
process, the server's checks of an encoded push (``encoded.decode_push``: a refused push changes
nothing), the exact sum of sparse pushes and the low-precision mean reply of the aggregate design; and
checkpoints with error feedback (every worker's residuals, resumed exactly), and PowerSGD's refusal."""
from __future__ import annotations


import pytest
import torch
from test_compressed import max_rel_diff, records

from psring.compress import CodecState, Encoded, parse
from psring.config import ConfigError, TrainConfig
from psring.sync.buckets import flat_layout
from psring.sync.ps.encoded import encode_push
from psring.sync.ps.protocol import ProtocolError
from psring.sync.ps.store import ShardStore
from psring.sync.ps.transport import chunk_ranges
from psring.train.models import build_model

N, S, B, STEPS, BUCKET_MB = 2, 2, 16, 5, 0.1
# fp16 and bf16 round each pushed gradient once (half an ulp: 2^-11, 2^-8 relative) and, with the
# aggregate design, the mean in the reply once more; after 5 updates the parameters differ by a few
# 2^-p of the move they made. Measured max relative differences to the plain PS run: fp16 8.5e-5
# (server-optimizer), 2.6e-4 (aggregate); bf16 7.5e-4 (server-optimizer), 1.4e-3 (aggregate). A wrong
# sum (a factor N, a missing chunk, the mean not multiplied back) gives > 1e-1.
TOLERANCE = {"fp16": 1e-3, "bf16": 1e-2}
# the frames' headers on top of the codec's bytes, per step and worker (22 chunks). Measured: about
# 1.5 kB received and 1.5-2 kB sent: < 0.2% of dense and fp16 traffic, 3% of onebit's 68 kB pushes
HEADROOM = 1.05


def train_args(out, codec=None, design="server-optimizer", steps=STEPS, extra=()):
    args = ["train", "--sync", "ps", "--workers", str(N), "--servers", str(S), "--ps-design", design,
            "--model", "cnn", "--batch-size", str(B), "--steps", str(steps), "--seed", "3", "--num-samples",
            "512", "--lr", "0.05", "--bucket-mb", str(BUCKET_MB), "--out", str(out)]
    return args + (["--compress", codec] if codec else []) + list(extra)


def chunk_numels() -> list[int]:
    """The chunks' element counts, cut as the workers cut them (no emulated links: the cap)."""
    layout = flat_layout(build_model("cnn", 0).named_parameters())
    return [r.end - r.start for r in chunk_ranges(layout, N, S, None, int(BUCKET_MB * 2**20))]


def expected_bytes(codec: str | None, design: str) -> tuple[int, int]:
    """(sent, received) per worker and step, headers left out: every worker pushes every chunk encoded
    and gets back its float32 parameters (server-optimizer) or sum (aggregate), or the mean in the
    codec's dtype (aggregate with fp16/bf16)."""
    c = parse(codec or "none")
    numels = chunk_numels()
    item = 2 if design == "aggregate" and c.dense and c.name != "none" else 4
    return sum(c.wire_bytes(n) for n in numels), sum(item * n for n in numels)


def check_bytes(recs: list[dict], codec: str | None, design: str) -> None:
    sent, recv = expected_bytes(codec, design)
    assert len(recs) > 0
    for rec in recs:
        assert sent <= rec["bytes_sent"] <= sent * HEADROOM, (sent, rec)
        assert recv <= rec["bytes_recv"] <= recv * HEADROOM, (recv, rec)


@pytest.fixture(scope="module")
def uncompressed(tmp_path_factory):
    from conftest import Psring

    tmp = tmp_path_factory.mktemp("plain")
    runner = Psring(tmp)
    try:
        r = runner.run(*train_args(tmp / "run"))
        assert r.returncode == 0, r.stderr
        check_bytes(records(tmp / "run"), None, "server-optimizer")  # the formula holds uncompressed too
        return torch.load(tmp / "run" / "model.pt")
    finally:
        runner.reap()


@pytest.mark.parametrize("codec,design", [("fp16", "server-optimizer"), ("bf16", "aggregate")])
def test_low_precision_matches_uncompressed_and_counts_its_bytes(psring, tmp_path, uncompressed, codec,
                                                                 design):
    run = tmp_path / "run"
    r = psring.run(*train_args(run, codec, design))
    assert r.returncode == 0, r.stderr
    diff = max_rel_diff(torch.load(run / "model.pt"), uncompressed)
    assert 0 < diff <= TOLERANCE[codec], f"{codec} {design}: max relative difference {diff:.2e}"
    check_bytes(records(run), codec, design)


# Measured (first 3 steps' mean loss -> last 5 steps'): topk 2.29 -> 1.08; topk without error feedback
# 2.29 -> 1.94; onebit (aggregate) at --lr 0.02 2.29 -> 1.34; randomk (SSP, staleness 1) at --lr 0.01 2.29 ->
# 1.61..1.65 over 3 runs (SSP's timing varies). Lower rates than topk's 0.05, each for a measured reason:
# * onebit at 0.05 diverges on the PS with 2 servers (2.29 -> 3.33, both designs), where it converges on
#   all-reduce (1.69): the PS cuts the flat vector into equal chunks across parameters, so one scale
#   (mean |x| of the chunk) covers fc2's large and fc1's small gradients. With whole-parameter chunks
#   (--servers 1: the same buckets as all-reduce's at --first-bucket-mb 0.1) the aggregate design gives
#   all-reduce's model bit for bit (measured for onebit and topk).
# * randomk under SSP at 0.02 diverges (2.29 -> 3.0, 3.6): SSP applies each worker's gradient as it
#   arrives, not their mean, so the step is N times BSP's (plain SSP at 0.02 still converges, 1.49).
@pytest.mark.parametrize("codec,design,extra", [
    ("topk:0.1", "server-optimizer", ()),
    ("onebit", "aggregate", ("--lr", "0.02")),
    ("randomk:0.1", "server-optimizer", ("--lr", "0.01", "--consistency", "ssp", "--staleness", "1")),
    # (without error feedback: the same code path less the residual; its cost in accuracy is measured in
    # results/compression, and the all-reduce family's onebit case runs without it in test_compressed)
])
def test_sparse_and_onebit_train_and_count_their_bytes(psring, tmp_path, codec, design, extra):
    run = tmp_path / "run"
    args = train_args(run, codec, design, steps=30, extra=("--dataset", "digits", "--no-eval", *extra))
    args[args.index("--num-samples"):args.index("--num-samples") + 2] = []  # the whole digits set
    r = psring.run(*args)
    assert r.returncode == 0, r.stderr
    recs = records(run)
    assert len(recs) == 30 * N
    check_bytes(recs, codec, design)  # the replies: float32 parameters, or (onebit) the dense float32 sum
    loss = [sum(x["loss"] for x in recs if x["step"] == s) / N for s in range(30)]
    first, last = sum(loss[:3]) / 3, sum(loss[-5:]) / 5
    assert last < first - 0.2, f"{codec} {design} {extra}: loss {first:.3f} -> {last:.3f}"


# --- in process: the server's side of an encoded push ---------------------------------------------------
LR = 0.1
OPTIM = {"lr": LR, "momentum": 0.0, "weight_decay": 0.0}
INIT = [("a", torch.randn(10, generator=torch.Generator().manual_seed(1))),
        ("b", torch.randn(3, 3, generator=torch.Generator().manual_seed(2)))]


def gradients(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: torch.randn(p.shape, generator=gen) for k, p in INIT}


def encoded(spec: str, seed: int) -> list[tuple[str, torch.Tensor]]:
    """A worker's push of every key of INIT, encoded with ``spec`` (fresh codec state)."""
    c = parse(spec)
    return [x for k, g in gradients(seed).items() for x in encode_push(c, k, g.reshape(-1), CodecState())]


def decoded(spec: str, seed: int) -> dict[str, torch.Tensor]:
    """What that push stands for, per key (dense, the key's shape)."""
    c, named = parse(spec), encoded(spec, seed)
    return {k: c.decode(Encoded({n.split("/")[1]: t for n, t in named if n.split("/")[0] == k}),
                        p.numel()).view(p.shape) for k, p in INIT}


def store(spec: str, semantics: dict | None = None) -> ShardStore:
    st = ShardStore(N)
    st.init([(k, p.clone()) for k, p in INIT], OPTIM, semantics, codec=spec)
    return st


def unchanged(st: ShardStore) -> None:
    """Nothing of a step is recorded yet: version 0, no key counted, the initial parameters."""
    assert st.version == 0 and not st.updated
    assert all(c == 0 for c in st.count.values()) and all(not w for w in st.pushed.values())
    assert all(torch.equal(st.params[k], p) for k, p in INIT)


def replace(named, name, t):
    return [(n, t if n == name else x) for n, x in named]


def bad_topk_pushes(good: list[tuple[str, torch.Tensor]]) -> dict[str, list]:
    """Variants of a valid top-k:0.5 push of keys a (10 elements, k=5) and b (9, k=5); most spoil key b,
    after a valid a, so a refusal must also undo nothing of a."""
    d = dict(good)
    idx, val = d["b/indices"], d["b/values"]
    return {
        "part missing": [x for x in good if x[0] != "b/values"],
        "parts in the wrong order": good[:2] + [good[3], good[2]],
        "extra part": good + [("b/scale", torch.ones(1))],
        "extra part inside a key": good[:2] + [good[2], ("b/extra", torch.ones(5)), good[3]],
        "indices int64": replace(good, "b/indices", idx.long()),
        "values float64": replace(good, "b/values", val.double()),
        "k-1 indices": replace(good, "b/indices", idx[:-1].clone()),
        "k-1 elements": replace(replace(good, "b/indices", idx[:-1].clone()), "b/values", val[:-1].clone()),
        "2-D values": replace(good, "b/values", val.view(1, -1)),
        "index == numel": replace(good, "b/indices", torch.tensor([0, 1, 2, 3, 9], dtype=torch.int32)),
        "negative index": replace(good, "b/indices", torch.tensor([0, 1, -1, 3, 4], dtype=torch.int32)),
        "index == numel in the first key": replace(good, "a/indices", torch.tensor([0, 1, 2, 3, 10],
                                                                                   dtype=torch.int32)),
        "plain key name": good[:2] + [("b", torch.zeros(3, 3))],
        "plain name of a part": good[:2] + [("indices", idx), ("values", val)],
        "unknown key": good + [("zz/indices", idx), ("zz/values", val)],
        "key twice": good + good[:2],
    }


def test_valid_encoded_push_is_accepted_and_every_malformed_one_is_refused_without_a_trace():
    spec = "topk:0.5"
    st = store(spec)
    assert st.state()["codec"] == spec and store("none").state()["codec"] == "none"
    assert parse(spec).layout(9) == {"indices": (torch.int32, (5,)), "values": (torch.float32, (5,))}
    good = encoded(spec, 10)
    assert [n for n, _ in good] == ["a/indices", "a/values", "b/indices", "b/values"]
    for what, named in bad_topk_pushes(good).items():
        with pytest.raises(ProtocolError):
            st.push(0, 0, named)
            pytest.fail(f"{what}: accepted")
        unchanged(st)
    assert st.push(0, 0, good) is False
    for what, named in bad_topk_pushes(encoded(spec, 11)).items():  # refused again with one worker in
        with pytest.raises(ProtocolError):
            st.push(1, 0, named)
            pytest.fail(f"{what}: accepted from worker 1")
        assert st.version == 0 and all(c == 1 for c in st.count.values())
        assert all(w == {0} for w in st.pushed.values())
    with pytest.raises(ProtocolError):  # worker 0 again: twice for this step
        st.push(0, 0, encoded(spec, 12))
    assert st.push(1, 0, encoded(spec, 11)) is True and st.version == 1
    d0, d1 = decoded(spec, 10), decoded(spec, 11)
    for k, p in INIT:  # the server's float32 order: (0 + d0 + d1) / 2, then p - lr * that
        want = p.clone().add_(torch.zeros_like(p).add_(d0[k]).add_(d1[k]).div_(N), alpha=-LR)
        assert torch.equal(st.params[k], want), k
    assert st.state()["codec"] == spec


@pytest.mark.parametrize("spec", ["powersgd:2", "zip", 7, None, "topk:2", "topk", "fp16:1"])
def test_init_refuses_a_bad_codec_and_leaves_no_trace(spec):
    st = ShardStore(N)
    with pytest.raises(ProtocolError):
        st.init([(k, p.clone()) for k, p in INIT], OPTIM, codec=spec)
    assert not st.initialized and st.params == {} and st.codec is None
    st.init([(k, p.clone()) for k, p in INIT], OPTIM, codec="onebit")  # a valid init still works
    assert st.initialized and st.state()["codec"] == "onebit"


def test_onebit_push_needs_its_signs_length():
    st = store("onebit")
    good = encoded("onebit", 5)
    assert [tuple(t.shape) for _, t in good] == [(2,), (1,), (2,), (1,)]  # 10 and 9 elements: 2 bytes each
    signs = dict(good)["b/signs"]
    for bad in (signs[:1].clone(), torch.cat([signs, signs[:1]]), signs.to(torch.int8), torch.ones(2)):
        with pytest.raises(ProtocolError):
            st.push(0, 0, replace(good, "b/signs", bad))
        unchanged(st)
    with pytest.raises(ProtocolError):  # the scale: one float32
        st.push(0, 0, replace(good, "a/scale", torch.ones(2)))
    unchanged(st)
    st.push(0, 0, good)
    assert st.push(1, 0, encoded("onebit", 6)) is True
    d0, d1 = decoded("onebit", 5), decoded("onebit", 6)
    for k, p in INIT:
        want = p.clone().add_(torch.zeros_like(p).add_(d0[k]).add_(d1[k]).div_(N), alpha=-LR)
        assert torch.equal(st.params[k], want), k


def reply_sums(named: list, keys: list[str], numels: dict | None = None) -> dict[str, torch.Tensor]:
    """An aggregate reply read back as each key's dense float32 sum (1-D), in either form a sparse codec's
    reply may take: the sum itself (``KEY``), or its nonzeros (``KEY/indices``, ``KEY/values``, each
    index once)."""
    out, rest = {}, list(named)
    numels = numels or {k: p.numel() for k, p in INIT}
    for k in keys:
        if rest and rest[0][0] == k:
            (_, t), rest = rest[0], rest[1:]
            assert t.dtype == torch.float32 and t.numel() == numels[k], (k, t.dtype, t.shape)
            out[k] = t.reshape(-1)
            continue
        assert [n for n, _ in rest[:2]] == [f"{k}/indices", f"{k}/values"], [n for n, _ in named]
        (_, idx), (_, val), rest = rest[0], rest[1], rest[2:]
        assert idx.numel() == val.numel() == idx.unique().numel() and val.dtype == torch.float32
        out[k] = torch.zeros(numels[k]).index_put_((idx.long(),), val)
    assert not rest, [n for n, _ in rest]
    return out


def test_aggregate_sums_sparse_pushes_exactly():
    spec = "topk:0.5"
    st = store(spec, {"design": "aggregate"})
    for step in range(2):  # the sums are double-buffered by step parity: both buffers
        e0, e1 = encoded(spec, 20 + step), encoded(spec, 30 + step)
        ia, ib = dict(e0)["a/indices"].tolist(), dict(e1)["a/indices"].tolist()
        assert set(ia) & set(ib) and set(ia) ^ set(ib)  # some elements from both workers, some from one
        assert st.push(0, step, e0) is False and not st.reply_ready(["a", "b"], step)
        assert st.push(1, step, e1) is True and st.reply_ready(["a", "b"], step)
        d0, d1 = decoded(spec, 20 + step), decoded(spec, 30 + step)
        version, named = st.reply(0, ["a", "b"], step)
        assert version == step + 1
        for k, t in reply_sums(named, ["a", "b"]).items():
            assert torch.equal(t, (d0[k] + d1[k]).view(-1)), (step, k)
    assert all(torch.equal(st.params[k], p) for k, p in INIT)  # aggregate: the start version stays


@pytest.mark.parametrize("spec", ["topk:0.1", "randomk:0.1"])
def test_aggregate_sparse_reply_is_the_sums_nonzeros_and_workers_check_it(spec):
    """A top-k/random-k sum travels back as its nonzeros: k <= m <= N*k of them (at most N*k, at least
    k unless values cancel), indices ascending; a worker refuses a reply that is not such a sum."""
    from psring.sync.ps.encoded import decode_sparse_sum
    from psring.sync.ps.received import received

    n, c = 1000, parse(spec)
    k = c.k(n)
    st = ShardStore(N)
    st.init([("w", torch.zeros(n))], OPTIM, {"design": "aggregate"}, codec=spec)
    gens = [torch.Generator().manual_seed(60 + w) for w in range(N)]
    encs = [encode_push(c, "w", torch.randn(n, generator=g), CodecState(seed=w)) for w, g in enumerate(gens)]
    for w, e in enumerate(encs):
        st.push(w, 0, e)
    _, named = st.reply(0, ["w"], 0)
    assert [name for name, _ in named] == ["w/indices", "w/values"]
    idx, val = (t for _, t in named)
    assert idx.dtype == torch.int32 and k <= idx.numel() <= N * k and bool((idx[1:] > idx[:-1]).all())
    want = sum(c.decode(Encoded({p.split("/")[1]: t for p, t in e}), n) for e in encs)
    assert torch.equal(reply_sums(named, ["w"], {"w": n})["w"], want)
    got = decode_sparse_sum(c, [(name, received(t)) for name, t in named], "w", n)
    dense = torch.full((n,), 7.0)
    got.copy_into(dense)
    assert torch.equal(dense, want)
    bad = {"names": [("w/values", val), ("w/indices", idx)],
           "index == numel": [("w/indices", torch.cat([idx[:-1], torch.tensor([n], dtype=torch.int32)])),
                              ("w/values", val)],
           "negative index": [("w/indices", torch.cat([torch.tensor([-1], dtype=torch.int32), idx[1:]])),
                              ("w/values", val)],
           "lengths differ": [("w/indices", idx), ("w/values", val[:-1])],
           "more than numel": [("w/indices", torch.arange(n + 1, dtype=torch.int32)),
                               ("w/values", torch.ones(n + 1))],
           "int64 indices": [("w/indices", idx.long()), ("w/values", val)]}
    for what, named in bad.items():
        with pytest.raises(ProtocolError):
            decode_sparse_sum(c, [(name, received(t)) for name, t in named], "w", n)
            pytest.fail(f"{what}: accepted")


@pytest.mark.parametrize("spec,dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_aggregate_answers_the_mean_in_the_low_precision_dtype(spec, dtype):
    """The reply is the mean of the pushed values in the codec's dtype, divided before the cast: a
    sum of two fp16 values near 4e4 is past fp16's largest (65504), their mean is not."""
    st = store(spec, {"design": "aggregate"})
    c = parse(spec)
    for step in range(2):
        pushed = []
        for w in range(N):
            g = gradients(40 + 10 * w + step)
            g["a"] = 4e4 + 1e3 * g["a"]
            named = [x for k, t in g.items() for x in encode_push(c, k, t.reshape(-1), CodecState())]
            assert all(t.dtype == dtype for _, t in named)
            st.push(w, step, named)
            pushed.append(dict(named))
        version, named = st.reply(1, ["b", "a"], step)
        assert version == step + 1 and [k for k, _ in named] == ["b", "a"]
        for k, t in named:
            want = (pushed[0][f"{k}/values"].float() + pushed[1][f"{k}/values"].float()).div(N).to(dtype)
            assert t.dtype == dtype and torch.isfinite(t).all() and torch.equal(t.view(-1), want), (step, k)
    with pytest.raises(ProtocolError):  # float32 values where the codec's dtype is due
        st.push(0, 2, [(f"{k}/values", g.reshape(-1)) for k, g in gradients(1).items()])
    assert st.count == {"a": 0, "b": 0}


# --- configuration ----------------------------------------------------------------------------------
@pytest.mark.parametrize("codec,design", [("topk:0.1", "aggregate")])  # (server-optimizer: the same feedback_state)
def test_error_feedback_checkpoint_resumes_exactly(psring, tmp_path, codec, design):
    """Each worker writes its residuals beside rank 0's checkpoint (checkpoint/rankR.pt); a run resumed
    after step 3 ends where the uninterrupted run ends. Without them, resuming fails in one line."""
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    r = psring.run(*train_args(whole, codec, design, steps=8, extra=("--checkpoint-every", "4")))
    assert r.returncode == 0, r.stderr
    for rank in range(N):
        own = torch.load(whole / "checkpoint" / f"rank{rank}.pt", weights_only=True)
        assert own["step"] == 3 and own["state"]["codec"] == codec
        assert any(t.abs().sum() > 0 for t in own["state"]["residuals"]), rank  # what the codec held back
    r = psring.run(*train_args(resumed, codec, design, steps=8, extra=("--resume", str(whole))))
    assert r.returncode == 0, r.stderr
    a, b = torch.load(whole / "model.pt"), torch.load(resumed / "model.pt")
    assert max_rel_diff(b, a) < 1e-6, max_rel_diff(b, a)
    if design == "aggregate":  # the local optimizer, restored: bit for bit
        for k in a:
            assert torch.equal(a[k], b[k]), k
    (whole / "checkpoint" / "rank1.pt").unlink()
    r = psring.run(*train_args(tmp_path / "lost", codec, design, steps=8, extra=("--resume", str(whole))))
    assert r.returncode != 0 and "rank1.pt" in r.stderr, r.stderr


def ps_config(**kw) -> TrainConfig:
    return TrainConfig(sync="ps", workers=N, servers=S, **kw)


def test_powersgd_on_ps_is_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        ps_config(compress="powersgd:1").validate()
    msg = str(e.value)
    assert "\n" not in msg and "--compress powersgd:1" in msg and "--sync ps" in msg, msg
