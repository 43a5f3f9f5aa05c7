"""Every run beside its own α-β bound: the physical limit of its strategy on its links.

A comparison of two designs means something only when each implementation is near its own bound
(nccl-tests reports busbw for the same reason); otherwise it compares implementations. For a row of a
sweep's ``runs.csv`` on emulated links:

* a strategy whose cost model (``strategies.Strategy.cost_model``) is the ring (``allreduce``, ``ddp``):
  ``2(N-1) alpha + 2(N-1)/N * M/B`` (``costmodel.ring_allreduce``);
* one whose model is the PS (``ps``): the pipelined PS, ``2 alpha + T (1 + 1/k)`` with
  ``T = max(M/B_w, N*M/(S*B_s))`` and k the chunks per server the run used (``costmodel.ps``;
  ``sharding.chunk_bytes`` fits them as the run did);
* any other model: its ``costmodel.STRATEGIES`` formula; a strategy without one (``none``): no bound.

With G workers per host (``workers_per_host``) the models take G (``per_host``): the host link is
what is shared; the PS's placement (``ps_placement``) picks dedicated, colocated or BytePS's mixed one.

B is the emulated rate at TCP's payload share (``costmodel.TCP_GOODPUT``), alpha a calibration's.

A whole step has a bound of its own in the run's ``--overlap`` mode (``step_bound_s``, from
``overlap_model.step_bound``): forward and backward from ``--compute emulated:MS`` (split as the
emulation splits it), the communication the sync bound above, readiness and per-layer forward time in
proportion to the model's parameters, as the emulation has them, and the workers' own optimizer update as
the run measured it (``update_s_p50``: the reduce family's; the PS's servers update, its workers' is 0).
Example::

    runs = with_bounds(pd.read_csv("results/bandwidth/runs.csv"), alpha_s=2e-4)
    runs[["sync", "workers", "servers", "sync_s_p50", "bound_s", "over_bound"]]
"""
from __future__ import annotations

import functools
import math

import pandas as pd

from . import costmodel as cm
from .overlap_model import BACKWARD, MODES, step_bound
from .strategies import attr, overlap_mode
from .sync.ps.sharding import chunk_bytes, chunks_per_server, shared_rounds
from .topology import dedicated_share, server_shares

PS_DEFAULT_CAP = 4 << 20  # --bucket-mb of the PS when a row does not say


def _rate(v) -> str | None:
    return v if isinstance(v, str) and v else None


def is_num(x) -> bool:
    try:
        return x is not None and not math.isnan(float(x))
    except (TypeError, ValueError):
        return False


def gradient_bytes(runs: pd.DataFrame) -> float | None:
    """M, the bytes of gradients each worker synchronizes, from a run table: rows of a strategy whose
    cost model is the ring report exactly 2(N-1)/N*M per step (derived), those of the PS model count M
    plus a few hundred bytes of headers."""
    if "bytes_sent_per_step" not in runs:
        return None
    model = runs["sync"].map(cost_model)
    ar = runs[(model == cm.RING_MODEL) & (runs["workers"] > 1) & runs["bytes_sent_per_step"].map(is_num)]
    ar = ar[ar["bytes_sent_per_step"] > 0]
    if not ar.empty:
        r = ar.iloc[0]
        return float(r["bytes_sent_per_step"]) * r["workers"] / (2 * (r["workers"] - 1))
    ps = runs[(model == cm.PS_MODEL) & runs["bytes_sent_per_step"].map(is_num)]
    return float(ps["bytes_sent_per_step"].min()) if not ps.empty else None


def cost_model(sync) -> str | None:
    """The ``costmodel.STRATEGIES`` key of a run table's ``sync`` value (None: none, or not a strategy)."""
    return attr(sync, "cost_model")


