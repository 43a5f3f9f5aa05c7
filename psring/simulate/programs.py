"""What each strategy sends in one step, replayed on ``network.Network`` from the plans the synchronizers run
(imported, not described again): the reduce family's buckets (``buckets.param_ranges``), the ring's rounds
(``ring.schedule``, ``ring.chunk_sizes``), the PS's chunks and windows (``transport.chunk_ranges``,
``sharding.default_window``). ``--overlap none``: every rank starts its step's communication once its
backward ended (``start(rank)``) and calls ``done(rank, bytes_sent)`` when it holds the step's result.

* ``RingProgram``: each bucket in launch order, 2(N-1) rounds on a ring of ranks; a round's transfer from
  rank r to its right neighbour starts once both entered that round (gloo pairs each send with its
  receive) and the round ends for r when its send and its receive both arrived. ``allreduce`` (gloo's
  ring) and ``ring`` run it over all N ranks; ``hierarchical`` runs G of them at once, ring l over the
  local ranks l of the H hosts with the l-th of G slices of every bucket (the in-host reduce-scatter and
  all-gather are free: an emulated host's loopback). A sparse or 1-bit codec's encodings are all-gathered
  instead (``gathered``: N - 1 rounds of each part, every rank sending one rank's part in each).
* ``PSProgram``: worker w sends each server its chunks in order on one connection (FIFO), at most
  ``window`` of them unanswered per server; a server answers a chunk (to every worker, FIFO per
  connection) once all N pushes of it arrived (BSP). ASP and SSP (``sync.ps.consistency``): a push is its
  own update and is answered to its worker alone, at once (ASP) or, for a push of step t, once every
  worker's clock at that server (the steps for which it pushed all the server's chunks) is >= t + 1 - k
  (SSP, staleness k).
"""
from __future__ import annotations

from collections.abc import Callable

from ..sync.ring import chunk_sizes, schedule
from .network import Network

Done = Callable[..., None]  # done(rank, bytes sent[, bytes received: where they differ])


class RingProgram:
    """One or several rings at once (``rings``: lists of ranks; ``slices[i]``: per bucket, the elements ring
    i reduces); a rank holds the step's sum once every ring has finished on its host (hierarchical: the
    host's all-gather needs every local rank's slice; on one host it is free)."""

    def __init__(self, net: Network, host_of: list[int], rings: list[list[int]], slices: list[list[int]],
                 itemsize: int, done: Done, gathered: list[int] | None = None):
        """``gathered``: an all-gather instead (a sparse or 1-bit codec's encodings): per round, the bytes
        every rank sends (each part of each bucket's encoding, N - 1 rounds each); ``slices`` unused."""
        self.net, self.host_of, self.done, self.itemsize = net, host_of, done, itemsize
        self.rings = [_Ring(self, members, numels, gathered) for members, numels in zip(rings, slices)]
        self.steps = [0] * len(host_of)  # steps each rank has started
        self.reported = [0] * len(host_of)  # steps each rank has finished
        self.on_host: dict[int, list[int]] = {}
        for r, h in enumerate(host_of):
            self.on_host.setdefault(h, []).append(r)

    def start(self, rank: int) -> None:
        """``rank``'s backward ended. A host's rings start once all its ranks are there (hierarchical: the
        in-host reduce-scatter needs every local rank's gradients; one rank per host: at once)."""
        self.steps[rank] += 1
        host = self.on_host[self.host_of[rank]]
        if all(self.steps[r] == self.steps[rank] for r in host):
            for r in host:
                for g in self.rings:
                    if r in g.pos:
                        g.start(r)

    def _ring_done(self, member: int) -> None:
        h = self.host_of[member]
        for r in self.on_host[h]:
            k = self.steps[r]
            if self.reported[r] < k and all(g.steps_done_on(h) >= k for g in self.rings):
                self.reported[r] = k
                self.done(r, sum(g.sent[g.pos[r]] for g in self.rings if r in g.pos))


