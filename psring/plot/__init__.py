"""``psring plot FOLDER``: regenerate every figure of a results folder from its committed data.

What is drawn depends on what the folder holds:

* a sweep's ``runs.csv`` -> ``speedup`` (measured, ideal and cost-model speedup and sync time vs N)
  and ``breakdown`` (median phase times per strategy and N), and for ps runs at one N with several S
  ``servers`` (sync time vs S beside its bound, the ring's beside); without ``runs.csv``, the
  ``summary.json`` files of its run folders give ``breakdown`` alone; with hosts of several workers
  (``workers_per_host`` > 1) ``topology`` (every arrangement's sync time beside its bound, and BytePS's
  colocated + k dedicated servers curve) instead of ``servers``; emulated runs at several N over one
  link rate, with and without servers (``psring compare`` as root) -> ``compare`` (sync time vs N beside
  the model); ``--overlap`` modes at several compute:comm (``experiments/overlap.toml``) -> ``overlap``
  (step time against compute:comm per mode, each beside its bound); several models
  (``experiments/models.toml``) -> ``models`` alone (each strategy's sync time per model beside its bound,
  and over each model's M/B);
  a simulated sweep over many N (``experiments/scale.toml``) -> ``scale`` and ``scale_jitter`` alone
  (``plot/scale.py``); one over BSP, SSP and ASP (``experiments/scale_consistency.toml``) -> ``consistency`` alone
  (``plot/consistency.py``: each worker at its own pace); one over ``--overlap`` modes
  (``experiments/scale_overlap.toml``) -> ``scale_overlap`` alone (``plot/scale_overlap.py``); one over codecs
  (``experiments/scale_codecs.toml``) -> ``scale_codecs`` alone (``plot/scale_codecs.py``); a replay beside
  the published result in the folder's ``published.csv`` (``experiments/published_horovod.toml``) ->
  ``published`` alone (``plot/published.py``);
* ``overlap_floor.csv`` (``benchmarks/overlap_floor.py``) -> ``overlap_floor`` (psring's overlapped PS step beside
  raw floors of the same schedule, each over its bound; ``plot/overlap_floor.py``); ``reduce_floor.csv``
  (``benchmarks/reduce_floor.py``) -> ``reduce_floor`` (the same for the reduce family, raw gloo floors);
* ``ps_cpu.csv`` (``benchmarks/ps_cpu.py``) -> ``ps_cpu`` (the PS's CPU a step per role and thread; ``plot/ps_cpu.py``);
* ``validation.csv`` (``python -m psring.simulate.validate``) -> ``validation`` (simulated against measured
  sync time of every replayed run);
* ``bench.csv`` (in the folder or a sub-folder) -> ``message_size`` (time, algbw, busbw vs size);
* run folders whose ``steps.jsonl`` has ``test_acc`` -> ``convergence`` (accuracy vs steps and wall time,
  staleness histograms);
* run folders (``steps.jsonl``, ``ranks/`` or ``trace.json``) -> ``timeline_<run>`` of the run with the
  most workers (and servers) of each strategy whose communication is timed apart (ps, all-reduce), with
  a tick per gradient bucket when it was ready where the records have ``ready`` (``--trace``);
* run folders run with ``--trace`` whose step records hold the hand-written ring's transfers ->
  ``ring_steps_<run>`` (one step's bucket, round by round: what each worker holds, what it sends, each
  round's time beside alpha + (M/N)/B) and its animation ``ring_steps_<run>.gif``; those of a strategy
  with servers whose records hold push/reply messages -> ``ps_step_<run>`` (one step's pushes, the
  servers' wait and update, the replies on one time axis) and ``ps_step_<run>.gif``; the run with the
  most workers (and servers) of each strategy, as for the timeline;
* traced ``--overlap full`` runs -> ``priority_<run>`` (one step of one worker: when each bucket or chunk
  was made, sent and back, by index: the priority order at work);
* every run folder with ``links.jsonl`` (``--net emulated``: the launcher's link samples) -> ``links_<run>``
  (a host x time heatmap of each direction's link utilisation over a few steps).

The cost model (alpha-beta, ``psring.costmodel``) needs the link's alpha and B: from
``--calibration FILE`` or ``FOLDER/calibration.json`` (``python -m psring.calibrate --out FOLDER``);
without one its curves are left out and the legend says so. Figures go to ``FOLDER/figures`` as PNG
and SVG (``--formats``), animations as GIF whatever the formats, written without dates so that the
same data give the same files.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..compress.spec import NONE
from ..strategies import OVERLAPS, names, uses_servers
from ..bounds import with_bounds
from .breakdown import figure_breakdown
from .compare import figure_compare, has_compare
from .links import figure_links, link_runs
from .common import FORMATS, find_calibration, run_folders, run_table, save, show
from .compression import figure_compression, figure_seed_spread, figure_time_to_accuracy, has_codecs, \
    has_seed_spread
from .convergence import accuracy_runs, figure_convergence
from .message_size import figure_message_size, load_bench
from .models import figure_models, has_models
from .consistency import figure_consistency, has_consistency
from .overlap import figure_overlap, has_overlap_grid
from .priority import figure_priority, pick_step
from .ps_step import animate_ps_step, figure_ps_step, pick_ps_step
from .ring_steps import animate_ring_steps, figure_ring_steps, has_transfers
from .servers import figure_servers, has_server_curve
from .speedup import figure_speedup, model_curve
from .timeline import figure_timeline, run_info, timeline_strategies
from .scale import figure_scale, figure_scale_jitter, has_scale, jitter_cost
from .overlap_floor import figure_overlap_floor, figure_reduce_floor, load_overlap_floor, load_reduce_floor
from .ps_cpu import figure_ps_cpu, load_ps_cpu
from .published import figure_published, load_published
from .scale_codecs import figure_scale_codecs, has_scale_codecs
from .scale_overlap import figure_scale_overlap, has_scale_overlap
from .validation import figure_validation, load_validation
from .topology import figure_topology, has_topology

FULL = OVERLAPS[2]

__all__ = ["animate_ps_step", "animate_ring_steps", "figure_breakdown", "figure_convergence",
           "figure_message_size", "figure_models", "figure_overlap", "figure_priority", "figure_ps_step", "figure_ring_steps", "figure_servers", "figure_speedup",
           "figure_timeline", "figure_topology", "main", "model_curve", "plot_results", "ps_step_runs",
           "ring_step_runs", "show", "timeline_runs"]


def _best_runs(folder: Path, keep) -> list[Path]:
    """A run per strategy (registry order) among those for which ``keep(run_dir, info)``: most workers,
    then most servers (first by name)."""
    best: dict[str, tuple] = {}
    for d in run_folders(folder):
        info = run_info(d)
        sync = info.get("sync")
        if not keep(d, info):
            continue
        key = (int(info.get("workers") or 0), int(info.get("servers") or 0) if uses_servers(sync) else 0)
        if sync not in best or key > best[sync][0]:
            best[sync] = (key, d)
    return [best[s][1] for s in names() if s in best]


def timeline_runs(folder: Path) -> list[Path]:
    """A run to draw per strategy of ``timeline.timeline_strategies``."""
    shown = timeline_strategies()
    return _best_runs(folder, lambda d, info: info.get("sync") in shown)


def ring_step_runs(folder: Path) -> list[Path]:
    """Traced runs (``--trace``) of a strategy without servers whose records hold ring transfers."""
    return _best_runs(folder, lambda d, info: bool(info.get("trace")) and not uses_servers(info.get("sync"))
                      and has_transfers(d))


def ps_step_runs(folder: Path) -> list[Path]:
    """Traced runs of a strategy with servers whose records hold push/reply messages and whose servers
    wrote their records."""
    return _best_runs(folder, lambda d, info: bool(info.get("trace")) and uses_servers(info.get("sync"))
                      and any((d / "servers").glob("server*.jsonl")) and pick_ps_step(d) is not None)


def priority_runs(folder: Path) -> list[Path]:
    """Traced ``--overlap full`` runs whose records hold readiness and messages, one per strategy."""
    return _best_runs(folder, lambda d, info: bool(info.get("trace")) and info.get("overlap") == FULL
                      and pick_step(d) is not None)


def _stem(prefix: str, folder: Path, sub: Path) -> str:
    rel = sub.relative_to(folder).as_posix()
    rel = rel.removeprefix("runs/")
    return prefix if rel in ("", ".") else f"{prefix}_{rel.replace('/', '-')}"


def _compare(runs: pd.DataFrame, out: Path, formats: tuple[str, ...]) -> list[Path]:
    """``compare`` for a table of ``psring compare``'s shape (sync time vs N beside the model), else nothing."""
    bounded = with_bounds(runs) if "sync_s_p50" in runs else runs
    if not has_compare(bounded):
        return []
    ok = bounded[bounded["status"] == "ok"] if "status" in bounded else bounded
    return save(figure_compare(ok), out, "compare", formats)


