"""A parameter-server process: one ROUTER socket in front of one ``ShardStore``.

Start one per shard with ``psring server`` (``server_main``; the launcher does this for local runs). Example, two hosts::

    host-a$ psring server --workers 4 --bind 0.0.0.0 --port 5555
    host-b$ torchrun ... -m psring worker --sync ps --ps-addrs tcp://host-a:5555 ...

Requests are handled one at a time in arrival order; a pull for a version not yet reached is parked and
answered by the push that completes that version, and a pushpull's reply waits until its keys' update
is done — then it carries their new values at once, so the shard streams back chunk by chunk while
later chunks still arrive (ps-lite's ZPushPull, BytePS's push-pull per partition). A bad request gets
an error reply and changes nothing, so the other workers are served on as if it never came.

What "its keys' update is done" means is the consistency model's (``consistency``: BSP waits for all N
workers' gradients, ASP answers at once, SSP once the slowest worker is within the bound), and what the
reply carries is the design's (``store``: new values, or the gradient sum for ``aggregate``); rank 0's
init names both, with the optimizer, so the command line of ``psring server`` never changes.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import zmq

from ...auth import secure_server
from ...compress.spec import NONE
from .encoded import pushed_keys
from .optimizers import optim_header
from .probe import ProbeRounds
from .frames import DONTWAIT, FrameCache, readable, send_frames
from .protocol import (PROTOCOL, SECTIONS, ProtocolError, decode_sections, decode_tensors, encode_tensors, int_field,
                       pack_header, unpack_header)
from .server_metrics import StepMetrics
from .store import ShardStore

log = logging.getLogger("psring.server")

MAX_MESSAGE_BYTES = 1 << 30  # default cap on a request's frames, in all (init carries a whole shard)
CURVE_SLACK = 1024  # a frame's bytes on the wire with CURVE: payload + box overhead
LOG_FIRST, LOG_EVERY = 20, 1000  # rejections logged one by one, then every LOG_EVERY-th (a peer can't flood the log)
MAX_ERROR_CHARS = 400
OPS = ("init", "push", "pushpull", "pull", "state", "done", "probe")


@dataclass
class Parked:
    """A pull waiting for its version."""
    ident: bytes
    req: int | None
    worker: int
    version: int


@dataclass
class Waiting:
    """A pushpull waiting for its keys' update (its reply carries their new values or sums)."""
    ident: bytes
    req: int | None
    worker: int
    keys: list[str]
    step: int


