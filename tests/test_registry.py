"""The strategy registry (``psring.strategies``) is the one place that knows a strategy by its name.

``test_no_code_compares_a_strategy_name`` reads every module of psring but the registry and fails on
a strategy name written as a string in a comparison (``==``, ``!=``, ``is``, ``in``, ``not in``,
``case``), as a dict key, or in a tuple, list or set literal used for membership (``x in (...)``,
``.isin([...])``, a set literal in set algebra, a module-level ``NAME = (...)`` later used as ``x in
NAME``): such code has to learn every new strategy by hand. Ask the registry instead (``where``,
``uses_servers``, ``is_baseline``, ``attr``, ``get(name).<field>``).

A string that only looks like a strategy name (a config section called ``ps``, a cost model of
``costmodel.STRATEGIES``) is marked on its line with the comment ``# not a strategy name``, or, for a
whole table, listed in ``TABLES_OF_OTHER_NAMES`` with the reason.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd
import pytest

from psring import costmodel, strategies
from psring.strategies import REGISTRY, Strategy

ROOT = Path(__file__).resolve().parents[1] / "psring"
PRAGMA = "# not a strategy name"
# Assignments whose dict literal is keyed by names that are not strategies, though some are spelled like one.
TABLES_OF_OTHER_NAMES = {
    "SECTIONS": "config sections (``ps`` is the parameter server's options, not the strategy)",
    "SECTION_CHECKS": "the checks of a config section, keyed by section",
}
SET_ALGEBRA = (ast.Sub, ast.BitAnd, ast.BitOr, ast.BitXor)
MEMBERSHIP_CALLS = {"isin", "issubset", "issuperset", "isdisjoint", "intersection", "difference", "union"}


def offenders(source: str, names, filename: str = "<string>") -> list[str]:
    """``file:line: 'name' (where)`` for every strategy name of ``names`` that ``source`` compares as a
    string literal, uses as a dict key or puts in a literal used for membership."""
    names, lines = set(names), source.splitlines()
    tree = ast.parse(source, filename)
    found: list[tuple[int, str, str]] = []

    def name_consts(node) -> list[ast.Constant]:
        """``node`` if it is a strategy name's literal, or such elements of a tuple/list/set literal."""
        elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return [e for e in elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in names]

    def flag(nodes, where: str) -> None:
        for c in nodes:
            if PRAGMA not in lines[c.lineno - 1]:
                found.append((c.lineno, c.value, where))

    exempt = set()  # dict literals of TABLES_OF_OTHER_NAMES
    literal_of: dict[str, list] = {}  # NAME = (literal tuple/list/set) at any level: NAME -> its nodes
    member_names: set[str] = set()  # names used on the right of `in` / inside a membership call
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            ids = {t.id for t in targets if isinstance(t, ast.Name)}
            if ids & set(TABLES_OF_OTHER_NAMES) and isinstance(node.value, ast.Dict):
                exempt.add(id(node.value))
            if isinstance(node.value, (ast.Tuple, ast.List, ast.Set)):
                for i in ids:
                    literal_of.setdefault(i, []).append(node.value)
        elif isinstance(node, ast.Compare):
            ops = [type(op) for op in node.ops]
            if any(op in (ast.Eq, ast.NotEq, ast.Is, ast.IsNot, ast.In, ast.NotIn) for op in ops):
                for operand in (node.left, *node.comparators):
                    flag(name_consts(operand), "compared")
            for op, right in zip(node.ops, node.comparators):
                if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, ast.Name):
                    member_names.add(right.id)
        elif isinstance(node, ast.Dict) and id(node) not in exempt:
            flag(name_consts(ast.Tuple([k for k in node.keys if k is not None])), "a dict key")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in MEMBERSHIP_CALLS:
            for a in node.args:
                flag(name_consts(a), f"in .{node.func.attr}()")
                if isinstance(a, ast.Name):
                    member_names.add(a.id)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, SET_ALGEBRA):
            for side in (node.left, node.right):
                if isinstance(side, ast.Set):
                    flag(name_consts(side), "in a set operation")
        elif isinstance(node, ast.MatchValue):
            flag(name_consts(node.value), "matched by case")
    for n in member_names:
        for lit in literal_of.get(n, []):
            flag(name_consts(lit), f"in {n}, used for membership")
    return [f"{filename}:{line}: {value!r} {where}" for line, value, where in sorted(set(found))]


def modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if p != ROOT / "strategies.py")


