"""A worker's chunks on their servers, for both PS designs: how they are cut, how a step's pushpulls
leave under credits, and how their replies come back in order.

The model's parameters, as one flat vector in backward order, are cut into equal chunks spread
round-robin over the servers (``sharding.plan_chunks``; fitted to the link where it is known). Each
chunk is one bucket of ``buckets.GradBuckets`` (``.grad`` are views into the flat buffer), pushed as a
``pushpull``: the server answers it once every worker's gradients for it arrived (and, in the
server-optimizer design, its update ran). Frames go to ZeroMQ without copies: the chunk's own memory
(on GPU, a pinned host copy made asynchronously, then waited for).

With a codec (``--compress``), a push carries the chunk's encoding instead (``encoded``), error
feedback kept per chunk on this worker.

Planned order (``--ps-order planned``, the default; ``priority`` pushes by priority at each freed credit;
``push_order``): under credits, once a step was timed (``PLAN_STEP``), every later step
ranks its chunks by the order one serial link would serve them by priority over that step's hand-over times
(at the worker's link rate; under ``--overlap full`` at the pace its pushes were acked in that step, since a
chunk is answered only once every worker's copy is in and the pushes back up beyond what the link alone says),
and at each freed credit pushes the ready chunk earliest in that order (the reduce
family's kept order, ``sync/serving_order.py``; TicTac's, Hashemi et al., SysML'19, used as a ranking so the
link never idles). Pushed by priority at the instant a credit frees instead (``--ps-order priority``), the
workers' orders drift apart (acks come back at different times), and a server waits for the last worker's copy
of each chunk. Each worker plans from its own timing, with no round to agree: where two chunks' hand-overs nearly
tie, two workers' plans can differ (traced at N = 4, 1 Gbit: a few neighbours swapped), which costs a chunk's
wait, not correctness. The plan as a strict sequence (a chunk waiting for its turn) was measured too and lost at
N = 8, 100 Mbit, where a chunk handed over later than in the timed step held up ready ones and the link idled
(``results/overlap_floor``).

Credits (``window``): at most that many of this worker's pushpulls unanswered per server. Every worker
sends its chunks in the same order, so with a window the N copies of a chunk reach its server
together and its reply leaves while later chunks still arrive, instead of a fast TCP flow running
ahead and the slowest flow's chunks all completing at the end (ByteScheduler's credits, SOSP'19).
"""
from __future__ import annotations

import heapq
import re
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from ...compress import Codec, CodecState
from ..buckets import Bucket, BucketRange, space_sizes
from ..serving_order import busy_seconds, timed_order
from .client import PSClient
from .encoded import decode_sparse_sum, encode_push
from .frames import FrameCache
from .received import Received
from .sharding import chunk_bytes, plan_chunks

# The step whose hand-over times plan the push order (``push_order``) of every later step: the second one
# this worker runs (its first pays the first pass's allocations and caches).
PLAN_STEP = 1


def push_order(handed: list[float], nbytes: list[int], link_Bps: float, spans: list | None = None) -> list[int]:
    """The chunks' push order from one timed step: the order a serial link serves them in, taking whenever
    free the chunk nearest the input (the highest index) among those handed over (``handed[i]``, seconds on
    any one clock), each for its bytes' share of the link's busy seconds (``serving_order.timed_order``): the
    union of the pushes' ``spans`` (push to ack, as timed: ``--overlap full``, where the next forward waits
    for the front chunks and the plan must see the backlog the step really had), else the bytes at
    ``link_Bps``. The simulator's replay plans with this function too (``simulate/overlapped_ps.py``).

    >>> push_order([0.0, 0.0, 0.5, 2.5], [1000] * 4, 1000.0)  # 2, ready while 1 holds the link, before 0
    [1, 2, 0, 3]
    >>> push_order([0.0, 0.0, 1.5, 2.5], [1000] * 4, 1000.0, [(0.0, 4.0), (3.0, 8.0)])  # busy 8 s: 3 before 0
    [1, 2, 3, 0]
    """
    busy_s = busy_seconds(spans) if spans else sum(nbytes) / link_Bps
    return timed_order(handed, busy_s, nbytes)


