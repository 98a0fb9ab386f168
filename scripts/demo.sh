#!/usr/bin/env bash
# Runs the demo fine-tuning job: on the GPU when there is one and nvcc can build the CUDA
# executor, else on the CPU reference.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/tunegraph
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && command -v nvcc >/dev/null 2>&1; then
    make -s gpu
    bin=build/gpu/tunegraph
fi
cd examples
exec "../$bin" run demo-classify.job --metrics ../build/demo-metrics.jsonl
