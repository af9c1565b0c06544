#!/usr/bin/env bash
# GPU smoke test of the verl backend (docs/readme_verl.md): a tiny real verl GRPO trial through
# tune_dfrl's launcher on ONE GPU with vLLM, printing the milestones Ray Tune would receive.
# Needs an NVIDIA GPU and the `gpu` extra (verl[vllm]); CI and CPU machines never run it.
#   bash benchmarks/verl_gpu_smoke.sh [--method softmax --params '{"temperature": 0.5}'] [--steps 4]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"

command -v nvidia-smi >/dev/null && nvidia-smi -L | grep -q GPU \
  || { echo "verl_gpu_smoke: no NVIDIA GPU found (nvidia-smi -L); this check needs one" >&2; exit 2; }
"$PYTHON" -c "import vllm" 2>/dev/null \
  || { echo "verl_gpu_smoke: vLLM is not installed; install verl[vllm]==0.9.1 as docs/readme_verl.md shows" >&2; exit 2; }

export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
exec "$PYTHON" benchmarks/verl_gpu_smoke.py "$@"
