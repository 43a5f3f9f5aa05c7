"""ResNet-50 and ViT-B/16 under every strategy on the emulated cluster, compute emulated: a short run each
(their 102 MB and 346 MB of gradients, at 32x32 pixels, through every synchronizer's buckets and shards)."""
from __future__ import annotations

import json

import pytest
from conftest import run_concurrently
from psring.launch.resources import model_bytes
from test_emulated_run import needs_net, no_new_namespaces  # noqa: F401 - fixture

RUNS = {"ps": ("--workers", "2", "--servers", "2"), "allreduce": ("--workers", "2"), "ring": ("--workers", "2"),
        "ddp": ("--workers", "2"), "hierarchical": ("--workers", "4", "--workers-per-host", "2")}


@needs_net
@pytest.mark.parametrize("model,at_once", [("resnet50", 2), ("vit_b_16", 1)])  # ViT: ~3 GB a worker
def test_every_strategy_runs_the_big_models(no_new_namespaces, psring, tmp_path, model, at_once):  # noqa: F811
    outs = {sync: tmp_path / sync for sync in RUNS}
    jobs = {sync: ["train", "--sync", sync, *extra, "--model", model, "--image-size", "32", "--net", "emulated",
                   "--link-rate", "10gbit", "--compute", "emulated:50", "--batch-size", "4", "--steps", "3",
                   "--warmup", "1", "--out", str(outs[sync])] for sync, extra in RUNS.items()}
    done = run_concurrently(psring, jobs, at_once=at_once, timeout=500)
    m = model_bytes(model)  # the gradients' bytes at 10 classes (--image-size changes no parameter of these)
    for sync in RUNS:
        assert done[sync].returncode == 0, (sync, done[sync].stderr[-2000:])
        s = json.loads((outs[sync] / "summary.json").read_text())
        assert s["steps_completed"] == 3, (sync, s["steps_completed"])
        if sync != "hierarchical":  # N = 2: every flat strategy sends each worker's M once a step
            assert 0.99 * m <= s["bytes_sent_per_step"] <= 1.05 * m, (sync, s["bytes_sent_per_step"], m)
