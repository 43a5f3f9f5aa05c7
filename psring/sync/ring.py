"""``ring``: the bandwidth-optimal ring all-reduce, written out on torch.distributed point-to-point.

Each of the N workers talks only to its neighbours: it sends to its right one, ``(r + 1) mod N``, and
receives from its left one, ``(r - 1) mod N``. The bucket is cut into N chunks and the reduction runs
in two phases of N - 1 steps each (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for
clusters of workstations", JPDC 2009; Baidu's ring all-reduce, 2017):

* reduce-scatter: at step k, rank r sends chunk ``(r - k) mod N`` and adds the chunk
  ``(r - k - 1) mod N`` it receives into its own copy. Every chunk travels once around the ring,
  picking up one worker's gradients per hop; afterwards rank r holds chunk ``(r + 1) mod N`` summed
  over all workers.
* all-gather: at step k, rank r sends chunk ``(r + 1 - k) mod N`` and receives chunk ``(r - k) mod N``
  straight into place: the finished chunks travel once more around the ring.

One reduce-scatter step (N = 3, step 0; ``a``, ``b``, ``c`` are the chunks, the digit is the rank whose
gradients a chunk holds)::

      rank 0               rank 1               rank 2
    [a0  b0  c0]         [a1  b1  c1]         [a2  b2  c2]
      a0 ───────────────▶ += a                  |
                             b1 ──────────────▶ += b
      += c ◀──────────────────────────────────── c2
    [a0  b0  c02]        [a01 b1  c1]         [a2  b12 c2]      (c02 = c0 + c2)

Every worker sends (and receives) 2(N - 1) chunks of M/N bytes, 2(N - 1)/N * M in all: below 2M
whatever N, and the least any all-reduce can move per worker (Patarasuk & Yuan's lower bound).
The unchunked ring of PyTorch's "Writing Distributed Applications" tutorial, which passes the whole
bucket N - 1 times, sends (N - 1) * M. The price is latency: 2(N - 1) dependent rounds per bucket.

The 2(N - 1) rounds depend on each other, so they run on the process's ``CommThread``, one bucket after
the other in launch order, while backward goes on. Every round is recorded as a ``Transfer``.

The rounds are lockstep: each waits for the slowest of its neighbours, then adds and posts the next, and
meanwhile every link idles. Under ``--overlap backward`` and ``full`` two buckets are reduced at once
(``OVERLAP_LANES``): launch i runs on lane i mod 2, a comm thread of its own whose point-to-point calls carry
the lane as their tag, so one bucket's bytes move while the other's rounds wait, add or post (as gloo's
all-reduce runs two at a time on its own two threads). Every rank launches the same buckets in the same
order, so every rank puts each bucket on the same lane. On gloo only: NCCL pairs point-to-point calls by their
order on the communicator, not by tag, so with NCCL the ring keeps one lane.
"""
from __future__ import annotations

import contextlib
import datetime
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .buckets import Bucket
from .process_group import ProcessGroupInfo
from .reducer import CommThread, FutureHandle, Reducer

REDUCE_SCATTER, ALL_GATHER = "reduce-scatter", "all-gather"
# Buckets reduced at once under --overlap backward and full (the module docstring). Emulated 1 Gbit, N = 8,
# ResNet-18, compute:comm = 1, against one lane in alternating pairs: step over bound 1.075 -> 1.034
# (backward), 1.164 -> 1.116 (full); results/overlap_n8_1gbit/ring_lanes_ab.csv
OVERLAP_LANES = 2


@dataclass
class Transfer:
    """One round of one bucket's reduction, as one rank saw it: the chunk it sent to ``dst`` (its
    receive from the left neighbour ran at the same time). ``start``/``end``: perf_counter seconds from
    posting the pair until both completed (with NCCL: until both were enqueued on the GPU's stream)."""

    bucket: int
    phase: str  # REDUCE_SCATTER or ALL_GATHER
    step: int  # 0 .. N-2 within the phase
    src: int
    dst: int
    chunk: int
    bytes: int
    start: float
    end: float

    def message(self) -> list:
        """As a trace message: [name, start perf_counter, duration]."""
        name = f"ring b{self.bucket} {self.phase} {self.step}: {self.src}->{self.dst} chunk {self.chunk}"
        return [f"{name} ({self.bytes / 1e3:.1f} kB)", self.start, self.end - self.start]

    @classmethod
    def from_message(cls, msg) -> Transfer | None:
        """The inverse of ``message``: a trace message ``[name, start, duration]`` (as ``steps.jsonl``
        holds it: start in s after the step's sync began) back into a Transfer, bytes to the 100 B the
        name keeps; None for any other message (e.g. a bucket's ``ring bucket 1 (2.0 MB)``)."""
        ok = isinstance(msg, (list, tuple)) and len(msg) == 3 and isinstance(msg[0], str)
        m = _MESSAGE.fullmatch(msg[0]) if ok else None
        if m is None:
            return None
        bucket, phase, step, src, dst, chunk, kb = m.groups()
        return cls(int(bucket), phase, int(step), int(src), int(dst), int(chunk), round(float(kb) * 1e3),
                   float(msg[1]), float(msg[1]) + float(msg[2]))


_MESSAGE = re.compile(rf"ring b(\d+) ({re.escape(REDUCE_SCATTER)}|{re.escape(ALL_GATHER)}) (\d+): "
                      r"(\d+)->(\d+) chunk (\d+) \(([0-9.]+) kB\)")  # Transfer.message's name