def chunk_key(b: Bucket) -> str:
    """A chunk's key on its server (the protocol's tensor name)."""
    return f"c{b.index}"


def chunk_ranges(layout, world: int, servers: int, links_Bps, cap_bytes: int,
                 shares: list[float] | None = None, drain: float = 1.0,
                 shared_cores: int | None = None) -> list[BucketRange]:
    """The chunks of ``layout`` for ``servers`` servers: fitted to the links where known, else ``cap``;
    ``shares``: the servers' unequal shares (``--ps-placement mixed``), else equal ones. ``drain`` and
    ``shared_cores``: what the fit weighs (``sharding.fitted_chunk_bytes``)."""
    sizes, itemsizes = space_sizes(layout)
    m_bytes = sum(n * i for sp, i in zip(sizes, itemsizes) for n in sp)
    cap = chunk_bytes(m_bytes, world, servers, links_Bps, cap_bytes, drain, shared_cores)
    return plan_chunks(sizes, itemsizes, servers, cap, split=links_Bps is not None, shares=shares)


@dataclass
class Sent:
    """A pushpull on its way: its request id, its chunk, its trace message (duration set on arrival), and
    the encoded tensors its frames point into (kept alive until the reply: ZeroMQ sends without copies)."""
    req: int
    bucket: Bucket
    trace: list = field(default_factory=list)
    keep: list = field(default_factory=list)


