#!/usr/bin/env bash
# Everything a lent GPU machine should check (issue #28), in under 8 minutes on one GPU from a clean
# checkout, from any folder:
#
#     bash benchmarks/gpu.sh
#
# 1. facts: nvidia-smi; python, torch, CUDA, cuDNN, NCCL versions -> results/gpu/nvidia-smi.txt, environment.txt
# 2. tests/test_gpu.py, every GPU run against the CPU run of its configuration -> tests.xml (junit), tests.log
# 3. step times per strategy, real compute, for resnet18 (and resnet50 once psring/config.py's MODELS has
#    it): `psring sweep` of a generated sweep file -> steps.toml, steps.log, steps/ (runs.csv, runs/)
# 4. results/gpu/README.md, generated from the above (with status.tsv: each step's exit status and time)
#
# It installs what it needs into a python3.11 venv (.venv, or PSRING_GPU_VENV): `pip install torch==2.13.0`,
# which on a GPU machine resolves to a CUDA build (wanted here, unlike on CPU CI), then psring with its
# test extras. A venv whose torch already sees the GPU is used as it is. Offline (no package registry):
# PSRING_GPU_PYTHON and PSRING_GPU_WHEELS, below. Every step runs under `timeout`,
# within a budget of PSRING_GPU_BUDGET_S seconds (450) for the whole script. It writes only under
# results/gpu/, replacing its own files of an earlier run there (steps/ included: a sweep would otherwise
# skip the runs it finds finished, keeping another machine's times).
#
# Exit status: 0 every step ran and every GPU test passed (or xfailed); 1 a step failed or ran out of
# time (README.md says which); 3 no GPU here: one line on stderr, before anything is installed or written;
# 4 the venv's torch cannot use the GPU (a CPU build: point PSRING_GPU_VENV at a new folder). Other
# statuses come from a failed venv or pip install.
set -euo pipefail

# Why first: a machine without a GPU must learn so at once, before minutes of multi-GB installs.
# (the list is read whole: under pipefail, `nvidia-smi -L | grep -q` fails when grep quits early)
gpus=$(nvidia-smi -L 2>/dev/null || true)
if ! command -v nvidia-smi >/dev/null 2>&1 || ! grep -q '^GPU ' <<< "$gpus"; then
    echo "benchmarks/gpu.sh: no NVIDIA GPU here (nvidia-smi absent or lists none); nothing checked, exit 3" >&2
    exit 3
fi

cd "$(dirname "$0")/.."
OUT=results/gpu
VENV=${PSRING_GPU_VENV:-.venv}
PY=$VENV/bin/python
BUDGET_S=${PSRING_GPU_BUDGET_S:-450}
status=0

# bounded NAME CAP CMD...: run CMD for at most CAP seconds (less if the budget has less left), record
# its exit status in status.tsv; a failure marks the script's status but lets the next steps run.
bounded() {
    local name=$1 cap=$2 start=$SECONDS rc=0
    shift 2
    local left=$((BUDGET_S - SECONDS))
    if ((left < cap)); then
        cap=$left
    fi
    if ((cap < 15)); then
        rc=124
        echo "benchmarks/gpu.sh: $name skipped: the ${BUDGET_S} s budget is spent" >&2
    else
        timeout --kill-after=10 "$cap" "$@" || rc=$?
    fi
    printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" >> "$OUT/status.tsv"
    if ((rc != 0)); then
        status=1
    fi
    return 0
}