class _Ring:
    def __init__(self, prog: RingProgram, members: list[int], bucket_numels: list[int],
                 gathered: list[int] | None = None):
        self.prog, self.members = prog, members
        self.pos = {r: i for i, r in enumerate(members)}
        n = len(members)
        # every round of every bucket, per position: the bytes that position sends in it
        self.bytes = [[chunk_sizes(numel, n)[sent] * prog.itemsize
                       for numel in bucket_numels for _, _, sent, _ in schedule(i, n)] for i in range(n)] \
            if gathered is None else [list(gathered) for _ in range(n)]
        self.total = len(self.bytes[0]) if n > 1 else 0
        # rounds are numbered on across steps (step s: rounds s*total .. (s+1)*total - 1), so a transfer of
        # one step never mixes with the next one's; a position waits between steps (live False)
        self.round = [0] * n
        self.live = [False] * n
        self.started: list[set] = [set() for _ in range(n)]
        self.arrived: list[dict] = [{} for _ in range(n)]  # round -> {"send", "recv"} that arrived
        self.sent = [0.0] * n
        self.done_steps = [0] * n

    def steps_done_on(self, host: int) -> int:
        """The steps this ring has finished at its member on ``host`` (no member there: every step)."""
        mine = [i for i, r in enumerate(self.members) if self.prog.host_of[r] == host]
        return min((self.done_steps[i] for i in mine), default=1 << 60)

    def start(self, rank: int) -> None:
        i = self.pos[rank]
        self.live[i], self.sent[i] = True, 0.0
        self._enter(i, self.round[i])

    def _enter(self, i: int, j: int) -> None:
        self.round[i] = j
        if self.total == 0:  # a ring of one
            self._end(i)
            return
        n = len(self.members)
        self._try(i, j)
        self._try((i - 1) % n, j)

    def _try(self, i: int, j: int) -> None:
        """Start position i's transfer of round j to its right neighbour once both are in round j."""
        n = len(self.members)
        right = (i + 1) % n
        if j in self.started[i] or not (self.live[i] and self.live[right]) or self.round[i] != j \
                or self.round[right] != j:
            return
        self.started[i].add(j)
        nbytes = self.bytes[i][j % self.total]
        self.sent[i] += nbytes
        src, dst = self.prog.host_of[self.members[i]], self.prog.host_of[self.members[right]]
        self.prog.net.send(src, dst, nbytes, lambda: (self._arrive(i, j, "send"), self._arrive(right, j, "recv")))

    def _arrive(self, i: int, j: int, what: str) -> None:
        got = self.arrived[i].setdefault(j, set())
        got.add(what)
        if got == {"send", "recv"}:
            del self.arrived[i][j]
            self.started[i].discard(j - 1)
            if (j + 1) % self.total:
                self._enter(i, j + 1)
            else:  # the step's last round: wait for the next step's start
                self.round[i] = j + 1
                self._end(i)

    def _end(self, i: int) -> None:
        self.live[i] = False
        self.done_steps[i] += 1
        self.prog._ring_done(self.members[i])


class Connections:
    """Named connections on ``net``, each sending its messages one after the other (a TCP connection's
    order): ``send(conn, src, dst, nbytes, then)``."""

    def __init__(self, net: Network):
        self.net, self.queues = net, {}

    def send(self, conn, src: int, dst: int, nbytes: float, then: Callable[[], None]) -> None:
        q = self.queues.setdefault(conn, [])
        q.append((src, dst, nbytes, then))
        if len(q) == 1:
            self._next(conn)

    def _next(self, conn) -> None:
        src, dst, nbytes, then = self.queues[conn][0]

        def sent():
            self.queues[conn].pop(0)
            if self.queues[conn]:
                self._next(conn)
            then()
        self.net.send(src, dst, nbytes, sent)


