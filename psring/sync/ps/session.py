"""What both PS designs do around the steps: initialise the servers, start every worker from their copy,
and checkpoint or resume the servers' shards.

Rank 0 initialises every server with its (seeded) initial weights, the optimizer settings, the design
and the consistency model; every worker then pulls the start version, so all start from the servers'
copy. Resuming, rank 0 inits every server with the model's parameters (loaded from the checkpoint),
the saved optimizer state cut into its chunks, and the version of the step to continue at. State is
kept by parameter name, so the number of servers (and the chunking) may differ from the checkpointed
run's. A worker's error-feedback residuals (``--compress`` with error feedback) are its own
(``feedback_state``, written per rank): one flat vector per parameter space, cut into whatever chunks the
resumed run has (``load_feedback``).
"""
from __future__ import annotations

import torch

from ...compress import parse
from ...compress.spec import NONE
from ..buckets import Bucket, Space
from .client import PSClient
from .consistency import Semantics
from .optimizers import optim_header
from .received import Received
from .sharding import credit_bytes, plan_link_Bps, plan_paced_by_acks
from .transport import ChunkTransport, chunk_key


def resume_point(resume: tuple[dict, int] | None, rank: int, aggregate: bool,
                 bsp: bool) -> tuple[int, dict[str, dict[str, torch.Tensor]]]:
    """(first step, {parameter: {kind: tensor}} of saved server optimizer state) from a synchronizer's
    ``resume``; (0, {}) for a fresh run. Only rank 0 gets the state: only it inits the servers."""
    if resume is None:
        return 0, {}
    state, step = resume
    if rank != 0:
        return step, {}
    if state.get("servers") is None and not aggregate:
        raise ValueError("the checkpoint holds no PS server state (state_dict()['servers']): cannot resume "
                         "the servers' optimizer")
    for srv in state.get("servers") or []:
        if bsp and srv["version"] != step:
            raise ValueError(f"the checkpoint's servers are at step {srv['version']}, not at {step}, "
                             f"the step to resume at")
    by_param: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in (state.get("opt_state") or {}).items():
        kind, _, param = name.partition("/")
        by_param.setdefault(param, {})[kind] = t
    return step, by_param


