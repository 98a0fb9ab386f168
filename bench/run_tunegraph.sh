#!/usr/bin/env bash
# Times tunegraph on the benchmark cases: makes the synthetic data, then runs each job with
# the GPU build and writes its metrics under OUT (default build/bench).
# usage: bench/run_tunegraph.sh [OUT] [case...]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/bench}
shift || true
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(bert-base-cls-b32-t128 bert-base-cls-b8-t512 gpt2-lm-b16-t1024)
mkdir -p "$out" /tmp/tunegraph-bench
for c in "${cases[@]}"; do
    case $c in
    bert-base-cls-b32-t128) args="--vocab 30522 --seq 128 --count 2048 --labels 2" ;;
    bert-base-cls-b8-t512) args="--vocab 30522 --seq 512 --count 512 --labels 2" ;;
    gpt2-lm-b16-t1024) args="--vocab 50257 --seq 1024 --count 512" ;;
    *) echo "unknown case $c" >&2; exit 2 ;;
    esac
    python3 bench/make_synthetic_data.py "/tmp/tunegraph-bench/$c.jsonl" $args
    build/gpu/tunegraph run "bench/jobs/$c.job" --metrics "$out/tunegraph-$c.jsonl" --profile 2> "$out/tunegraph-$c.log" ||
        { tail -5 "$out/tunegraph-$c.log"; continue; }
    grep -E "^trained|^profile|^  forward" "$out/tunegraph-$c.log"; sed -n "/^  op /,/slowest/p" "$out/tunegraph-$c.log" | head -10
done
