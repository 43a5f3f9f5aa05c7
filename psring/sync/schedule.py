"""The reduce family's priority scheduler (``--overlap full``; issue #29 item 2): buckets are reduced
nearest-the-input first, the same order on every rank, at most ``credits`` of them in flight.

The next forward needs the first layers' parameters first, and their gradients are the last backward
makes: reduced in the order they became ready (FIFO), they would be the last to come back, and the
next forward would wait for the whole step's communication (P3, Jayarajan et al. SysML'19; TicTac,
Hashemi et al. SysML'19; ByteScheduler, Peng et al. SOSP'19). So before each reduction the ranks agree
which buckets are ready everywhere, with a SUM all-reduce of their readiness flags on a process group
of its own (a few bytes; the collectives of the data keep theirs), and launch the one with the highest
index among those ready on all N (the layout is in backward order). Every rank computes the same
choice from the same counts, so the data's collectives line up.

Credits (ByteScheduler's): a decision is taken once fewer than ``credits`` reductions are in flight, so
the next one is agreed on while the current one still moves bytes and the link never idles between
partitions for a consensus round or a thread hand-off; a bucket that becomes ready waits behind at
most ``credits`` others, each bounded by the partition (``--bucket-mb`` or the probed size).

No rank spins: a round in which nothing is ready everywhere tells each rank, from the counts, whether
it lacks a bucket another has (it is behind, and waits for its own next bucket before asking again) or
not (it asks again at once and blocks in the all-reduce until the ranks behind join).

``submit`` (from backward's hooks) returns at once with a handle the trainer waits on, as
``Reducer.launch``'s does, so ``ReduceSync`` and its per-bucket updates are the same with or without it.
"""
from __future__ import annotations

import datetime
import queue
import threading

import torch
import torch.distributed as dist

from .buckets import Bucket
from .handles import FutureHandle, Handle
from .reducer import Reducer

# Reductions in flight: one on the link, the next agreed on and queued behind it. Emulated 1 Gbit, N = 4,
# ResNet-18, ring --overlap full: 1 credit (no pipelining) 1.00 s a step, 2 credits 0.76 s, 3 credits 0.77 s
CREDITS = 2


def consensus_group(world: int, timeout_s: float):
    """The ranks' group for the readiness flags: gloo whatever the data's backend (a few CPU ints; NCCL
    takes CUDA tensors only), and apart from the data's collectives. Every rank must call it."""
    return dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=timeout_s), backend="gloo")


class PriorityScheduler:
    def __init__(self, reducer: Reducer, group, nbuckets: int, timeout_s: float, credits: int = CREDITS):
        self.reducer, self.group, self.n, self.timeout_s = reducer, group, nbuckets, timeout_s
        self.world = dist.get_world_size(group)
        self.cond = threading.Condition()
        self.pending: dict[int, tuple[Bucket, FutureHandle]] = {}  # ready here, not yet reduced
        self.version = 0  # submits so far: a rank that is behind waits for it to move
        self.stop = False
        self.failed: BaseException | None = None
        self.decisions = 0  # consensus rounds (one per reduction, more while a rank is behind)
        self.credits = threading.Semaphore(credits)
        self.launched: queue.Queue = queue.Queue()  # (the reducer's handle, the trainer's), launch order
        self.thread = threading.Thread(target=self._run, name="psring-priority", daemon=True)
        self.completer = threading.Thread(target=self._complete, name="psring-priority-done", daemon=True)
        self.thread.start()
        self.completer.start()

    def submit(self, b: Bucket) -> Handle:
        h = FutureHandle(self.timeout_s)
        with self.cond:
            if self.failed is not None:
                h.error = RuntimeError(f"an earlier bucket's reduction failed: {self.failed}")
                h.done.set()
                return h
            self.pending[b.index] = (b, h)
            self.version += 1
            self.cond.notify()
        return h

    def close(self) -> None:
        with self.cond:
            self.stop = True
            self.cond.notify()
        self.credits.release()  # a scheduler waiting for a credit sees the stop
        self.thread.join(timeout=5)
        self.launched.put(None)
        self.completer.join(timeout=5)

    def _run(self) -> None:
        counts = torch.zeros(self.n, dtype=torch.int32)
        behind_at = None  # the submit count at a round that showed this rank behind: wait until it moves
        while True:
            if not self.credits.acquire(timeout=self.timeout_s):
                continue  # every credit out for a whole timeout: the completer reports that failure
            with self.cond:
                if not self.cond.wait_for(lambda: self._moved(behind_at), self.timeout_s):
                    self.credits.release()
                    continue  # idle between runs' phases: nothing to agree on
                if self.stop or self.failed:
                    return
                counts.zero_()
                mine = list(self.pending)
                counts[mine] = 1
                version = self.version
            try:
                dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=self.group)
                self.decisions += 1
                everywhere = (counts == self.world).nonzero().flatten().tolist()
                if not everywhere:
                    self.credits.release()
                    lacking = set((counts > 0).nonzero().flatten().tolist()) - set(mine)
                    behind_at = version if lacking else None
                    continue
                behind_at = None
                with self.cond:
                    b, h = self.pending.pop(max(everywhere))
            except BaseException as e:  # noqa: BLE001 - the consensus failed: every waiting bucket fails
                self._fail(e)
                return
            try:
                self.launched.put((self.reducer.launch(b), h))
            except BaseException as e:  # noqa: BLE001 - handed to the waiting trainer, and to every later bucket
                h.error = e
                h.done.set()
                self._fail(e)
                return

    def _moved(self, behind_at: int | None) -> bool:
        """Time for a round: stopping, failed, or something pending and (if behind) a new submit since."""
        return self.stop or self.failed is not None or (bool(self.pending) and self.version != behind_at)

    def _complete(self) -> None:
        """Hands each reduction's end to the trainer's handle, in launch order, and gives its credit back."""
        while True:
            job = self.launched.get()
            if job is None:
                return
            work, h = job
            try:
                work.wait()
            except BaseException as e:  # noqa: BLE001 - handed to the waiting trainer
                h.error = e
                self._fail(e)
            h.done.set()
            self.credits.release()

    def _fail(self, e: BaseException) -> None:
        with self.cond:
            self.failed = self.failed or e
            for _, h in self.pending.values():
                h.error = e
                h.done.set()
            self.pending.clear()
