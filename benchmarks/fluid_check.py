"""How far the PS's lockstep fluid (``simulate/vector_ps.py``, which ``results/scale`` uses at S = N and S = 1) sits from
the flow replay it stands in for, at the sizes both can run: N = 8, 16, 32 workers, S = N/4 and N servers,
10/25/100 Gbit/s, alpha 20 and 205 us, ResNet-50's gradients, 100 ms of compute (``results/scale``'s
settings), no jitter. Writes ``results/simulate/fluid_check.csv`` (step and sync time of both, their ratios; and
the step of ``vector_async.AsyncPS`` under BSP, the fluid of drifting workers ``psring simulate`` takes for SSP and
ASP, beside them: ``drifting_step_s``, ``drifting_ratio``)::

    python benchmarks/fluid_check.py [--out results/simulate]
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


def check(n: int, s: int, rate: str, alpha_us: float, scratch: Path) -> dict:
    cfg = TrainConfig(sync="ps", workers=n, servers=s, model="resnet50", net="emulated", link_rate=rate,
                      compute="emulated:100", overlap="none", link_burst="0kb", steps=4, warmup=1, batch_size=32,
                      num_samples=65536).validate()
    fluid = lockstep_summary(cfg, "none", alpha_us * 1e-6)  # at every S (psring simulate: S = 1 and S = N only)
    flows = simulate(cfg, scratch / "flows", alpha_us=alpha_us, flows=True)
    drifting = async_summary(cfg, "none", alpha_us * 1e-6)["step_s_p50"]
    return {"workers": n, "servers": s, "link_rate": rate, "alpha_us": alpha_us,
            "flow_step_s": flows["step_s_p50"], "fluid_step_s": fluid["step_s_p50"],
            "step_ratio": fluid["step_s_p50"] / flows["step_s_p50"],
            "flow_sync_s": flows["sync_s_p50"], "fluid_sync_s": fluid["sync_s_p50"],
            "sync_ratio": fluid["sync_s_p50"] / flows["sync_s_p50"],
            "drifting_step_s": drifting, "drifting_ratio": drifting / flows["step_s_p50"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/simulate")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="psring-fluid-") as tmp:
        for n, quarter, rate, alpha in itertools.product((8, 16, 32), (True, False), ("10gbit", "25gbit", "100gbit"),
                                                         (20.0, 205.0)):
            rows.append(check(n, n // 4 if quarter else n, rate, alpha, Path(tmp)))
            r = rows[-1]
            print(f"N={n:<3} S={r['servers']:<3} {rate:>7} alpha {alpha:>5.0f}: step x{r['step_ratio']:.3f} "
                  f"sync x{r['sync_ratio']:.3f}, drifting fluid x{r['drifting_ratio']:.3f}", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out / "fluid_check.csv", index=False)
    print(f"{len(rows)} points: {out / 'fluid_check.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
