"""A parameter-server process: one ROUTER socket in front of one ``ShardStore``.

Start one per shard with ``psring server`` (the launcher does this for local runs). Example, two hosts::

    host-a$ psring server --workers 4 --bind 0.0.0.0 --port 5555
    host-b$ torchrun ... -m psring worker --sync ps --ps-addrs tcp://host-a:5555 ...

Requests are handled one at a time in arrival order; a pull for a version not yet reached is parked and
answered by the push that completes that version, and a pushpull's reply waits until its keys' update
is done — then it carries their new values at once, so the shard streams back bucket by bucket while
later buckets still arrive (ps-lite's ZPushPull, BytePS's push-pull per partition). A bad request gets an error reply and changes nothing,
so the other workers are served on as if it never came.

What "its keys' update is done" means is the consistency model's (``consistency``: BSP waits for all N
workers' gradients, ASP answers at once, SSP once the slowest worker is within the bound), and what the
reply carries is the design's (``store``: new values, or the gradient sum for ``aggregate``); rank 0's
init names both, with the optimizer, so the command line of ``psring server`` never changes.
"""
from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import torch
import zmq

from ...auth import secure_server
from .protocol import PROTOCOL, ProtocolError, decode_tensors, encode_tensors, pack_header, unpack_header
from .server_metrics import StepMetrics
from .store import ShardStore

log = logging.getLogger("psring.server")


