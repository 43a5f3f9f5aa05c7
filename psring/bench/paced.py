"""A raw paced PS worker: the floor of an overlapped PS step on this machine, with none of psring's logic.

It runs the schedule the PS's priority scheduler aims at, on the raw transport of ``bench.echo`` (echo
servers that run the SGD update, ``--update-bytes``), in one thread and one event loop:

- the parameters are the model's tensors in forward order (``--sizes``), flat, cut into ``C``-byte
  chunks; chunk k goes to server k mod S (round robin: every server busy at every moment of the
  priority order);
- forward takes ``F`` seconds and backward ``Bw``, each tensor its share by bytes (as ``--compute
  emulated`` and the bound, ``overlap_model``, have it); a chunk is ready once backward has made every
  tensor it holds a part of (a tensor's gradient is whole at once, the last tensor first);
- a ready chunk leaves at once while fewer than ``credits`` chunks of this worker await their reply
  (``--keyed``: their server's acknowledgement, as psring's credits; 0: no limit), the front-most ready
  one first (P3's priority);
- ``--mode backward``: the next forward starts once every reply is in; ``full``: right after backward,
  each tensor's part of the forward waiting only for the replies of its chunks; ``none``:
  every chunk ready when backward ends (with F = Bw = 0: the burst, the transport alone).

What it leaves out, each a cost psring pays and this floor does not: emulated gradients (no bucket is
zeroed or filled), headers, steps and checks, a trainer's thread apart from the communication's.
``--trainer-work`` puts the first in, as psring's trainer does that work on this machine's cores: the gradient
buffer zeroed before each backward (``zero_grad``) and each tensor's fixed gradient added into it when backward
makes it (autograd accumulating into psring's buckets); a PS worker has no update of its own. Against
plain echo servers it also leaves out acknowledgements (credits come back with replies) and a BSP
server's wait for the other workers' pushes (each push is answered at once, with its own update); with
``--keyed`` against ``echo --bsp N`` it has both. A reply is copied into the worker's parameters, which
any PS worker has to do.
Each step's start, as ``time.time()``, goes to ``--out`` (JSON list), for the driver to time and to
match against the machine's CPU samples. Run as ``python -m psring.bench.paced``.
"""
from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import time
from collections import deque
from pathlib import Path

import numpy as np
import zmq

from ..strategies import OVERLAPS

MODES = OVERLAPS  # --overlap's modes: none, backward, full
NONE, BACKWARD, FULL = MODES
REPLY_TIMEOUT_S = 60.0  # no reply for this long: a server is gone
START_WITHIN_S = 60.0  # a --start-at further ahead is a mistake (milliseconds for seconds), not a wait


