#!/usr/bin/env bash
# Scoring kernel on one CUDA GPU (sized for an H200; needs torch with CUDA and triton, e.g. triton==3.7.1
# for torch 2.13): the parity tests compiled for the GPU, then the benchmark at 4k/16k/32k.
# Writes gpu.txt, pytest.txt, scoring.txt under $OUT (default out/gpu_scoring). Takes under 5 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-out/gpu_scoring}"
PY="${PYTHON:-python}"
mkdir -p "$OUT"
unset TRITON_INTERPRET  # compiled kernels, not the CPU interpreter
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())"
} 2>&1 | tee "$OUT/gpu.txt"

timeout 210 "$PY" -m pytest tests/test_kernels_score.py -q -p no:cacheprovider -rs 2>&1 | tee "$OUT/pytest.txt"
tests_rc=${PIPESTATUS[0]}
timeout 75 "$PY" benches/scoring.py --lengths 4096,16384,32768 2>&1 | tee "$OUT/scoring.txt"
bench_rc=${PIPESTATUS[0]}
echo "pytest exit $tests_rc, benchmark exit $bench_rc" | tee -a "$OUT/gpu.txt"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
