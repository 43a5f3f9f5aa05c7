"""How far the PS's fluid of drifting workers (``simulate/vector_async.py``: SSP, ASP, and BSP with 1 < S < N in
``psring simulate``)
sits from the flow replay it stands in for, at the sizes both run in seconds: N = 8, 16, 32 workers, S = N/4,
25 Gbit/s, alpha 20 us, ResNet-50's gradients, 100 ms of compute with lognormal jitter of 5% and 20%
(``results/scale_consistency``'s settings), under BSP, SSP (k = 2) and ASP. BSP's row also gives
``vector_ps.VectorPS``, the lockstep fluid ``psring simulate`` took for BSP here before 2026-12-05 (it keeps it
for S = 1 and S = N). Writes ``results/simulate/async_check.csv``
(every worker at its own pace: ``worker_samples_per_s`` of each, and their ratios to the flow replay's).

With ``--bsp-scale``, instead: BSP on both fluids at ``results/scale_consistency``'s every N (8-1,024) and
jitter (the drifting one is what that folder's BSP rows now hold), into ``scale_consistency/bsp_drifting.csv``::

    python benchmarks/async_check.py [--out results/simulate]
    python benchmarks/async_check.py --bsp-scale [--out results/scale_consistency]
"""
from __future__ import annotations

import argparse
import itertools
import tempfile
from pathlib import Path

import pandas as pd

from psring.config import TrainConfig
from psring.simulate.run import simulate
from psring.simulate.vector_async import async_summary
from psring.simulate.vector_ps import lockstep_summary


def drifting_fluid(cfg: TrainConfig, jitter: str) -> float:
    """``worker_samples_per_s`` of ``AsyncPS`` on ``cfg``."""
    return async_summary(cfg, jitter, 20e-6)["worker_samples_per_s"]


def lockstep_fluid(cfg: TrainConfig, jitter: str) -> float:
    """``worker_samples_per_s`` of ``VectorPS`` on ``cfg`` (what ``psring simulate`` took for BSP at S = N/4 before
    2026-12-05; now it takes ``AsyncPS`` there)."""
    return lockstep_summary(cfg, jitter, 20e-6)["worker_samples_per_s"]


def cfg_of(n: int, consistency: str) -> TrainConfig:
    """``experiments/scale_consistency.toml``'s run at N = n."""
    return TrainConfig(sync="ps", workers=n, servers=n // 4, model="resnet50", net="emulated", link_rate="25gbit",
                       compute="emulated:100", overlap="none", link_burst="0kb", steps=16, warmup=4, batch_size=32,
                       num_samples=65536, consistency=consistency, staleness=2).validate()


def bsp_scale(out: Path) -> int:
    runs = pd.read_csv(out / "runs.csv")
    rows = []
    for (n, jitter), _ in runs[(runs["consistency"] == "bsp") & (runs["workers"] > 1)].groupby(["workers", "jitter"]):
        cfg = cfg_of(int(n), "bsp")
        rows.append({"workers": n, "servers": n // 4, "jitter": jitter, "vector_ps": lockstep_fluid(cfg, jitter),
                     "async_fluid": drifting_fluid(cfg, jitter)})
        print(f"N={n:<5} {jitter:>15}: BSP on the drifting fluid x{rows[-1]['async_fluid'] / rows[-1]['vector_ps']:.3f} "
              f"VectorPS's", flush=True)
    pd.DataFrame(rows).to_csv(out / "bsp_drifting.csv", index=False)
    return 0


def one(n: int, jitter: str, consistency: str, scratch: Path) -> dict:
    cfg = cfg_of(n, consistency)
    flows = simulate(cfg, scratch / "flows", jitter, 20.0, flows=True)["worker_samples_per_s"]
    row = {"workers": n, "servers": n // 4, "jitter": jitter, "consistency": consistency, "flow": flows,
           "async_fluid": drifting_fluid(cfg, jitter)}
    row["async_ratio"] = row["async_fluid"] / flows
    if consistency == "bsp":
        row["vector_ps"] = lockstep_fluid(cfg, jitter)
        row["vector_ps_ratio"] = row["vector_ps"] / flows
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="default results/simulate (--bsp-scale: results/scale_consistency)")
    ap.add_argument("--bsp-scale", action="store_true")
    a = ap.parse_args()
    if a.bsp_scale:
        return bsp_scale(Path(a.out or "results/scale_consistency"))
    path = Path(a.out or "results/simulate") / "async_check.csv"
    with tempfile.TemporaryDirectory(prefix="psring-async-") as tmp:
        grid = itertools.product((8, 16, 32), ("lognormal:0.05", "lognormal:0.2"), ("bsp", "ssp", "asp"))
        rows = [report(one(n, jitter, consistency, Path(tmp))) for n, jitter, consistency in grid]
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, index=False)
    print(f"{len(rows)} points: {path}")
    return 0


def report(r: dict) -> dict:
    print(f"N={r['workers']:<3} {r['jitter']:>15} {r['consistency']}: drifting fluid x{r['async_ratio']:.3f}"
          + (f", VectorPS x{r['vector_ps_ratio']:.3f}" if "vector_ps" in r else ""), flush=True)
    return r


if __name__ == "__main__":
    raise SystemExit(main())
