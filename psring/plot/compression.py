"""Compression figures: what each codec does to sync time and bytes per strategy and N
(``experiments/compression_sync.toml``), and how soon each reaches a held-out accuracy
(``experiments/compression.toml``)."""
from __future__ import annotations

import pandas as pd

from ..compress.spec import NONE
from ..config import OptimConfig
from ..strategies import attr, is_baseline
from .common import HOLLOW_NOTE, new_figure, saturated, setting_key

CODEC_COLORS = {NONE: "black", "fp16": "tab:blue", "bf16": "tab:cyan", "topk": "tab:red",
                "randomk": "tab:orange", "onebit": "tab:green"}
STRATEGY_STYLES = ["-", "--", ":", "-."]  # per strategy, in the order they appear


def codec_color(spec: str) -> str:
    return CODEC_COLORS.get(str(spec).partition(":")[0], "tab:gray")


def has_codecs(runs: pd.DataFrame) -> bool:
    """A sweep over codecs and N: runs with two or more ``compress`` values at two or more N > 1."""
    if "compress" not in runs or "workers" not in runs:
        return False
    multi = runs[runs["workers"] > 1]
    return multi["compress"].fillna(NONE).nunique() >= 2 and multi["workers"].nunique() >= 2


def _rates(runs: pd.DataFrame) -> list:
    if "link_rate" not in runs:
        return [None]
    return sorted(runs["link_rate"].dropna().unique(), key=setting_key) or [None]


def figure_compression(runs: pd.DataFrame):
    """Per link rate: sync time (top) and bytes sent per worker and step (bottom) against N, one line per
    strategy (line style) and codec (colour); CPU-saturated runs hollow."""
    df = runs[(runs["workers"] > 1) & ~runs["sync"].map(is_baseline)].copy()
    df["compress"] = df["compress"].fillna(NONE)
    rates = _rates(df)
    fig, axes = new_figure(5.2 * len(rates), 8, ncols=len(rates), nrows=2)
    strategies = list(dict.fromkeys(df["sync"]))
    for j, rate in enumerate(rates):
        at = df if rate is None else df[df["link_rate"] == rate]
        ax_t, ax_b = axes[0][j], axes[1][j]
        for si, sync in enumerate(strategies):
            for codec in dict.fromkeys(at["compress"]):
                g = at[(at["sync"] == sync) & (at["compress"] == codec)].sort_values("workers")
                if g.empty:
                    continue
                label, color = f"{attr(sync, 'label', sync)}, {codec}", codec_color(codec)
                style = STRATEGY_STYLES[si % len(STRATEGY_STYLES)]
                sat = saturated(g)
                ax_t.plot(g["workers"], g["sync_s_p50"], marker="o", color=color, linestyle=style, label=label,
                          markevery=[not x for x in sat])
                ax_t.plot(g["workers"][sat], g["sync_s_p50"][sat], linestyle="none", marker="o",
                          markerfacecolor="none", markeredgecolor=color)
                ax_b.plot(g["workers"], g["bytes_sent_per_step"] / 2**20, marker="o", color=color, linestyle=style,
                          label=label)
        for ax, what in ((ax_t, "sync time per step (s)"), (ax_b, "bytes sent per worker and step (MiB)")):
            ax.set_yscale("log")
            ax.set_xlabel("workers N")
            ax.set_ylabel(what)
            ax.set_xticks(sorted(at["workers"].unique()))
            ax.grid(alpha=0.3, which="both")
        ax_t.set_title(f"{rate or 'loopback'}: sync time per codec (hollow: CPU-saturated)")
        ax_b.set_title(f"{rate or 'loopback'}: bytes; a ring all-gathers sparse codecs", fontsize=10)
    axes[1][-1].legend(fontsize=6, loc="center right")
    return fig


def time_to_accuracy(ev: pd.DataFrame, target: float) -> tuple[float, float]:
    """(step, wall seconds) of the first evaluation at or above ``target``; NaNs if never reached."""
    hit = ev[ev["test_acc"] >= target]
    if hit.empty:
        return float("nan"), float("nan")
    first = hit.iloc[0]
    return float(first["step"] + 1), float(first["wall_s"])


def run_label(cfg: dict) -> str:
    """A compression run's name: its codec, and what it changed from the defaults (error feedback, the
    optimizer's momentum and learning rate; a run's config.json holds them under ``optim``)."""
    name = cfg.get("compress", NONE)
    if name != NONE and not cfg.get("error_feedback", True):
        name += ", no error feedback"
    optim, default = {**cfg, **(cfg.get("optim") or {})}, OptimConfig()
    if optim.get("momentum") is not None and float(optim["momentum"]) != default.momentum:
        name += f", momentum {float(optim['momentum']):g}"
    if optim.get("lr") is not None and float(optim["lr"]) != default.lr:
        name += f", lr {float(optim['lr']):g}"
    return name


def by_label(runs: list[tuple[dict, pd.DataFrame, dict]]) -> dict[str, list[tuple[dict, pd.DataFrame, dict]]]:
    """The runs grouped by ``run_label`` (the seeds of one setting together), in order of appearance;
    where the runs use several strategies, each label starts with its strategy's."""
    several = len({r[0].get("sync") for r in runs}) > 1
    groups: dict[str, list] = {}
    for r in runs:
        name = run_label(r[0])
        groups.setdefault(f"{attr(r[0].get('sync'), 'label', r[0].get('sync'))}: {name}" if several else name,
                          []).append(r)
    return groups