class ParameterServer:
    def __init__(self, workers: int, bind: str = "127.0.0.1", port: int = 0, idle_timeout_s: float = 600.0,
                 metrics_path: str | None = None, frame_bytes: int | None = None, curve: str | None = None):
        self.metrics_path, self.frame_bytes = metrics_path, frame_bytes
        self.store = ShardStore(workers)
        self.idle_timeout_s = idle_timeout_s
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.auth = secure_server(self.ctx, self.sock, curve) if curve else None  # before bind
        self.sock.linger = 2000  # let the last replies (to "done") leave before the process exits
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a vanished peer raises, not drops
        addr = f"tcp://{bind}"
        if port == 0:
            self.port = self.sock.bind_to_random_port(addr)
        else:
            self.sock.bind(f"{addr}:{port}")
            self.port = port
        self.address = f"tcp://{bind}:{self.port}"
        self.parked: list[tuple[bytes, dict]] = []  # pulls waiting for their version
        self.waiting: list[tuple[bytes, object, int, list[str], int]] = []  # pushpulls waiting: (.., worker, keys, step)
        self.done: set[int] = set()
        self.errors = 0
        self.bytes_sent = self.bytes_recv = 0
        self.metrics = StepMetrics(self)

    # --- replies ---------------------------------------------------------------------------------
    def _send(self, ident: bytes, header: dict, frames: list = ()) -> None:
        head = pack_header(header)
        self.bytes_sent += len(head) + sum(len(f) for f in frames)
        t0 = time.perf_counter()
        try:
            # copy=False: the shard's memory goes to the wire as is. Safe under BSP: a parameter (or an
            # aggregate's sum buffer, of which there are two) is written again only after every worker
            # has pushed the next step, i.e. after every worker has received this reply in full. Under
            # ASP/SSP the store hands out copies (``ShardStore.read_values``).
            self.sock.send_multipart([ident, head, *frames], copy=False)
        except zmq.ZMQError as e:
            log.warning("reply to a peer that is gone dropped: %s", e)
        self.metrics.send_s += time.perf_counter() - t0

    def _error(self, ident: bytes, req, msg: str) -> None:
        self.errors += 1
        log.warning("rejected request %r: %s", req, msg)
        self._send(ident, {"ok": False, "req": req, "error": msg})

    def _reply_params(self, ident: bytes, req, worker) -> None:
        metas, frames = encode_tensors(self.store.read_values(worker), self.frame_bytes)
        self._send(ident, {"ok": True, "req": req, "version": self.store.version, "tensors": metas}, frames)

    # --- request handling -------------------------------------------------------------------------
    def handle(self, ident: bytes, header_frame, frames: list) -> None:
        req = None
        try:
            header = unpack_header(header_frame)
            req = header.get("req")
            if header.get("protocol", PROTOCOL) != PROTOCOL:
                raise ProtocolError(f"protocol {header.get('protocol')!r} not supported (this server: {PROTOCOL})")
            op = header.get("op")
            if op in ("push", "pushpull"):
                self.metrics.on_push()
                named, step, worker = decode_tensors(header, frames), header.get("step"), header.get("worker")
                completed = self.store.push(worker, step, named)
                if op == "push":
                    self._send(ident, {"ok": True, "req": req})
                else:
                    self.waiting.append((ident, req, worker, [k for k, _ in named], step))
                if completed:
                    self.metrics.on_last_push()
                    self._serve_parked()
                self._serve_waiting()
            elif op == "pull":
                version = header.get("version")
                if type(version) is not int or version < 0:
                    raise ProtocolError(f"pull needs a non-negative int version, got {version!r}")
                if frames:
                    raise ProtocolError("a pull carries no tensor frames")
                if self.store.initialized and self.store.aggregate and version > 0:
                    raise ProtocolError("this server only aggregates gradients (design aggregate): "
                                        "it holds the initial parameters only, pull version 0")
                worker = header.get("worker")
                if not (type(worker) is int and 0 <= worker < self.store.workers):  # ASP/SSP record its reads
                    raise ProtocolError(f"worker id {worker!r} outside 0..{self.store.workers - 1}")
                if self.store.version >= version:
                    self._reply_params(ident, req, worker)
                else:
                    self.parked.append((ident, header))
            elif op == "init":
                self.store.init(decode_tensors(header, frames), header.get("optim") or {},
                                {k: header[k] for k in ("design", "consistency", "staleness") if k in header})
                self._send(ident, {"ok": True, "req": req})
                self._serve_parked()
            elif op == "done":
                worker = header.get("worker")
                if not (type(worker) is int and 0 <= worker < self.store.workers):
                    raise ProtocolError(f"worker id {worker!r} outside 0..{self.store.workers - 1}")
                self.done.add(worker)
                self._send(ident, {"ok": True, "req": req})
            else:
                raise ProtocolError(f"unknown op {op!r}; expected init, push, pushpull, pull or done")
        except ProtocolError as e:
            self._error(ident, req, str(e))
        except Exception as e:
            log.exception("unexpected error handling a request")
            self._error(ident, req if isinstance(req, (int, str)) else None, f"{type(e).__name__}: {e}")

    def _serve_parked(self) -> None:
        still = []
        for ident, header in self.parked:
            if self.store.version >= header["version"]:
                self._reply_params(ident, header.get("req"), header.get("worker"))
            else:
                still.append((ident, header))
        self.parked = still

    def _serve_waiting(self) -> None:
        still = []
        for item in self.waiting:
            ident, req, worker, keys, step = item
            if self.store.reply_ready(keys, step):
                version, named = self.store.reply(worker, keys, step)
                metas, frames = encode_tensors(named, self.frame_bytes)
                self._send(ident, {"ok": True, "req": req, "version": version, "tensors": metas}, frames)
            else:
                still.append(item)
        self.waiting = still

    def serve(self) -> int:
        """Serve until every worker said done (0) or nothing arrived for ``idle_timeout_s`` (1)."""
        last = time.monotonic()
        while len(self.done) < self.store.workers:
            if not self.sock.poll(500):
                if time.monotonic() - last > self.idle_timeout_s:
                    log.error("no request for %.0f s; exiting", self.idle_timeout_s)
                    return 1
                continue
            last = time.monotonic()
            t0 = time.perf_counter()
            msg = self.sock.recv_multipart(copy=False)
            self.metrics.recv_s += time.perf_counter() - t0
            self.bytes_recv += sum(len(f) for f in msg[1:])
            if len(msg) < 2:
                continue  # an empty message has nobody to answer
            version = self.store.version
            self.handle(msg[0].bytes, msg[1].buffer, [f.buffer for f in msg[2:]])
            if self.store.version != version and self.store.version > 0:
                self.metrics.flush(step=self.store.version - 1)
        return 0

    def close(self) -> None:
        self.metrics.close()
        self.sock.close()
        if self.auth is not None:
            self.auth.stop()
        self.ctx.term()


def run_server(workers: int, bind: str, port: int, port_file: str | None, idle_timeout_s: float,
               threads: int = 1, metrics_path: str | None = None, frame_bytes: int | None = None,
               curve: str | None = None) -> int:
    """Entry point of ``psring server``: bind, announce the port, serve, exit 0 when all workers are done."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s psring server %(levelname)s: %(message)s")
    torch.set_num_threads(max(1, threads))
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(143)))
    server = ParameterServer(workers, bind, port, idle_timeout_s, metrics_path, frame_bytes, curve)
    try:
        if port_file:  # atomic: the launcher never reads a half-written port
            tmp = Path(f"{port_file}.tmp{os.getpid()}")
            tmp.write_text(f"{server.address}\n")
            tmp.rename(port_file)
        log.info("serving %d workers at %s", workers, server.address)
        rc = server.serve()
        log.info("done: %d updates, %d rejected requests, %d B sent, %d B received",
                 server.store.version, server.errors, server.bytes_sent, server.bytes_recv)
        return rc
    finally:
        server.close()