def ps_chunks_per_server(row, n: int, s: int, m_bytes: float) -> int:
    """k, the chunks per server a ps run with ``row``'s settings uses at N = n, S = s: its chunk size
    the chunk the run recorded where its links were fitted and (n, s) are its own, else as ``PSSync`` fits it
    (``sharding.chunk_bytes``, with the drain and the shared cores the run recorded), capped by ``bucket_mb``;
    with unequal shares (``--ps-placement mixed``), the rounds ``sharding.plan_shared`` cuts."""
    cap = int(float(row["bucket_mb"]) * 2**20) if is_num(row.get("bucket_mb")) else PS_DEFAULT_CAP
    links = cm.emulated_links_Bps(row.get("net"), row.get("link_rate"), row.get("server_link_rate"),
                                  row.get("link_tuning") if isinstance(row.get("link_tuning"), str) else "auto")
    drain = float(row["chunk_drain"]) if is_num(row.get("chunk_drain")) else 1.0  # (runs before it: 1)
    cores = int(row["chunk_cores"]) if is_num(row.get("chunk_cores")) and row["chunk_cores"] > 0 else None
    recorded, own = row.get("chunk_bytes"), is_num(row.get("workers")) and is_num(row.get("servers")) \
        and (int(row["workers"]), int(row["servers"])) == (n, s)
    if links is not None and own and is_num(recorded) and recorded > 0:
        size = int(recorded)  # the chunk the run cut (probed links, or a fit since retuned)
    else:
        size = chunk_bytes(int(m_bytes), n, s, links, cap, drain, cores)
    shares = server_shares(placement_of(row), n // per_host(row), s)
    return shared_rounds(int(m_bytes), shares, size) if shares else chunks_per_server(int(m_bytes), s, size)


def placement_of(row) -> str:
    p = row.get("ps_placement")
    return p if isinstance(p, str) and p else "dedicated"


def host_link_bytes(row, m_bytes: float) -> float:
    """What the model puts on a host's link per step, each way (the busiest host of a PS run): the
    figure the kernel's counters of that link are held to (local rank 0 counts a shared one)."""
    n, g = int(row["workers"]), per_host(row)
    h = n // g
    model = cost_model(row["sync"])
    if model == cm.HIERARCHICAL_MODEL:
        return 2 * (h - 1) / h * m_bytes
    if model != cm.PS_MODEL:
        return 2 * (n - 1) / n * m_bytes  # a flat ring, consecutive per host: one edge per host link
    x = dedicated_share(placement_of(row), h, int(row["servers"]))
    return g * m_bytes * (x + 2 * (1 - x) * (h - 1) / h)


def bound_s(row, m_bytes: float, alpha_s: float = 0.0) -> float:
    """The α-β bound of one sync step of this run (s); NaN where it has none (no emulated link, N = 1)."""
    n = int(row["workers"])
    if row.get("net") != "emulated" or not _rate(row.get("link_rate")) or n < 2:
        return math.nan
    w = cm.Link.from_rate(row["link_rate"], alpha_s, cm.TCP_GOODPUT)
    srv = _rate(row.get("server_link_rate"))
    s_link = cm.Link.from_rate(srv, alpha_s, cm.TCP_GOODPUT) if srv else w
    model = cost_model(row["sync"])
    if model is None:
        return math.nan
    g = per_host(row)
    if model != cm.PS_MODEL:
        return cm.STRATEGIES[model](n, m_bytes, w, server_link=s_link, per_host=g)
    s = int(row["servers"])
    return cm.STRATEGIES[cm.PS_MODEL](n, m_bytes, w, servers=s, server_link=s_link, per_host=g,
                                      chunks_per_server=ps_chunks_per_server(row, n, s, m_bytes),
                                      placement=placement_of(row))


def overlap_of(row) -> str:
    """A row's ``--overlap`` mode (tables written before the modes hold a bool, or nothing: backward)."""
    v = overlap_mode(row.get("overlap"))
    return v if v in MODES else BACKWARD


@functools.lru_cache(maxsize=None)
def param_bytes(model: str, num_classes: int = 10, image_size: int | None = None) -> tuple[int, ...]:
    """The bytes of each trainable parameter of ``model``, in forward (registration) order; shapes only
    (built on the meta device)."""
    from .train.models import build_model, shapes_only

    with shapes_only():
        m = build_model(model, 0, num_classes, image_size)
    return tuple(p.numel() * p.element_size() for p in m.parameters() if p.requires_grad)


def row_param_bytes(row) -> tuple[int, ...]:
    """``param_bytes`` of a run table's row (tables written before ``--num-classes``/``--image-size``: 10, default)."""
    classes = int(row["num_classes"]) if is_num(row.get("num_classes")) else 10
    size = int(row["image_size"]) if is_num(row.get("image_size")) else None
    return param_bytes(row["model"], classes, size)


def step_bound_s(row, m_bytes: float, alpha_s: float = 0.0) -> float:
    """The bound of a whole step in the row's overlap mode, given its emulated compute, its links and its
    workers' own update as the run measured it (``update_s_p50``; 0 for the PS, whose servers update);
    NaN without emulated compute or a sync bound."""
    from .train.compute_spec import FORWARD_SHARE, parse_compute

    comm = bound_s(row, m_bytes, alpha_s)
    spec = row.get("compute")
    ms = parse_compute(spec) if isinstance(spec, str) and spec else None
    if not ms or not is_num(comm) or not isinstance(row.get("model"), str):
        return math.nan
    compute_s, update = ms / 1000, row.get("update_s_p50")
    return step_bound(overlap_of(row), list(row_param_bytes(row)), compute_s * FORWARD_SHARE,
                      compute_s * (1 - FORWARD_SHARE), comm, update_s=float(update) if is_num(update) else 0.0)


def per_host(row) -> int:
    """G of an emulated run's row (``workers_per_host``, 0 or absent: one worker per host)."""
    g = row.get("workers_per_host")
    return int(g) if is_num(g) and int(g) > 0 else 1


def with_bounds(runs: pd.DataFrame, alpha_s: float = 0.0, m_bytes: float | None = None) -> pd.DataFrame:
    """``runs`` with ``bound_s`` (the α-β bound of its sync step), ``over_bound`` (median sync time /
    bound), ``step_bound_s`` and ``step_over_bound`` (the whole step's bound in its overlap mode, and the
    median step time over it), ``cpu_at_bound`` (``cpu_util`` x step time / ``step_bound_s``: the share of
    all cores the step's measured CPU would need if it ran at its bound; near 1 or above, the machine's
    cores, not the schedule, keep it from the bound, even where a slowed run reads under ``cpu_saturated``'s
    0.90) and ``link_bound`` (a bound exists and the CPU was not saturated: a point claims may rest on).
    ``m_bytes``: M (default: ``gradient_bytes`` of the table, of each model's rows where it has several)."""
    df = runs.copy()
    m_of = _m_per_row(df, m_bytes)
    df["bound_s"] = [bound_s(r, m_of(r), alpha_s) for _, r in df.iterrows()]
    df["over_bound"] = df["sync_s_p50"] / df["bound_s"]
    saturated = df["cpu_saturated"].fillna(False).astype(bool) if "cpu_saturated" in df else False
    df["link_bound"] = df["bound_s"].notna() & ~saturated
    df["step_bound_s"] = [step_bound_s(r, m_of(r), alpha_s) for _, r in df.iterrows()]
    if "step_s_p50" in df:
        df["step_over_bound"] = df["step_s_p50"] / df["step_bound_s"]
        if "cpu_util" in df:  # the CPU a step took (cores, as a share of all) squeezed into its bound's time
            df["cpu_at_bound"] = df["cpu_util"] * df["step_s_p50"] / df["step_bound_s"]
    return df


def _m_per_row(df: pd.DataFrame, m_bytes: float | None):
    """``row -> M``: ``m_bytes`` if given; else the table's ``gradient_bytes``, taken over each model's own
    rows where the table ran several models (``results/models``: ResNet-18's 44.7 MB beside ViT's 343 MB)."""
    if m_bytes is not None:
        return lambda row: m_bytes
    if "model" not in df or df["model"].nunique() < 2:
        m = gradient_bytes(df) or math.nan
        return lambda row: m
    per_model = {k: gradient_bytes(g) or math.nan for k, g in df.groupby("model")}
    return lambda row: per_model.get(row.get("model"), math.nan)
