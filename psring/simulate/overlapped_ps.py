"""The PS's chunks leaving while backward makes them (``--overlap backward|full``; BSP; any placement), as
``sync.ps.transport`` sends them:

* with credits (``credit`` bytes > 0, ``sharding.credit_bytes``): the priority scheduler's pump pushes the
  ready chunk nearest the model's input first (the highest index) while fewer than ``credit`` bytes of this
  worker's pushes are not yet acked; a server acks a push the moment it has read it, on the connection its
  replies take (so an ack waits behind the replies queued before it). With ``link_Bps``
  (``sharding.plan_link_Bps``: ``--ps-order planned``, the link known), each worker's steps after
  ``transport.PLAN_STEP`` push, among their ready chunks, the one earliest in the order ``transport.push_order`` plans
  from that step's ready times (under ``full``, with its pushes' push-to-ack spans);
* without: per server, its chunks in order as they become ready, at most ``window`` unanswered (0: no limit).

A server answers chunk c to every worker (FIFO per connection) once all N pushes of it are in; the update is
free. ``unit_done(worker, step, chunk)`` when a reply arrives.
"""
from __future__ import annotations

from .. import costmodel as cm
from ..sync.ps.transport import PLAN_STEP, push_order
from .programs import Connections

ACK_BYTES = 64  # a pushpull's ack: a msgpack header in one frame


def ps_schedule(cfg, layout, chunk_bytes: int | None = None):
    """(chunk ranges, window, credit bytes, the worker's link in bytes/s or None, whether its plan is paced by the
    acks) as ``PSSync`` plans them: ``run.ps_ranges``' chunks and window, and ``sharding.credit_bytes`` for the
    biggest chunk, ``plan_link_Bps`` and ``plan_paced_by_acks``, as the worker's transport gets them."""
    from ..sync.ps.sharding import credit_bytes, credit_chunks, plan_link_Bps, plan_paced_by_acks
    from .plans import ps_ranges

    ranges, window = ps_ranges(cfg, layout, chunk_bytes)
    links = cm.emulated_links_Bps("emulated", cfg.link_rate, cfg.server_link_rate, cfg.link_tuning)
    biggest = max((r.end - r.start) * layout[0].dtype.itemsize for r in ranges)
    credit = credit_bytes(cfg.ps_credit_mb, cfg.overlap, credit_chunks(links, cfg.workers, cfg.servers), biggest)
    return ranges, window, credit, plan_link_Bps(cfg.ps_order, links, credit), plan_paced_by_acks(cfg.overlap)