class ChunkTransport:
    """This worker's pushpulls of one step, per server: sent (unanswered or not yet used) and queued
    (ready, waiting for a credit)."""

    def __init__(self, client: PSClient, buckets: list[Bucket], servers: int, device: torch.device, window: int,
                 codec: Codec | None = None, rank: int = 0, credit_bytes: int = 0, link_Bps: float | None = None,
                 timed_busy: bool = False):
        """``credit_bytes`` > 0: the priority scheduler (``pump``) instead of per-server FIFO queues under
        ``window``; with ``link_Bps`` (``sharding.plan_link_Bps``) it plans the push order once ``PLAN_STEP`` was timed
        (``push_order``; ``timed_busy``: from the timed step's push-to-ack spans, ``--overlap full``)."""
        self.client, self.window, self.codec, self.credit = client, window, codec, credit_bytes
        self.link_Bps = link_Bps
        self.order: list[int] | None = None  # the planned push order (chunk indices), once planned
        self.rank: dict[int, int] = {}  # chunk index -> its position in ``order``
        self.steps_run = 0  # steps this transport ended (the step numbers start where a resumed run does)
        self.handed_at: dict[int, float] = {}  # chunk index -> when the trainer handed it over (perf_counter)
        self.timed_busy = timed_busy
        self.spans: dict[tuple[int, int], list] = {}  # (server, request) -> [pushed, acked] in the timed step
        # per chunk, the codec's state (error-feedback residual, a random codec's draws), seeded per rank
        self.states = {b.index: CodecState(seed=(rank << 20) + b.index) for b in buckets}
        self.chunks: list[list[Bucket]] = [[] for _ in range(servers)]  # per server, in launch order
        for b in buckets:
            self.chunks[b.group].append(b)
        # per chunk, the memory its push leaves from: the gradient buffer itself, or on GPU a pinned copy
        self.host = {b.index: b.flat if device.type == "cpu" else torch.empty(
            b.flat.shape, dtype=b.flat.dtype, pin_memory=True) for b in buckets}
        self.device = device
        self.wire = FrameCache(client.frame_bytes)  # push frames (a chunk's own memory, the same each step, kept)
        self.names: dict[int, tuple[str, str]] = {}  # per chunk, its push's and its reply's trace names
        self.step = 0
        self.new_step()

    def new_step(self) -> None:
        self.sent: list[deque[Sent]] = [deque() for _ in self.chunks]
        self.queued: list[deque[Bucket]] = [deque() for _ in self.chunks]
        # the priority scheduler's: ready chunks by forward priority (or rank in the planned order), and pushes
        # not yet received
        self.ready: list[tuple[int, Bucket]] = []
        self.unacked: dict[tuple[int, int], int] = {}  # (server, request) -> bytes
        self.unacked_bytes = 0  # their sum
        self.messages: list[list] = []  # [start perf_counter, name, duration] per push and reply
        # bytes are counted from the end of the previous step: with overlap, pushes leave during backward
        self.sent0, self.recv0 = self.client.bytes_sent, self.client.bytes_recv

    @property
    def inflight(self) -> bool:
        return any(self.sent) or any(self.queued) or bool(self.ready)

    def bytes(self) -> tuple[int, int]:
        """(sent, received) since the step began, headers included."""
        return self.client.bytes_sent - self.sent0, self.client.bytes_recv - self.recv0

    def enqueue(self, b: Bucket) -> None:
        if self.credit:  # nearest the input first, or earliest in the planned order
            heapq.heappush(self.ready, (self.rank[b.index] if self.rank else -b.index, b))
        else:
            self.queued[b.group].append(b)

    def pump_ready(self, collect: bool = True) -> None:
        """The priority scheduler: push the ready chunk nearest the model's input first (the highest
        index: the layout is in backward order), since the next forward needs it first (P3, Jayarajan et
        al. SysML'19; in backward that is the newest ready one), while fewer than ``credit`` bytes of this
        worker's pushes are not yet received by their servers (ByteScheduler's credits, Peng et al.
        SOSP'19). Credits come back with the servers' acks, whatever the other workers do, so workers
        need not push in the same order; what is not pushed stays here, where priority still applies. With a
        planned order (``push_order``), the ready chunk earliest in it goes first instead. ``collect`` False:
        the caller has just taken every ack off the sockets (the communication thread, after its poll), so
        the servers are not asked again (a readiness check is a system call per socket)."""
        if self.unacked:
            if collect:
                for s in {s for s, _ in self.unacked}:
                    self.client.collect(s)
            for key in [k for k in self.unacked if self.client.received(*k)]:
                self.unacked_bytes -= self.unacked.pop(key)
                if key in self.spans:
                    self.spans[key][1] = time.perf_counter()
        while self.unacked_bytes < self.credit and self.ready:
            b = heapq.heappop(self.ready)[1]
            self._push(b)
            key = (b.group, self.sent[b.group][-1].req)
            self.unacked[key] = b.nbytes
            if self.timed_busy and self.link_Bps is not None and self.order is None and self.steps_run == PLAN_STEP:
                self.spans[key] = [self.sent[b.group][-1].trace[0], None]
            self.unacked_bytes += b.nbytes

    def handed(self, b: Bucket) -> None:
        """The trainer handed chunk ``b`` over now (its thread; the comm thread reads the times at the step's
        end, while the trainer waits for it)."""
        if self.link_Bps is not None and self.order is None:
            self.handed_at[b.index] = time.perf_counter()

    def pump(self, s: int) -> None:
        """Send server ``s``'s queued chunks while it has credits. Replies already here are taken off the
        socket first (not used: that is ``take``'s), so this may run from inside backward."""
        if not self.queued[s]:
            return
        if self.window:
            self.client.collect(s)
            busy = sum(1 for x in self.sent[s] if not self.client.arrived(s, x.req))
        else:
            busy = -len(self.queued[s])  # no window: everything at once
        while self.queued[s] and (not self.window or busy < self.window):
            self._push(self.queued[s].popleft())
            busy += 1

    def pump_all(self) -> None:
        if self.credit:
            return self.pump_ready()
        for s in range(len(self.chunks)):
            self.pump(s)

    def _push(self, b: Bucket) -> None:
        s, host = b.group, self.host[b.index]
        t = time.perf_counter()
        if self.codec is not None:  # encoded where the gradient is, the (small) parts copied to the host
            named = encode_push(self.codec, chunk_key(b), b.flat, self.states[b.index])
            wire = self.wire.encode(named, cache=False)
        else:
            if host is not b.flat:  # GPU: device-to-host into pinned memory, asynchronous, then waited for
                host.copy_(b.flat, non_blocking=True)
                torch.cuda.current_stream(self.device).synchronize()
            named = [(chunk_key(b), host)]
            wire = self.wire.encode(named)
        header = {"op": "pushpull", "step": self.step}
        if self.credit:
            header["ack"] = True
        req = self.client.send(s, header, encoded=wire)
        sent = time.perf_counter()
        push_name, reply_name = trace_names(b, named) if self.codec is not None else \
            self.names.get(b.index) or self.names.setdefault(b.index, trace_names(b, named))
        reply = [sent, reply_name, None]
        self.messages += [[t, push_name, sent - t], reply]
        self.sent[s].append(Sent(req, b, reply, [x for _, x in named]))

    def take(self, s: int) -> tuple[Bucket, Received] | None:
        """Server ``s``'s next reply in send order if it is here (the priority scheduler: any of its
        replies that is here, workers' orders may differ): (its chunk, the chunk's tensor)."""
        sent = self.sent[s]
        if not self.client.early[s]:  # nothing of this server's here
            return None
        at = next((i for i, x in enumerate(sent) if self.client.arrived(s, x.req)), None) if self.credit else \
            (0 if sent and self.client.arrived(s, sent[0].req) else None)
        if at is None:
            return None
        x = sent[at]
        del sent[at]
        _, named = self.client.recv(s, x.req)
        x.trace[2] = time.perf_counter() - x.trace[0]
        key = chunk_key(x.bucket)
        if self.codec is not None and named and named[0][0] != key:  # the aggregate design's sparse sum
            named = [(key, decode_sparse_sum(self.codec, named, key, x.bucket.flat.numel()))]
        if [k for k, _ in named] != [key]:
            raise RuntimeError(f"PS server {s} answered with {[k for k, _ in named][:3]}, expected "
                               f"[{chunk_key(x.bucket)!r}]")
        return x.bucket, named[0][1]

    def wait_any(self) -> None:
        """Wait for a message from a server this worker waits on; the priority scheduler pushes what the
        acks among them (or ones taken off the sockets before) made room for."""
        if self.credit:
            self.pump_ready()
        self.client.wait_any([s for s in range(len(self.chunks)) if self.sent[s]])
        if self.credit:
            self.pump_ready()

    def end_step(self) -> None:
        if self.steps_run == PLAN_STEP and self.link_Bps is not None and len(self.handed_at) == len(self.host):
            nbytes = dict(sorted((b.index, b.nbytes) for mine in self.chunks for b in mine))
            spans = [x for x in self.spans.values() if x[1] is not None]
            self.order = push_order([self.handed_at[i] for i in nbytes], list(nbytes.values()), self.link_Bps,
                                    spans if len(spans) == len(nbytes) else None)
            self.rank = {c: k for k, c in enumerate(self.order)}
        self.handed_at.clear()
        self.spans.clear()
        self.steps_run += 1
        self.step += 1
        self.new_step()


def trace_names(b: Bucket, named: list) -> tuple[str, str]:
    """A chunk's push's and reply's names in a step's trace (``parse_message`` reads them back); the push's
    names its size as sent (a codec's encoding)."""
    mb = sum(x.numel() * x.element_size() for _, x in named) / 2**20
    return f"push chunk {b.index} to server {b.group} ({mb:.2f} MB)", f"params of chunk {b.index} from server {b.group}"


_PUSH = re.compile(r"push chunk (\d+) to server (\d+) \(([0-9.]+) MB\)")  # Transport._push's names
_REPLY = re.compile(r"params of chunk (\d+) from server (\d+)")


def parse_message(name: str) -> tuple[str, int, int, int | None] | None:
    """A trace message name of ``Transport._push`` read back: ("push", chunk, server, bytes, to the
    0.01 MiB the name keeps) or ("reply", chunk, server, None); None for any other name."""
    if isinstance(name, str) and (m := _PUSH.fullmatch(name)):
        return "push", int(m[1]), int(m[2]), round(float(m[3]) * 2**20)
    if isinstance(name, str) and (m := _REPLY.fullmatch(name)):
        return "reply", int(m[1]), int(m[2]), None
    return None
