"""The hand-written ring, round by round: one bucket of one step replayed from its recorded transfers.

With ``--trace`` each worker's step records hold its ring rounds as trace messages (``ring.Transfer``;
``Transfer.from_message`` reads them back). Replaying them (who sent which chunk to whom, in which
round) gives what every worker holds after every round: during reduce-scatter how many workers'
gradients each of its partial sums holds (1 up to N), during all-gather the finished sums spreading;
at the end every worker holds every chunk summed over all N. Nothing here re-derives the schedule
(``ring.schedule``): a transfer that went wrong shows as a wrong grid.

Each round's measured time is set beside the α-β model's ``alpha + (M/N)/B`` per round (a 2(N-1)-th of
``costmodel.ring_allreduce``), M the bucket's bytes. Measured: from the earliest start to the latest
end of the round over the workers (wall clock, each worker's offsets from its own sync start), and the
median of the workers' own durations of it. Where other buckets' rounds ran at the same time (the ring's
two lanes under ``--overlap backward`` and ``full``) the links were shared, and the figure says how many.
"""
from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ..costmodel import TCP_GOODPUT, Link, ring_allreduce
from ..sync.ring import REDUCE_SCATTER, Transfer
from .common import find_calibration, save_gif
from .timeline import run_info, run_title, step_records, sync_start

PHASE_ARROW = {REDUCE_SCATTER: "tab:orange"}  # all-gather: ARROW
ARROW = "tab:blue"
CMAP = colormaps["Greens"]


@dataclass
class RingStep:
    """One bucket of one step: every worker's rounds of it, ``start``/``end`` in wall-clock s."""
    run_dir: Path
    step: int
    bucket: int
    workers: int
    transfers: list[Transfer]
    beside: int = 0  # other buckets whose rounds overlapped this one's on some worker (the ring's lanes)

    @property
    def bucket_bytes(self) -> int:
        """M: the bucket's chunks' bytes (each chunk passes in reduce-scatter), to the names' 100 B."""
        sizes: dict[int, int] = {}
        for t in self.transfers:
            sizes[t.chunk] = max(sizes.get(t.chunk, 0), t.bytes)
        return sum(sizes.values())

    def rounds(self) -> list[tuple[str, int, list[Transfer]]]:
        """(phase, step, its transfers) in order: reduce-scatter's N - 1 rounds, then all-gather's."""
        keys = sorted({(t.phase, t.step) for t in self.transfers}, key=lambda k: (k[0] != REDUCE_SCATTER, k[1]))
        return [(ph, k, sorted((t for t in self.transfers if (t.phase, t.step) == (ph, k)), key=lambda t: t.src))
                for ph, k in keys]


def load_transfers(run_dir: str | Path) -> list[tuple[int, Transfer]]:
    """(step, transfer) of every ring message in a run's step records, times made wall-clock s."""
    out = []
    for r in step_records(Path(run_dir)).to_dict("records"):
        msgs = r.get("messages")
        if not isinstance(msgs, list):
            continue
        t0 = sync_start(r)
        for m in msgs:
            if (t := Transfer.from_message(m)) is not None:
                out.append((int(r["step"]), dataclasses.replace(t, start=t0 + t.start, end=t0 + t.end)))
    return out


def has_transfers(run_dir: str | Path) -> bool:
    return bool(load_transfers(run_dir))


def pick_ring_step(run_dir: str | Path, step: int | None = None, bucket: int | None = None) -> RingStep | None:
    """``step`` (default: the first after warm-up, else the last) and ``bucket`` (default: the largest)
    of a run; None when its records hold no ring transfers."""
    run_dir = Path(run_dir)
    found = load_transfers(run_dir)
    if not found:
        return None
    info = run_info(run_dir)
    steps = sorted({s for s, _ in found})
    if step is None:
        step = next((s for s in steps if s >= int(info.get("warmup", 3))), steps[-1])
    here = [t for s, t in found if s == step]
    if not here:
        raise ValueError(f"{run_dir}: no ring transfers at step {step} (steps {steps[0]}-{steps[-1]})")
    n = int(info.get("workers") or 1 + max(max(t.src, t.dst) for t in here))
    if bucket is None:
        sizes = {b: RingStep(run_dir, step, b, n, [t for t in here if t.bucket == b]).bucket_bytes
                 for b in sorted({t.bucket for t in here})}
        bucket = max(sizes, key=lambda b: (sizes[b], -b))
    mine = [t for t in here if t.bucket == bucket]
    span = {w: (min(t.start for t in mine if t.src == w), max(t.end for t in mine if t.src == w))
            for w in {t.src for t in mine}}  # on each worker's own clock: one lane's buckets never overlap there
    beside = len({t.bucket for t in here if t.bucket != bucket and t.src in span
                  and t.start < span[t.src][1] and t.end > span[t.src][0]})
    return RingStep(run_dir, step, bucket, n, mine, beside)


