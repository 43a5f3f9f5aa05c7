"""The PS's link probe (``--link-tuning probe``; ``sync.link_probe``): every worker echoes a few MB off
the servers, all workers in the same rounds, before rank 0 initialises them.

Op ``probe`` (``protocol``): ``round`` r (0..``MAX_ROUND``), optionally ``value`` (a list of at most
``MAX_VALUES`` numbers) and any tensors. A server answers the N probes of a round once all of them have
arrived, each with its own frames echoed and ``values``: every worker's ``value`` in rank order. The
barrier makes a round what a step's pushes are, N workers converging on S servers, then the replies
going back; its last round carries each worker's times, so every worker fits the same line from the
slowest worker's times and cuts the same chunks.
"""
from __future__ import annotations

import math
import time

import torch

from ..link_probe import PROBE_BYTES, REPEATS, LinkProbe, fit
from .protocol import ProtocolError, int_field

MAX_ROUND = 64
MAX_VALUES = 16


class ProbeRounds:
    """A server's side: the probes of each round until all N are here."""

    def __init__(self, workers: int):
        self.workers = workers
        self.rounds: dict[int, dict[int, tuple]] = {}

    def add(self, worker: int, header: dict, reply: tuple) -> list[tuple] | None:
        """Keep ``reply`` (what to send back: ident, req, metas, frames) of ``worker``'s probe; once the
        round is complete, the replies to send, as (ident, header, frames), else None."""
        r = int_field(header, "round", 0, MAX_ROUND)
        value = header.get("value")
        if value is not None and not (isinstance(value, list) and len(value) <= MAX_VALUES
                                      and all(type(v) in (int, float) for v in value)):
            raise ProtocolError(f"probe 'value' must be a list of at most {MAX_VALUES} numbers")
        got = self.rounds.setdefault(r, {})
        if worker in got:
            raise ProtocolError(f"worker {worker} probed round {r} twice")
        got[worker] = (*reply, value)
        if len(got) < self.workers:
            return None
        del self.rounds[r]
        values = [got[w][4] for w in range(self.workers)]
        return [(ident, {"ok": True, "req": req, "tensors": metas, "values": values}, frames)
                for ident, req, metas, frames, _ in got.values()]


def _round(client, r: int, per_server: int, value=None) -> tuple[float, list]:
    """One round to every server; (seconds until the last reply, server 0's ``values``)."""
    payload = [("probe", torch.zeros(per_server, dtype=torch.uint8))] if per_server else []
    t0 = time.perf_counter()
    reqs = [client.send(s, {"op": "probe", "round": r, **({"value": value} if value else {})}, payload)
            for s in range(len(client.addrs))]
    values = [client.recv(s, req)[0].get("values") for s, req in enumerate(reqs)][0]
    return time.perf_counter() - t0, values


def probe_servers(client, sizes: tuple[int, int] = PROBE_BYTES, repeats: int = REPEATS) -> LinkProbe:
    """This worker's side (every worker calls it, before the servers are initialised): ``sizes`` bytes
    spread evenly over the servers, each echoed back; the fastest of ``repeats`` rounds per size. A
    round moves its bytes up, then back down (the barrier keeps the two apart): 2 * size on the wire."""
    servers = len(client.addrs)
    r = 0
    _round(client, r, 64 << 10)  # connections up, the servers' buffers touched
    times = []
    for nbytes in sizes:
        best = math.inf
        for _ in range(repeats):
            r += 1
            best = min(best, _round(client, r, math.ceil(nbytes / servers))[0])
        times.append(best)
    _, values = _round(client, r + 1, 0, times)
    t1, t2 = (max(v[i] for v in values) for i in range(2))
    return fit((2 * sizes[0], 2 * sizes[1]), (t1, t2))
