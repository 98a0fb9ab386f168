#!/usr/bin/env bash
# Exports trained models with `tunegraph export` and checks with transformers that the
# folders give tunegraph's logits (tests/golden/check_hf_export.py), in two phases so the
# tunegraph side can run where the model files are and the transformers side on a machine
# with PyTorch:
#
#   tests/golden/hf_export_check.sh prepare DIR [TUNEGRAPH]
#       For each case: writes a job and seeded data into DIR/CASE, trains a few steps on
#       the CPU (`run --save`), exports the folder (DIR/CASE/hf) and predicts the eval
#       logits from that folder (DIR/CASE/logits-cpu.jsonl). Cases: tiny BERT, RoBERTa and
#       GPT-2 classifiers, a tiny GPT-2 LM and tiny BERT and RoBERTa masked LMs (whose
#       logits files hold the ids as the eval masked them; fp32 folders), and all-MiniLM-L6-v2 with a
#       new 5-label head when build/assets/all-minilm-l6-v2 is there (scripts/fetch_assets.sh
#       minilm), exported in bf16 to stay small: its logits are tunegraph's fp32 forward
#       over those bf16 weights, which transformers loads in float32 too. TUNEGRAPH: the
#       binary (default build/tunegraph).
#
#   tests/golden/hf_export_check.sh check DIR [--device cuda|cpu]
#       With $TUNEGRAPH_CUDA naming a GPU build (build/gpu/tunegraph) and a GPU present,
#       first predicts each case's logits again on CUDA (DIR/CASE/logits-cuda.jsonl). Then
#       checks each logits file against transformers in fp32 (1e-4), and the CPU logits
#       against the model run in bf16 (2e-2). Prints one PASS or FAIL line per check and
#       exits 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/../.."

phase=${1:?usage: tests/golden/hf_export_check.sh prepare|check DIR ...}
dir=${2:?usage: tests/golden/hf_export_check.sh prepare|check DIR ...}
shift 2

# case name, model, task, labels (comma-separated, or - for an LM), export dtype
cases() {
    echo "bert tiny-bert classify neg,neutral,pos fp32"
    echo "roberta tiny-roberta classify neg,neutral,pos fp32"
    echo "gpt2-classify tiny-gpt2 classify neg,neutral,pos fp32"
    echo "gpt2-lm tiny-gpt2 lm - fp32"
    echo "bert-mlm tiny-bert mlm - fp32"
    echo "roberta-mlm tiny-roberta mlm - fp32"
    echo "bert-qa tiny-bert qa - fp32"
    if [ -f build/assets/all-minilm-l6-v2/model.safetensors ]; then
        echo "minilm $(pwd)/build/assets/all-minilm-l6-v2 classify business,entertainment,politics,sport,tech bf16"
    fi
}

# write_data CASE_DIR TASK LABELS VOCAB FIRST: seeded train and eval JSON Lines. Ids start
# at FIRST, past the special and padding ids, so every framework finds the same real tokens.
write_data() {
    python3 - "$@" <<'EOF'
import json, random, sys
out, task, labels, vocab, first = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
n_labels = 0 if labels == "-" else len(labels.split(","))
rng = random.Random(20261125)
for name, rows in (("train", 64), ("eval", 48)):
    with open(f"{out}/{name}.jsonl", "w") as f:
        for _ in range(rows):
            ids = [rng.randrange(first, vocab) for _ in range(rng.randrange(4, 40))]
            row = {"input_ids": ids}
            if n_labels:
                row["label"] = rng.randrange(n_labels)
            f.write(json.dumps(row) + "\n")
EOF
}

# write_squad CASE_DIR: a seeded SQuAD v2 file over a small word list, that list as a
# WordPiece vocab.txt (within tiny-bert's 128 ids), for task = qa: `data convert` makes
# the shard set (CASE_DIR/set, its eval split with its SQuAD eval file) of them.
write_squad() {
    python3 - "$1" <<'EOF'
import json, random, sys
out = sys.argv[1]
words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
         "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango"]
with open(f"{out}/vocab.txt", "w") as f:
    f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n")
rng = random.Random(20261126)
data = []
for a in range(12):
    toks = [rng.choice(words) for _ in range(rng.randrange(20, 50))]
    context = " ".join(toks)
    qas = []
    for q in range(3):
        question = " ".join(rng.choice(words) for _ in range(rng.randrange(2, 5)))
        if rng.random() < 0.3:
            qas.append({"id": f"{a}-{q}", "question": question, "answers": [], "is_impossible": True})
            continue
        i, n = rng.randrange(len(toks) - 3), rng.randrange(1, 4)
        start = len(" ".join(toks[:i])) + (1 if i else 0)
        qas.append({"id": f"{a}-{q}", "question": question,
                    "answers": [{"text": " ".join(toks[i:i + n]), "answer_start": start}]})
    data.append({"title": str(a), "paragraphs": [{"context": context, "qas": qas}]})