class PSProgram:
    """Dedicated servers on hosts ``server_host[s]``; ``chunks``: (server, bytes) in chunk order."""

    def __init__(self, net: Network, host_of: list[int], server_host: list[int], chunks: list[tuple[int, int]],
                 window: int, done: Done, consistency: str = "bsp", staleness: int = 0,
                 pushes: list[float] | None = None):
        """``pushes``: each chunk's bytes on the way up where a codec encodes them (None: the chunk's)."""
        self.net, self.host_of, self.server_host, self.done = net, host_of, server_host, done
        self.push_bytes = pushes or [b for _, b in chunks]
        self.consistency, self.staleness = consistency, staleness
        self.workers = len(host_of)
        self.per_server = [[c for c, (s, _) in enumerate(chunks) if s == srv] for srv in range(len(server_host))]
        self.chunks, self.window = chunks, window
        self._fifo = Connections(net).send  # (worker, "up"|"down", server): its messages one after the other
        self.answered = [0] * self.workers
        self.sent = [0.0] * self.workers
        self.arrived = [0] * len(chunks)
        self.next_chunk: dict = {}  # (worker, server) -> how many of its chunks it has pushed this step
        self.unanswered: dict = {}  # (worker, server) -> pushes without a reply yet
        self.steps = [0] * self.workers  # steps each worker has started
        servers = len(server_host)
        self.clock = [[0] * servers for _ in range(self.workers)]  # ASP/SSP: [w][s], steps w pushed all of s's
        self.landed: dict = {}  # (worker, server) -> this step's pushes that arrived at the server
        self.held: list[list[tuple[int, int, int]]] = [[] for _ in range(servers)]  # SSP: (w, c, t) to answer

    def start(self, w: int) -> None:
        self.answered[w] = 0
        self.steps[w] += 1
        for s in range(len(self.per_server)):
            self.next_chunk[w, s], self.unanswered[w, s] = 0, 0
            self._push_more(w, s)

    def _push_more(self, w: int, s: int) -> None:
        ids = self.per_server[s]
        while self.next_chunk[w, s] < len(ids) and (not self.window or self.unanswered[w, s] < self.window):
            c = ids[self.next_chunk[w, s]]
            self.next_chunk[w, s] += 1
            self.unanswered[w, s] += 1
            self._fifo((w, "up", s), self.host_of[w], self.server_host[s], self.push_bytes[c],
                       lambda c=c, w=w, t=self.steps[w] - 1: self._pushed(c, w, t))
            self.sent[w] += self.push_bytes[c]

    def _pushed(self, c: int, w: int, t: int) -> None:
        if self.consistency != "bsp":
            self._pushed_async(c, w, t)
            return
        self.arrived[c] += 1
        if self.arrived[c] == self.workers:  # BSP: every worker's push of chunk c is in; the update is free
            self.arrived[c] = 0
            s, nbytes = self.chunks[c]
            for w in range(self.workers):
                self._fifo((w, "down", s), self.server_host[s], self.host_of[w], nbytes,
                           lambda w=w, s=s: self._replied(w, s))

    def _pushed_async(self, c: int, w: int, t: int) -> None:
        """ASP/SSP: worker w's push of chunk c (its step t) is applied on arrival (the update is free); its
        reply waits in the server's queue until SSP's clock condition holds (ASP: never)."""
        s = self.chunks[c][0]
        self.landed[w, s] = self.landed.get((w, s), 0) + 1
        if self.landed[w, s] == len(self.per_server[s]):
            self.landed[w, s] = 0
            self.clock[w][s] += 1
        self.held[s].append((w, c, t))
        slowest = min(self.clock[v][s] for v in range(self.workers))
        keep = []
        for hw, hc, ht in self.held[s]:
            if self.consistency == "asp" or slowest >= ht + 1 - self.staleness:
                self._fifo((hw, "down", s), self.server_host[s], self.host_of[hw], self.chunks[hc][1],
                           lambda hw=hw, s=s: self._replied(hw, s))
            else:
                keep.append((hw, hc, ht))
        self.held[s] = keep

    def _replied(self, w: int, s: int) -> None:
        self.unanswered[w, s] -= 1
        self.answered[w] += 1
        self._push_more(w, s)
        if self.answered[w] == len(self.chunks):
            sent, self.sent[w] = self.sent[w], 0.0
            self.done(w, sent, float(sum(b for _, b in self.chunks)))
