"""The committed topology runs (results/topology) hold what their README says: on link-bound points every
arrangement's sync time is within 15% of its alpha-beta bound, the measured order of the arrangements is
the model's, and the kernel's counters of a shared host link are the bytes the model puts on it."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from psring.plot.topology import topology_table

RESULTS = Path(__file__).resolve().parent.parent / "results" / "topology"


def table() -> pd.DataFrame:
    t = topology_table(pd.read_csv(RESULTS / "runs.csv"))
    assert len(t) == 10 and (t["workers_per_host"] == 2).all(), t["label"].tolist()
    return t


def test_every_link_bound_point_within_15_percent_of_its_bound():
    t = table()
    assert t["link_bound"].all(), t[["label", "cpu_util"]]
    bad = t[(t["over_bound"] < 0.85) | (t["over_bound"] > 1.15)]
    assert bad.empty, bad[["label", "sync_s_p50", "bound_s", "over_bound"]].to_string()


def test_the_measured_order_is_the_models():
    t = table()  # ordered by bound; the two flat rings share theirs, so either may come first
    by_model = t.sort_values(["bound_s", "sync_s_p50"], kind="stable")
    assert by_model["sync_s_p50"].is_monotonic_increasing, t[["label", "sync_s_p50", "bound_s"]].to_string()
    labels = t["label"].tolist()
    assert labels.index("hierarchical") < labels.index("all-reduce")  # on slow host links
    assert labels[3:] == ["ps S=4", "ps colocated + k=3", "ps colocated + k=2", "ps colocated + k=1",
                          "ps colocated", "ps S=2", "ps S=1"]


def test_kernel_counters_of_the_host_link_are_the_models_bytes():
    t = table()
    for k in ("wire_tx_bytes_per_step", "wire_rx_bytes_per_step"):
        ratio = t[k] / t["link_bytes_model"]
        assert ratio.between(1.0, 1.02).all(), pd.concat([t["label"], ratio], axis=1).to_string()
