#!/usr/bin/env bash
# Tokenizer throughput on one core: `tunegraph tokenize` against Hugging Face `tokenizers`
# on the same text, for WordPiece (all-MiniLM-L6-v2's tokenizer.json) and byte-level BPE
# (GPT-2's encoder.json + vocab.bpe).
#
#   bench/tokenizer_throughput.sh [REPEAT] [RUNS]
#
# The text is tests/data/tokenizer_corpus.txt repeated REPEAT times (default 20; 5.8 MB).
# Both sides are pinned to CPU 0 (taskset) and each number is the best of RUNS (default 3):
#   tunegraph   the whole command: read stdin, tokenize, write the ids (to /dev/null);
#               "encode" leaves out opening the tokenizer (a run on empty input)
#   HF batch    Tokenizer.encode_batch over all lines, TOKENIZERS_PARALLELISM=false (one
#               thread); reading the file and writing ids are not timed
#   HF per line Tokenizer.encode once a line, the same way
# Needs build/tunegraph (make) and the files and reference library of
# scripts/fetch_assets.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
repeat=${1:-20}
runs=${2:-3}
cli=$root/build/tunegraph
assets=${TG_ASSETS:-$root/build/assets}
[ -x "$cli" ] || { echo "build $cli first (make)" >&2; exit 1; }
"$root/scripts/fetch_assets.sh"
py=$assets/venv/bin/python
ref=$root/tests/tokenizer_reference.py
corpus=$root/tests/data/tokenizer_corpus.txt
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tg-tokbench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
for _ in $(seq "$repeat"); do cat "$corpus"; done >"$tmp/text.txt"
bytes=$(wc -c <"$tmp/text.txt")
lines=$(wc -l <"$tmp/text.txt")
export TOKENIZERS_PARALLELISM=false

calc() { awk "BEGIN { printf \"%.6f\", $* }"; }
less() { awk "BEGIN { exit !($1 < $2) }"; }

# best_of CMD...: the smallest wall time of $runs runs, in seconds
best_of() {
    local best="" t0 t1 s
    for _ in $(seq "$runs"); do
        t0=$(date +%s.%N)
        "$@"
        t1=$(date +%s.%N)
        s=$(calc "$t1 - $t0")
        if [ -z "$best" ] || less "$s" "$best"; then best=$s; fi
    done
    echo "$best"
}

ours() { taskset -c 0 "$cli" tokenize --tokenizer "$1" <"$2" >/dev/null; }

hf() { # SPEC [--per-line]: best reported encode time
    local best="" s
    for _ in $(seq "$runs"); do
        s=$(taskset -c 0 "$py" "$ref" time "$1" "$corpus" --repeat "$repeat" "${@:2}" | cut -d' ' -f1)
        if [ -z "$best" ] || less "$s" "$best"; then best=$s; fi
    done
    echo "$best"
}

rate() { # SECONDS: "MB/s  lines/s"
    printf '%7.2f MB/s %10.0f lines/s' "$(calc "$bytes / $1 / 1000000")" "$(calc "$lines / $1")"
}

echo "text: $lines lines, $bytes bytes ($repeat x tests/data/tokenizer_corpus.txt); CPU: $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
echo "tokenizers $("$py" -c 'import tokenizers; print(tokenizers.__version__)'), one core (taskset -c 0), best of $runs"
: >"$tmp/empty.txt"
for family in wordpiece bpe; do
    case $family in
    wordpiece) spec=$assets/minilm/tokenizer.json name="WordPiece (all-MiniLM-L6-v2)" ;;
    bpe) spec=$assets/gpt2 name="byte-level BPE (GPT-2)" ;;
    esac
    total=$(best_of ours "$spec" "$tmp/text.txt")
    load=$(best_of ours "$spec" "$tmp/empty.txt")
    encode=$(calc "$total - $load")
    batch=$(hf "$spec")
    per_line=$(hf "$spec" --per-line)
    echo "$name"
    printf '  tunegraph tokenize, whole command  %8.3f s  %s\n' "$total" "$(rate "$total")"
    printf '  tunegraph, encode (less %.3f s open) %6.3f s  %s\n' "$load" "$encode" "$(rate "$encode")"
    printf '  HF encode_batch, one thread        %8.3f s  %s\n' "$batch" "$(rate "$batch")"
    printf '  HF encode, one call a line         %8.3f s  %s\n' "$per_line" "$(rate "$per_line")"
    printf '  tunegraph whole command vs HF batch: %.1fx\n' "$(calc "$batch / $total")"
done
