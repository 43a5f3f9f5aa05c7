"""``--compress powersgd:RANK`` for the all-reduce family: PowerSGD (Vogels, Karimireddy and Jaggi,
NeurIPS 2019) as a ``Reducer`` that wraps any other one, so the hand-written ring runs it as well as
torch's all-reduce. ``ddp`` uses torch's own ``powerSGD_hook``; this is the same algorithm on psring's
buckets, where a DDP comm hook cannot reach (a hook is handed torch's C++ ``GradBucket`` and calls
torch's own all-reduce).

Per bucket, each parameter of two or more dimensions is a matrix M (n x m: its first dimension by the
rest) that is sent as two thin ones where that halves it at least (2r(n + m) < nm, torch's rule):

    M = G + E                   the gradient plus the error this worker's earlier approximations left (EF)
    P = M Q        (n x r)      Q (m x r) warm-started from the last step, the same on every worker
    P = sum over workers        the first reduction (the inner reducer, on a shadow bucket of all Ps;
                                 vectors and small matrices travel in it uncompressed)
    P = orthonormal(P)          QR, identical on every worker
    Q = M^T P      (m x r)
    Q = sum over workers        the second reduction
    sum of M ~ P Q^T            written into the bucket: the sum ReduceSync's optimizer divides by N
    E = M - P Q^T / N           what this worker's share of the approximation missed, sent later

The first reduction is launched with the bucket (from backward); the second when its handle is waited
for. Bytes per bucket: the inner reducer's for the two shadows, r(n + m) elements per matrix instead of
nm. State (every rank's error, the shared Qs) is in ``state_dict``, so a checkpointed run resumes exactly.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ..compress.spec import powersgd_rank
from .buckets import Bucket
from .compressed import Wrapped
from .process_group import ProcessGroupInfo
from .reducer import Handle, Reducer

STATE_KEY = "powersgd"


@dataclasses.dataclass
class _Plan:
    """One bucket's matrices (offset in the bucket, n, m, offset of P in the P shadow, of Q in the Q
    shadow) and its uncompressed elements ((offset, numel) in the bucket, offset in the P shadow)."""
    matrices: list[tuple[int, int, int, int, int]]
    plain: list[tuple[int, int, int]]
    p: Bucket
    q: Bucket


class _Handle(Handle):
    def __init__(self, reducer: PowerSGDReducer, bucket: Bucket, first: Handle):
        self.reducer, self.bucket, self.first = reducer, bucket, first

    def wait(self) -> None:
        self.first.wait()
        self.reducer._finish(self.bucket)


class PowerSGDReducer(Wrapped):
    """``inner`` (a reducer of the all-reduce family) with rank-``r`` PowerSGD on every bucket."""

    def __init__(self, inner: Reducer, pg: ProcessGroupInfo, spec: str, error_feedback: bool = True):
        super().__init__(inner, pg)
        self.spec, self.r, self.error_feedback = spec, powersgd_rank(spec), error_feedback
        self.plans: dict[int, _Plan] = {}
        self.qs: dict[int, list[torch.Tensor]] = {}  # per bucket, per matrix: Q (m x r), warm start
        self.errors: dict[int, torch.Tensor] = {}  # per bucket: E (the bucket's shape)
        self.m: dict[int, torch.Tensor] = {}  # per bucket: M = G + E of the step in flight

    def attach(self, model: nn.Module, buckets: list[Bucket]) -> None:
        super().attach(model, buckets)
        for b in buckets:
            self.plans[b.index] = self._plan(b)
            gen = torch.Generator().manual_seed(1_000_003 * b.index + 7)  # the same Q on every rank
            self.qs[b.index] = [torch.randn(m, self.r, generator=gen).to(b.flat.device)
                                for _, _, m, _, _ in self.plans[b.index].matrices]
            self.errors[b.index] = torch.zeros_like(b.flat)
        if self.resume is not None and STATE_KEY in self.resume[0]:
            self._load(self.resume[0][STATE_KEY])

    def _plan(self, b: Bucket) -> _Plan:
        matrices, plain, p_at, q_at = [], [], 0, 0
        for mem in b.members:
            numel = mem.hi - mem.lo
            shape = mem.param.shape
            n = shape[0] if len(shape) >= 2 else 0
            m = numel // n if n else 0
            if n and mem.whole and 2 * self.r * (n + m) < n * m:  # torch's min_compression_rate 2
                matrices.append((mem.at, n, m, p_at, q_at))
                p_at, q_at = p_at + n * self.r, q_at + m * self.r
            else:
                plain.append((mem.at, numel, p_at))
                p_at += numel
        shadow = lambda numel: dataclasses.replace(b, flat=torch.zeros(numel, dtype=b.flat.dtype,  # noqa: E731
                                                                       device=b.flat.device))
        return _Plan(matrices, plain, shadow(p_at), shadow(q_at))

    def launch(self, bucket: Bucket) -> Handle:
        plan, flat = self.plans[bucket.index], bucket.flat
        m = flat + self.errors[bucket.index] if self.error_feedback else flat  # (flat is rewritten last)
        self.m[bucket.index] = m
        p = plan.p.flat
        for (at, n, cols, p_at, _), q in zip(plan.matrices, self.qs[bucket.index]):
            torch.matmul(m[at:at + n * cols].view(n, cols), q, out=p[p_at:p_at + n * self.r].view(n, self.r))
        for at, numel, p_at in plan.plain:
            p[p_at:p_at + numel].copy_(flat[at:at + numel])
        return _Handle(self, bucket, self.inner.launch(plan.p))

    def _finish(self, bucket: Bucket) -> None:
        """The first reduction is done: orthonormalise P, reduce Q, write the approximation of the sum."""
        plan, flat, m = self.plans[bucket.index], bucket.flat, self.m.pop(bucket.index)
        p, q = plan.p.flat, plan.q.flat
        ps = []
        for at, n, cols, p_at, q_at in plan.matrices:
            pm = torch.linalg.qr(p[p_at:p_at + n * self.r].view(n, self.r)).Q
            ps.append(pm)
            torch.matmul(m[at:at + n * cols].view(n, cols).t(), pm, out=q[q_at:q_at + cols * self.r].view(cols, self.r))
        if plan.matrices:
            self.inner.launch(plan.q).wait()
        for (at, n, cols, _, q_at), pm, i in zip(plan.matrices, ps, range(len(ps))):
            qm = q[q_at:q_at + cols * self.r].view(cols, self.r)
            torch.matmul(pm, qm.t(), out=flat[at:at + n * cols].view(n, cols))
            self.qs[bucket.index][i] = qm.clone()  # the next step's warm start
        for at, numel, p_at in plan.plain:
            flat[at:at + numel].copy_(p[p_at:p_at + numel])
        if self.error_feedback:
            err = self.errors[bucket.index]
            torch.sub(m, flat, alpha=1.0 / self.world, out=err)  # M - (sum approximation) / N
            for at, numel, _ in plan.plain:  # sent exactly: nothing left over
                err[at:at + numel].zero_()

    def wire_bytes(self, bucket: Bucket) -> tuple[int, int]:
        plan = self.plans[bucket.index]
        s1, r1 = self.inner.wire_bytes(plan.p)
        s2, r2 = self.inner.wire_bytes(plan.q) if plan.matrices else (0, 0)
        return s1 + s2, r1 + r2

    def state_dict(self) -> dict:
        """Every rank's error (gathered: a collective, every rank calls it at the same step) and the Qs."""
        errors = {index: self.gather(e) for index, e in sorted(self.errors.items())}
        qs = {index: [q.cpu().clone() for q in qq] for index, qq in self.qs.items()}
        return {**self.inner.state_dict(), STATE_KEY: {"codec": self.spec, "errors": errors, "qs": qs}}

    def _load(self, saved: dict) -> None:
        if saved["codec"] != self.spec:
            raise ValueError(f"the checkpoint was written with --compress {saved['codec']}, this run has "
                             f"--compress {self.spec}")
        for index, e in saved["errors"].items():
            self.errors[int(index)] = e[self.rank].to(self.device).clone()
        for index, qq in saved["qs"].items():
            self.qs[int(index)] = [q.to(self.device).clone() for q in qq]