class ParameterServer:
    def __init__(self, workers: int, bind: str = "127.0.0.1", port: int = 0, idle_timeout_s: float = 600.0,
                 metrics_path: str | None = None, frame_bytes: int | None = None, curve: str | None = None,
                 max_message_bytes: int = MAX_MESSAGE_BYTES):
        """``max_message_bytes``: the most a request's frames may hold in all (checked before decoding,
        refused with an error reply); ZeroMQ drops a connection that sends a single frame over it."""
        if max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be >= 1, got {max_message_bytes}")
        self.metrics_path, self.frame_bytes, self.wire = metrics_path, frame_bytes, FrameCache(frame_bytes)
        self.max_message_bytes, self.store, self.idle_timeout_s = max_message_bytes, ShardStore(workers), idle_timeout_s
        self.max_parked = max(16, 4 * workers)  # honest workers park one pull each
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.auth = secure_server(self.ctx, self.sock, curve) if curve else None  # before bind
        self.sock.linger = 2000  # let the last replies (to "done") leave before the process exits
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a vanished peer raises, not drops
        self.sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes + CURVE_SLACK)  # per frame, in libzmq
        addr = f"tcp://{bind}"
        if port == 0:
            self.port = self.sock.bind_to_random_port(addr)
        else:
            self.sock.bind(f"{addr}:{port}")
            self.port = port
        self.address = f"tcp://{bind}:{self.port}"
        self.parked: list[Parked] = []
        self.waiting: list[Waiting] = []
        self.done: set[int] = set()
        self.errors = self.unexpected = self.dropped = self.bytes_sent = self.bytes_recv = 0
        self.metrics = StepMetrics(self)
        self._ops = {"init": self._init, "push": self._push, "pushpull": self._push, "pull": self._pull,
                     "state": self._state, "done": self._done, "probe": self._probe}
        self.probes = ProbeRounds(workers)

    # --- replies ---------------------------------------------------------------------------------
    def _send(self, ident: bytes, header: dict, frames: list = ()) -> None:
        head = pack_header(header)
        self.bytes_sent += len(head) + sum(len(f) for f in frames)
        t0 = time.perf_counter()
        try:
            # Zero-copy: the shard's memory goes to the wire as is. Safe under BSP: a parameter (or one of an
            # aggregate's two sum buffers) is written again only after every worker pushed the next step, i.e.
            # received this reply in full. Under ASP/SSP the store hands out copies (``read_values``). DONTWAIT:
            # a peer with a full queue (SNDHWM replies it never read) loses this one rather than stalling all.
            send_frames(self.sock, [ident, head, *frames], DONTWAIT)
        except zmq.ZMQError as e:
            self.dropped += 1
            if self.dropped <= LOG_FIRST or self.dropped % LOG_EVERY == 0:
                log.warning("reply dropped (%d so far; peer gone or not reading): %s", self.dropped, e)
        self.metrics.send_s += time.perf_counter() - t0

    def _error(self, ident: bytes, req, msg: str) -> None:
        self.errors += 1
        msg = msg if len(msg) <= MAX_ERROR_CHARS else msg[:MAX_ERROR_CHARS] + "..."
        if self.errors <= LOG_FIRST:
            log.warning("rejected request %r: %s", req, msg)
        elif self.errors % LOG_EVERY == 0:
            log.warning("%d requests rejected so far (logging every %dth), latest: %s", self.errors, LOG_EVERY, msg)
        self._send(ident, {"ok": False, "req": req, "error": msg})

    def _reply_params(self, ident: bytes, req, worker) -> None:
        metas, frames = encode_tensors(self.store.read_values(worker), self.frame_bytes)
        self._send(ident, {"ok": True, "req": req, "version": self.store.version, "tensors": metas}, frames)

    # --- request handling -------------------------------------------------------------------------
    def handle(self, ident: bytes, header_frame, frames: list) -> None:
        """One request: a reply now or later, or an error reply; never raises for anything a peer sends."""
        req = None
        try:
            header = unpack_header(header_frame)
            req = header.get("req")
            if req is not None and type(req) is not int:
                req = None
                raise ProtocolError("'req' must be an int")
            protocol = header.get("protocol", PROTOCOL)
            if type(protocol) is not int or protocol != PROTOCOL:
                raise ProtocolError(f"protocol {protocol!r:.40} not supported (this server: {PROTOCOL})")
            op = header.get("op")
            handler = self._ops.get(op) if type(op) is str else None
            if handler is None:
                raise ProtocolError(f"unknown op {op!r:.40}; expected one of {', '.join(OPS)}")
            handler(ident, req, header, frames)
        except ProtocolError as e:
            self._error(ident, req, str(e))
        except Exception as e:
            self.unexpected += 1  # a bug: the request is still answered, the loop goes on
            if self.unexpected <= LOG_FIRST:
                log.exception("unexpected error handling a request")
            self._error(ident, req, f"{type(e).__name__}: {e}")

    def _worker(self, header: dict) -> int:
        worker = header.get("worker")
        if not (type(worker) is int and 0 <= worker < self.store.workers):
            raise ProtocolError(f"worker id {worker!r:.40} outside 0..{self.store.workers - 1}")
        return worker

    @staticmethod
    def _no_frames(op: str, frames: list) -> None:
        if frames:
            raise ProtocolError(f"{op} carries no tensor frames, got {len(frames)}")

    def _push(self, ident: bytes, req, header: dict, frames: list) -> None:
        t = time.time()
        if header.get("ack") is True and header["op"] == "pushpull":  # read: the sender's credit is free
            self._send(ident, {"ok": True, "req": req, "ack": True})
        named, step, worker, updates = decode_tensors(header, frames), header.get("step"), header.get("worker"), \
            self.store.key_updates  # (BSP: only a key's update can answer a waiting pushpull)
        completed = self.store.push(worker, step, named)
        self.metrics.on_push(t)
        if header["op"] == "push":
            self._send(ident, {"ok": True, "req": req})
        else:
            keys = [k for k, _ in named] if self.store.codec is None else pushed_keys([k for k, _ in named])
            self.waiting.append(Waiting(ident, req, worker, keys, step))
        if completed:
            self.metrics.on_last_push()
            self._serve_parked()
        if self.store.clocks is not None or self.store.key_updates != updates:
            self._serve_waiting()

    def _pull(self, ident: bytes, req, header: dict, frames: list) -> None:
        version = int_field(header, "version")
        self._no_frames("a pull", frames)
        self._worker(header)  # ASP/SSP record its reads
        limit = self.store.pull_limit()
        if limit is not None and version > limit:
            raise ProtocolError(self._too_far(version, limit))
        if self.store.version >= version:
            self._reply_params(ident, req, header["worker"])
        elif len(self.parked) >= self.max_parked:
            raise ProtocolError(f"{len(self.parked)} pulls already wait for their version; refused")
        else:
            self.parked.append(Parked(ident, req, header["worker"], version))

    def _too_far(self, version: int, limit: int) -> str:
        if self.store.aggregate:
            return (f"this server only aggregates gradients (design aggregate): it holds the parameters of "
                    f"version {self.store.base} only, pull that")
        return f"pull of version {version} is too far ahead (shard at {self.store.version}, at most {limit})"

    def _init(self, ident: bytes, req, header: dict, frames: list) -> None:
        if self.store.initialized:  # before decoding anything: the usual second init is cheap to refuse
            raise ProtocolError("shard already initialised (a second init arrived)")
        sections = decode_sections(header, frames, SECTIONS)
        self.store.init(sections["tensors"], header.get("optim", {}),
                        {k: header[k] for k in ("design", "consistency", "staleness") if k in header},
                        sections["opt_state"], header.get("version", 0), header.get("codec", NONE))
        self._send(ident, {"ok": True, "req": req})
        self._serve_parked()

    def _state(self, ident: bytes, req, header: dict, frames: list) -> None:
        self._no_frames("a state request", frames)
        self._worker(header)
        st = self.store.state()
        metas, tframes = encode_tensors(st["params"], self.frame_bytes)
        ometas, oframes = encode_tensors(st["opt_state"], self.frame_bytes)
        self._send(ident, {"ok": True, "req": req, "version": st["version"], "clocks": st["clocks"],
                           "optim": optim_header(self.store.cfg), **self.store.semantics.header(),
                           "codec": st["codec"],
                           "tensors": metas, "opt_state": ometas}, tframes + oframes)

    def _done(self, ident: bytes, req, header: dict, frames: list) -> None:
        self._no_frames("done", frames)
        self.done.add(self._worker(header))
        self._send(ident, {"ok": True, "req": req})

    def _probe(self, ident: bytes, req, header: dict, frames: list) -> None:
        decode_tensors(header, frames)  # the frames are what the header says; echoed as they came
        for reply in self.probes.add(self._worker(header), header, (ident, req, header.get("tensors", []), frames)) or ():
            self._send(*reply)

    def _serve_parked(self) -> None:
        still, limit = [], self.store.pull_limit()
        for p in self.parked:
            if limit is not None and p.version > limit:  # parked before init, beyond what init allows
                self._error(p.ident, p.req, self._too_far(p.version, limit))
            elif self.store.version >= p.version:
                self._reply_params(p.ident, p.req, p.worker)
            else:
                still.append(p)
        self.parked = still

    def _serve_waiting(self) -> None:
        still = []
        for w in self.waiting:
            if self.store.reply_ready(w.keys, w.step):
                version, named = self.store.reply(w.worker, w.keys, w.step)
                metas, frames = self.wire.encode(named, cache=self.store.shared_replies)
                self._send(w.ident, {"ok": True, "req": w.req, "version": version, "tensors": metas}, frames)
            else:
                still.append(w)
        self.waiting = still

    def serve(self) -> int:
        """Serve until every worker said done (0) or nothing arrived for ``idle_timeout_s`` (1)."""
        last = time.monotonic()
        poller = zmq.Poller()  # one for the run: ``sock.poll`` builds one per call, at every idle wait
        poller.register(self.sock, zmq.POLLIN)
        try:
            while len(self.done) < self.store.workers:
                if not readable(self.sock) and not poller.poll(500):  # (the poller only when idle)
                    if time.monotonic() - last > self.idle_timeout_s:
                        log.error("no request for %.0f s; exiting", self.idle_timeout_s)
                        return 1
                    continue
                last = time.monotonic()
                t0 = time.perf_counter()
                msg = self.sock.recv_multipart(copy=False)
                self.metrics.recv_s += time.perf_counter() - t0
                size = sum(len(f) for f in msg[1:])
                self.bytes_recv += size
                ident = msg[0].bytes
                version = self.store.version
                try:
                    if len(msg) < 2:  # only an identity: nothing to decode, but the peer can be told
                        self._error(ident, None, "empty message: no header frame")
                    elif size > self.max_message_bytes:
                        self._error(ident, None, f"message of {size} bytes exceeds this server's "
                                                 f"max_message_bytes ({self.max_message_bytes}); not decoded")
                    else:
                        self.handle(ident, msg[1].buffer, [f.buffer for f in msg[2:]])
                except Exception:
                    log.exception("error while replying")
                if version >= 0 and self.store.version != version:  # a step completed (init is not one)
                    self.metrics.flush(step=self.store.version - 1)
            return 0
        finally:
            self.metrics.finish()

    def close(self) -> None:
        self.metrics.close()
        self.sock.close()
        if self.auth is not None:
            self.auth.stop()
        self.ctx.term()
