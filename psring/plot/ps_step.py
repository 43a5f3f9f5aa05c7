"""One PS step on one time axis: every worker's pushes to every server, the servers waiting for the
slowest worker and updating, and the replies coming back.

With ``--trace`` a PS worker's step records hold a message per chunk pushed (``push chunk C to server S``,
from the push's start until ZeroMQ took it) and per reply (``params of chunk C from server S``, from the
push's end until the reply was taken), offsets from the worker's sync start (``transport.parse_message``
reads the names back); each server's ``servers/serverI.jsonl`` gives the step's first and last push
arrival and the end of its update and replies (``t_first_push``, ``t_last_push``, ``t_done``), all one
host's wall clock. A push is drawn as a line from its worker, leaving when the push began, to its
server; a reply as a line from the server to the worker, ending when the worker took it. The servers
record neither when each chunk came in nor when its reply left, only the step's first and last push
in and ``t_done``: a push's line arrives at the earliest time the server's record allows (when ZeroMQ
took it, but not before the server's first push in nor after its last), a reply's line leaves at
``t_done``, or where the worker took it if that came earlier (chunks answered before the server's
last).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from ..bounds import bound_s
from ..costmodel import Link
from ..sync.ps.transport import parse_message
from .common import PS_COLORS, find_calibration, is_num, save_gif
from .timeline import SERVER_COLORS, run_info, run_title, server_records, step_records, sync_start

COLUMNS = ["rank", "kind", "chunk", "server", "bytes", "start", "end"]


@dataclass
class PSStep:
    """One step: ``msgs`` (one row per push or reply: ``rank, kind, chunk, server, bytes, start, end``,
    wall-clock s), ``servers`` (``server, t_first_push, t_last_push, t_done``; empty without records)
    and each worker's sync start."""
    run_dir: Path
    step: int
    workers: int
    msgs: pd.DataFrame
    servers: pd.DataFrame
    sync_starts: dict[int, float]

    def pushes(self) -> pd.DataFrame:
        return self.msgs[self.msgs["kind"] == "push"]

    def replies(self) -> pd.DataFrame:
        return self.msgs[self.msgs["kind"] == "reply"]

    def n_servers(self) -> int:
        return 1 + int(max(self.msgs["server"].max(), self.servers["server"].max() if len(self.servers) else 0))


def load_messages(run_dir: str | Path) -> tuple[pd.DataFrame, dict]:
    """Every PS push and reply of a run's step records (``COLUMNS`` and ``step``; wall-clock s) and
    ``{(step, rank): sync start}``."""
    rows, starts = [], {}
    for r in step_records(Path(run_dir)).to_dict("records"):
        if not isinstance(r.get("messages"), list):
            continue
        t0 = sync_start(r)
        for name, off, dur in r["messages"]:
            if (p := parse_message(name)) is not None and is_num(off) and is_num(dur):
                rows.append((int(r["step"]), int(r["rank"]), *p, t0 + off, t0 + off + dur))
                starts[(int(r["step"]), int(r["rank"]))] = t0
    return pd.DataFrame(rows, columns=["step", *COLUMNS]), starts


def pick_ps_step(run_dir: str | Path, step: int | None = None) -> PSStep | None:
    """``step`` (default: the first after warm-up with server records, else the last with messages) of a
    run; None when its records hold no PS messages."""
    run_dir = Path(run_dir)
    msgs, starts = load_messages(run_dir)
    if msgs.empty:
        return None
    info = run_info(run_dir)
    srv = server_records(run_dir)
    if not srv.empty:
        keep = [c for c in ("t_first_push", "t_last_push", "t_done") if c in srv]
        srv = srv[srv[keep].notna().all(axis=1)] if len(keep) == 3 else srv.iloc[:0]
    steps = sorted(msgs["step"].unique())
    with_srv = [s for s in steps if srv.empty or s in set(srv["step"])]
    if step is None:
        warm = int(info.get("warmup", 3))
        step = next((s for s in with_srv if s >= warm), with_srv[-1] if with_srv else steps[-1])
    here = msgs[msgs["step"] == step].drop(columns="step").reset_index(drop=True)
    if here.empty:
        raise ValueError(f"{run_dir}: no PS messages at step {step}")
    servers = (srv[srv["step"] == step][["server", "t_first_push", "t_last_push", "t_done"]].reset_index(drop=True)
               if not srv.empty else pd.DataFrame(columns=["server", "t_first_push", "t_last_push", "t_done"]))
    n = int(info.get("workers") or here["rank"].max() + 1)
    return PSStep(run_dir, int(step), n, here, servers, {r: t for (s, r), t in starts.items() if s == step})


