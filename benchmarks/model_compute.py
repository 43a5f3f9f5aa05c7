"""Each model's forward+backward on this machine, and the emulated compute times results/models runs with.

    python benchmarks/model_compute.py [--models resnet18,resnet50,vit_b_16] [--batch 8] [--out results/models]

Measures, for every model at its own input size (psring's defaults: 32 x 32 for the CIFAR-style ResNet-18,
whose 3 x 3 stem keeps full resolution and takes 12 s a batch at 224; 224 x 224 for ResNet-50 and ViT-B/16,
ImageNet's), the median
forward+backward of one batch in one process with every core (``train.emulation.measure_compute_ms``, what
``--compute emulated`` measures), and writes ``OUT/compute.json``: the measured ms, the ratio of each to
the first model's, and ``emulated_ms`` = REFERENCE_MS x that ratio. REFERENCE_MS is the first model's
emulated time (200 ms: results/bandwidth's ResNet-18 choice, between this CPU and a datacenter GPU). So
every model keeps its measured compute relative to the others while a step stays short enough for a sweep
on two cores; the ratios, not this CPU's absolute times, are what carries over to an accelerator.

Not a test: a minute of CPU-heavy work; run it alone on a quiet machine.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

REFERENCE_MS = 200.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,resnet50,vit_b_16")
    ap.add_argument("--batch", type=int, default=8, help="images per forward+backward (default 8)")
    ap.add_argument("--image-size", type=int, default=None, help="input side (default: each model's own)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="results/models")
    a = ap.parse_args(argv)

    import torch

    from psring.config import TrainConfig
    from psring.train.emulation import measure_compute_ms

    models = [m.strip() for m in a.models.split(",") if m.strip()]
    threads = os.cpu_count() or 1
    measured, sizes = {}, {}
    for m in models:
        cfg = TrainConfig(model=m, batch_size=a.batch, image_size=a.image_size).validate()
        measured[m] = measure_compute_ms(cfg, threads, a.repeats)
        sizes[m] = cfg.input_size
        print(f"{m:>10}: {measured[m]:8.1f} ms forward+backward, batch {a.batch}, {cfg.input_size} px, "
              f"{threads} threads", flush=True)
    ref = measured[models[0]]
    rows = {m: {"image_size": sizes[m], "measured_ms": round(ms, 1), "ratio": round(ms / ref, 3),
                "emulated_ms": round(REFERENCE_MS * ms / ref)} for m, ms in measured.items()}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"command": "python benchmarks/model_compute.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "machine": f"{platform.processor() or platform.machine()}, {threads} cores, torch {torch.__version__}",
           "batch": a.batch, "threads": threads, "reference_ms": REFERENCE_MS,
           "models": rows}
    (out / "compute.json").write_text(json.dumps(doc, indent=2) + "\n")
    for m, r in rows.items():
        print(f"{m:>10}: ratio {r['ratio']:.2f} -> --compute emulated:{r['emulated_ms']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
