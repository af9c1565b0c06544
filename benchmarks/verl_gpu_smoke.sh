#!/usr/bin/env bash
# GPU smoke test of the verl backend (docs/readme_verl.md): the small search of
# benchmarks/verl_cpu_e2e.py (control + arms x seeds, real verl GRPO trials through the CLI) with
# backend.device=cuda: vLLM rollouts on ONE GPU instead of the CPU platform's HF rollout.
# Needs an NVIDIA GPU and the `gpu` extra (verl[vllm]); CI and CPU machines never run it.
# Its figures go to benchmarks/results/verl_gpu_smoke.json (docs/performance.md).
#   bash benchmarks/verl_gpu_smoke.sh [--arms 2] [--seeds 2] [--steps 4] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"

command -v nvidia-smi >/dev/null && nvidia-smi -L | grep -q GPU \
  || { echo "verl_gpu_smoke: no NVIDIA GPU found (nvidia-smi -L); this check needs one" >&2; exit 2; }
"$PYTHON" -c "import vllm" 2>/dev/null \
  || { echo "verl_gpu_smoke: vLLM is not installed; pip install -c constraints/gpu.txt -e '.[gpu]' (docs/readme_verl.md)" >&2; exit 2; }

export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
exec "$PYTHON" benchmarks/verl_cpu_e2e.py --device cuda "$@"
