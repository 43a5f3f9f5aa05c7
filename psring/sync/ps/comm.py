"""Where a worker's PS traffic runs: ``LocalChannel`` on the trainer's thread (FIFO per server under a
window: pushes leave from backward's hooks, replies are taken when the trainer asks), or ``PSComm``,
its own thread. Both offer ``ready(b)``, ``flush()``, ``take_any()``, ``run(fn)`` and ``close()``.

``PSComm``: the worker's PS traffic on a thread of its own, for the priority scheduler (``ChunkTransport`` with
credits): pushes leave whenever credits come back, not only when the trainer's thread passes a hook.

Backward's hooks and the next forward's gates only hand chunks over (``ready``) and wait for replies
(``take_any``); the thread owns the sockets from then on (ZeroMQ sockets are not thread-safe), pushes by
priority within the credits, takes acks and replies off the sockets as they come, and keeps each reply
until the trainer's thread takes it. Loading a reply into the parameters stays on the trainer's thread:
a parameter must not change under a backward that may still read it. A wake-up travels over an inproc
PAIR socket, so the thread waits on the servers and on the trainer in one poll (pyzmq's idiom).
Everything else that touches the transport (a step's bytes and messages, its end, a checkpoint's
``state`` requests) runs on the thread too, through ``run``; ``done`` is said once it has stopped.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import zmq

from ..buckets import Bucket
from .client import PSError
from .frames import readable
from .received import Received
from .transport import ChunkTransport

POLL_MS = 50  # how often an idle thread looks at its queue without a wake-up (a lost one costs this)
_ids = itertools.count()


class LocalChannel:
    """The transport driven from the trainer's thread (``ChunkTransport`` without credits)."""

    def __init__(self, tr: ChunkTransport):
        self.tr = tr
        self.pump_s = 0.0  # seconds spent pushing inside ``take_any`` (credits a reply freed): push_s

    def ready(self, b: Bucket) -> None:
        self.tr.enqueue(b)
        self.tr.pump(b.group)

    def wake(self) -> None:
        """(pushes left from ``ready`` already)"""

    def flush(self) -> None:
        self.tr.pump_all()

    def take_any(self) -> list[tuple[Bucket, Received]]:
        """The replies here now, each server's in send order (pushing what each one's credit frees);
        waits for one if none is (at most the timeout); [] when nothing is on its way."""
        tr, out = self.tr, []
        while True:
            for s in range(len(tr.chunks)):
                while (got := tr.take(s)) is not None:
                    out.append(got)
                    t0 = time.perf_counter()
                    tr.pump(s)
                    self.pump_s += time.perf_counter() - t0
            if out or not tr.inflight:
                return out
            tr.wait_any()

    def run(self, fn):
        return fn()

    def close(self) -> None:
        pass


class PSComm:
    def __init__(self, tr: ChunkTransport, timeout_s: float):
        self.tr, self.timeout_s = tr, timeout_s
        ctx = tr.client.ctx
        addr = f"inproc://psring-comm-{id(self)}-{next(_ids)}"
        self.wake_rx, self.wake_tx = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
        for s in (self.wake_rx, self.wake_tx):
            s.linger = 0
        self.wake_rx.bind(addr)
        self.wake_tx.connect(addr)
        self.incoming: deque[Bucket] = deque()  # chunks the trainer made ready (deque: thread-safe ends)
        self.jobs: deque = deque()  # (function, its Future)
        self.replies: dict[int, tuple[Bucket, Received]] = {}  # chunk index -> (chunk, reply) until taken
        self.cond = threading.Condition()
        self.error: BaseException | None = None
        self.handed = self.answered = 0  # chunks handed over (the trainer's count), replies kept (the thread's)
        self.stop = False
        self.thread = threading.Thread(target=self._run, name="psring-ps-comm", daemon=True)
        self.thread.start()

    # --- the trainer's thread ----------------------------------------------------------------------
    def ready(self, b: Bucket) -> None:
        """Hand a chunk over; the thread looks at it on ``wake`` (or ``flush``): a parameter may complete
        several chunks at once, and the thread must see them all before it picks the highest priority
        (traced: woken per chunk, it once pushed the lowest of six ready together first, and the other
        worker, which had seen them all, pushed that one last)."""
        self.handed += 1
        self.tr.handed(b)
        self.incoming.append(b)

    def wake(self) -> None:
        self._wake()

    def flush(self) -> None:
        self._wake()

    def take_any(self) -> list[tuple[Bucket, Received]]:
        """The replies the thread has taken (waits for one, at most the timeout; the thread's error is
        raised here); [] when nothing is on its way."""
        with self.cond:
            ok = self.cond.wait_for(lambda: self.replies or self.error is not None or not self.busy(),
                                    self.timeout_s)
            if self.error is not None:
                raise self.error
            if not ok:
                raise PSError(f"no PS reply arrived within {self.timeout_s:.0f} s")
            out = list(self.replies.values())
            self.replies.clear()
            return out

    def busy(self) -> bool:
        """Chunks handed over and not yet answered."""
        return self.handed > self.answered

    def run(self, fn):
        """Run ``fn()`` on the thread (it touches the sockets or the transport) and return its result."""
        fut: Future = Future()
        self.jobs.append((fn, fut))
        self._wake()
        try:
            return fut.result(self.timeout_s + 5)  # fn's exception, if any, raised here
        except FutureTimeout:
            raise PSError(f"the PS communication thread did not answer within {self.timeout_s:.0f} s") from None

    def close(self) -> None:
        """Stop the thread; the sockets are the caller's again (to say done and close them)."""
        self.stop = True
        self._wake()
        self.thread.join(timeout=self.timeout_s)
        self.wake_tx.close(linger=0)

    def _wake(self) -> None:
        try:
            self.wake_tx.send(b"", zmq.DONTWAIT)
        except zmq.Again:  # a wake-up is already waiting: that one will do
            pass

    # --- the communication thread ------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.wake_rx, zmq.POLLIN)
        for s in self.tr.client.socks:
            poller.register(s, zmq.POLLIN)
        last = time.monotonic()  # when a server last said anything, or this worker began waiting on one
        try:
            while not self.stop:
                self._jobs()
                while self.incoming:
                    self.tr.enqueue(self.incoming.popleft())
                self.tr.pump_ready(collect=False)  # (``_collect`` took the acks off the sockets)
                events = dict(poller.poll(POLL_MS))
                if self.wake_rx in events:
                    while readable(self.wake_rx):  # (not ``poll(0)``: it builds a Poller per call)
                        self.wake_rx.recv()
                if self._collect(events) or not any(self.tr.sent):
                    last = time.monotonic()
                elif time.monotonic() - last > self.timeout_s:
                    raise PSError(f"no PS server answered within {self.timeout_s:.0f} s (is one stopped? "
                                  f"is a worker stuck?)")
        except BaseException as e:  # noqa: BLE001 - handed to the trainer's thread
            with self.cond:
                self.error = e
                self.cond.notify_all()
        finally:
            self.wake_rx.close(linger=0)

    def _collect(self, events: dict) -> bool:
        """Take what the servers sent; keep each reply for the trainer. True if anything came."""
        tr, got = self.tr, False
        for s, sock in enumerate(tr.client.socks):
            if sock in events:
                tr.client.collect(s)
                got = True
            while (taken := tr.take(s)) is not None:
                with self.cond:
                    self.replies[taken[0].index] = taken
                    self.answered += 1
                    self.cond.notify_all()
        return got

    def _jobs(self) -> None:
        while self.jobs:
            fn, fut = self.jobs.popleft()
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
                fut.set_exception(e)
