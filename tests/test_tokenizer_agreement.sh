#!/usr/bin/env bash
# `tunegraph tokenize` against Hugging Face `tokenizers`, token for token and offset for
# offset, on the committed corpus (tests/data/tokenizer_corpus.txt, 2,500 lines, and
# tests/data/tokenizer_pairs.txt, 1,200 pairs; tests/data/make_tokenizer_corpus.py makes
# them), with real tokenizer files fetched by scripts/fetch_assets.sh:
#   all-MiniLM-L6-v2 (WordPiece, lower-casing): its tokenizer.json, its folder, and its
#     vocabulary as a vocab.txt; single texts, pairs, truncation, no special tokens
#   GPT-2 (byte-level BPE): the encoder.json + vocab.bpe folder; single texts and pairs
#   RoBERTa's template (<s> A </s></s> B </s>) over GPT-2's files, as a tokenizer.json
#     that HF builds; single texts, pairs, pairs with truncation
#   Llama 3.2 (byte-level BPE after its Split pattern, <|begin_of_text|> A, pairs
#     <|begin_of_text|> A <|begin_of_text|> B): its tokenizer.json and its folder; single
#     texts, truncation, no special tokens, pairs, pairs with truncation, the corpus with
#     Llama's special tokens written in the text; and `data convert --format text` with
#     the folder (each line's tokens, then the eos token of its tokenizer_config.json)
# Run by `make test` (and `make test-asan`, with TG_TEST_CLI). Where the files or the
# reference library cannot be installed (no network), prints "not run" and why.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cli=${TG_TEST_CLI:-$root/build/tunegraph}
case $cli in /*) ;; *) cli=$root/$cli ;; esac
assets=${TG_ASSETS:-$root/build/assets}
corpus=$root/tests/data/tokenizer_corpus.txt
pairs=$root/tests/data/tokenizer_pairs.txt

if ! why=$("$root/scripts/fetch_assets.sh" 2>&1 >/dev/null); then
    echo "not run test_tokenizer_agreement: ${why:-scripts/fetch_assets.sh failed}"
    exit 0
fi
py=$assets/venv/bin/python
ref=$root/tests/tokenizer_reference.py
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tg-tokagree.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

"$py" "$ref" roberta "$assets/gpt2" "$tmp/roberta.json" || { echo "FAIL test_tokenizer_agreement: building the RoBERTa tokenizer.json"; exit 1; }
"$py" "$ref" vocab-txt "$assets/minilm/tokenizer.json" "$tmp/bert-vocab" || { echo "FAIL test_tokenizer_agreement: writing vocab.txt"; exit 1; }

failed=0 cases=0 lines=0 tokens=0
# check NAME OURS_PATH HF_SPEC INPUT [OPTIONS...]
check() {
    local name=$1 ours=$2 spec=$3 input=$4
    shift 4
    if ! "$py" "$ref" encode "$spec" "$@" --offsets <"$input" >"$tmp/$name.hf" 2>"$tmp/$name.hf.err"; then
        echo "FAIL test_tokenizer_agreement: $name: the reference failed: $(tail -1 "$tmp/$name.hf.err")"
        failed=1
        return
    fi
    if ! "$cli" tokenize --tokenizer "$ours" "$@" --offsets <"$input" >"$tmp/$name.tg" 2>"$tmp/$name.tg.err"; then
        echo "FAIL test_tokenizer_agreement: $name: tunegraph tokenize failed: $(tail -1 "$tmp/$name.tg.err")"
        failed=1
        return
    fi
    local n bad
    n=$(wc -l <"$input")
    bad=$(paste -d '\n' "$tmp/$name.hf" "$tmp/$name.tg" | paste - - | awk -F '\t' '$1 != $2' | wc -l)
    if [ "$(wc -l <"$tmp/$name.tg")" -ne "$n" ] || [ "$(wc -l <"$tmp/$name.hf")" -ne "$n" ]; then
        echo "FAIL test_tokenizer_agreement: $name: $(wc -l <"$tmp/$name.tg") lines out (HF $(wc -l <"$tmp/$name.hf")) for $n in"
        failed=1
    elif [ "$bad" -ne 0 ]; then
        echo "FAIL test_tokenizer_agreement: $name ($*): $bad of $n lines differ from HF tokenizers; the first:"
        paste -d '\t' "$tmp/$name.hf" "$tmp/$name.tg" | awk -F '\t' '$1 != $2 { print NR; exit }' | while read -r at; do
            echo "    line $at: $(sed -n "${at}p" "$input" | cut -c1-200)"
            echo "    HF:   $(sed -n "${at}p" "$tmp/$name.hf" | cut -c1-300)"
            echo "    ours: $(sed -n "${at}p" "$tmp/$name.tg" | cut -c1-300)"
        done
        failed=1
    fi
    cases=$((cases + 1))
    lines=$((lines + n))
    tokens=$((tokens + $(wc -w <"$tmp/$name.tg")))
}

minilm=$assets/minilm
check minilm "$minilm/tokenizer.json" "$minilm/tokenizer.json" "$corpus"
check minilm-folder "$minilm" "$minilm/tokenizer.json" "$corpus" --max-len 16
check minilm-vocab-txt "$tmp/bert-vocab/vocab.txt" "$minilm/tokenizer.json" "$corpus"
check minilm-no-special "$minilm" "$minilm/tokenizer.json" "$corpus" --no-special
check minilm-pair "$minilm" "$minilm/tokenizer.json" "$pairs" --pair
check minilm-pair-trunc "$minilm" "$minilm/tokenizer.json" "$pairs" --pair --max-len 48
check gpt2 "$assets/gpt2" "$assets/gpt2" "$corpus"
check gpt2-pair "$assets/gpt2" "$assets/gpt2" "$pairs" --pair --max-len 64
check roberta "$tmp/roberta.json" "$tmp/roberta.json" "$corpus"
check roberta-pair "$tmp/roberta.json" "$tmp/roberta.json" "$pairs" --pair
check roberta-pair-trunc "$tmp/roberta.json" "$tmp/roberta.json" "$pairs" --pair --max-len 40

llama=$assets/llama3
# the corpus with Llama's special tokens where it writes BERT's and GPT-2's
llama_specials='s/<|endoftext|>/<|end_of_text|>/g; s/\[CLS\]/<|begin_of_text|>/g; s/\[SEP\]/<|eot_id|>/g;'
llama_specials+=' s/\[MASK\]/<|reserved_special_token_7|>/g; s/\[PAD\]/<|finetune_right_pad_id|>/g'
sed "$llama_specials" "$corpus" >"$tmp/llama-corpus.txt"
sed "$llama_specials" "$pairs" >"$tmp/llama-pairs.txt"
check llama3 "$llama/tokenizer.json" "$llama/tokenizer.json" "$corpus"
check llama3-folder "$llama" "$llama/tokenizer.json" "$corpus" --max-len 16
check llama3-no-special "$llama" "$llama/tokenizer.json" "$corpus" --no-special
check llama3-specials "$llama" "$llama/tokenizer.json" "$tmp/llama-corpus.txt"
check llama3-pair "$llama" "$llama/tokenizer.json" "$pairs" --pair
check llama3-pair-trunc "$llama" "$llama/tokenizer.json" "$tmp/llama-pairs.txt" --pair --max-len 48

# data convert --format text: the records' ids, as the reference cuts the same stream
if ! "$cli" data convert "$corpus" -o "$tmp/llama-lm" --tokenizer "$llama" --format text --seq 256 >/dev/null \
    2>"$tmp/llama-lm.err" || ! "$cli" data dump "$tmp/llama-lm/train" -o "$tmp/llama-lm.jsonl" 2>>"$tmp/llama-lm.err"; then
    echo "FAIL test_tokenizer_agreement: llama3-data-convert: $(tail -1 "$tmp/llama-lm.err")"
    failed=1
else
    "$py" "$ref" dump-ids <"$tmp/llama-lm.jsonl" >"$tmp/llama-lm.tg"
    "$py" "$ref" lm-text "$llama" 256 <"$corpus" >"$tmp/llama-lm.hf"
    if ! cmp -s "$tmp/llama-lm.hf" "$tmp/llama-lm.tg"; then
        echo "FAIL test_tokenizer_agreement: llama3-data-convert: the records differ from HF tokenizers' ids" \
            "($(wc -l <"$tmp/llama-lm.tg") records, HF $(wc -l <"$tmp/llama-lm.hf"))"
        failed=1
    fi
    cases=$((cases + 1))
    lines=$((lines + $(wc -l <"$corpus")))
    tokens=$((tokens + $(wc -w <"$tmp/llama-lm.tg")))
fi

if [ $failed -ne 0 ]; then exit 1; fi
echo "ok   test_tokenizer_agreement ($cases cases, $lines lines, $tokens tokens: ids and offsets equal to HF tokenizers $("$py" -c 'import tokenizers; print(tokenizers.__version__)'))"
