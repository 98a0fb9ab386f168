#!/usr/bin/env bash
# One device call: the GPU test suite, then the benchmark cases named on the command line
# (tunegraph, then PyTorch's three configurations), with logs and results under OUT.
# Expects a `make gpu` build in build/ (made on any machine with nvcc, then carried).
# usage: bench/device-check.sh OUT [case...]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench/device-check.sh OUT [case...]}
shift
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
TG_TEST_DEVICE=cuda ./build/gpu/run_tests 2>&1 | tee "$out/gpu-test.log" | grep -v '^ok '
[ $# -gt 0 ] || exit 0
bench/run_tunegraph.sh "$out" "$@"
cases=$(IFS=,; echo "$*")
PYTHONUNBUFFERED=1 python3 bench/pytorch_baseline.py --cases "$cases" --out "$out/pytorch.json" 2>&1 | tail -12
