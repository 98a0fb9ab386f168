#!/usr/bin/env bash
# Times the compiler (host only, no GPU): each benchmark job, each example job, and tiny
# BERTs of 1,000, 2,000 and 4,000 layers (written under OUT), REPEATS compiles each with
# the CLI; prints the median and fastest of the compile times `tunegraph compile` reports
# (job, config and compile, without writing the plan) with each plan's size, into
# OUT/compile-times.txt. Compile time should grow linearly with the layers.
# usage: bench/compile_time.sh [OUT] [REPEATS] [BIN]   (defaults: build/bench, 5, build/tunegraph)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/bench}
repeats=${2:-5}
bin=${3:-build/tunegraph}
mkdir -p "$out"
summary="$out/compile-times.txt"

# A tiny BERT (tiny-bert's widths) of $1 layers, and a job for it.
deep_job() {
    local dir="$out/deep-bert-$1"
    mkdir -p "$dir"
    cat > "$dir/config.json" <<JSON
{"architectures": ["BertForMaskedLM"], "hidden_act": "gelu", "hidden_size": 32,
 "intermediate_size": 64, "layer_norm_eps": 1e-12, "max_position_embeddings": 64,
 "model_type": "bert", "num_attention_heads": 4, "num_hidden_layers": $1,
 "pad_token_id": 0, "type_vocab_size": 2, "vocab_size": 128}
JSON
    printf 'model = %s\nnum_labels = 2\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\n' "$(cd "$dir" && pwd)" > "$dir/deep.job"
    echo "$dir/deep.job"
}

jobs=(bench/jobs/*.job examples/*.job "$(deep_job 1000)" "$(deep_job 2000)" "$(deep_job 4000)")
printf '%-28s %8s %9s %14s %10s %10s\n' job ops tensors "planned MiB" "median ms" "min ms" | tee "$summary"
for j in "${jobs[@]}"; do
    name=$(basename "$(dirname "$j")")
    [ "$name" = jobs ] || [ "$name" = examples ] && name=$(basename "$j" .job)
    times=()
    for r in $(seq 1 "$repeats"); do
        line=$("$bin" compile "$j" -o "$out/compile-time.tgp")
        times+=("$(sed -n 's/.*(\([0-9]*\) ms)$/\1/p' <<<"$line")")
    done
    read -r ops tensors mib < <(sed -n 's/.*: \([0-9]*\) ops, \([0-9]*\) tensors, planned peak \([0-9.]*\) MiB.*/\1 \2 \3/p' <<<"$line")
    sorted=($(printf '%s\n' "${times[@]}" | sort -n))
    printf '%-28s %8s %9s %14s %10s %10s\n' "$name" "$ops" "$tensors" "$mib" "${sorted[$((repeats / 2))]}" "${sorted[0]}" |
        tee -a "$summary"
done
rm -f "$out/compile-time.tgp"
