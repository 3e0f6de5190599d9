#!/usr/bin/env bash
# The GPU figures of benchmarks/RESULTS.md in one run on a CUDA machine (an H200: ~139 GiB, no network).
#
#   OUT=/tmp/out bash benchmarks/gpu.sh                 # from anywhere; PYTHON=... picks the interpreter
#   SMALL=1 OUT=/tmp/out bash benchmarks/gpu.sh         # check this script on a CPU (tiny shapes, seconds)
#
# What comes back under $OUT (default benchmarks/results/gpu), six files:
#   env.log                nvidia-smi summary; python, torch, CUDA, triton, diffusers versions
#   preflight.log          `vidserve check --gpu`: one line per step, before any benchmark
#   gpu_attention.{log,json}  Triton block-sparse attention vs SDPA flash, Wan2.1-1.3B shapes (L=32760)
#   gpu_steps.{log,json}   Wan2.1-1.3B and 14B transformers (random bf16 weights) at 480x832x81:
#                          s per denoising step dense / topk / cache / topk+cache, attention
#                          TFLOP/s, peak memory (see benchmarks/gpu_steps.py)
# Expected about 3 minutes on an H200 (imports included). Each step has a timeout (90 s, 330 s)
# and gpu_steps.py starts no variant after 240 s, so it ends within about 7.5 minutes.
#
# Nothing is installed there (no network): benchmarks/gpu_env.sh says which wheels to carry.
set -euo pipefail

# Paths given relative to the caller's folder stay valid after the cd to the repo root.
if [[ -n "${OUT:-}" ]]; then mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd); fi
if [[ "${PYTHON:-}" == */* ]]; then PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")"; fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-benchmarks/results/gpu}"
source benchmarks/gpu_env.sh
mkdir -p "$OUT"
start=$SECONDS

{
  echo "== $(date -u +%FT%TZ) $(hostname), $(nproc) CPUs"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv
    nvidia-smi
  else
    echo "nvidia-smi: not found"
  fi
  (cd "$site" && "$PYTHON" -) <<'PY'
import importlib, sys
import torch
print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "CUDA", torch.version.cuda, "GPU", torch.cuda.get_device_name() if torch.cuda.is_available() else None)
for name in ("triton", "diffusers", "transformers", "pydantic"):
    try:
        module = importlib.import_module(name)
        print(name, module.__version__, module.__file__)
    except ImportError as error:
        print(name, "MISSING:", error)
# Fail in seconds, not after minutes of device time, when something the benchmarks need is missing.
try:
    import vidserve.pipelines.attention, vidserve.pipelines.speedups  # noqa: E401
    print("vidserve", vidserve.pipelines.attention.__file__)
except ImportError as error:
    sys.exit(f"gpu.sh: vidserve's pipelines do not import ({error}); carry the missing wheels (see benchmarks/gpu_env.sh)")
PY
} 2>&1 | tee "$OUT/env.log"

status=0
if [[ "${SMALL:-0}" == 1 ]]; then
  echo "SMALL=1: skipping the GPU preflight and gpu_attention.py (they need a GPU)" | tee "$OUT/gpu_attention.log"
  steps_args=(--small)
else
  # Seconds, not minutes of device time: a GPU, Triton's launcher, and the kernel against a reference.
  (cd "$site" && timeout 120 "$PYTHON" -m vidserve.cli check --gpu) 2>&1 | tee "$OUT/preflight.log" \
    || { echo "gpu.sh: the preflight failed (see $OUT/preflight.log); no benchmark started" >&2; exit 3; }
  timeout 90 "$PYTHON" benchmarks/gpu_attention.py --json "$OUT/gpu_attention.json" 2>&1 \
    | tee "$OUT/gpu_attention.log" || status=$?
  echo "gpu_attention.py: exit $status, $((SECONDS - start)) s so far" | tee -a "$OUT/gpu_attention.log"
  steps_args=()
fi
# Variants stop starting at --deadline; the timeout is the backstop (the JSON keeps what finished).
timeout 330 "$PYTHON" benchmarks/gpu_steps.py --deadline 240 --json "$OUT/gpu_steps.json" ${steps_args[@]+"${steps_args[@]}"} 2>&1 \
  | tee "$OUT/gpu_steps.log" || status=$?
echo "gpu.sh: done in $((SECONDS - start)) s, exit $status; files in $OUT:" | tee -a "$OUT/gpu_steps.log"
ls -l "$OUT"
exit "$status"
