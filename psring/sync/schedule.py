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

A consensus round is a collective of its own: on ranks that share a few cores it costs 20-40 ms of
every rank's CPU (traced at N = 8 on 2 cores, 1 Gbit), once per partition. So the ranks agree round by
round for ``learn_steps`` steps only, then keep the last such step's order (``order``) and launch each
bucket in it as soon as it is ready here and a credit is free, with no round at all: TicTac's fixed order
(Hashemi et al., SysML'19), learned from the run's own timing instead of derived from the graph. Every
rank learned the same order from the same rounds, so the collectives still line up; where a later step's
timing differs, a rank waits for the bucket next in the order instead of launching another.

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
# Steps agreed on round by round before their order is kept: the first has no forward to overlap with.
LEARN_STEPS = 2


def consensus_group(world: int, timeout_s: float):
    """The ranks' group for the readiness flags: gloo whatever the data's backend (a few CPU ints; NCCL
    takes CUDA tensors only), and apart from the data's collectives. Every rank must call it."""
    return dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=timeout_s), backend="gloo")


class PriorityScheduler:
    def __init__(self, reducer: Reducer, group, nbuckets: int, timeout_s: float, credits: int = CREDITS,
                 learn_steps: int = LEARN_STEPS):
        """``learn_steps``: steps agreed on round by round before their order is kept (0: every step)."""
        self.reducer, self.group, self.n, self.timeout_s = reducer, group, nbuckets, timeout_s
        self.learn_steps = learn_steps
        self.order: list[int] | None = None  # the launch order kept once learned
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
        if self._agree():
            self._replay()

    def _agree(self) -> bool:
        """Consensus rounds, one per launch, until ``learn_steps`` steps are launched; True once the last
        one's order is kept, False when stopped or failed."""
        counts = torch.zeros(self.n, dtype=torch.int32)
        behind_at = None  # the submit count at a round that showed this rank behind: wait until it moves
        launched: list[int] = []
        while self.learn_steps <= 0 or len(launched) < self.learn_steps * self.n:
            if not self.credits.acquire(timeout=self.timeout_s):
                continue  # every credit out for a whole timeout: the completer reports that failure
            with self.cond:
                if not self.cond.wait_for(lambda: self._moved(behind_at), self.timeout_s):
                    self.credits.release()
                    continue  # idle between runs' phases: nothing to agree on
                if self.stop or self.failed:
                    return False
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
                return False
            if not self._launch(b, h):
                return False
            if self.learn_steps > 0:  # (0: every step agreed on; nothing to keep)
                launched.append(b.index)
        self.order = launched[-self.n:]
        return True

    def _replay(self) -> None:
        """Launch every step's buckets in ``order``, each once it is ready here and a credit is free."""
        while True:
            for i in self.order:
                while not self.credits.acquire(timeout=self.timeout_s):
                    if self.stop or self.failed:
                        return
                with self.cond:
                    while not (self.stop or self.failed is not None or i in self.pending):
                        self.cond.wait(self.timeout_s)  # idle between runs' phases: keep waiting
                    if self.stop or self.failed:
                        return
                    b, h = self.pending.pop(i)
                if not self._launch(b, h):
                    return

    def _launch(self, b: Bucket, h: FutureHandle) -> bool:
        try:
            self.launched.put((self.reducer.launch(b), h))
            return True
        except BaseException as e:  # noqa: BLE001 - handed to the waiting trainer, and to every later bucket
            h.error = e
            h.done.set()
            self._fail(e)
            return False

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
            self.cond.notify_all()  # a scheduler waiting for a bucket sees the failure now, not at its timeout
