#!/usr/bin/env bash
# Every Unicode code point through `tunegraph tokenize` and Hugging Face `tokenizers`:
# one line a code point C (all but surrogates, NUL and '\n'), "aCb CC 1C  Cx'sC", for
# WordPiece (all-MiniLM-L6-v2) and byte-level BPE (GPT-2; Llama 3.2, whose Split pattern
# classes letters, numbers and spaces its own way). Prints how many lines differ
# and the code points where they do, as ranges. A few minutes (HF takes most of it).
#
#   bench/tokenizer_codepoint_sweep.sh
#
# Needs build/tunegraph and scripts/fetch_assets.sh's files and reference library.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cli=$root/build/tunegraph
assets=${TG_ASSETS:-$root/build/assets}
"$root/scripts/fetch_assets.sh"
py=$assets/venv/bin/python
ref=$root/tests/tokenizer_reference.py
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tg-toksweep.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

"$py" - "$tmp/sweep.txt" <<'EOF'
import sys
with open(sys.argv[1], "w", encoding="utf-8", newline="") as out:
    for c in range(1, 0x110000):
        if 0xD800 <= c <= 0xDFFF or c == 10:
            continue
        ch = chr(c)
        out.write("a%sb %s%s 1%s  %sx's%s\n" % (ch, ch, ch, ch, ch, ch))
EOF

for family in wordpiece bpe llama; do
    case $family in
    wordpiece) spec=$assets/minilm/tokenizer.json name="WordPiece (all-MiniLM-L6-v2)" ;;
    bpe) spec=$assets/gpt2 name="byte-level BPE (GPT-2)" ;;
    llama) spec=$assets/llama3/tokenizer.json name="byte-level BPE (Llama 3.2)" ;;
    esac
    "$py" "$ref" encode "$spec" <"$tmp/sweep.txt" >"$tmp/$family.hf"
    "$cli" tokenize --tokenizer "$spec" <"$tmp/sweep.txt" >"$tmp/$family.tg"
    paste -d '\t' "$tmp/$family.hf" "$tmp/$family.tg" | awk -F '\t' '$1 != $2 { print NR }' >"$tmp/$family.diff"
    echo "$name: $(wc -l <"$tmp/$family.diff") of $(wc -l <"$tmp/sweep.txt") code points differ"
    "$py" - "$tmp/sweep.txt" "$tmp/$family.diff" <<'EOF'
import sys
lines = open(sys.argv[1], encoding="utf-8", newline="").read().split("\n")
cps = [ord(lines[int(n) - 1][1]) for n in open(sys.argv[2])]
ranges = []
for c in cps:
    if ranges and c == ranges[-1][1] + 1:
        ranges[-1][1] = c
    else:
        ranges.append([c, c])
if ranges:
    print("  " + " ".join("%04X-%04X" % (a, b) if a != b else "%04X" % a for a, b in ranges))
EOF
done