with open(f"{out}/squad.json", "w") as f:
    json.dump({"version": "v2.0", "data": data}, f)
EOF
}

prepare() {
    local bin=${1:-build/tunegraph} failed=0
    mkdir -p "$dir"
    while read -r name model task labels dtype; do
        local c=$dir/$name
        rm -rf "$c" && mkdir -p "$c"
        local vocab=128 first=3 extra=""
        case $model in *minilm*) vocab=30522 first=1000 ;; esac
        [ "$model" = tiny-gpt2 ] && [ "$task" = classify ] && extra="pad_token_id = 0"
        {
            echo "model = $model"
            echo "task = $task"
            [ "$labels" != - ] && echo "num_labels = $(echo "$labels" | tr , '\n' | wc -l)"
            echo "batch = 8"
            echo "seq = 32"
            echo "steps = 20"
            echo "lr = 1e-3"
            echo "train_data = train.jsonl"
            echo "eval_data = eval.jsonl"
            [ -n "$extra" ] && echo "$extra"
        } >"$c/job.job"
        if [ "$task" = qa ]; then
            write_squad "$c"
            sed -i -e 's|^train_data = .*|train_data = set|' -e 's|^eval_data = .*|eval_data = set/eval|' "$c/job.job"
            if ! "$bin" data convert "$c/squad.json" -o "$c/set" --tokenizer "$c/vocab.txt" --seq 32 --doc-stride 8 \
                --eval-fraction 0.3 >"$c/convert.log" 2>&1; then
                echo "FAIL $name: data convert failed (logs in $c)"
                failed=1
                continue
            fi
        else
            write_data "$c" "$task" "$labels" "$vocab" "$first"
        fi
        local label_args=()
        [ "$labels" != - ] && label_args=(--labels "$labels")
        if "$bin" run "$c/job.job" --device cpu --save "$c/w.safetensors" >"$c/run.log" 2>&1 &&
            "$bin" export "$c/job.job" --weights "$c/w.safetensors" -o "$c/hf" "${label_args[@]}" --dtype "$dtype" \
                >"$c/export.log" 2>&1 &&
            "$bin" predict "$c/job.job" --set model="$c/hf" --device cpu -o "$c/logits-cpu.jsonl" >"$c/predict.log" 2>&1
        then
            rm -f "$c/w.safetensors" # the folder holds the weights
            echo "prepared $name: $(tail -1 "$c/predict.log")"
        else
            echo "FAIL $name: tunegraph failed (logs in $c)"
            failed=1
        fi
    done < <(cases)
    return $failed
}

check() {
    local device_args=("$@") failed=0 n=0
    for c in "$dir"/*/; do
        c=${c%/}
        [ -f "$c/hf/config.json" ] || continue
        local name=${c##*/}
        if [ -n "${TUNEGRAPH_CUDA:-}" ] && command -v nvidia-smi >/dev/null; then
            if ! "$TUNEGRAPH_CUDA" predict "$c/job.job" --set model="$c/hf" --device cuda -o "$c/logits-cuda.jsonl" \
                >"$c/predict-cuda.log" 2>&1; then
                echo "FAIL $name: tunegraph predict on CUDA failed: $(tail -1 "$c/predict-cuda.log")"
                failed=1
            fi
        fi
        for logits in "$c"/logits-*.jsonl; do
            local run=${logits##*/logits-}
            run=${run%.jsonl}
            local dtypes=(fp32)
            [ "$run" = cpu ] && dtypes+=(bf16)
            for dtype in "${dtypes[@]}"; do
                n=$((n + 1))
                local log=$c/check-$run-$dtype.log
                PYTHONUNBUFFERED=1 python3 tests/golden/check_hf_export.py "$c/hf" "$logits" --dtype "$dtype" \
                    "${device_args[@]}" >"$log" 2>&1
                local rc=$?
                local verdict=FAIL
                [ $rc -eq 0 ] && verdict=PASS
                [ $rc -eq 0 ] || failed=1
                echo "$verdict $name: tunegraph $run logits vs transformers $dtype: $(grep 'max abs diff' "$log" || tail -1 "$log")"
            done
        done
    done
    [ $n -gt 0 ] || { echo "FAIL: no prepared case in $dir"; return 1; }
    return $failed
}

case $phase in
prepare) prepare "$@" ;;
check) check "$@" ;;
*) echo "usage: tests/golden/hf_export_check.sh prepare|check DIR ..." >&2; exit 2 ;;
esac
