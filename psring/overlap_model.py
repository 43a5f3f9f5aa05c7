"""The step-time bound of each ``--overlap`` mode, given when each gradient is ready, when each layer's
parameters are needed, and one bottleneck link (issue #29 item 4).

Units are the model's parameters in forward order (``sizes``: bytes each; ``forward_s``/``backward_s``
split over them in proportion to their bytes, as ``--compute emulated`` does, unless ``forward_shares``
says otherwise). Backward produces the gradients in reverse order: unit i is ready once backward has
done every unit after it. The bottleneck link moves ``comm_s`` seconds' worth of the whole model (the
strategy's own no-overlap bound, e.g. max(M/B_w, N*M/(S*B_s)) for the PS, 2(N-1)/N * M/B for the
ring), each unit its share; ``latency_s`` is added once to whatever arrives last (a chunk's reply, a
ring's last round):

* ``none``: forward + backward + comm_s + update_s.
* ``backward``: the link starts each unit when it is ready (the order does not matter for when it is
  done); the update follows backward and the last of it, and the next forward waits for both.
* ``full``: the link serves, at every moment, the ready unit the next forward needs first (preemptive
  priority, P3/ByteScheduler taken to their limit of infinitely small partitions), and each layer of the
  next forward starts once its own parameters are back, updated, and the layer before it is done. A lower
  bound: no real scheduler beats a preemptive fluid one.

``update_s``: the worker's own optimizer step over the whole model (0 where the servers update, the PS),
work on the trainer's thread that no schedule hides from the next forward (the issue's ``(+ update)``);
in ``full`` each unit's share of it (by bytes) runs just before the layer that needs it.

Each returns the steady-state step time in seconds (one step's communication always ends before the
next backward, which overwrites the gradients). Example (four equal layers, 1 s of compute, comm 1 s)::

    >>> round(step_bound("none", [1, 1, 1, 1], 1/3, 2/3, 1.0), 3)
    2.0
    >>> round(step_bound("backward", [1, 1, 1, 1], 1/3, 2/3, 1.0), 3)
    1.5
"""
from __future__ import annotations

from .strategies import OVERLAPS as MODES

NONE, BACKWARD, FULL = MODES


def step_bound(mode: str, sizes: list[float], forward_s: float, backward_s: float, comm_s: float,
               latency_s: float = 0.0, forward_shares: list[float] | None = None, update_s: float = 0.0) -> float:
    if mode not in MODES:
        raise ValueError(f"overlap mode must be one of {', '.join(MODES)}, got {mode!r}")
    total = float(sum(sizes))
    if total <= 0:
        raise ValueError("the model has no bytes to communicate")
    if mode == NONE:
        return forward_s + backward_s + comm_s + latency_s + update_s
    link = [comm_s * b / total for b in sizes]  # seconds of link each unit needs
    ready = ready_times(sizes, backward_s)
    if mode == BACKWARD:
        done = 0.0
        for i in sorted(range(len(sizes)), key=lambda i: ready[i]):  # FIFO = any order, for the last end
            done = max(done, ready[i]) + link[i]
        return forward_s + max(backward_s, done + latency_s) + update_s
    arrival = priority_arrivals(ready, link)
    shares = forward_shares or [b / total for b in sizes]
    t = backward_s  # the next forward starts when backward is done
    for i, share in enumerate(shares):
        t = max(t, arrival[i] + latency_s) + forward_s * share + update_s * sizes[i] / total
    return t  # = backward_s + the next forward's length, with its waits


def ready_times(sizes: list[float], backward_s: float) -> list[float]:
    """When each unit's gradient is ready, after backward began: the last unit first, each after its
    byte share of the backward time."""
    total, t, out = float(sum(sizes)), 0.0, [0.0] * len(sizes)
    for i in reversed(range(len(sizes))):
        t += backward_s * sizes[i] / total
        out[i] = t
    return out


def priority_arrivals(ready: list[float], link: list[float]) -> list[float]:
    """When each unit is through the link if the link always serves the ready unit with the lowest index
    (preemptive, fluid): an event-driven run over the readiness times."""
    left, arrival = list(link), [0.0] * len(link)
    events = sorted(set(ready))
    t, k = 0.0, 0
    while k < len(events) or any(x > 0 for x in left):
        horizon = events[k] if k < len(events) else float("inf")
        avail = [i for i, x in enumerate(left) if x > 0 and ready[i] <= t]
        if not avail:
            t = horizon
            k += 1
            continue
        i = min(avail)
        if t + left[i] <= horizon:
            t += left[i]
            left[i] = 0.0
            arrival[i] = t
        else:
            left[i] -= horizon - t
            t = horizon
            k += 1
    return arrival
