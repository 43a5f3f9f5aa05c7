"""sync/ps/frames.py: frames out without pyzmq's send_multipart, readiness without a poller, and the cache of a
tensor's frames (which must follow the tensor's memory and notice a new tensor under the same key)."""
import torch
import zmq

from psring.sync.ps.frames import DONTWAIT, FrameCache, readable, send_frames
from psring.sync.ps.protocol import encode_tensors


def test_send_frames_and_readable_over_a_pair():
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        a.bind("inproc://frames-test")
        b.connect("inproc://frames-test")
        assert not readable(b)
        t = torch.arange(6, dtype=torch.float32)
        send_frames(a, [b"head", memoryview(t.numpy()), b""], DONTWAIT)
        assert b.poll(2000) and readable(b)
        got = b.recv_multipart()
        assert got == [b"head", t.numpy().tobytes(), b""]
        assert not readable(b)
    finally:
        a.close(linger=0)
        b.close(linger=0)
        ctx.term()


def test_frame_cache_follows_the_tensor_and_a_new_one():
    cache, t = FrameCache(None), torch.zeros(4)
    metas, frames = cache.encode([("c0", t)])
    assert (metas, [bytes(f) for f in frames]) == (encode_tensors([("c0", t)])[0], [bytes(4 * 4)])
    t.add_(1.5)  # updated in place, as a BSP server's parameters are: the same frames now read the new values
    metas2, frames2 = cache.encode([("c0", t)])
    assert frames2[0] is frames[0] and bytes(frames2[0]) == t.numpy().tobytes()
    u = torch.full((4,), 7.0)  # another tensor under the key: encoded anew
    _, frames3 = cache.encode([("c0", u)])
    assert frames3[0] is not frames[0] and bytes(frames3[0]) == u.numpy().tobytes()


def test_frame_cache_off_and_split_frames():
    t = torch.arange(10, dtype=torch.float32)
    cache = FrameCache(16)  # 16-byte frames: the tensor goes in three
    assert [bytes(f) for f in cache.encode([("k", t)], cache=False)[1]] == \
        [bytes(f) for f in encode_tensors([("k", t)], 16)[1]]
    metas, frames = cache.encode([("k", t), ("j", t[:2].clone())])
    assert metas[0][-1] == 3 and len(frames) == 4 and b"".join(bytes(f) for f in frames[:3]) == t.numpy().tobytes()


def test_a_cached_large_frame_is_one_zmq_frame_that_follows_the_tensor():
    """Frames at or over pyzmq's copy threshold are cached as zero-copy ``zmq.Frame`` objects (sent again as
    reference copies, not through pyzmq's garbage-collector thread); what arrives is the tensor's memory as it is
    at each send."""
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        port = a.bind_to_random_port("tcp://127.0.0.1")
        b.connect(f"tcp://127.0.0.1:{port}")
        cache, t = FrameCache(None), torch.zeros(zmq.COPY_THRESHOLD // 4)
        _, frames = cache.encode([("c0", t)])
        assert isinstance(frames[0], zmq.Frame) and cache.encode([("c0", t)])[1][0] is frames[0]
        for value in (1.0, 2.5):
            t.fill_(value)
            send_frames(a, frames)
            assert b.poll(10_000)  # (a timeout, not a hang, if it never comes)
            got = b.recv(copy=False)
            assert torch.equal(torch.frombuffer(bytearray(got.buffer), dtype=torch.float32), t)
    finally:
        a.close(linger=0)
        b.close(linger=0)
        ctx.term()