DIVERGED = 0.5  # a final held-out accuracy below this is a run that diverged (chance is 0.1)


def has_seed_spread(runs: list[tuple[dict, pd.DataFrame, dict]], seeds: int = 8) -> bool:
    """Settings run with many seeds (``seeds`` or more each): their per-seed spread is the figure."""
    groups = by_label(runs)
    return len(groups) >= 2 and min(len(g) for g in groups.values()) >= seeds


def figure_seed_spread(runs: list[tuple[dict, pd.DataFrame, dict]]):
    """Final held-out accuracy of every seed per setting, the same seed joined across settings (the
    same initial weights and data order): how far runs that differ only in rounding drift apart. Runs
    that diverged are counted beside the axis, not drawn; the mean of the others is the bar."""
    groups = by_label(runs)
    names = list(groups)
    fig, axes = new_figure(max(6.0, 1.6 * len(names)), 4.8)
    ax = axes[0][0]
    per_seed: dict[int, list[float]] = {}
    for x, g in enumerate(groups.values()):
        accs = [(c.get("seed", i), 100 * ev["test_acc"].iloc[-1]) for i, (c, ev, _) in enumerate(g)]
        ok = [a for _, a in accs if a >= 100 * DIVERGED]
        color = codec_color(g[0][0].get("compress", NONE))
        ax.bar(x, sum(ok) / len(ok) if ok else 0, width=0.6, color=color, alpha=0.25)
        ax.scatter([x] * len(ok), ok, color=color, s=14, zorder=3)
        bad = len(accs) - len(ok)
        mean = f"{sum(ok) / len(ok):.2f}" if ok else "-"
        ax.text(x, 0.02, f"mean {mean}\n{bad}/{len(accs)} diverged", ha="center", va="bottom", fontsize=7,
                transform=ax.get_xaxis_transform())
        for seed, a in accs:
            per_seed.setdefault(seed, []).append(a if a >= 100 * DIVERGED else float("nan"))
    for seq in per_seed.values():
        if len(seq) == len(names):
            ax.plot(range(len(names)), seq, color="gray", alpha=0.25, linewidth=0.8)
    lo = min((a for seq in per_seed.values() for a in seq if a == a), default=85.0)
    ax.set_ylim(min(lo - 1, 88), 100)
    ax.set_xticks(range(len(names)), names, fontsize=8, rotation=15)
    ax.set_ylabel("final held-out accuracy (%)")
    ax.set_title("Every seed's final accuracy (a line joins one seed's runs)")
    ax.grid(alpha=0.3, axis="y")
    return fig


def mean_curve(group: list[tuple[dict, pd.DataFrame, dict]]) -> pd.DataFrame:
    """[step, wall_s, test_acc]: the mean over a group's runs (seeds) at each evaluated step."""
    both = pd.concat([ev for _, ev, _ in group])
    return both.groupby("step", as_index=False)[["wall_s", "test_acc"]].mean()


def figure_time_to_accuracy(runs: list[tuple[dict, pd.DataFrame, dict]], target: float = 0.9):
    """Bars, one per setting (the mean over its seeds): wall time until held-out accuracy first reached
    ``target``, over the seeds that reached it (how many did is written beside), and final accuracy."""
    fig, axes = new_figure(11, 4.2, ncols=2)
    ax_t, ax_a = axes[0]
    groups = by_label(runs)
    names = list(groups)
    colors = [codec_color(g[0][0].get("compress", NONE)) for g in groups.values()]
    reached = [[t for t in (time_to_accuracy(ev, target)[1] for _, ev, _ in g) if not pd.isna(t)]
               for g in groups.values()]
    times = [sum(r) / len(r) if r else float("nan") for r in reached]
    ys = range(len(names))
    ax_t.barh(ys, [0 if pd.isna(t) else t for t in times], color=colors)
    for y, t, r, g in zip(ys, times, reached, groups.values()):
        of = f" ({len(r)}/{len(g)} seeds)" if len(g) > 1 else ""
        ax_t.text(0 if pd.isna(t) else t, y, (" not reached" if pd.isna(t) else f" {t:.0f} s") + of,
                  va="center", fontsize=7)
    ax_t.set_yticks(list(ys), names, fontsize=7)
    ax_t.invert_yaxis()
    ax_t.set_xlabel(f"wall time to {100 * target:.0f}% held-out accuracy (s)")
    ax_t.set_title("time to accuracy")
    final = [100 * sum(ev["test_acc"].iloc[-1] for _, ev, _ in g) / len(g) for g in groups.values()]
    ax_a.barh(ys, final, color=colors)
    ax_a.set_xlim(min(final) - 5, 100)
    for y, a in zip(ys, final):
        ax_a.text(a, y, f" {a:.1f}", va="center", fontsize=7)
    ax_a.set_yticks(list(ys), [""] * len(names))
    ax_a.invert_yaxis()
    ax_a.set_xlabel("final held-out accuracy (%, mean over seeds)")
    ax_a.set_title("accuracy after the last step")
    for ax in (ax_t, ax_a):
        ax.grid(alpha=0.3, axis="x")
    return fig


__all__ = ["HOLLOW_NOTE", "by_label", "figure_compression", "figure_seed_spread", "figure_time_to_accuracy",
           "has_codecs", "has_seed_spread", "mean_curve", "run_label", "time_to_accuracy"]
