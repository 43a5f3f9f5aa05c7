"""The reduce family's priority scheduler (``--overlap full``; issue #29 item 2): buckets are reduced
nearest-the-input first, the same order on every rank, one at a time on a thread of their own.

The next forward needs the first layers' parameters first, and their gradients are the last backward
makes: reduced in the order they became ready (FIFO), they would be the last to come back, and the
next forward would wait for the whole step's communication (P3, Jayarajan et al. SysML'19; TicTac,
Hashemi et al. SysML'19; ByteScheduler, Peng et al. SOSP'19). So before each reduction the ranks agree
which buckets are ready everywhere, with a MIN all-reduce of their readiness flags on a process group
of its own (a few bytes; the collectives of the data keep theirs), and reduce the one with the highest
index among those not yet reduced (the layout is in backward order). Every rank computes the same
choice from the same flags, so the data's collectives line up; a rank that is behind holds the others
only until its bucket is ready, as plain FIFO would. One reduction is in flight at a time, so a bucket
that becomes ready waits behind at most one other: the partition (``--bucket-mb``) bounds that wait.

``submit`` (from backward's hooks) returns at once with a handle the trainer waits on, as
``Reducer.launch``'s does, so ``ReduceSync`` and its per-bucket updates are the same with or without it.
"""
from __future__ import annotations

import datetime
import threading

import torch
import torch.distributed as dist

from .buckets import Bucket
from .handles import FutureHandle, Handle
from .reducer import Reducer


def consensus_group(world: int, timeout_s: float):
    """The ranks' group for the readiness flags: gloo whatever the data's backend (a few CPU ints; NCCL
    takes CUDA tensors only), and apart from the data's collectives. Every rank must call it."""
    return dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=timeout_s), backend="gloo")


class PriorityScheduler:
    def __init__(self, reducer: Reducer, group, nbuckets: int, timeout_s: float):
        self.reducer, self.group, self.n, self.timeout_s = reducer, group, nbuckets, timeout_s
        self.cond = threading.Condition()
        self.pending: dict[int, tuple[Bucket, FutureHandle]] = {}  # ready here, not yet reduced
        self.stop = False
        self.failed: BaseException | None = None
        self.decisions = 0  # consensus rounds (one per reduction, more while a rank is behind)
        self.thread = threading.Thread(target=self._run, name="psring-priority", daemon=True)
        self.thread.start()

    def submit(self, b: Bucket) -> Handle:
        h = FutureHandle(self.timeout_s)
        with self.cond:
            if self.failed is not None:
                h.error = RuntimeError(f"an earlier bucket's reduction failed: {self.failed}")
                h.done.set()
                return h
            self.pending[b.index] = (b, h)
            self.cond.notify()
        return h

    def close(self) -> None:
        with self.cond:
            self.stop = True
            self.cond.notify()
        self.thread.join(timeout=5)

    def _run(self) -> None:
        flags = torch.zeros(self.n, dtype=torch.int32)
        while True:
            with self.cond:
                if not self.cond.wait_for(lambda: self.pending or self.stop, self.timeout_s):
                    continue  # idle between runs' phases: nothing to agree on
                if self.stop:
                    return
                flags.zero_()
                flags[list(self.pending)] = 1
            try:
                dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=self.group)  # ready on every rank
                self.decisions += 1
                everywhere = flags.nonzero().flatten().tolist()
                if not everywhere:
                    continue  # another rank is behind: ask again once it has caught up (it joins then)
                with self.cond:
                    b, h = self.pending.pop(max(everywhere))
                try:
                    self.reducer.launch(b).wait()
                except BaseException as e:  # noqa: BLE001 - handed to the waiting trainer
                    h.error = e
                    self.failed = e
                h.done.set()
            except BaseException as e:  # noqa: BLE001 - the consensus failed: every waiting bucket fails
                self._fail(e)
                return

    def _fail(self, e: BaseException) -> None:
        with self.cond:
            self.failed = e
            for _, h in self.pending.values():
                h.error = e
                h.done.set()
            self.pending.clear()
