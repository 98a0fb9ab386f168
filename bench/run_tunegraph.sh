#!/usr/bin/env bash
# Times tunegraph on the benchmark cases: makes the synthetic data, then runs each job with
# the GPU build and writes its metrics under OUT (default build/bench).
# usage: bench/run_tunegraph.sh [OUT] [case...]
# BENCH_PRECISION=fp16 (or bf16, fp32) runs the cases at that precision instead of the jobs'.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/cases.sh
out=${1:-build/bench}
shift || true
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=("${bench_default_cases[@]}")
mkdir -p "$out"
for c in "${cases[@]}"; do
    bench_make_case_data "$c"
    build/gpu/tunegraph run "bench/jobs/$c.job" ${BENCH_PRECISION:+--set precision=$BENCH_PRECISION} --metrics "$out/tunegraph-$c.jsonl" --profile 2> "$out/tunegraph-$c.log" ||
        { tail -5 "$out/tunegraph-$c.log"; continue; }
    grep -E "^trained|^profile|^  forward" "$out/tunegraph-$c.log"; sed -n "/^  op /,/slowest/p" "$out/tunegraph-$c.log" | head -10
done