# --- the check -----------------------------------------------------------------------------------------

def test_no_code_compares_a_strategy_name():
    found = [o for p in modules()
             for o in offenders(p.read_text(), strategies.names(), str(p.relative_to(ROOT.parent)))]
    assert not found, ("a strategy name compared outside psring/strategies.py; ask the registry instead:\n"
                       + "\n".join(found))


OLD = '''
def bound_s(row, m_bytes, alpha_s=0.0):
    if row["sync"] in ("allreduce", "ddp"):
        return cm.ring_allreduce(n, m_bytes, w)
    if row["sync"] != "ps":
        return math.nan
RAW = {"allreduce": "raw_allreduce", "ps": "raw_zmq_echo"}
ar = runs[runs["sync"].isin(["allreduce", "ddp"])]
bad = set(strategies) - {"allreduce", "ps"}
if sync == "ps":
    pass
if "none" == cfg.sync:
    pass
SYNCS = ("ps", "allreduce")
if x not in SYNCS:
    pass
match sync:
    case "ddp":
        pass
'''


def test_the_check_finds_what_the_code_before_the_registry_did():
    """Lines as psring had them (bounds, bench/runner, bench/cli, plot/convergence ...): each is found."""
    found = offenders(OLD, strategies.names(), "old.py")
    lines = sorted({int(f.split(":")[1]) for f in found})
    assert lines == [3, 5, 7, 8, 9, 10, 12, 14, 18], "\n".join(found)
    assert "old.py:10: 'ps' compared" in found
    assert "old.py:14: 'allreduce' in SYNCS, used for membership" in found
    assert "old.py:7: 'ps' a dict key" in found and "old.py:18: 'ddp' matched by case" in found


def test_the_check_leaves_other_strings_and_registry_queries_alone():
    ok = '''
name = "ps"                                  # a value, not a comparison
ax.plot(x, y, linestyle="none", fillstyle="none")
style = {"fillstyle": "none" if raw else "full"}
model_curve(grid, c, m, link, "ps")          # an argument
if uses_servers(sync) and attr(sync, "cost_model") == cm.RING_MODEL:
    pass
if sync == "gossip" or section in ("run", "model"):
    pass
SECTIONS = {"run": "run", "ps": "parameter server"}
CHECKS = {"ps": check}  # not a strategy name
'''
    assert offenders(ok, strategies.names()) == []


def test_the_check_reads_every_module_and_a_copied_offender_fails_it(tmp_path):
    assert ROOT / "bounds.py" in modules() and ROOT / "sync" / "ddp.py" in modules()
    assert ROOT / "strategies.py" not in modules()
    bad = tmp_path / "speedup.py"
    bad.write_text('ORDER = ["none", "allreduce", "ddp", "ps"]\n'
                   'def color_of(s):\n    return "a" if s.sync == "ps" else "b"\n')
    assert offenders(bad.read_text(), strategies.names(), "speedup.py") == ["speedup.py:3: 'ps' compared"]


# --- the registry's answers ----------------------------------------------------------------------------

def test_registry_queries():
    assert strategies.where(servers=True) == ("ps",)
    assert strategies.baseline_name() == "none" and strategies.where(baseline=True) == ("none",)
    assert strategies.uses_servers("ps") and not strategies.uses_servers("allreduce")
    assert not strategies.uses_servers(float("nan")) and not strategies.is_baseline(None)
    assert strategies.attr("gossip", "color", "k") == "k" and strategies.attr("ddp", "sync_timed") is False
    with pytest.raises(ValueError, match="unknown strategy 'gossip'"):
        strategies.get("gossip")
    assert {"ps", "allreduce", "ddp", "none"} <= set(strategies.names())


def test_every_entry_is_complete():
    colors = [s.color for s in REGISTRY.values()]
    assert len(set(colors)) == len(colors), colors
    for name, s in REGISTRY.items():
        assert isinstance(s, Strategy) and s.name == name and s.label and s.help
        assert callable(s.build) and (s.reducer is None or callable(s.reducer)), name
        assert s.cost_model is None or s.cost_model in costmodel.STRATEGIES, name
        assert s.reducer is None or s.process_group, name  # a reducer runs on the process group
        assert not (s.servers and s.process_group), name
    assert [n for n, s in REGISTRY.items() if s.baseline] == [strategies.baseline_name()]
    assert REGISTRY[strategies.baseline_name()].cost_model is None  # the baseline moves no bytes


