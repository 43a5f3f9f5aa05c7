"""The worker's side of the PS protocol: one DEALER socket per server, requests pipelined, every reply
waited for with a timeout."""
from __future__ import annotations

import zmq

from ...auth import secure_client
from .frames import readable, send_frames
from .protocol import (
    PROTOCOL,
    SECTIONS,
    ProtocolError,
    decode_sections,
    encode_tensors,
    pack_header,
    unpack_header,
)

MAX_TIMEOUT_MS = 2**31 - 1  # zmq's timeouts are C ints (a --timeout of 25 days or more waits this long)


class PSError(RuntimeError):
    """A server answered with an error, or did not answer in time."""


class PSClient:
    def __init__(self, addrs: list[str], worker: int, timeout_s: float, frame_bytes: int | None = 1 << 20,
                 curve: str | None = None):
        """``curve``: a key folder (``psring keys``): encrypt, and authenticate as its worker key pair."""
        self.addrs, self.worker = list(addrs), worker
        self.frame_bytes = frame_bytes
        self.ctx = zmq.Context()
        self.socks = []
        for addr in self.addrs:
            s = self.ctx.socket(zmq.DEALER)
            s.linger = 0
            if curve:
                secure_client(s, curve)
            s.connect(addr)
            self.socks.append(s)
        self.set_timeout(timeout_s)
        self._next = 0  # the next request id
        self.early: list[dict] = [{} for _ in self.addrs]  # replies that arrived before the one waited for
        self.acks: list[set[int]] = [set() for _ in self.addrs]  # requests a server said it received (``ack``)
        self.bytes_sent = self.bytes_recv = 0

    def set_timeout(self, timeout_s: float) -> None:
        """How long a reply, and a send (``sndtimeo``: a send blocks once zmq holds 1,000 messages for a server,
        for good if it is gone), may take."""
        self.timeout_ms = min(int(timeout_s * 1000), MAX_TIMEOUT_MS)
        for s in self.socks:
            s.sndtimeo = self.timeout_ms

    def send(self, server: int, header: dict, named=(), opt_state=(), encoded: tuple | None = None) -> int:
        """Send a request to ``server`` without waiting; returns its request id for ``recv``. ``named``
        travel as the header's ``tensors``, ``opt_state`` (an init's optimizer state) after them;
        ``encoded``: ``named`` as ``encode_tensors`` made them already (``frames.FrameCache``)."""
        req, self._next = self._next, self._next + 1
        metas, frames = encoded if encoded is not None else encode_tensors(list(named), self.frame_bytes)
        extra = {}
        if opt_state:
            extra["opt_state"], more = encode_tensors(list(opt_state), self.frame_bytes)
            frames = frames + more  # (not +=: ``encoded`` may be a cache's own list)
        head = pack_header({"protocol": PROTOCOL, "req": req, "worker": self.worker, **header, "tensors": metas,
                            **extra})
        self.bytes_sent += len(head) + sum(len(f) for f in frames)
        # copy=False: gradient memory goes to the wire as is. The caller keeps the tensors unchanged
        # until the reply to this or a later request of the same server arrived (the server has then
        # received this message in full).
        try:
            send_frames(self.socks[server], [head, *frames])
        except zmq.Again:
            raise self._silent(server) from None
        return req

    def recv(self, server: int, req: int):
        """Wait for the reply to request ``req``; returns ``(header, [(key, tensor), ...])`` (tensors
        view the received frames: copy what must outlive them). A reply with ``opt_state`` (to ``state``)
        has it decoded in place: ``header["opt_state"]`` is then ``[(name, tensor), ...]`` too. Replies
        to other requests of ours that arrive first are kept for their own ``recv``."""
        early = self.early[server]
        while req not in early:
            if not self.socks[server].poll(self.timeout_ms):
                raise self._silent(server)
            self._take(server)
        header, frames = early.pop(req)
        if not header.get("ok"):
            raise PSError(f"PS server {server} ({self.addrs[server]}) refused request: {header.get('error')}")
        try:
            sections = decode_sections(header, [f.buffer for f in frames], SECTIONS)
        except ProtocolError as e:
            raise PSError(f"PS server {server} ({self.addrs[server]}) sent a malformed reply: {e}") from None
        if "opt_state" in header:
            header["opt_state"] = sections["opt_state"]
        return header, sections["tensors"]

    def received(self, server: int, req: int) -> bool:
        """Whether ``server`` said it received request ``req`` (its ack, or already its reply, is here).
        The ack is forgotten once seen: ask until True, then no more."""
        if req in self.acks[server]:
            self.acks[server].discard(req)
            return True
        return req in self.early[server]

    def arrived(self, server: int, req: int) -> bool:
        """Whether the reply to ``req`` is here (taken off the socket, waiting for its ``recv``)."""
        return req in self.early[server]

    def collect(self, server: int) -> None:
        """Take every reply of ``server`` that has already arrived off its socket, without waiting (so a
        worker can tell, from inside backward, which requests are answered)."""
        sock = self.socks[server]
        while readable(sock):
            self._take(server)

    def wait_any(self, servers: list[int]) -> None:
        """Wait until a reply from one of ``servers`` arrives (at most the timeout) and take it."""
        poller = zmq.Poller()
        for s in servers:
            poller.register(self.socks[s], zmq.POLLIN)
        ready = dict(poller.poll(self.timeout_ms))
        if not ready:
            raise self._silent(servers[0])
        for s in servers:
            if self.socks[s] in ready:
                self.collect(s)

    def _silent(self, server: int) -> PSError:
        return PSError(f"PS server {server} ({self.addrs[server]}) did not answer within "
                       f"{self.timeout_ms / 1000:g} s (is it running? is a worker stuck?)")

    def _take(self, server: int) -> None:
        """Receive one message of ``server`` (it is there) and keep it for the ``recv`` of its request."""
        msg = self.socks[server].recv_multipart(copy=False)
        self.bytes_recv += sum(len(f) for f in msg)
        try:
            header = unpack_header(msg[0].buffer)
        except ProtocolError as e:
            raise PSError(f"PS server {server} ({self.addrs[server]}) sent an unreadable reply: {e}") from None
        got = header.get("req")
        if got is None and header.get("ok") is False:  # the server could not read our request's id
            raise PSError(f"PS server {server} ({self.addrs[server]}) refused a request it could not "
                          f"read: {header.get('error')}")
        if type(got) is not int or got >= self._next or got in self.early[server]:
            raise PSError(f"PS server {server} answered request {got!r}, which this worker did not send")
        if header.get("ack") is True and header.get("ok") is True:
            self.acks[server].add(got)
            return
        self.early[server][got] = (header, msg[1:])

    def call(self, server: int, header: dict, named=(), opt_state=()):
        return self.recv(server, self.send(server, header, named, opt_state))

    def close(self) -> None:
        for s in self.socks:
            s.close(linger=0)
        self.ctx.term()