def _chunk_state(b: Bucket, by_param: dict[str, dict[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """A chunk's slice of the saved per-parameter optimizer state, named ``KIND/KEY`` as init takes it
    (Adam's ``step`` is per tensor: the chunk's first parameter's, the same for all of them)."""
    if not by_param:
        return []
    key, first = chunk_key(b), by_param[b.members[0].name]
    return [(f"{kind}/{key}", first[kind] if kind == "step" else
             torch.cat([m.in_param(by_param[m.name][kind].contiguous()) for m in b.members]))
            for kind in first]


def start(client: PSClient, rank: int, layout: list[Space], chunks: list[list[Bucket]], init: dict,
          version: int, opt_state: dict) -> list[list[Received]]:
    """Rank 0 inits every server (``init``: the header's optim and semantics fields); then every worker
    pulls ``version``. Returns per server the values of its chunks, in chunk order."""
    if rank == 0:
        values = [torch.cat([p.detach().reshape(-1).cpu() for _, p, _ in sp.members]) for sp in layout]
        reqs = [client.send(s, {"op": "init", **init, "version": version},
                            [(chunk_key(b), values[b.space][b.start:b.end]) for b in mine],
                            [kt for b in mine for kt in _chunk_state(b, opt_state)])
                for s, mine in enumerate(chunks)]
        for s, req in enumerate(reqs):
            client.recv(s, req)
        del values
    reqs = [client.send(s, {"op": "pull", "version": version}) for s in range(len(chunks))]
    out = []
    for s, req in enumerate(reqs):
        named = client.recv(s, req)[1]
        keys = [k for k, _ in named]
        if keys != [chunk_key(b) for b in chunks[s]]:
            raise RuntimeError(f"PS server {s} holds chunks {keys[:3]}..., expected "
                               f"{[chunk_key(b) for b in chunks[s]][:3]}... (another run's server?)")
        out.append([t for _, t in named])
    return out


def open_worker(layout: list[Space], buckets: list[Bucket], *, rank: int, device: torch.device, addrs: list[str],
                timeout_s: float, frame_bytes: int | None, curve: str | None, window: int, optim,
                semantics: Semantics, resume: tuple[dict, int] | None, compress: str = NONE,
                error_feedback: bool = True, resume_rank: dict | None = None, credit_mb: float | None = None,
                overlap: str = "backward", credit_chunks: int = 0, client: PSClient | None = None,
                links_Bps: tuple[float, float] | None = None,
                order: str = "planned") -> tuple[PSClient, ChunkTransport, object]:
    """Both designs' ``attach``: connect, init the servers (rank 0; with the codec pushes are encoded
    with), start every worker from their copy of the start version (a view of the reply where the servers
    run the optimizer, a copy where the local optimizer writes the parameters), and a transport at that
    step whose byte counts begin after it, and the channel it runs on (``channel``). ``resume_rank``: this
    rank's ``feedback_state`` of the checkpoint. ``credit_mb``, ``overlap``, ``credit_chunks`` (the default
    credits, ``sharding.credit_chunks``: 0 where the link is unknown or the servers' side is the narrow
    one): the priority scheduler's credits (``sharding.credit_bytes``; 0: none). ``client``: one already connected (the probe's).
    ``links_Bps``: the (worker, server) links told or probed, whose worker side plans the push order under
    credits where ``order`` (``--ps-order``) is ``planned`` (``transport.push_order``)."""
    aggregate = semantics.design == "aggregate"
    client = client or PSClient(addrs, rank, timeout_s, frame_bytes, curve)
    codec = None if compress == NONE else parse(compress, error_feedback)
    credit = credit_bytes(credit_mb, overlap, credit_chunks, max(b.nbytes for b in buckets))
    tr = ChunkTransport(client, buckets, len(addrs), device, window, codec, rank, credit,
                        plan_link_Bps(order, links_Bps, credit), timed_busy=plan_paced_by_acks(overlap))
    start_step, opt_state = resume_point(resume, rank, aggregate, semantics.consistency == "bsp")
    init = {"optim": optim_header(optim), **semantics.header(), "codec": compress}
    for mine, vals in zip(tr.chunks, start(client, rank, layout, tr.chunks, init, start_step, opt_state)):
        for b, t in zip(mine, vals):
            load_params(t, b, alias=not aggregate)
    tr.step = start_step
    for st in tr.states.values():  # a random codec draws from (seed, step): a resumed run draws the same
        st.steps = start_step
    if resume is not None and codec is not None and codec.error_feedback:
        load_feedback(tr, layout, resume_rank, compress, rank, start_step)
    tr.new_step()  # the init and the start pull are not step 0's bytes
    return client, tr, channel(tr, timeout_s)


def probed_links(addrs: list[str], rank: int, timeout_s: float, frame_bytes: int | None, curve: str | None,
                 links_Bps, tuning: str) -> tuple[PSClient | None, tuple[float, float] | None, dict]:
    """Where ``--link-tuning`` asks for it (``link_probe.wants_probe``), a client connected to the servers
    and the links the probe measured: the rate each worker's chunks see with every worker pushing (its
    servers' links included, so the server side is left unbounded); else (None, the told links, {})."""
    from ..link_probe import wants_probe

    if not wants_probe(tuning, links_Bps is not None):
        return None, links_Bps, {}
    from .probe import probe_servers

    client = PSClient(addrs, rank, timeout_s, frame_bytes, curve)
    try:
        probe = probe_servers(client)
    except BaseException:
        client.close()
        raise
    return client, (probe.rate_Bps, float("inf")), {"link_tuning": "probe", **probe.as_dict()}


def chunk_fit(buckets: list[Bucket], drain: float, shared_cores: int | None) -> dict:
    """What the run records of its chunks (``tuned.json``, then ``summary.json``): the largest chunk, and
    the drain and shared cores the fit weighed (``sharding.fitted_chunk_bytes``), so that ``bounds``
    fits the same chunk again."""
    return {"chunk_bytes": max(b.nbytes for b in buckets), "chunk_drain": drain, "chunk_cores": shared_cores or 0}


def channel(tr: ChunkTransport, timeout_s: float):
    """Where the worker's traffic runs: its own thread for the priority scheduler (credits), else the
    trainer's (``comm``)."""
    from .comm import LocalChannel, PSComm

    return PSComm(tr, timeout_s) if tr.credit else LocalChannel(tr)


def close_worker(chan, client: PSClient) -> None:
    """Stop the channel's thread (the sockets are this thread's again), say done, close the sockets."""
    try:
        chan.close()
    finally:
        say_done(client)


def feedback_state(tr: ChunkTransport, layout: list[Space], compress: str) -> dict:
    """This worker's error-feedback residuals, one float32 vector per parameter space ({} without them)."""
    if tr.codec is None or not tr.codec.error_feedback:
        return {}
    spaces = [torch.zeros(sp.numel, dtype=torch.float32) for sp in layout]
    for mine in tr.chunks:
        for b in mine:
            res = tr.states[b.index].residual
            if res is not None:
                spaces[b.space][b.start:b.end].copy_(res.detach().to("cpu", torch.float32).reshape(-1))
    return {"codec": compress, "residuals": spaces}


def load_feedback(tr: ChunkTransport, layout: list[Space], saved: dict | None, compress: str, rank: int,
                  step: int) -> None:
    if not saved:
        raise ValueError(f"resuming --compress {compress} with error feedback needs rank {rank}'s residuals "
                         f"after step {step - 1} (checkpoint/rank{rank}.pt beside checkpoint.pt), and there are none")
    if saved["codec"] != compress:
        raise ValueError(f"the checkpoint was written with --compress {saved['codec']}, this run has "
                         f"--compress {compress}")
    res = saved["residuals"]
    if [r.numel() for r in res] != [sp.numel for sp in layout]:
        raise ValueError("the checkpoint's residuals do not fit this model's parameters")
    for mine in tr.chunks:
        for b in mine:
            tr.states[b.index].residual = res[b.space][b.start:b.end].to(tr.device).clone()


def frame_bytes(frame_kb: int) -> int | None:
    """``--frame-kb`` as the client's largest frame: None for 0 (one frame per tensor)."""
    return frame_kb * 1024 if frame_kb > 0 else None


def check_addrs(addrs: list[str]) -> None:
    if not addrs:
        raise ValueError("--sync ps needs server addresses (--ps-addrs), or start it with `psring train`")


def servers_state(client: PSClient, layout: list[Space], buckets: list[Bucket]) -> dict:
    """Every server's shard state (the ``state`` op), put back together per parameter: ``{"servers":
    [per server: {"version", "clocks", "optim", "semantics"}], "opt_state": {"KIND/PARAMETER": tensor}}``."""
    reqs = [client.send(s, {"op": "state"}) for s in range(len(client.addrs))]
    servers, chunk_state = [], {}
    for s, req in enumerate(reqs):
        header, _ = client.recv(s, req)
        for name, t in header["opt_state"]:
            chunk_state[name] = t.owned()
        servers.append({"version": header["version"], "clocks": header["clocks"], "optim": header["optim"],
                        "semantics": {k: header[k] for k in ("design", "consistency", "staleness")}})
    kinds = sorted({name.partition("/")[0] for name in chunk_state})
    opt_state = {}
    for sp in layout:
        for pname, p, _ in sp.members:
            for kind in kinds:
                opt_state[f"{kind}/{pname}"] = torch.empty(() if kind == "step" else p.shape,
                                                           dtype=torch.float32 if kind == "step" else p.dtype)
    for b in buckets:
        for kind in kinds:
            t = chunk_state[f"{kind}/{chunk_key(b)}"]
            for m in b.members:
                dst = opt_state[f"{kind}/{m.name}"]
                if kind == "step":
                    dst.copy_(t)
                else:
                    m.in_param(dst).copy_(m.in_bucket(t.reshape(-1)))
    return {"servers": servers, "opt_state": opt_state}


def load_params(t: Received, b: Bucket, alias: bool) -> None:
    """A chunk's values into the parameters it covers. ``alias`` (CPU, server-optimizer): a parameter
    wholly in the chunk becomes a view of the received frame, kept alive by the tensor; nothing on such a
    worker writes parameters (the servers run the optimizer) and the next reply replaces the view.
    Parameters split over chunks, and frames not aligned to their element size (ZeroMQ packs small
    messages into a shared buffer), are copied."""
    t = t.tensor().view(-1)  # one frame: a view; several (a server started with --frame-kb): joined once
    alias = alias and t.device.type == "cpu" and b.flat.device.type == "cpu" and \
        t.data_ptr() % t.element_size() == 0
    with torch.no_grad():
        for m in b.members:
            src = m.in_bucket(t)
            if alias and m.whole:
                m.param.data = src.view(m.param.shape)
            else:
                m.in_param(m.param.data).copy_(src)


def say_done(client: PSClient) -> None:
    """Tell every server this worker is done (best effort, 5 s at most), then close the sockets."""
    client.set_timeout(min(client.timeout_ms / 1000, 5.0))
    try:
        reqs = [client.send(s, {"op": "done"}) for s in range(len(client.addrs))]
        for s, req in enumerate(reqs):
            client.recv(s, req)
    except Exception:  # noqa: BLE001, S110 - a server already gone is the launcher's to report, not ours
        pass
    finally:
        client.close()
