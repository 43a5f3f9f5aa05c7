"""What the synchronizers would cut for a run, from their own planners, for ``psring simulate``: the model's
flat gradient layout, the reduce family's buckets (``--overlap none``) and the PS's chunks and window (the
overlap replay's partitions come from ``ReduceSync`` itself: ``overlapped.unit_ranges``)."""
from __future__ import annotations

from .. import costmodel as cm
from ..config import TrainConfig


def link_Bps(rate: str) -> float:
    """A link's payload rate, bytes/s: ``--link-rate`` at TCP's payload share (``costmodel.TCP_GOODPUT``)."""
    from .. import costmodel as cm

    return cm.Link.from_rate(rate, 0.0, cm.TCP_GOODPUT).bandwidth_Bps


def layout_of(cfg: TrainConfig):
    """The model's flat gradient layout (``buckets.flat_layout``), built on the meta device."""
    from ..sync.buckets import flat_layout
    from ..train.models import model_of, shapes_only

    with shapes_only():
        return flat_layout(model_of(cfg).named_parameters())


def bucket_numels(cfg: TrainConfig, layout) -> list[int]:
    """The reduce family's buckets with ``--overlap none`` (``param_ranges``, as ``ReduceSync`` cuts them)."""
    from ..sync.buckets import param_ranges
    from ..sync.reducer import UNTUNED_MB

    cap = int((cfg.bucket_mb or UNTUNED_MB) * 2**20)
    return [r.end - r.start for r in param_ranges(layout, cap, int(cfg.first_bucket_mb * 2**20))]


def ps_ranges(cfg: TrainConfig, layout, chunk_bytes: int | None = None):
    """The PS's chunk ranges and its window per server: what ``PSSync`` plans (``transport.chunk_ranges``,
    ``sharding.window_for``) on the links it is told, each host its own cores (no ``shared_cores``);
    ``chunk_bytes``: the chunk a run being replayed cut (its probe, its cores) instead of the fit."""
    from ..sync.buckets import space_sizes
    from ..sync.ps.sharding import drain_chunks, plan_chunks, window_for
    from ..sync.ps.transport import chunk_ranges
    from ..topology import server_shares

    links = cm.emulated_links_Bps("emulated", cfg.link_rate, cfg.server_link_rate, cfg.link_tuning)
    shares = server_shares(cfg.ps_placement, cfg.hosts, cfg.servers)
    if chunk_bytes:
        ranges = plan_chunks(*space_sizes(layout), cfg.servers, int(chunk_bytes), split=links is not None,
                             shares=shares)
    else:
        drain = drain_chunks(cfg.overlap, cfg.ps_credit_mb, links, cfg.workers, cfg.servers)
        ranges = chunk_ranges(layout, cfg.workers, cfg.servers, links, int(cfg.bucket_mb * 2**20), shares,
                              drain=drain)
    return ranges, window_for(cfg.ps_window, cfg.servers, links is not None, cfg.consistency, cfg.staleness)


def ps_plan(cfg: TrainConfig, layout) -> tuple[list[tuple[int, int]], int]:
    """The PS's chunks, (server, bytes) in chunk order, and its window per server (``ps_ranges``)."""
    ranges, window = ps_ranges(cfg, layout)
    return [(r.group, (r.end - r.start) * layout[0].dtype.itemsize) for r in ranges], window
