"""benchmarks/gpu.sh off a GPU machine: without nvidia-smi it stops at once with one line (exit 3); with an
interpreter given (PSRING_GPU_PYTHON, the offline path a lent machine without a package registry needs) it
installs psring into a folder of its own, then stops where that torch has no CUDA (exit 4), having written
nothing under results/."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.sh"


def tools(tmp_path: Path, fake_gpu: bool) -> str:
    """A PATH of the few tools the script's first lines use, and a fake nvidia-smi if asked."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("bash", "grep", "timeout", "mkdir", "printf", "chmod", "ln", "dirname", "cat"):
        found = shutil.which(tool)
        if found:
            (bin_ / tool).symlink_to(found)
    if fake_gpu:
        smi = bin_ / "nvidia-smi"
        smi.write_text('#!/bin/sh\necho "GPU 0: Fake GPU (UUID: GPU-0)"\n')
        smi.chmod(0o755)
    return str(bin_)


def test_without_a_gpu_it_stops_at_once_with_one_line(tmp_path):
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=30,
                       env={**os.environ, "PATH": tools(tmp_path, fake_gpu=False)})
    assert r.returncode == 3, r.stderr
    assert r.stderr.count("\n") == 1 and "no NVIDIA GPU" in r.stderr and not r.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the script would run for real and "
                    "replace results/gpu (run it as benchmarks/gpu.sh)")
@pytest.mark.timeout(180)
def test_offline_install_into_its_own_folder_then_no_cuda_is_exit_4(tmp_path):
    site = tmp_path / "site"
    before = sorted((ROOT / "results").iterdir())
    env = {**os.environ, "PATH": tools(tmp_path, fake_gpu=True) + os.pathsep + os.environ["PATH"],
           "PSRING_GPU_PYTHON": sys.executable, "PSRING_GPU_SITE": str(site)}
    env.pop("PSRING_GPU_WHEELS", None)
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=170, env=env)
    assert r.returncode == 4, r.stderr
    assert "cannot use the GPU" in r.stderr and r.stderr.strip().count("\n") == 0
    assert list(site.glob("psring-*.dist-info")) and (site / "psring" / "__init__.py").is_file()
    launcher = site / "launchers" / "bin" / "python"
    out = subprocess.run([str(launcher), "-c", "import sys; print(sys.executable)"], capture_output=True,
                         text=True, timeout=30)
    assert Path(out.stdout.strip()).resolve() == Path(sys.executable).resolve()
    assert (site / "launchers" / "bin" / "psring").exists()
    assert sorted((ROOT / "results").iterdir()) == before
