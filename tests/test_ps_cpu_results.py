"""results/ps_cpu: the README's figures are the committed table's medians (benchmarks/ps_cpu.py)."""
import re
from pathlib import Path

import pandas as pd
import pytest

FOLDER = Path(__file__).resolve().parent.parent / "results" / "ps_cpu"


@pytest.fixture(scope="module")
def medians():
    df = pd.read_csv(FOLDER / "ps_cpu.csv")
    assert set(df["label"]) == {"before", "after"} and df.groupby("label")["repeat"].nunique().eq(3).all()
    return df.groupby(["role", "thread", "label"])["ms_per_step"].median()


@pytest.mark.parametrize("role, thread, before, after", [
    ("worker", "other", 30.8, 24.5),  # the PS communication thread: 20% less
    ("server", "main", 38.5, 34.7),  # the servers' loop: 10% less
    ("worker", "main", 32.2, 32.8),
    ("machine", "all cores", 576.5, 536.8),
])
def test_readme_figures_are_the_tables_medians(medians, role, thread, before, after):
    assert medians[role, thread, "before"] == pytest.approx(before, abs=0.05)
    assert medians[role, thread, "after"] == pytest.approx(after, abs=0.05)
    text = (FOLDER / "README.md").read_text()
    for x in (before, after):  # the table's cell: "| 32.2 (", "| **30.8** ("
        assert re.search(rf"\| (\*\*)?{re.escape(f'{x:.1f}')}(\*\*)? \(", text), x


@pytest.mark.parametrize("role, thread", [("worker", "other"), ("server", "main")])
def test_it_fell_in_every_pair(role, thread):
    df = pd.read_csv(FOLDER / "ps_cpu.csv")
    pairs = df[(df["role"] == role) & (df["thread"] == thread)].pivot(index="repeat", columns="label",
                                                                       values="ms_per_step")
    assert (pairs["after"] < pairs["before"]).all()
