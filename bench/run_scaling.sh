#!/usr/bin/env bash
# Data-parallel scaling: tunegraph with data_parallel = 1, 2, 4, 8 (as many as there are
# GPUs) and PyTorch DDP on the same GPU counts, for BERT-base (B=32 per GPU, T=128) and
# GPT-2 124M (B=16 per GPU, T=1024), tunegraph also with ZeRO-1 on 2 GPUs and more. Writes
# OUT/scaling-tunegraph-<case>-<n>[-zero1].jsonl (the CLI's metrics), OUT/scaling-ddp-<case>-<mode>.json (DDP_MODES, default "compile eager"),
# OUT/scaling.json (every median, the
# speedups over one GPU, the optimizer phase as the exposed communication) and
# OUT/scaling.svg.
# usage: bench/run_scaling.sh OUT [steps]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench/run_scaling.sh OUT [steps]}
steps=${2:-200}
export NCCL_NVLS_ENABLE=0
mkdir -p "$out" /tmp/tunegraph-bench
gpus=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)
counts=""
for n in 1 2 4 8; do [ "$n" -le "$gpus" ] && counts="$counts $n"; done
echo "GPUs: $gpus; replicas:$counts"
for c in bert-base-cls-b32-t128 gpt2-lm-b16-t1024; do
    case $c in
    bert-base-cls-b32-t128) args="--vocab 30522 --seq 128 --count 8192 --labels 2" ;;
    gpt2-lm-b16-t1024) args="--vocab 50257 --seq 1024 --count 2048" ;;
    esac
    python3 bench/make_synthetic_data.py "/tmp/tunegraph-bench/$c.jsonl" $args > /dev/null
    for n in $counts; do
        build/gpu/tunegraph run "bench/jobs/$c.job" --set steps="$steps" --set data_parallel="$n" \
            --metrics "$out/scaling-tunegraph-$c-$n.jsonl" 2> "$out/scaling-tunegraph-$c-$n.log" ||
            tail -3 "$out/scaling-tunegraph-$c-$n.log"
        echo "tunegraph $c x$n: $(grep -E '^trained' "$out/scaling-tunegraph-$c-$n.log")"
        [ "$n" -gt 1 ] || continue
        build/gpu/tunegraph run "bench/jobs/$c.job" --set steps="$steps" --set data_parallel="$n" --set zero_stage=1 \
            --metrics "$out/scaling-tunegraph-$c-$n-zero1.jsonl" 2> "$out/scaling-tunegraph-$c-$n-zero1.log" ||
            tail -3 "$out/scaling-tunegraph-$c-$n-zero1.log"
        echo "tunegraph ZeRO-1 $c x$n: $(grep -E '^trained' "$out/scaling-tunegraph-$c-$n-zero1.log")"
    done
    for m in ${DDP_MODES:-compile eager}; do
        python3 bench/pytorch_ddp.py --case "$c" --mode "$m" --world "$(echo $counts | tr ' ' ',')" \
            --out "$out/scaling-ddp-$c-$m.json"
    done
done
python3 bench/plot_scaling.py "$out"