def _table_figures(runs: pd.DataFrame, link, note: str, out: Path, formats: tuple[str, ...]) -> list[Path]:
    """The figures of a run table (a sweep's runs.csv, or its run folders' summaries)."""
    written: list[Path] = []
    if has_scale_overlap(runs):  # replayed over N and --overlap modes (experiments/scale_overlap.toml)
        return save(figure_scale_overlap(runs), out, "scale_overlap", formats)
    if has_scale_codecs(runs):  # replayed over N and codecs (experiments/scale_codecs.toml)
        return save(figure_scale_codecs(runs), out, "scale_codecs", formats)
    if has_scale(runs):  # replayed from 8 to 1,024 workers (experiments/scale.toml)
        jittered = not jitter_cost(runs).query("rate_gbit == 25 and alpha_us == 20").empty
        return save(figure_scale(runs), out, "scale", formats) + \
            (save(figure_scale_jitter(runs), out, "scale_jitter", formats) if jittered else [])
    if has_consistency(runs):  # BSP/SSP/ASP (experiments/scale_consistency.toml): each worker at its own pace
        return save(figure_consistency(runs), out, "consistency", formats)
    if has_models(runs):  # several models (experiments/models.toml): each strategy per model beside its bound
        return save(figure_models(runs), out, "models", formats)
    if has_codecs(runs):  # a sweep over codecs: their sync time and bytes side by side
        written += save(figure_compression(runs), out, "compression", formats)
    elif "speedup" in runs and runs["speedup"].notna().any() and runs["workers"].nunique() > 1 and \
            not has_topology(runs) and \
            runs.get("compress", pd.Series(dtype=str)).fillna(NONE).nunique() <= 1:  # (codecs: a line each)
        written += save(figure_speedup(runs, link, calibration_note=note), out, "speedup", formats)
    if "step_s_p50" in runs:
        written += save(figure_breakdown(runs), out, "breakdown", formats)
    if has_overlap_grid(runs):  # --overlap modes at several compute:comm (experiments/overlap.toml)
        written += save(figure_overlap(runs), out, "overlap", formats)
    if has_server_curve(runs) and not has_topology(runs):
        written += save(figure_servers(runs, link), out, "servers", formats)
    if has_topology(runs):  # hosts of several workers: every arrangement beside its bound
        written += save(figure_topology(runs, link), out, "topology", formats)
    written += _compare(runs, out, formats)
    return written