class PacedWorker:
    def __init__(self, addrs: list[str], sizes: list[int], chunk: int, credits: int, forward_s: float,
                 backward_s: float, mode: str, keyed: bool = False, trainer_work: bool = False):
        self.ctx = zmq.Context()
        self.socks = []
        for a in addrs:
            s = self.ctx.socket(zmq.DEALER)
            s.linger = 0
            s.sndtimeo = int(REPLY_TIMEOUT_S * 1000)  # (with no --credits a send blocks past 1,000 waiting)
            s.connect(a)
            self.socks.append(s)
        self.poller = zmq.Poller()
        for s in self.socks:
            self.poller.register(s, zmq.POLLIN)
        nbytes, ends = sum(sizes), list(itertools.accumulate(sizes))
        self.tensors = list(zip([0, *ends[:-1]], ends))  # each parameter tensor's bytes, in forward order
        self.bounds = [(o, min(o + chunk, nbytes)) for o in range(0, nbytes, chunk)]
        self.chunks_of = [range(lo // chunk, (hi - 1) // chunk + 1) for lo, hi in self.tensors]  # a tensor's chunks
        self.grads = np.zeros(nbytes, dtype=np.uint8)  # what is pushed (zeros: float32 0.0)
        self.params = np.zeros(nbytes, dtype=np.uint8)  # where replies land
        # --trainer-work: the fixed gradient autograd adds into the buffer (float32, as psring's buckets)
        self.fixed = np.random.default_rng(0).standard_normal(nbytes // 4, dtype=np.float32) * np.float32(1e-3) \
            if trainer_work else None
        self.floats = self.grads[:nbytes // 4 * 4].view(np.float32)
        self.credits, self.mode, self.keyed = credits, mode, keyed
        self.fwd_per_byte, self.bwd_per_byte = forward_s / nbytes, backward_s / nbytes
        self.ready: list[int] = []  # heap of chunk indices ready to leave
        self.sent: list[deque] = [deque() for _ in addrs]  # per server: chunks awaiting their reply, in order
        self.waiting = 0  # chunks sent and not answered (keyed: not acknowledged)
        self.answered = [True] * len(self.bounds)  # chunk k's reply of the latest step it was made in is here

    def close(self) -> None:
        for s in self.socks:
            s.close()
        self.ctx.term()

    def _ready(self, k: int) -> None:
        heapq.heappush(self.ready, k)
        self.answered[k] = False

    def _send(self) -> None:
        while self.ready and (not self.credits or self.waiting < self.credits):
            k = heapq.heappop(self.ready)
            s = k % len(self.socks)
            lo, hi = self.bounds[k]
            try:
                if self.keyed:
                    self.socks[s].send_multipart([k.to_bytes(4, "little"), memoryview(self.grads[lo:hi])], copy=False)
                else:
                    self.socks[s].send(memoryview(self.grads[lo:hi]), copy=False)
            except zmq.Again:
                raise TimeoutError(f"echo server {s} took no chunk in {REPLY_TIMEOUT_S:.0f} s: is it running?") \
                    from None
            if not self.keyed:
                self.sent[s].append(k)
            self.waiting += 1

    def _take(self, timeout_s: float) -> None:
        for sock, _ in self.poller.poll(max(0, math.ceil(timeout_s * 1e3))):
            s = self.socks.index(sock)
            while True:
                try:
                    msg = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                if self.keyed and len(msg) == 1:  # an ack: a credit back
                    self.waiting -= 1
                    continue
                k = int.from_bytes(msg[0].bytes, "little") if self.keyed else self.sent[s].popleft()
                frame = msg[-1]
                lo, hi = self.bounds[k]
                self.params[lo:hi] = np.frombuffer(frame.buffer, dtype=np.uint8)
                self.answered[k] = True
                self.waiting -= not self.keyed

    def pump(self, until_s: float | None = None, until=None) -> None:
        """Send and take replies until the clock reaches ``until_s`` or ``until()`` holds."""
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while True:
            self._send()
            now = time.perf_counter()
            if (until_s is not None and now >= until_s) or (until is not None and until()):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {REPLY_TIMEOUT_S:.0f} s for a reply or a deadline: is an echo server "
                                   f"gone?")
            self._take(until_s - now if until_s is not None else 0.05)

    def step(self, clock: float) -> float:
        """One step from ``clock`` (the compute's own time, perf_counter); returns the clock at its end."""
        full = self.mode == FULL
        for j, (lo, hi) in enumerate(self.tensors):  # forward, front first
            if full and not all(self.answered[k] for k in self.chunks_of[j]):
                self.pump(until=lambda j=j: all(self.answered[k] for k in self.chunks_of[j]))
                clock = max(clock, time.perf_counter())
            clock += (hi - lo) * self.fwd_per_byte
            self.pump(until_s=clock)
        made = len(self.bounds)  # chunks from here on are made
        if self.fixed is not None:  # the trainer's zero_grad (every push of the last step was answered)
            self.floats[:] = 0
        for j in reversed(range(len(self.tensors))):  # backward, back first: a tensor's gradient whole at once
            lo, hi = self.tensors[j]
            clock += (hi - lo) * self.bwd_per_byte
            self.pump(until_s=clock)
            if self.fixed is not None:  # autograd accumulating the tensor's gradient into its bucket
                np.add(self.floats[lo // 4:hi // 4], self.fixed[lo // 4:hi // 4], out=self.floats[lo // 4:hi // 4])
            while self.mode != NONE and made and self.bounds[made - 1][0] >= lo:
                made -= 1
                self._ready(made)
        for k in range(made):  # (``none``: every chunk, after backward)
            self._ready(k)
        if not full:
            self.pump(until=lambda: all(self.answered))
            clock = max(clock, time.perf_counter())
        return clock

    def run(self, steps: int, start_at: float) -> list[float]:
        """``steps`` steps from the wall clock's ``start_at``; each step's start (and the last's end) as
        ``time.time()``."""
        time.sleep(max(0.0, start_at - time.time()))
        offset = time.time() - time.perf_counter()
        clock, starts = time.perf_counter(), []
        for _ in range(steps):
            starts.append(clock + offset)
            clock = self.step(clock)
        self.pump(until=lambda: all(self.answered))
        starts.append(max(clock, time.perf_counter()) + offset)
        return starts


def check_start_at(ap: argparse.ArgumentParser, start_at: float) -> None:
    """``--start-at`` within ``START_WITHIN_S`` of now (its sleep is otherwise unbounded)."""
    if not start_at - time.time() <= START_WITHIN_S:
        ap.error(f"--start-at {start_at} is more than {START_WITHIN_S:.0f} s from now (time.time(), in seconds)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--addrs", required=True, help="JSON file: the echo servers' addresses")
    ap.add_argument("--sizes", required=True, help="JSON file: the parameter tensors' bytes, in forward order")
    ap.add_argument("--chunk", type=int, required=True)
    ap.add_argument("--credits", type=int, default=0, help="chunks awaiting a reply at most (0: no limit)")
    ap.add_argument("--forward", type=float, default=0.0)
    ap.add_argument("--backward", type=float, default=0.0)
    ap.add_argument("--mode", choices=MODES, default=BACKWARD)
    ap.add_argument("--keyed", action="store_true", help="chunks keyed on the wire (for ``echo --bsp``)")
    ap.add_argument("--trainer-work", action="store_true", help="the trainer's zero_grad and accumulation (the docstring)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--start-at", type=float, required=True, help="time.time() to start at (all workers alike)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    check_start_at(ap, a.start_at)
    w = PacedWorker(json.loads(Path(a.addrs).read_text()), json.loads(Path(a.sizes).read_text()), a.chunk, a.credits, a.forward, a.backward,
                    a.mode, a.keyed, a.trainer_work)
    try:
        starts = w.run(a.steps, a.start_at)
    finally:
        w.close()
    Path(a.out).write_text(json.dumps(starts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