class OverlapPS:
    def __init__(self, net, host_of: list[int], server_host: list[int], chunks: list[tuple[int, int]],
                 window: int, credit: int, unit_done, link_Bps: float | None = None, timed_busy: bool = False):
        self.net, self.host_of, self.server_host, self.unit_done = net, host_of, server_host, unit_done
        self.chunks, self.window, self.credit, self.link_Bps = chunks, window, credit, link_Bps
        self.per_server = [[c for c, (s, _) in enumerate(chunks) if s == srv] for srv in range(len(server_host))]
        n = len(host_of)
        self._fifo = Connections(net).send  # (worker, "up"|"down", server): its messages one after the other
        self.ready: list[set] = [set() for _ in range(n)]  # (step, chunk) ready, not yet pushed
        self.unacked = [0] * n  # bytes pushed, not yet acked (credits)
        self.next: dict = {}  # (worker, server) -> index into per_server of its next push (FIFO)
        self.unanswered: dict = {}  # (worker, server) -> pushes without a reply (FIFO under the window)
        self.arrived: dict = {}  # (step, chunk) -> pushes in at its server
        self.handed: list[dict] = [{} for _ in range(n)]  # chunk -> when it was ready in step PLAN_STEP
        self.order: list[list[int] | None] = [None] * n  # each worker's planned push order, once planned
        self.rank: list[dict[int, int]] = [{} for _ in range(n)]  # chunk -> its position in the worker's order
        self.timed_busy = timed_busy  # plan from step PLAN_STEP's push-to-ack spans (``--overlap full``)
        self.spans: list[dict] = [{} for _ in range(n)]  # chunk -> [pushed, acked] in step PLAN_STEP

    def step_bytes(self, w: int) -> float:
        return float(sum(nbytes for _, nbytes in self.chunks))

    def launch(self, w: int, step: int, c: int) -> None:
        """Chunk c of ``step`` is ready on worker w."""
        self.ready[w].add((step, c))
        if step == PLAN_STEP and self.link_Bps:
            self._plan(w, c)
        if self.credit:
            self._pump(w)
        else:
            self._push_fifo(w, self.chunks[c][0], step)

    def _plan(self, w: int, c: int | None = None) -> None:
        """Worker w's push order from step PLAN_STEP's ready times (and spans), once all of them are in (the
        worker plans at that step's end: the order is the same)."""
        if c is not None:
            self.handed[w][c] = self.net.now
        n = len(self.chunks)
        spans = [x for x in self.spans[w].values() if x[1] is not None] if self.timed_busy else None
        if len(self.handed[w]) == n and (spans is None or len(spans) == n):
            self.order[w] = push_order([self.handed[w][i] for i in range(n)], [nbytes for _, nbytes in self.chunks],
                                       self.link_Bps, spans)
            self.rank[w] = {c: k for k, c in enumerate(self.order[w])}

    def _next(self, w: int) -> tuple[int, int]:
        """(step, chunk) worker w pushes next: of its oldest step's ready chunks, the one earliest in its planned
        order (steps after PLAN_STEP, once planned), else the one nearest the input."""
        step = min(s for s, _ in self.ready[w])
        mine = [c for s, c in self.ready[w] if s == step]
        rank = self.rank[w] if step > PLAN_STEP else None
        return step, (min(mine, key=rank.__getitem__) if rank else max(mine))

    def _pump(self, w: int) -> None:
        while self.ready[w] and self.unacked[w] < self.credit:
            step, c = self._next(w)
            self.ready[w].discard((step, c))
            self.unacked[w] += self.chunks[c][1]
            self._push(w, step, c)

    def _push_fifo(self, w: int, s: int, step: int) -> None:
        ids = self.per_server[s]
        key = (w, s)
        while True:
            i = self.next.get(key, 0) % len(ids)
            if (step, ids[i]) not in self.ready[w] or (self.window and self.unanswered.get(key, 0) >= self.window):
                return
            self.ready[w].discard((step, ids[i]))
            self.next[key] = self.next.get(key, 0) + 1
            self.unanswered[key] = self.unanswered.get(key, 0) + 1
            self._push(w, step, ids[i])

    def _push(self, w: int, step: int, c: int) -> None:
        s, nbytes = self.chunks[c]
        if self.timed_busy and step == PLAN_STEP and self.link_Bps:
            self.spans[w][c] = [self.net.now, None]
        self._fifo((w, "up", s), self.host_of[w], self.server_host[s], nbytes, lambda: self._pushed(w, step, c))

    def _pushed(self, w: int, step: int, c: int) -> None:
        s, nbytes = self.chunks[c]
        if self.credit:
            self._fifo((w, "down", s), self.server_host[s], self.host_of[w], ACK_BYTES, lambda: self._acked(w, c))
        got = self.arrived[step, c] = self.arrived.get((step, c), 0) + 1
        if got == len(self.host_of):  # BSP: every worker's push of chunk c is in
            del self.arrived[step, c]
            for v in range(len(self.host_of)):
                self._fifo((v, "down", s), self.server_host[s], self.host_of[v], nbytes,
                           lambda v=v: self._replied(v, step, c))

    def _acked(self, w: int, c: int) -> None:
        self.unacked[w] -= self.chunks[c][1]
        if c in self.spans[w] and self.spans[w][c][1] is None:
            self.spans[w][c][1] = self.net.now
            self._plan(w)
        self._pump(w)

    def _replied(self, w: int, step: int, c: int) -> None:
        s = self.chunks[c][0]
        if not self.credit:
            self.unanswered[w, s] -= 1
            self._push_fifo(w, s, step)
        self.unit_done(w, step, c)