def _benchmark_figures(folder: Path, out: Path, formats: tuple[str, ...]) -> list[Path]:
    """The figures of a benchmark's or a check's own table, where the folder holds one."""
    written = []
    for load, figure, stem in ((load_overlap_floor, figure_overlap_floor, "overlap_floor"),  # psring beside raw floors
                               (load_reduce_floor, figure_reduce_floor, "reduce_floor"),  # likewise, all-reduce
                               (load_ps_cpu, figure_ps_cpu, "ps_cpu"),  # the PS's CPU per thread
                               (load_validation, figure_validation, "validation")):  # psring simulate vs the runs
        table = load(folder)
        if table is not None:
            written += save(figure(table), out, stem, formats)
    return written


def plot_results(folder: str | Path, calibration: str | Path | None = None,
                 formats: tuple[str, ...] | list[str] = FORMATS, out: str | Path | None = None) -> list[Path]:
    """Write every figure that applies to ``folder`` into ``out`` (default ``folder/figures``); return
    the files written. Raises FileNotFoundError / ValueError on a missing folder or one without data."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a directory")
    out = Path(out) if out else folder / "figures"
    formats = tuple(formats)
    link, source = find_calibration(folder, calibration)
    note = (f"α = {link.alpha_s * 1e6:.0f} µs, B = {link.bandwidth_Bps / 1e9:.2f} GB/s ({Path(source).name})"
            if link else "")
    written: list[Path] = []

    runs, published = run_table(folder), load_published(folder)
    if runs is not None and not runs.empty and published is not None:  # a published result beside its replay
        written += save(figure_published(runs, published), out, "published", formats)
    elif runs is not None and not runs.empty:
        written += _table_figures(runs, link, note, out, formats)

    written += _benchmark_figures(folder, out, formats)
    benches = [p.parent for p in sorted([*folder.glob("bench.csv"), *folder.glob("*/bench.csv")])]
    for b in benches:
        written += save(figure_message_size(load_bench(b), link, calibration_note=note), out,
                        _stem("message_size", folder, b), formats)

    acc = accuracy_runs(folder)  # runs that measured held-out accuracy (e.g. experiments/convergence.toml)
    if acc:
        written += save(figure_convergence(folder, acc), out, "convergence", formats)
        if len({c.get("compress", NONE) for c, _, _ in acc}) > 1:  # experiments/compression.toml
            written += save(figure_time_to_accuracy(acc), out, "time_to_accuracy", formats)
        if has_seed_spread(acc):  # many seeds per setting (experiments/compression_precision.toml)
            written += save(figure_seed_spread(acc), out, "seed_spread", formats)

    for d in timeline_runs(folder):
        written += save(figure_timeline([d]), out, _stem("timeline", folder, d), formats)
    for d in ring_step_runs(folder):  # the ring round by round, and its animation
        stem = _stem("ring_steps", folder, d)
        written += save(figure_ring_steps(d, link), out, stem, formats)
        written.append(animate_ring_steps(d, out, stem, link))
    for d in ps_step_runs(folder):  # one PS step: pushes, the servers' work, replies
        stem = _stem("ps_step", folder, d)
        written += save(figure_ps_step(d, link), out, stem, formats)
        written.append(animate_ps_step(d, out, stem))
    for d in priority_runs(folder):  # one full-overlap step: each unit made, sent, back, by index
        written += save(figure_priority(d), out, _stem("priority", folder, d), formats)
    for d in link_runs(folder):  # every emulated run whose launcher sampled its links
        written += save(figure_links(d), out, _stem("links", folder, d), formats)

    if not written:
        raise ValueError(f"{folder} has nothing to plot: no runs.csv, validation.csv, bench.csv, overlap_floor.csv, reduce_floor.csv, ps_cpu.csv or run folders "
                         "(steps.jsonl)")
    return written


from ..plot_cli import main  # noqa: E402 - the command line, kept light (``psring/plot_cli.py``)


if __name__ == "__main__":
    raise SystemExit(main())
