"""results/ps_cpu: the README's figures are the committed table's medians (benchmarks/ps_cpu.py)."""
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
    ("worker", "other", 29.7, 24.9),  # the PS communication thread: 16% less
    ("server", "main", 37.0, 36.0),
    ("worker", "main", 32.1, 32.1),
    ("machine", "all cores", 563.5, 539.8),
])
def test_readme_figures_are_the_tables_medians(medians, role, thread, before, after):
    assert medians[role, thread, "before"] == pytest.approx(before, abs=0.05)
    assert medians[role, thread, "after"] == pytest.approx(after, abs=0.05)
    text = (FOLDER / "README.md").read_text()
    assert f"{before:.1f}" in text or f"{before:.0f}" in text
    assert f"{after:.1f}" in text or f"{after:.0f}" in text


def test_the_communication_thread_fell_in_every_pair(medians):
    df = pd.read_csv(FOLDER / "ps_cpu.csv")
    comm = df[(df["role"] == "worker") & (df["thread"] == "other")].pivot(index="repeat", columns="label",
                                                                           values="ms_per_step")
    assert (comm["after"] < comm["before"]).all()
