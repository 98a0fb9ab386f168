#!/usr/bin/env bash
# One device call for the cost model: calibrates it on the GPU (tunegraph calibrate --device
# cuda, the extended sweep), then for each benchmark case prints the prediction
# (inspect --predict) and runs it with --profile, whose cost-model table puts the
# predicted and measured times per kernel group, phase and step side by side; last, the
# BERT-base sweep over batch x seq x precision with its artifact and plots. Everything
# lands under OUT: calibrate.log, cost-h100.txt, CASE.predict.txt, CASE.log, CASE.jsonl,
# errors.txt (the step rows of every case), sweep/ and sweep-artifact/.
# usage: bench/cost_model_check.sh OUT [case...]   (default: every case with a job in bench/jobs
#        but the SQuAD one, whose data needs a tokenizer)
# STEPS (default 30) steps a case, LLAMA_STEPS (default 8) for the Llama cases;
# SWEEP_STEPS (default 20); SWEEP=0 leaves the sweep out, CASES=0 the cases; CALIBRATE=0
# keeps the cached calibration (TUNEGRAPH_CACHE_DIR, default OUT/cache). TUNEGRAPH names the binary (default build/gpu/tunegraph).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/cases.sh
out=${1:?usage: bench/cost_model_check.sh OUT [case...]}
shift
tg=${TUNEGRAPH:-build/gpu/tunegraph}
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(bert-base-cls-b32-t128 bert-base-cls-b8-t512 gpt2-lm-b16-t1024 bert-base-mlm-b4-t512
    llama-3.2-1b-lm-b4-t2048 llama-3-8b-lora-b2-t2048 llama-3-8b-lora-b1-t4096)
mkdir -p "$out"
export TUNEGRAPH_CACHE_DIR=${TUNEGRAPH_CACHE_DIR:-$out/cache}
mkdir -p "$TUNEGRAPH_CACHE_DIR"

if [ "${CALIBRATE:-1}" != 0 ]; then
    echo "== calibrate"
    { time "$tg" calibrate --device cuda; } > "$out/calibrate.log" 2>&1
    echo "rc $?" >> "$out/calibrate.log"
    cat "$out/calibrate.log"
    cp "$TUNEGRAPH_CACHE_DIR"/cost-*.txt "$out/" 2>/dev/null
fi

: >> "$out/errors.txt"
[ "${CASES:-1}" != 0 ] || cases=()
for c in "${cases[@]}"; do
    echo "== $c"
    bench_make_case_data "$c" > /dev/null || continue
    steps=${STEPS:-30}
    case $c in llama-*) steps=${LLAMA_STEPS:-8} ;; esac
    "$tg" inspect "bench/jobs/$c.job" --predict --gpu h100 > "$out/$c.predict.txt" 2>&1
    "$tg" run "bench/jobs/$c.job" --set steps="$steps" --profile --metrics "$out/$c.jsonl" > "$out/$c.log" 2>&1 ||
        { tail -5 "$out/$c.log"; continue; }
    grep -E "^trained|^  step" "$out/$c.log"
    sed -n '/cost model (/,/step (run/p' "$out/$c.log" | sed "s/^/$c: /" >> "$out/errors.txt"
done

if [ "${SWEEP:-1}" != 0 ]; then
    echo "== sweep: bert-base batch x seq x precision"
    python3 bench/make_synthetic_data.py /tmp/tunegraph-bench/bert-base-sweep.jsonl --vocab 30522 --seq 512 --count 1024 --labels 2
    rm -rf "$out/sweep" "$out/sweep-artifact"
    "$tg" sweep bench/jobs/bert-base-cls-b32-t128.job --set train_data=/tmp/tunegraph-bench/bert-base-sweep.jsonl \
        --grid batch=8,16,32 --grid seq=128,256,512 --grid precision=bf16,fp16,fp32 \
        --steps "${SWEEP_STEPS:-20}" --weights throughput=1,memory=0.5,energy=0.5 \
        -o "$out/sweep" --artifact "$out/sweep-artifact" > "$out/sweep.log" 2>&1
    echo "rc $?" >> "$out/sweep.log"
    cat "$out/sweep/results.txt" 2>/dev/null || tail -20 "$out/sweep.log"
fi