def stages(ps: PSStep) -> list[tuple[str, float]]:
    """The animation's frames: (caption, time shown up to), in order."""
    out = [("pushes in flight", ps.pushes()["end"].max())]
    if len(ps.servers):
        out += [("every push in: the servers aggregate", ps.servers["t_last_push"].max()),
                ("updated: the servers reply", ps.servers["t_done"].max())]
    out.append(("replies in: every worker has its new parameters", ps.msgs["end"].max()))
    cut = -float("inf")
    return [(c, cut := max(cut, t)) for c, t in out]  # never back in time


def _rows(ps: PSStep) -> dict[str, float]:
    """y of each row: workers on top, servers below, a gap between."""
    s = ps.n_servers()
    return {**{f"worker {r}": s + 0.6 + ps.workers - 1 - r for r in range(ps.workers)},
            **{f"server {i}": s - 1 - i for i in range(s)}}


def _bar(bars: dict, y, a, b, cut, **kw) -> None:
    """A bar from ``a`` to ``b`` (up to ``cut``) on row ``y`` into ``bars`` (drawn at once by ``_draw_bars``)."""
    if a < cut:
        bars.setdefault((y, tuple(kw.items())), []).append((a, min(b, cut) - a))


def _draw_bars(ax, bars: dict) -> None:
    """One collection per row and style: a broken_barh per message re-scales the axes each time, quadratic in
    the thousands of chunks a step of an overlapped run sends."""
    for (y, kw), xranges in bars.items():
        ax.broken_barh(xranges, (y - 0.3, 0.6), **dict(kw))


def _line(lines: dict, x0, y0, x1, y1, cut, color, style: str = "-") -> None:
    """A message from (x0, y0) to (x1, y1) into ``lines`` (drawn at once by ``_draw_lines``): only the part
    up to ``cut``, with an arrowhead once it arrived."""
    if x0 > cut:
        return
    segs, heads = lines.setdefault((color, style), ([], []))
    if x1 <= cut:
        segs.append([(x0, y0), (x1, y1)])
        heads.append((x1, y1, "v" if y1 < y0 else "^"))
    elif x1 > x0:
        f = (cut - x0) / (x1 - x0)
        segs.append([(x0, y0), (cut, y0 + f * (y1 - y0))])


def _draw_lines(ax, lines: dict) -> None:
    """Every message line as one collection per colour and style (hundreds of single arrows are slow to draw)."""
    from matplotlib.collections import LineCollection

    for (color, style), (segs, heads) in lines.items():
        ax.add_collection(LineCollection(segs, colors=color, linewidths=0.9, linestyles=style))
        for marker in ("v", "^"):
            xy = [(x, y) for x, y, m in heads if m == marker]
            if xy:
                ax.scatter(*zip(*xy), marker=marker, color=color, s=14, zorder=3, linewidths=0)


def draw_ps_step(ax, ps: PSStep, cut: float | None = None, t0: float | None = None) -> None:
    """The step on ``ax``, ms from ``t0`` (default: the first push); only what happened by ``cut`` (s)."""
    t0 = ps.pushes()["start"].min() if t0 is None else t0
    cut = float("inf") if cut is None else (cut - t0) * 1e3
    y = _rows(ps)
    ms = ps.msgs.assign(start=(ps.msgs["start"] - t0) * 1e3, end=(ps.msgs["end"] - t0) * 1e3)
    srv = {int(s.server): [(v - t0) * 1e3 for v in (s.t_first_push, s.t_last_push, s.t_done)]
           for s in ps.servers.itertuples()}
    lines: dict = {}
    bars: dict = {}
    for m in ms.itertuples():
        color, yw, ys = PS_COLORS[m.server % len(PS_COLORS)], y[f"worker {m.rank}"], y[f"server {m.server}"]
        first, last, done = srv.get(m.server, (m.end, m.end, m.end))
        if m.kind == "push":  # in at the server between its first push in and its last
            _bar(bars, yw, m.start, m.end, cut, facecolors=color)
            _line(lines, m.start, yw - 0.3, min(max(m.end, first), last), ys + 0.3, cut, color)
        else:
            _bar(bars, yw, m.start, m.end, cut, facecolors=color, alpha=0.18)
            _line(lines, min(done, m.end), ys + 0.3, m.end, yw - 0.3, cut, color, "--")
    for s in ps.servers.itertuples():
        a, b, c = ((v - t0) * 1e3 for v in (s.t_first_push, s.t_last_push, s.t_done))
        _bar(bars, y[f"server {s.server}"], a, b, cut, facecolors=SERVER_COLORS["wait for slowest worker"],
             hatch="//", edgecolor="0.5")
        _bar(bars, y[f"server {s.server}"], b, c, cut, facecolors=SERVER_COLORS["update + reply"])
    _draw_bars(ax, bars)
    _draw_lines(ax, lines)
    for r, t in ps.sync_starts.items():
        if (x := (t - t0) * 1e3) <= cut:
            ax.plot([x], [y[f"worker {r}"] + 0.42], marker="v", color="black", markersize=5)
    ax.set_yticks(list(y.values()), list(y))
    ax.set_ylim(-0.7, max(y.values()) + 0.7)
    ax.set_xlim(min(0.0, (min(ps.sync_starts.values(), default=t0) - t0) * 1e3) - 0.2,
                max(ms["end"].max(), *(((ps.servers["t_done"] - t0) * 1e3).tolist() or [0])) * 1.03)
    ax.set_xlabel("wall-clock time from the step's first push (ms)")
    ax.grid(axis="x", alpha=0.3)


