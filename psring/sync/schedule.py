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
round for ``learn_steps`` steps only, timing the last of them: when each bucket became ready here and how
long the link was busy. One all-reduce (MAX) of those timings gives every rank the same figures, from which
each computes the same order (``serving_order.timed_order``: a serial link serving the ready bucket nearest
the input first), and plans again from the first two steps run in a plan (``PLANS``: the rounds' CPU
slows the reductions of the steps they run in), each time pricing the buckets by the fewest busy seconds timed
so far (a late rank or the cores' turns only ever make a step's reductions look slower). It launches each
bucket in the order (``order``) as soon as it is ready here and a credit is free, with no round at all:
TicTac's fixed order (Hashemi et al., SysML'19), planned from the run's own timing instead of derived from
the graph. The collectives still line up; where a later step's timing differs, a rank waits for the bucket
next in the order instead of launching another. (The rounds' own order is not kept: a round decides at the instant a credit frees, and
so sends a bucket the next forward needs last ahead of one a few milliseconds from ready that it needs
first.)

``submit`` (from backward's hooks) returns at once with a handle the trainer waits on, as
``Reducer.launch``'s does, so ``ReduceSync`` and its per-bucket updates are the same with or without it.
"""
from __future__ import annotations

import datetime
import math
import queue
import threading
import time

import torch
import torch.distributed as dist

from .buckets import Bucket
from .handles import FutureHandle, Handle
from .reducer import Reducer
from .serving_order import planned_order, rank_figures

# Reductions in flight: one on the link, the next agreed on and queued behind it. Emulated 1 Gbit, N = 4,
# ResNet-18, ring --overlap full: 1 credit (no pipelining) 1.00 s a step, 2 credits 0.76 s, 3 credits 0.77 s
CREDITS = 2
# Steps agreed on round by round before their order is kept: the first has no forward to overlap with.
LEARN_STEPS = 2
# Plans of the kept order (``serving_order``): from the last step agreed on, whose rounds slow its reductions
# (their CPU), then from each of the first two steps run in a plan, with none. Each prices the buckets by the
# fewest busy seconds timed so far: the first step run in a plan read 1.3x the steady steps' at N = 8, 1 Gbit.
PLANS = 3


def timed_step(step: int, learn_steps: int = LEARN_STEPS) -> bool:
    """Whether ``step`` is timed for a plan of the kept order: the last step agreed on round by round, then the
    first ``PLANS - 1`` run in a plan (the replays, ``simulate.timed_plan``, time the same steps)."""
    return learn_steps > 0 and 0 <= step - (learn_steps - 1) < PLANS


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
        # the timed steps (perf_counter): {step: {"ready": {bucket: t}, "spans": {bucket: [launch, end]}}}
        self.timing: dict[int, dict] = {}
        self.nbytes: dict[int, int] = {}
        self.busy_before = math.inf  # the fewest busy seconds of the steps timed so far (``planned_order``)
        self.submitted = self.launches = self.completed = 0  # buckets submitted, launched, reduced so far
        self.credits = threading.Semaphore(credits)
        self.launched: queue.Queue = queue.Queue()  # (reducer's handle, trainer's, bucket), launch order
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
            self.nbytes[b.index] = b.nbytes
            if (timing := self._timed(self.submitted)) is not None:
                timing["ready"][b.index] = time.perf_counter()
            self.submitted += 1
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
        """Consensus rounds, one per launch, until ``learn_steps`` steps are launched (0: for ever); True
        then, False when stopped or failed."""
        counts = torch.zeros(self.n, dtype=torch.int32)
        behind_at = None  # the submit count at a round that showed this rank behind: wait until it moves
        while self.learn_steps <= 0 or self.launches < self.learn_steps * self.n:
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
        return True

    def _timed(self, count: int) -> dict | None:
        """The timing record of the step the ``count``-th submit (or launch, or end) since the start is of,
        where that step is timed: the last one agreed on and the first run in its plan; else None."""
        step = count // self.n
        if timed_step(step, self.learn_steps):
            return self.timing.setdefault(step, {"ready": {}, "spans": {}})
        return None

    def _plan(self, step: int) -> bool:
        """``order`` from timed step ``step``, once every one of its reductions ended here: the same on every
        rank (one MAX all-reduce of the timings). False when stopped or failed."""
        with self.cond:
            while self.completed < (step + 1) * self.n:
                if self.stop or self.failed is not None:
                    return False
                self.cond.wait(self.timeout_s)  # idle between runs' phases: keep waiting
            timing = self.timing.pop(step)
        mine = rank_figures([timing["ready"][i] for i in range(self.n)], list(timing["spans"].values()))
        figures = torch.tensor(mine, dtype=torch.float64)
        try:
            dist.all_reduce(figures, op=dist.ReduceOp.MAX, group=self.group)
        except BaseException as e:  # noqa: BLE001 - every waiting bucket fails
            self._fail(e)
            return False
        nbytes = [self.nbytes[i] for i in range(self.n)]
        self.order = planned_order(figures.tolist(), nbytes, self.busy_before)
        self.busy_before = min(self.busy_before, float(figures[-1]))
        return True

    def _replay(self) -> None:
        """Launch every step's buckets in ``order``, each once it is ready here and a credit is free; the
        order planned from the last step agreed on, then again from the first step run in it."""
        step = self.learn_steps - 1
        if not self._plan(step):
            return
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
            step += 1
            if timed_step(step, self.learn_steps) and not self._plan(step):
                return

    def _launch(self, b: Bucket, h: FutureHandle) -> bool:
        try:
            if (timing := self._timed(self.launches)) is not None:
                timing["spans"][b.index] = [time.perf_counter(), 0.0]
            self.launches += 1
            self.launched.put((self.reducer.launch(b), h, b.index))
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
            work, h, index = job
            try:
                work.wait()
            except BaseException as e:  # noqa: BLE001 - handed to the waiting trainer
                h.error = e
                self._fail(e)
            with self.cond:
                if (timing := self._timed(self.completed)) is not None:
                    timing["spans"][index][1] = time.perf_counter()
                self.completed += 1
                self.cond.notify_all()
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