def replay(rounds: list[tuple[str, int, list[Transfer]]], n: int) -> list[list[list[frozenset]]]:
    """What every worker holds after each round: ``held[w][c]``, the workers whose gradients worker w's
    copy of chunk c sums. A round's transfers all read the state before it (they run at once): in
    reduce-scatter the receiver adds the sender's partial sum to its own, in all-gather it takes it."""
    held = [[frozenset([w]) for _ in range(n)] for w in range(n)]
    states = []
    for phase, _, transfers in rounds:
        before = [row[:] for row in held]
        for t in transfers:
            got = before[t.src][t.chunk]
            held[t.dst][t.chunk] = before[t.dst][t.chunk] | got if phase == REDUCE_SCATTER else got
        states.append([row[:] for row in held])
    return states


def ring_link(info: dict, link: Link | None) -> Link | None:
    """The link of the model: on an emulated network its rate at TCP's payload share with ``link``'s
    alpha (0 without one), as ``bounds.bound_s`` takes it; else the calibration ``link`` (or None)."""
    rate = info.get("link_rate")
    if info.get("net") == "emulated" and isinstance(rate, str) and rate:
        return Link.from_rate(rate, link.alpha_s if link else 0.0, TCP_GOODPUT)
    return link


def round_times(rs: RingStep, link: Link | None) -> pd.DataFrame:
    """Per round: ``phase, step, span_s`` (earliest start to latest end over the workers), ``median_s``
    (median of the workers' durations) and ``model_s`` (alpha + (M/N)/B; NaN without a link)."""
    n, m = rs.workers, rs.bucket_bytes
    model = ring_allreduce(n, m, link) / (2 * (n - 1)) if link and n > 1 else float("nan")
    rows = [(ph, k, max(t.end for t in ts) - min(t.start for t in ts),
             statistics.median(t.end - t.start for t in ts), model) for ph, k, ts in rs.rounds()]
    return pd.DataFrame(rows, columns=["phase", "step", "span_s", "median_s", "model_s"])


def draw_round(ax, held: list[list[frozenset]], phase: str, k: int, transfers: list[Transfer], n: int,
               title: str | None = None):
    """Worker x chunk grid after a round (colour and number: the workers summed in that copy) with an
    arrow per chunk sent, from its sender's cell to its receiver's; returns the image."""
    counts = np.array([[len(c) for c in row] for row in held])
    cmap = ListedColormap(CMAP(np.linspace(0.15, 1.0, n)))  # a shade per count 1..N
    im = ax.imshow(counts, cmap=cmap, vmin=0.5, vmax=n + 0.5, aspect="equal")
    for w in range(n):
        for c in range(n):
            full = counts[w, c] == n
            ax.text(c, w, "Σ" if full else str(counts[w, c]), ha="center", va="center", fontsize=8,
                    color="white" if counts[w, c] > 0.6 * n else "black", fontweight="bold" if full else None)
    color = PHASE_ARROW.get(phase, ARROW)
    for t in transfers:
        ax.add_patch(Rectangle((t.chunk - 0.5, t.src - 0.5), 1, 1, fill=False, edgecolor=color, linewidth=1.6))
        wrap = abs(t.dst - t.src) > 1
        ax.annotate("", xy=(t.chunk + 0.25, t.dst), xytext=(t.chunk + 0.25, t.src),
                    arrowprops=dict(arrowstyle="-|>", color=color, linewidth=1.2, shrinkA=2, shrinkB=2,
                                    connectionstyle=f"arc3,rad={-0.5 if wrap else -0.3}"))
    ax.set_xticks(range(n), [str(c) for c in range(n)], fontsize=7)
    ax.set_yticks(range(n), [f"w{w}" for w in range(n)], fontsize=7)
    ax.set_xlabel("chunk", fontsize=7)
    ax.set_title(title or f"{phase} {k}", fontsize=8)
    return im