def _legend(ax, ps: PSStep, bound: float | None) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    h = [Patch(color=PS_COLORS[i % len(PS_COLORS)], label=f"push to server {i} (bar: until sent)")
         for i in range(ps.n_servers())]
    h += [Patch(color="0.5", alpha=0.25, label="worker waits for the chunk's reply"),
          Line2D([], [], color="0.3", linestyle="--", label="reply (leaves at the server's t_done, or when taken if earlier)"),
          Line2D([], [], color="black", marker="v", linestyle="none", label="worker's sync starts (backward done)"),
          Patch(facecolor=SERVER_COLORS["wait for slowest worker"], hatch="//", edgecolor="0.5",
                label="server: first push in → last (the slowest worker)"),
          Patch(color=SERVER_COLORS["update + reply"], label="server: aggregate, update, reply")]
    if bound:
        h.append(Line2D([], [], color="tab:red", linestyle=":", label=f"first push + α-β bound ({bound * 1e3:.2f} ms)"))
    ax.legend(handles=h, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def step_bound(ps: PSStep, link: Link | None) -> float | None:
    """``bounds.bound_s`` of the run's config (emulated links only), M = one worker's pushed bytes."""
    m = ps.pushes().groupby("rank")["bytes"].sum().max()
    b = bound_s(run_info(ps.run_dir), float(m), link.alpha_s if link else 0.0)
    return b if is_num(b) else None


def _ps_step(run_dir, step) -> PSStep:
    ps = pick_ps_step(run_dir, step)
    if ps is None:
        raise ValueError(f"{run_dir} has no PS push/reply messages in its step records (run with --trace)")
    return ps


def figure_ps_step(run_dir: str | Path, link: Link | None = None, step: int | None = None) -> Figure:
    """The step's pushes, the servers' work and the replies on one time axis (``link``: for the bound's
    alpha; default: the run folder's ``calibration.json``, if any)."""
    run_dir = Path(run_dir)
    ps = _ps_step(run_dir, step)
    fig = Figure(figsize=(11, 1.6 + 0.55 * (ps.workers + ps.n_servers())), layout="constrained")
    ax = fig.add_subplot()
    draw_ps_step(ax, ps)
    bound = step_bound(ps, link if link is not None else find_calibration(run_dir)[0])
    if bound:
        ax.axvline(bound * 1e3, color="tab:red", linestyle=":")
    _legend(ax, ps, bound)
    ax.set_title(f"One PS step, {run_title(run_dir, run_info(run_dir))}: step {ps.step}", fontsize=9)
    return fig


def animate_ps_step(run_dir: str | Path, out_dir: Path, stem: str, step: int | None = None,
                    dpi: int = 60) -> Path:
    """``out_dir/stem.gif``: a frame per stage of ``stages`` (pushes in flight, aggregated, replied)."""
    ps = _ps_step(Path(run_dir), step)
    frames = stages(ps)
    fig = Figure(figsize=(7, 1.4 + 0.5 * (ps.workers + ps.n_servers())), layout="constrained")
    ax = fig.add_subplot()
    t0 = ps.pushes()["start"].min()

    def frame(i: int) -> None:
        ax.clear()
        caption, cut = frames[i]
        draw_ps_step(ax, ps, cut, t0)
        ax.axvline((cut - t0) * 1e3, color="black", linewidth=0.8)
        ax.set_title(f"step {ps.step}, {i + 1}/{len(frames)}: {caption} ({(cut - t0) * 1e3:.1f} ms)", fontsize=9)

    return save_gif(fig, frame, len(frames), out_dir, stem, fps=1.0, dpi=dpi)
