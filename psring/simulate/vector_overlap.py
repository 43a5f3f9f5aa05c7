"""``--overlap backward`` of the flat ring (``allreduce``, ``ring``; G workers a host) replayed with numpy, for
thousands of ranks: the units ``overlapped.OverlapReplay`` reduces (``unit_ranges``, ``ReduceSync``'s own
cut), each ready on a rank once backward made its last parameter's gradient (``overlapped.Plan``), reduced
one after another in index order on ``vector.VectorRing`` (each rank enters a unit once it is ready there and
done with the one before: ``UnitRing`` in ready order). A rank's step ends once its last unit is back, and
its next forward starts then. ``tests/test_simulate_vector_overlap.py`` holds it equal to the flow replay.

``hierarchical`` (G workers on each of H hosts) as ``vector.VectorHierarchy`` replays it: its in-host stages free,
its G cross-host rings one ring over the hosts on whole units, a host entering a unit once its last rank has it.

``--overlap full`` of the flat ring (the priority scheduler's decisions and the gated forward) is
``vector_full.full_records`` on the same ring and plan; hierarchical's ``full`` is not replayed, and the flow
replay has no hierarchical overlap.
"""
from __future__ import annotations

import numpy as np

from .. import costmodel as cm
from .. import strategies


def vector_overlap_of(cfg, alpha_s: float, tuned: dict | None = None, readiness: str = "bytes"):
    """``(ring, plan)`` for a run this replays (the flat ring's ``--overlap backward`` or ``full``, G a host;
    hierarchical's ``backward``: a ``VectorHierarchy`` over the hosts), else None.
    ``tuned``: the partition a run being replayed cut (``partition_bytes``), else the one its probe would;
    ``readiness``: when backward makes each gradient (``profile``)."""
    from ..sync.buckets import layout_bytes
    from .overlapped import Plan, partition_bytes, unit_ranges
    from .plans import layout_of, link_Bps
    from .profile import param_weights
    from .checks import burst_bytes
    from .vector import VectorHierarchy, VectorRing

    model = strategies.attr(cfg.sync, "cost_model")
    if cfg.overlap not in ("backward", "full") or cfg.workers < 2 or not strategies.attr(cfg.sync, "reducer") \
            or model not in (cm.RING_MODEL, cm.HIERARCHICAL_MODEL) \
            or cfg.overlap == "full" and model != cm.RING_MODEL:
        return None
    hosts = cfg.workers // cfg.per_host if model == cm.HIERARCHICAL_MODEL else cfg.workers
    layout = layout_of(cfg)
    m_bytes = layout_bytes(layout)
    cap = int((tuned or {}).get("partition_bytes") or partition_bytes(cfg, m_bytes, alpha_s))
    ranges = unit_ranges(cfg, layout, cap)
    ring = VectorRing(hosts, [r.end - r.start for r in ranges], layout[0].dtype.itemsize, link_Bps(cfg.link_rate),
                      alpha_s, burst_bytes(cfg.link_burst), per_host=1 if hosts < cfg.workers else cfg.per_host)
    plan = Plan(layout, ranges, param_weights(cfg, readiness))
    return (VectorHierarchy(hosts, cfg.per_host, ring) if hosts < cfg.workers else ring), plan


def overlap_records(cfg, compute: np.ndarray, ring, plan, update_s: float = 0.0) -> list[list[dict]]:
    """Every step of every worker: forward, then backward making the units ready as it goes, each reduced as
    soon as the ring gets to it; the records as ``OverlapReplay``'s (sync: from backward's end to the last
    unit back)."""
    from ..train.compute_spec import FORWARD_SHARE
    from .records import add_step

    share = np.asarray(plan.ready, dtype=np.float64)[:, None]
    records: list[list[dict]] = [[] for _ in range(cfg.workers)]
    t = np.zeros(cfg.workers)
    for step in range(cfg.steps):
        c = np.asarray(compute[step], dtype=np.float64)
        begin = t + update_s + c * FORWARD_SHARE  # backward starts (after the last step's update, then forward)
        end, sent = ring.units(begin[None, :] + c[None, :] * (1 - FORWARD_SHARE) * share)
        add_step(records, cfg, step, t, t + update_s + c, end, sent, update_s)
        t = end
    return records