def schedule(rank: int, world: int) -> Iterator[tuple[str, int, int, int]]:
    """(phase, step, chunk sent, chunk received) of every round of ``rank``, in order; empty at N = 1.
    What rank r sends at a step is what rank r + 1 receives: ``(r - k) mod N`` both."""
    for k in range(world - 1):
        yield REDUCE_SCATTER, k, (rank - k) % world, (rank - k - 1) % world
    for k in range(world - 1):
        yield ALL_GATHER, k, (rank + 1 - k) % world, (rank - k) % world


def chunk_sizes(numel: int, world: int) -> list[int]:
    """Element counts of ``torch.tensor_split(flat, world)``: the first ``numel % world`` chunks have one
    element more (chunks are empty when numel < world; an empty send is a valid no-op)."""
    q, extra = divmod(numel, world)
    return [q + (i < extra) for i in range(world)]


class RingAllReduce(Reducer):
    """Sums a bucket with the ring above; ``bucket.flat`` holds the sum when the handle returns."""

    name = "ring"
    wait_phase = "ring_wait_s"
    uses_thread = True
    overlap_lanes = OVERLAP_LANES

    def __init__(self, pg: ProcessGroupInfo):
        super().__init__(pg.rank, pg.world, pg.device)
        self.pg = pg
        self.right, self.left = (pg.rank + 1) % pg.world, (pg.rank - 1) % pg.world
        self.transfers: list[Transfer] = []  # appended by the comm thread; handed out by take_transfers
        self.last_transfers: list[Transfer] = []  # the records take_messages last turned into messages
        self.lanes: list[CommThread] = []  # lane 0 is ``self.comm``; the others' threads are the ring's own
        self.launches = 0  # buckets launched so far: launch i runs on lane i mod len(lanes)

    def use_comm(self, thread: CommThread | None, lanes: int = 1) -> None:
        """``lanes`` on gloo only: NCCL matches point-to-point calls by their order on the communicator, not by
        tag, so two threads issuing them would pair one lane's send with the other's receive."""
        for t in self.lanes[1:]:
            t.close()
        super().use_comm(thread)
        lanes = lanes if self.pg.backend == "gloo" else 1
        self.lanes = [] if thread is None else [thread] + [CommThread(thread.timeout_s, shares=thread)
                                                         for _ in range(lanes - 1)]

    def launch(self, bucket: Bucket) -> FutureHandle:
        lane = self.launches % len(self.lanes)
        self.launches += 1
        return self.lanes[lane].submit(lambda: self._reduce(bucket, lane))

    def _reduce(self, bucket: Bucket, lane: int = 0) -> None:
        """Runs on lane ``lane``'s comm thread: the 2(N - 1) rounds of ``schedule``, in place on
        ``bucket.flat``, their messages tagged ``lane``."""
        chunks = torch.tensor_split(bucket.flat, self.world)
        recv_buf = torch.empty_like(chunks[0])  # chunk 0 is a largest one; allocated once per bucket
        with _on_device(self.device):
            for phase, step, out, into in schedule(self.rank, self.world):
                if phase == REDUCE_SCATTER:
                    buf = recv_buf[:chunks[into].numel()]
                    self._exchange(bucket, phase, step, out, chunks[out], buf, lane)
                    chunks[into].add_(buf)  # the left neighbour's partial sum plus ours
                else:
                    self._exchange(bucket, phase, step, out, chunks[out], chunks[into], lane)  # a final sum

    def _exchange(self, bucket: Bucket, phase: str, step: int, chunk: int, send: torch.Tensor,
                  recv: torch.Tensor, lane: int = 0) -> None:
        """Receive ``recv`` from the left neighbour while sending ``send`` to the right one, both tagged
        ``lane``; raise if either fails or does not finish within the process group's timeout.

        Both are posted before either is waited for: were every rank to wait for its send first, a
        send that blocks until it is received would deadlock the ring. ``batch_isend_irecv`` issues the pair as one NCCL group (neither blocks the
        other); gloo cannot coalesce, so there it simply posts the irecv, then the isend."""
        timeout = datetime.timedelta(seconds=self.comm.timeout_s)
        start = time.perf_counter()
        works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, recv, self.left, self.pg.group, lane),
                                        dist.P2POp(dist.isend, send, self.right, self.pg.group, lane)])
        for work in works:
            # gloo raises on a timeout or a dead peer ("Connection closed by peer"); the comm thread
            # hands the error to FutureHandle.wait in the trainer
            if work.wait(timeout) is False:
                raise TimeoutError(f"ring bucket {bucket.index} {phase} step {step}: no transfer within "
                                   f"{self.comm.timeout_s:.0f} s (rank {self.rank}, neighbours "
                                   f"{self.left} and {self.right})")
        self.transfers.append(Transfer(bucket.index, phase, step, self.rank, self.right, chunk,
                                       send.numel() * send.element_size(), start, time.perf_counter()))

    def wire_bytes(self, bucket: Bucket) -> tuple[int, int]:
        """Exactly the chunks ``schedule`` sends and receives: 2(N - 1)/N * M up to chunk rounding."""
        sizes, item = chunk_sizes(bucket.flat.numel(), self.world), bucket.flat.element_size()
        rounds = list(schedule(self.rank, self.world))
        return sum(sizes[out] for *_, out, _ in rounds) * item, sum(sizes[into] for *_, into in rounds) * item

    def take_transfers(self) -> list[Transfer]:
        """The records since the last take (call once every launched bucket was waited for)."""
        taken, self.transfers = self.transfers, []
        return taken

    def take_messages(self) -> list:
        self.last_transfers = self.take_transfers()
        return [t.message() for t in self.last_transfers]


def _on_device(device: torch.device):
    """The comm thread's current CUDA device (thread-local, so ``set_device`` in the trainer does not
    reach it; NCCL's point-to-point calls need it), or nothing on the CPU."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
