# The benchmark cases (bench/jobs/CASE.job) and their synthetic data, sourced by the bench
# scripts that run them. Each job reads /tmp/tunegraph-bench/CASE.jsonl.
bench_default_cases=(bert-base-cls-b32-t128 bert-base-cls-b8-t512 gpt2-lm-b16-t1024)

# Prints the arguments of bench/make_synthetic_data.py for CASE; an unknown case fails (2).
bench_case_data_args() {
    case $1 in
    bert-base-cls-b32-t128) echo "--vocab 30522 --seq 128 --count 2048 --labels 2" ;;
    bert-base-cls-b8-t512) echo "--vocab 30522 --seq 512 --count 512 --labels 2" ;;
    gpt2-lm-b16-t1024) echo "--vocab 50257 --seq 1024 --count 512" ;;
    bert-base-mlm-b4-t512) echo "--vocab 30522 --seq 512 --count 512" ;;
    llama-3.2-1b-lm-b4-t2048) echo "--vocab 128256 --seq 2048 --count 256" ;;
    llama-3-8b-lora-b1-t4096) echo "--vocab 128256 --seq 4096 --count 64" ;;
    llama-3-8b-lora-b2-t2048) echo "--vocab 128256 --seq 2048 --count 128" ;;
    mobilenet-v2-b64-s100 | mobilenet-v2-b64-s224 | mobilenet-v2-b64-s500 | mobilenet-v2-b64-s100-bf16 | \
        mobilenet-v2-b64-s224-bf16 | mobilenet-v2-b64-s500-bf16 | mobilenet-v2-b64-s100-fp16 | \
        mobilenet-v2-b64-s224-fp16 | mobilenet-v2-b64-s500-fp16) echo "--count 512" ;;
    *) echo "unknown case $1" >&2; return 2 ;;
    esac
}

# Writes CASE's synthetic data where its job reads it. The SQuAD case converts a synthetic
# SQuAD v2 file with the WordPiece tokenizer.json named by $BENCH_TOKENIZER (bert-base's
# vocabulary size: all-MiniLM-L6-v2's tokenizer is the bert-base-uncased vocabulary) using
# ${TUNEGRAPH:-build/gpu/tunegraph}.
bench_make_case_data() {
    local args
    if [ "$1" = bert-base-qa-b32-t384 ]; then
        mkdir -p /tmp/tunegraph-bench
        python3 bench/make_synthetic_squad.py /tmp/tunegraph-bench/squad.json --paragraphs 300 &&
            rm -rf "/tmp/tunegraph-bench/$1" &&
            "${TUNEGRAPH:-build/gpu/tunegraph}" data convert /tmp/tunegraph-bench/squad.json -o "/tmp/tunegraph-bench/$1" \
                --tokenizer "${BENCH_TOKENIZER:?BENCH_TOKENIZER names the tokenizer.json of the SQuAD case}" --format squad --seq 384
        return
    fi
    args=$(bench_case_data_args "$1") || return 2
    case $1 in
    mobilenet-v2-b64-s*) # synthetic IDX digits converted at the case's image size (the -bf16 and -fp16
        # cases' too: mobilenet-v2-b64-sSIZE[-PRECISION])
        local dir=/tmp/tunegraph-bench/$1-idx size=${1#mobilenet-v2-b64-s}
        size=${size%%-*}
        python3 bench/make_synthetic_idx.py "$dir" $args &&
            rm -rf "/tmp/tunegraph-bench/$1" &&
            "${TUNEGRAPH:-build/gpu/tunegraph}" data convert "$dir/train-images-idx3-ubyte" -o "/tmp/tunegraph-bench/$1" \
                --format idx --image-size "$size"
        return ;;
    esac
    mkdir -p /tmp/tunegraph-bench
    python3 bench/make_synthetic_data.py "/tmp/tunegraph-bench/$1.jsonl" $args
}
