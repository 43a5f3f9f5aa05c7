"""A PS server's own per-step figures, one JSON line per completed step (when ``--metrics`` is given).

Fields (seconds and bytes, for the step whose update just completed):
  recv_s       time in ZeroMQ receive calls        aggregate_s  summing workers' gradients in place
  update_s     the optimizer on the shard           send_s       handing replies to ZeroMQ
  wait_slowest_s  first push of the step -> last push (how long the server waited for the slowest worker)
  bytes_recv / bytes_sent, errors (rejected requests), and wall-clock times t_first_push, t_last_push,
  t_done for timelines. Replies to pulls that arrive after the update count toward the next step, and
  requests rejected before init toward the first step. A server that exits with rejections not yet in
  a record writes one more, ``"partial": true``, for the step it was at (a step never completed).
  pushes       gradients (one worker's request) taken since the previous record
  staleness    {value: count} over those pushes, staleness_max its largest value (clock units: how many
               of the slowest worker's steps the gradient's parameters lacked; <= k under SSP, 0 under BSP)
  delay        {value: count}, delay_max: updates of the keys applied between the read of the
               parameters and the gradient's own update (0 under BSP); see ``consistency``.
Under ASP/SSP a record's "step" is a round: it is written when the slowest worker completes a step, and
holds everything since the previous round (faster workers' pushes included); t_last_push is then the
push that completed the round.
"""
from __future__ import annotations

import json
import time


class StepMetrics:
    def __init__(self, server):
        self.server = server
        # open for the server's lifetime, closed by close()
        self.f = open(server.metrics_path, "w", buffering=1) if server.metrics_path else None  # noqa: SIM115
        self._reset()

    def _reset(self) -> None:
        s = self.server
        self.recv_s = self.send_s = 0.0
        self.t_first_push = self.t_last_push = None
        self._agg0, self._upd0 = s.store.aggregate_s, s.store.update_s
        self._sent0, self._recv0, self._err0 = s.bytes_sent, s.bytes_recv, s.errors

    def on_push(self, t: float) -> None:
        """An accepted push that arrived at ``t`` (``time.time()``)."""
        if self.t_first_push is None:
            self.t_first_push = t

    def on_last_push(self) -> None:
        self.t_last_push = time.time()

    def finish(self) -> None:
        """At exit: the rejections since the last record, if any, in a partial record."""
        if self.server.errors != self._err0:
            self.flush(max(self.server.store.version, 0), partial=True)

    def flush(self, step: int, partial: bool = False) -> None:
        s = self.server
        staleness, delay = s.store.take_staleness()
        if self.f is not None:
            first, last = self.t_first_push, self.t_last_push
            rec = {
                "step": step, "recv_s": self.recv_s, "aggregate_s": s.store.aggregate_s - self._agg0,
                "update_s": s.store.update_s - self._upd0, "send_s": self.send_s,
                "wait_slowest_s": (last - first) if first and last else 0.0,
                "bytes_recv": s.bytes_recv - self._recv0, "bytes_sent": s.bytes_sent - self._sent0,
                "errors": s.errors - self._err0, "t_first_push": first, "t_last_push": last, "t_done": time.time(),
            }
            rec.update(pushes=sum(staleness.values()),
                       staleness={str(k): v for k, v in sorted(staleness.items())},
                       staleness_max=max(staleness, default=0),
                       delay={str(k): v for k, v in sorted(delay.items())}, delay_max=max(delay, default=0))
            if partial:
                rec["partial"] = True
            self.f.write(json.dumps(rec) + "\n")
        self._reset()

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None
