"""The one async shape of the reduce family: a launched bucket's ``Handle`` (``wait()`` returns once
its sum is in place), over a torch.distributed ``Work`` or a function run on the process's one
``CommThread`` (a reduction of several dependent rounds, which would block backward inside a hook)."""
from __future__ import annotations

import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable


class Handle(ABC):
    """One launched bucket's reduction."""

    @abstractmethod
    def wait(self) -> None:
        """Return once the bucket's buffer holds the sum; raise what the reduction raised."""


class WorkHandle(Handle):
    """A torch.distributed ``Work`` (``async_op=True``)."""

    def __init__(self, work):
        self.work = work

    def wait(self) -> None:
        self.work.wait()


class FutureHandle(Handle):
    """A function run on the ``CommThread``: ``wait`` blocks until it ran, re-raising its exception."""

    def __init__(self, timeout_s: float):
        self.timeout_s, self.done, self.error = timeout_s, threading.Event(), None

    def wait(self) -> None:
        if not self.done.wait(self.timeout_s):
            raise TimeoutError(f"a bucket's reduction did not finish within {self.timeout_s:.0f} s")
        if self.error is not None:
            raise self.error


class Failure:
    """The first error of one or more comm threads that must fail together (a ring's lanes)."""

    def __init__(self):
        self.error: BaseException | None = None


class CommThread:
    """One background thread per process that runs submitted functions one at a time, in submission
    order (a daemon: a worker that dies is not kept alive by it). After a failure every later function
    fails at once with the same error: the collectives of the ranks no longer line up. ``shares``: another
    comm thread whose failures this one shares (a ring's second lane fails with its first, and the first
    with it)."""

    def __init__(self, timeout_s: float, shares: CommThread | None = None):
        self.timeout_s = timeout_s
        self.jobs: queue.Queue = queue.Queue()
        self.failure = Failure() if shares is None else shares.failure
        self.thread = threading.Thread(target=self._run, name="psring-comm", daemon=True)
        self.thread.start()

    @property
    def failed(self) -> BaseException | None:
        return self.failure.error

    def submit(self, fn: Callable[[], None]) -> FutureHandle:
        h = FutureHandle(self.timeout_s)
        self.jobs.put((fn, h))
        return h

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            fn, h = job
            try:
                if self.failure.error is not None:
                    raise RuntimeError(f"an earlier bucket's reduction failed: {self.failure.error}")
                fn()
            except BaseException as e:  # noqa: BLE001 - handed to the waiting trainer thread
                self.failure.error = self.failure.error or e
                h.error = e
            h.done.set()

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join(timeout=5)