# --- installs (only what the venv lacks) ----------------------------------------------------------------
# A machine that reaches no package registry (the lent H200: its image's python3 has torch with CUDA, but
# not pyzmq): PSRING_GPU_PYTHON=python3 uses that interpreter as it is, and installs psring, with the wheels
# in PSRING_GPU_WHEELS (e.g. pyzmq's, fetched elsewhere with `pip download`), offline into a folder of its
# own (PSRING_GPU_SITE) on PYTHONPATH; $VENV/bin then only holds launchers for that interpreter.
if [ -n "${PSRING_GPU_PYTHON:-}" ]; then
    site=${PSRING_GPU_SITE:-/tmp/psring-gpu-site}
    wheels=()
    [ -n "${PSRING_GPU_WHEELS:-}" ] && wheels=("$PSRING_GPU_WHEELS"/*.whl)
    timeout 150 "$PSRING_GPU_PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
        --upgrade --target "$site" "${wheels[@]}" .
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
    VENV=$site/launchers PY=$site/launchers/bin/python
    mkdir -p "$VENV/bin"
    printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v "$PSRING_GPU_PYTHON")" > "$PY"
    chmod +x "$PY"
    ln -sf "$site/bin/psring" "$VENV/bin/psring"
fi
# (psring's installed metadata, not `import psring`: from the repository root that imports the source folder)
if ! "$PY" -c 'import importlib.metadata as m, torch, pytest_timeout; m.version("psring")' 2>/dev/null \
        || [ ! -x "$VENV/bin/psring" ]; then
    [ -x "$PY" ] || "$(command -v python3.11 || command -v python3)" -m venv "$VENV"
    # a torch already there (any >= 2.2 works) is kept: a CUDA build is gigabytes to download again
    "$PY" -c 'import torch' 2>/dev/null || timeout 300 "$PY" -m pip install -q torch==2.13.0
    timeout 150 "$PY" -m pip install -q -e '.[test]'
fi
if ! "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    echo "benchmarks/gpu.sh: torch $("$PY" -c 'import torch; print(torch.__version__)') in $VENV cannot use" \
         "the GPU; set PSRING_GPU_VENV to a new folder for a CUDA build, exit 4" >&2
    exit 4
fi

mkdir -p "$OUT"
printf 'step\texit\tseconds\n' > "$OUT/status.tsv"

# --- 1. facts ---------------------------------------------------------------------------------------------
{
    nvidia-smi || true
    nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_cap,power.limit --format=csv || true
    nvidia-smi topo -m || true
} > "$OUT/nvidia-smi.txt" 2>&1
bounded facts 60 "$PY" - > "$OUT/environment.txt" <<'EOF'
import datetime, os, platform, subprocess, torch
def git(*args):
    return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()
p = torch.cuda.get_device_properties(0)
dirty = " (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else ""
print(f"date: {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}")
print(f"commit: {git('rev-parse', '--short', 'HEAD') or 'unknown'}{dirty}")
print(f"gpu: {torch.cuda.device_count()} x {p.name}, {p.total_memory / 2**30:.0f} GiB, "
      f"capability {p.major}.{p.minor}")
print(f"cpu: {os.cpu_count()} cores, {platform.machine()}, {platform.platform()}")
print(f"python: {platform.python_version()}; torch {torch.__version__} (CUDA {torch.version.cuda}, "
      f"cuDNN {torch.backends.cudnn.version()}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))})")
EOF

# --- 2. the GPU tests -------------------------------------------------------------------------------------
bounded tests 240 "$PY" -m pytest -q -p no:cacheprovider -ra tests/test_gpu.py \
    --junitxml="$OUT/tests.xml" > "$OUT/tests.log" 2>&1

# --- 3. step times per strategy ---------------------------------------------------------------------------
# N = 1: each strategy alone on the GPU (NCCL for the process-group ones). N = 2: two workers share the one
# GPU as psring places them today (rank 0 on it; README.md reports rank 0's device per run).
models=$("$PY" -c 'from psring.config import MODELS
print(", ".join(f"\"{m}\"" for m in ("resnet18", "resnet50") if m in MODELS))')
cat > "$OUT/steps.toml" <<EOF
# Written by benchmarks/gpu.sh: step times per strategy on one GPU, real compute.
[sweep]
name = "gpu"
description = "none, allreduce, ring, ddp, ps (S=1) at N = 1; allreduce, ps (S=2) at N = 2 on one GPU"

[grid]
model = [$models]

[[runs]]
sync = "none"
workers = 1
[[runs]]
sync = "allreduce"
workers = 1
[[runs]]
sync = "ring"
workers = 1
[[runs]]
sync = "ddp"
workers = 1
[[runs]]
sync = "ps"
workers = 1
servers = 1
[[runs]]
sync = "allreduce"
workers = 2
[[runs]]
sync = "ps"
workers = 2
servers = 2

[fixed]
batch_size = 32
steps = 30
num_samples = 4096
EOF
rm -rf "$OUT/steps"
bounded steps 300 "$VENV/bin/psring" sweep "$OUT/steps.toml" --out "$OUT/steps" > "$OUT/steps.log" 2>&1

# --- 4. README.md (reads rank 0's model.pt for its device, then the models go: 45 MB each) ----------------
# Outside the budget: whatever ran out of time, the README says what ran.
timeout 60 "$PY" - "$OUT" "$SECONDS" <<'EOF' || { status=1; echo "benchmarks/gpu.sh: README.md not written" >&2; }
import sys, xml.etree.ElementTree as ET
from pathlib import Path
import pandas as pd, torch
out, took = Path(sys.argv[1]), sys.argv[2]
lines = ["# GPU checks (`benchmarks/gpu.sh`)", "", f"Generated by `bash benchmarks/gpu.sh` in about {took} s; "
         "rerun it to replace every file here.", "", "```", (out / "environment.txt").read_text().strip(),
         "```", "", "| step | exit | s |", "|---|---|---|"]
lines += ["| " + " | ".join(r.split("\t")) + " |" for r in (out / "status.tsv").read_text().splitlines()[1:]]
lines += ["", "Exit 124: the step ran out of time. `nvidia-smi.txt` has the GPU's own report.", "",
          "## tests/test_gpu.py (`tests.xml`, `tests.log`)", "", "| test | outcome | message |", "|---|---|---|"]
xml = out / "tests.xml"
for case in (ET.parse(xml).getroot().iter("testcase") if xml.exists() else []):
    got = next((e for e in case if e.tag in ("failure", "error", "skipped")), None)
    outcome = "passed" if got is None else "xfailed" if got.get("type") == "pytest.xfail" else got.tag
    msg = "" if got is None else (got.get("message") or "").split("\n")[0][:160].replace("|", "/")
    lines.append(f"| {case.get('name')} | {outcome} | {msg} |")
lines += ["", "## Step times (`steps/runs.csv`, one folder per run in `steps/runs/`)", "",
          "Seconds per step (p50 of the slowest worker, 3 warm-up steps left out), batch 32 per worker, "
          "synthetic data. N = 1: one worker alone on the GPU. N = 2: two workers on a machine of one GPU, "
          "placed as psring places them: rank 0's device below; rank r is given device index r, which "
          "`local_device` in psring/sync/process_group.py maps to the CPU past the GPU count.", ""]
cols = ["model", "sync", "workers", "servers", "rank 0 on", "samples_per_s", "step_s_p50", "step_s_p90",
        "forward_s_p50", "backward_s_p50", "sync_s_p50", "update_s_p50", "speedup", "status"]
csv = out / "steps" / "runs.csv"
df = pd.read_csv(csv) if csv.exists() else pd.DataFrame(columns=cols)
def device(run_id):
    pt = out / "steps" / "runs" / str(run_id) / "model.pt"
    return str(next(iter(torch.load(pt).values())).device) if pt.exists() else "-"
df["rank 0 on"] = [device(r) for r in df.get("run_id", [])]
df["servers"] = [s if y == "ps" else "-" for s, y in zip(df["servers"], df["sync"])]
df = df[[c for c in cols if c in df.columns]]
lines += ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
lines += ["| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row) + " |"
          for row in df.itertuples(index=False)]
(out / "README.md").write_text("\n".join(lines) + "\n")
EOF
# what the other results/ folders drop too: the models (and ranks/, merged into steps.jsonl already)
find "$OUT/steps/runs" -mindepth 2 -maxdepth 2 \( -name model.pt -o -name ranks \) -exec rm -rf {} + \
    2>/dev/null || true
echo "benchmarks/gpu.sh: done in ${SECONDS} s, exit $status; see $OUT/README.md"
exit "$status"