def test_what_the_figures_and_the_bench_derive_stays_as_committed():
    """Colours, order and cost models of the existing strategies, as the committed figures show them."""
    from psring.bench.cli import BENCH_DEFAULTS, RAW_LABELS, benchable
    from psring.plot.common import SERIES_COLORS, strategy_order
    from psring.plot.message_size import _bench_rows
    from psring.plot.speedup import MODEL_OF
    from psring.plot.timeline import timeline_strategies

    old = ["none", "allreduce", "ddp", "ps"]
    assert [n for n in strategy_order() if n in old] == old
    assert {k: SERIES_COLORS[k] for k in old} == {"none": "tab:gray", "allreduce": "tab:blue",
                                                  "ddp": "tab:cyan", "ps": "tab:red"}
    assert {k: MODEL_OF.get(k) for k in old} == {"none": None, "allreduce": "allreduce", "ddp": "allreduce",
                                                 "ps": "ps"}
    shown = timeline_strategies()
    assert shown.index("ps") < shown.index("allreduce") and "ddp" not in shown and "none" not in shown
    assert [n for n in benchable() if n in old] == ["allreduce", "ps"]
    assert BENCH_DEFAULTS["strategies"] == "allreduce,ps"  # each raw transport once, as before
    order, raw_of = _bench_rows()
    assert [r for r in order if r in old or r in RAW_LABELS] == [
        "allreduce", "raw_allreduce", "ps", "raw_zmq_echo", "raw_zmq_echo_sgd"]
    assert raw_of == {"raw_allreduce": "allreduce", "raw_zmq_echo": "ps", "raw_zmq_echo_sgd": "ps"}
    for n in benchable():
        assert REGISTRY[n].bench_raw in RAW_LABELS


# --- a new strategy needs nothing but its entry --------------------------------------------------------

@pytest.fixture
def gossip(monkeypatch):
    """A strategy of the reducer family that no module but the registry has heard of."""
    entry = Strategy("gossip", "a test strategy", "gossip", "tab:olive", lambda cfg: None, process_group=True,
                     cost_model=costmodel.RING_MODEL, bench_raw="raw_allreduce", reducer=lambda pg: None)
    monkeypatch.setitem(REGISTRY, "gossip", entry)
    return entry


def test_a_new_strategy_is_plotted_bounded_and_benchable_from_its_entry(gossip):
    from psring import bounds
    from psring.bench.cli import benchable
    from psring.plot.breakdown import phase_table
    from psring.plot.speedup import color_of, split_series
    from psring.plot.timeline import timeline_strategies

    row = {"sync": "gossip", "workers": 4, "servers": 1, "net": "emulated", "link_rate": "1gbit"}
    link = costmodel.Link.from_rate("1gbit", 0.0, costmodel.TCP_GOODPUT)
    assert bounds.bound_s(row, 1e8) == pytest.approx(costmodel.ring_allreduce(4, 1e8, link))
    runs = pd.DataFrame([{"sync": s, "workers": n, "servers": 1, "speedup": 1.0, "sync_s_p50": 0.1,
                          "step_s_p50": 0.2}
                         for s, n in (("none", 1), ("ps", 2), ("gossip", 2), ("allreduce", 2))])
    series = split_series(runs)
    assert [s.sync for s in series] == ["none", "allreduce", "gossip", "ps"]
    assert color_of(series[2], 0) == "tab:olive"
    assert not phase_table(runs)["sync_missing"].any()
    assert "gossip" in timeline_strategies() and "gossip" in benchable()
    assert not strategies.uses_servers("gossip") and not strategies.is_baseline("gossip")


def test_bench_times_a_new_reducer_against_the_flat_all_reduce(psring, tmp_path):
    """``psring bench --strategies ring``: a strategy the bench never named, timed through its registry
    ``reducer`` against one flat ``dist.all_reduce`` of the same bytes (its ``bench_raw`` row)."""
    out = tmp_path / "bench"
    r = psring.run("bench", "--strategies", "ring", "--workers", "2", "--sizes", "64K,1M", "--warmup", "1",
                   "--iters", "3", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    df = pd.read_csv(out / "bench.csv")
    assert set(df["strategy"]) == {"ring", "raw_allreduce"}
    assert sorted(df.groupby("strategy").size().to_dict().items()) == [("raw_allreduce", 2), ("ring", 2)]
    assert (df["time_s"] > 0).all()