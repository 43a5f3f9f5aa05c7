"""``--overlap full``: step t+1's forward starts before step t's communication has finished.

``Synchronizer.step`` then only launches what backward did not; each module's forward pre-hook waits
for the buckets (all-reduce family) or chunks (PS) holding its own parameters, and for their update (a
per-bucket local optimizer step, or the PS's reply), so the first layers compute while the last ones'
parameters are still on the wire (P3, Jayarajan et al. SysML'19; ByteScheduler, Peng et al. SOSP'19).
What no forward waited for (a parameter unused this step) is finished by ``drain`` before the next
backward writes into the gradient buffers. Every parameter is updated exactly as after a full wait, so
training is the same bit for bit (tested against single-process training).

This module holds what both families share: the gates on the model (``install_gates``), the per-bucket
update units of the reduce family (``update_units``) and the clock of the time the trainer spent blocked
(``Waits``).
"""
from __future__ import annotations

import time

from torch import nn

from .buckets import Bucket


def install_gates(model: nn.Module, wait) -> list:
    """A forward pre-hook on every module that owns parameters needing gradients: ``wait(params)`` with
    them before the module runs. Returns the hooks' handles (``remove()`` each to take them off)."""
    handles = []
    for module in model.modules():
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if own:
            handles.append(module.register_forward_pre_hook(lambda _m, _args, own=own: wait(own)))
    return handles


def update_units(buckets: list[Bucket]) -> dict[int, list[nn.Parameter]]:
    """{bucket index: the parameters whose last bucket (in launch order) it is}: a parameter can be
    updated once every bucket covering it is reduced, so each bucket's unit is updated with, at the
    latest, that bucket. Buckets whose unit would be empty are left out."""
    last: dict[int, tuple[int, nn.Parameter]] = {}
    for b in buckets:
        for m in b.members:
            last[id(m.param)] = (b.index, m.param)
    units: dict[int, list[nn.Parameter]] = {}
    for index, p in last.values():
        units.setdefault(index, []).append(p)
    return units


def buckets_of(buckets: list[Bucket]) -> dict[int, list[int]]:
    """{id(parameter): the indices of the buckets covering it}."""
    out: dict[int, list[int]] = {}
    for b in buckets:
        for m in b.members:
            out.setdefault(id(m.param), []).append(b.index)
    return out


class Waits:
    """Seconds the trainer's thread spent blocked in gates and the updates run there, since last taken."""

    def __init__(self):
        self.gate_s = self.update_s = 0.0

    def gate(self, t0: float) -> None:
        self.gate_s += time.perf_counter() - t0

    def take(self) -> tuple[float, float]:
        out = (self.gate_s, self.update_s)
        self.gate_s = self.update_s = 0.0
        return out
