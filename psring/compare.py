"""``psring compare``: the first thing to run.

As root it runs a small emulated cluster (``presets/compare_emulated.toml``: every worker and PS server a
network namespace behind a 50 Mbit/s link, compute emulated): ``none`` at N=1, then ``allreduce``, ``ps``
with one server and ``ps`` with S=N at N = 2 and 4. That shows the classic picture — one server's
link carries N·M, so PS S=1's sync grows with N; the ring's 2(N−1)/N·M stays nearly flat; N servers
share the load — and prints every sync time beside its α-β model (``bounds.bound_s``), writing one PNG.

Without root (or with ``--net loopback``) it runs ``presets/quick.toml`` on loopback and says why in one
line: there the N=2 runs share the cores the N=1 run had to itself, so the table shows core sharing,
not the tradeoff (the sync share is the telling column).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from .bounds import with_bounds
from .fileio import out_folder
from .strategies import uses_servers

PRESETS = Path(__file__).parent / "presets"
QUICK = PRESETS / "quick.toml"
EMULATED = PRESETS / "compare_emulated.toml"
FIGURE = "compare.png"


def series(r) -> str:
    """A row's line of the picture: the strategy, and for a PS whether it has one server or N."""
    if not uses_servers(r["sync"]):
        return r["sync"]
    return "ps S=1" if int(r["servers"]) == 1 else ("ps S=N" if int(r["servers"]) == int(r["workers"])
                                                       else f"ps S={int(r['servers'])}")


def _ms(x) -> str:
    return "-" if pd.isna(x) else f"{1e3 * x:.0f}"


def format_table(df: pd.DataFrame) -> str:
    """One line per run; with emulated links the sync time beside its model and their ratio."""
    modelled = "bound_s" in df and df["bound_s"].notna().any()
    head = f"{'strategy':<10} {'workers':>7} {'servers':>7} {'samples/s':>10} {'speedup':>8} {'sync share':>10}"
    if modelled:
        head += f" {'sync ms':>8} {'model ms':>8} {'ratio':>6} {'step ms':>8} {'step/bound':>10} {'cpu':>5}"
    lines = [head, "-" * len(head)]
    for r in df.to_dict("records"):
        if r["status"] != "ok":
            lines.append(f"{r['sync']:<10} {r['workers']:>7}  failed: {r['error']}")
            continue
        servers = r["servers"] if uses_servers(r["sync"]) else "-"
        speedup = "n/a" if pd.isna(r["speedup"]) else f"{r['speedup']:.2f}x"
        share = "-" if pd.isna(r["sync_share"]) else f"{100 * r['sync_share']:.1f}%"
        line = (f"{r['sync']:<10} {r['workers']:>7} {servers:>7} {r['samples_per_s']:>10.1f} "
                f"{speedup:>8} {share:>10}")
        if modelled:
            ratio = "-" if pd.isna(r["over_bound"]) else f"{r['over_bound']:.2f}"
            cpu = "-" if pd.isna(r.get("cpu_util")) else f"{100 * r['cpu_util']:.0f}%"
            step = r.get("step_over_bound")  # the whole step beside the bound of its --overlap mode
            step = "-" if step is None or pd.isna(step) else f"{step:.2f}"
            line += f" {_ms(r['sync_s_p50']):>8} {_ms(r['bound_s']):>8} {ratio:>6} {_ms(r.get('step_s_p50')):>8} " \
                    f"{step:>10} {cpu:>5}"
        lines.append(line)
    return "\n".join(lines)


def choose_net(net: str | None) -> tuple[str, str | None]:
    """("emulated" | "loopback", why loopback when it was not asked for)."""
    if net == "loopback":
        return net, None
    from .net import NetError, check_available

    try:
        check_available()
    except NetError as e:
        if net == "emulated":
            raise
        return "loopback", (f"psring compare: on loopback, which on a small machine shows core sharing, not the "
                            f"PS/ring tradeoff ({str(e).removeprefix('--net emulated ')}); for the real "
                            f"picture run it as root: sudo psring compare")
    return "emulated", None


def _with_steps(preset: Path, out: str, steps: int | None) -> Path:
    """``preset``, or a copy of it in ``out`` with another step count (e.g. for tests)."""
    if steps is None:
        return preset
    text = "\n".join(f"steps = {steps}" if line.startswith("steps = ") else line
                     for line in preset.read_text().splitlines())
    path = out_folder(out) / preset.name
    path.write_text(text + "\n")
    return path


def run_compare(out: str, steps: int | None = None, net: str | None = None) -> int:
    from .sweep import run_sweep

    out_folder(out)  # one line for an --out in a file's way, before a run starts
    net, why = choose_net(net)
    if why:
        print(why, file=sys.stderr, flush=True)
    df = run_sweep(str(_with_steps(EMULATED if net == "emulated" else QUICK, out, steps)), out, echo=True)
    if net == "emulated":
        df = with_bounds(df)
    print()
    print(format_table(df))
    print(f"\nspeedup = samples/s over none at N=1, one worker without communication (warm-up steps "
          f"excluded); runs in {out}/")
    if net == "emulated":
        print("model = the alpha-beta bound of the sync step on these links (psring.bounds); ratio = sync / "
              "model; step/bound = the median step over the bound of its --overlap mode (psring.overlap_model); cpu = share of all cores busy (far below 100%: the links, not the CPU, set the times)")
        ok = df[df["status"] == "ok"]
        if not ok.empty:
            from .plot.compare import figure_compare
            from .plot.common import save

            path = save(figure_compare(ok), Path(out), Path(FIGURE).stem, ("png",))[0]
            print(f"figure: {path}")
    return 0 if (df["status"] == "ok").all() else 1