def draw_round_times(ax, table: pd.DataFrame, m_bytes: int, n: int, beside: int = 0) -> None:
    """``beside``: other buckets whose rounds ran at the same time (the ring's lanes), sharing the links."""
    x = np.arange(len(table))
    ax.bar(x, table["span_s"] * 1e3, color="0.75", label="measured: earliest start to latest end over the workers")
    ax.plot(x, table["median_s"] * 1e3, "o", color="black", markerfacecolor="none", markersize=8, zorder=4,
            label="measured: median of the workers' durations")
    if table["model_s"].notna().any():
        ax.plot(x, table["model_s"] * 1e3, "D--", color="tab:red", markersize=4,
                label=f"model: α + (M/N)/B per round, M = {m_bytes / 1e3:.1f} kB" +
                (f", the bucket alone on the links ({beside} other bucket{'s' * (beside > 1)} beside it here)"
                 if beside else ""))
    else:
        ax.plot([], [], " ", label="no model: no calibration.json and no emulated link")
    ax.set_xticks(x, [f"{'RS' if ph == REDUCE_SCATTER else 'AG'} {k}" for ph, k in zip(table["phase"], table["step"])],
                  fontsize=7)
    ax.set_ylabel("ms per round")
    ax.set_xlabel(f"round (RS: reduce-scatter, AG: all-gather; {2 * (n - 1)} in all)")
    ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0, 1.0), ncols=3 if n > 4 else 1, frameon=False)
    ax.grid(axis="y", alpha=0.3)


def _link_of(run_dir: Path, link: Link | None) -> Link | None:
    return ring_link(run_info(run_dir), link if link is not None else find_calibration(run_dir)[0])


def _ring_step(run_dir, step, bucket) -> RingStep:
    rs = pick_ring_step(run_dir, step, bucket)
    if rs is None:
        raise ValueError(f"{run_dir} has no ring transfers in its step records (run with --trace)")
    return rs


def figure_ring_steps(run_dir: str | Path, link: Link | None = None, step: int | None = None,
                      bucket: int | None = None) -> Figure:
    """A panel per round (reduce-scatter above, all-gather below) and the rounds' times beside the model.
    ``link``: the calibration (default: the run folder's ``calibration.json``, if any)."""
    run_dir = Path(run_dir)
    rs = _ring_step(run_dir, step, bucket)
    n, rounds = rs.workers, rs.rounds()
    cols = max(n - 1, 1)
    fig = Figure(figsize=(max(2.2 * cols + 1.2, 6.5), 8.0), layout="constrained")
    gs = fig.add_gridspec(3, cols, height_ratios=[1, 1, 1.1])
    grid_axes = []
    for i, ((phase, k, ts), held) in enumerate(zip(rounds, replay(rounds, n))):
        ax = fig.add_subplot(gs[0 if phase == REDUCE_SCATTER else 1, min(k, cols - 1)])
        im = draw_round(ax, held, phase, k, ts, n, f"round {i + 1}: {phase} {k}")
        grid_axes.append(ax)
    if grid_axes:
        fig.colorbar(im, ax=grid_axes, shrink=0.8, ticks=range(1, n + 1),
                     label="workers' gradients in the copy (Σ: all N)")
    draw_round_times(fig.add_subplot(gs[2, :]), round_times(rs, _link_of(run_dir, link)), rs.bucket_bytes, n,
                     rs.beside)
    fig.suptitle(f"Ring all-reduce, {run_title(run_dir, run_info(run_dir))}\nstep {rs.step}, bucket {rs.bucket} "
                 f"({rs.bucket_bytes / 1e3:.1f} kB), replayed from the recorded transfers: what each worker holds "
                 "after each round;\nframed and arrowed: the chunk each worker sent to its right neighbour",
                 fontsize=9)
    return fig


def animate_ring_steps(run_dir: str | Path, out_dir: Path, stem: str, link: Link | None = None,
                       step: int | None = None, bucket: int | None = None, dpi: int = 80) -> Path:
    """``out_dir/stem.gif``: one frame per round, the grid after it and its measured and model time."""
    run_dir = Path(run_dir)
    rs = _ring_step(run_dir, step, bucket)
    rounds = rs.rounds()
    states, times = replay(rounds, rs.workers), round_times(rs, _link_of(run_dir, link))
    fig = Figure(figsize=(4.2, 3.8), layout="constrained")
    ax = fig.add_subplot()

    def frame(i: int) -> None:
        ax.clear()
        phase, k, ts = rounds[i]
        row = times.iloc[i]
        model = f", model {row['model_s'] * 1e3:.2f} ms" if pd.notna(row["model_s"]) else ""
        draw_round(ax, states[i], phase, k, ts, rs.workers,
                   f"step {rs.step}, bucket {rs.bucket}: round {i + 1}/{len(rounds)}, {phase} {k}\n"
                   f"measured {row['span_s'] * 1e3:.2f} ms{model}")

    return save_gif(fig, frame, len(rounds), out_dir, stem, fps=1.0, dpi=dpi)
