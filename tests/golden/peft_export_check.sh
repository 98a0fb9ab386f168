#!/usr/bin/env bash
# Trains LoRA adapters with tunegraph, exports them, and checks with Hugging Face PEFT that
# the export loads and computes what tunegraph computes (tests/golden/check_peft_export.py),
# in two phases so the tunegraph side and the PyTorch side can run on different machines:
#
#   tests/golden/peft_export_check.sh prepare DIR [TUNEGRAPH]
#       For each case: writes seeded data and jobs into DIR/CASE, trains the base model a
#       few steps from a preset's random weights and exports it (DIR/CASE/base), LoRA-tunes
#       that folder a few steps (`run --save --save-dir DIR/CASE/lora --metrics`), predicts
#       the eval logits with the LoRA plan and its saved weights (DIR/CASE/logits.jsonl) and
#       keeps the eval loss and sequence length for the check. Cases: tiny-llama LM (adapters
#       on all seven projections) and tiny-llama classification (q_proj and v_proj, adapter
#       dropout 0.1, the head as modules_to_save); tiny-bert classification (query, key,
#       value and dense, which takes the pooler's dense too), tiny-roberta classification
#       (the encoder's dense; the classification head, dense and all, as modules_to_save),
#       tiny-gpt2 LM (c_attn, c_proj and c_fc over Conv1D weights: fan_in_fan_out) and
#       tiny-gpt2 classification (PEFT's default c_attn, score saved whole), and tiny-gpt2 LM
#       with paths' tails (mlp.c_proj, not attn.c_proj; layer 1's c_attn alone: the
#       adapter config names the modules' paths), and lora_modules_to_save: tiny-gpt2 LM with
#       ln_f, and with the position table wpe, and tiny-llama LM with norm and its untied
#       lm_head trained whole. With
#       build/examples/bbc-news-lora/lora there (examples/bbc-news/run-lora.sh), also that
#       run: its base and LoRA folders, its eval split dumped, its eval loss, and the logits
#       of two eval records cut to 16 tokens. TUNEGRAPH: the binary (default build/tunegraph).
#
#   tests/golden/peft_export_check.sh check DIR [PYTHON]
#       Runs check_peft_export.py on each prepared case with PYTHON (default python3; it
#       needs torch, transformers, peft and safetensors). Prints one PASS or FAIL line per
#       case and exits 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/../.."

phase=${1:?usage: tests/golden/peft_export_check.sh prepare|check DIR ...}
dir=${2:?usage: tests/golden/peft_export_check.sh prepare|check DIR ...}
shift 2

# case name, preset, task, labels (- for an LM), the LoRA keys (; between them)
cases() {
    echo "llama-lm tiny-llama lm - lora_r = 4;lora_alpha = 8;lora_targets = q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    echo "llama-classify tiny-llama classify 3 lora_r = 4;lora_alpha = 16;lora_dropout = 0.1;lora_targets = q_proj,v_proj"
    echo "bert-classify tiny-bert classify 3 lora_r = 4;lora_alpha = 16;lora_dropout = 0.1;lora_targets = query,key,value,dense"
    echo "roberta-classify tiny-roberta classify 2 lora_r = 4;lora_targets = query,value,dense"
    echo "gpt2-lm tiny-gpt2 lm - lora_r = 4;lora_alpha = 8;lora_targets = c_attn,c_proj,c_fc"
    echo "gpt2-classify tiny-gpt2 classify 2 lora_r = 4;lora_alpha = 16"
    echo "gpt2-lm-paths tiny-gpt2 lm - lora_r = 4;lora_alpha = 8;lora_targets = mlp.c_proj,h.1.attn.c_attn"
    echo "gpt2-lm-save tiny-gpt2 lm - lora_r = 4;lora_alpha = 8;lora_modules_to_save = ln_f"
    echo "gpt2-lm-save-wpe tiny-gpt2 lm - lora_r = 4;lora_alpha = 8;lora_modules_to_save = wpe"
    echo "llama-lm-save tiny-llama lm - lora_r = 4;lora_alpha = 8;lora_modules_to_save = norm,lm_head"
}

# write_data CASE_DIR LABELS: seeded train and eval JSON Lines over ids 3..127 (tiny-llama's
# vocabulary, past the padding id 0).
write_data() {
    python3 - "$@" <<'EOF'
import json, random, sys
out, labels = sys.argv[1], sys.argv[2]
rng = random.Random(20261127)
for name, rows in (("train", 64), ("eval", 24)):
    with open(f"{out}/{name}.jsonl", "w") as f:
        for _ in range(rows):
            row = {"input_ids": [rng.randrange(3, 128) for _ in range(rng.randrange(6, 32))]}
            if labels != "-":
                row["label"] = rng.randrange(int(labels))
            f.write(json.dumps(row) + "\n")
EOF
}

# eval_loss METRICS.jsonl: the summary's eval_loss.
eval_loss() { python3 -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if l.strip()][-1]["eval_loss"])' "$1"; }

prepare() {
    local bin=${1:-build/tunegraph} failed=0
    mkdir -p "$dir"
    while read -r name preset task labels lora; do
        local c=$dir/$name
        rm -rf "$c" && mkdir -p "$c"
        write_data "$c" "$labels"
        local head=("task = $task")
        [ "$labels" != - ] && head+=("num_labels = $labels")
        # Decoder classification pools at the last non-padding token: it needs a padding id.
        # RoBERTa keeps its config's (1): its position ids count from it, as HF's do.
        [ "$labels" != - ] && [ "$preset" != tiny-roberta ] && head+=("pad_token_id = 0")
        printf '%s\n' "model = $preset" "${head[@]}" "batch = 8" "seq = 32" "steps = 20" "lr = 1e-2" "seed = 7" \
            "train_data = train.jsonl" "eval_data = eval.jsonl" >"$c/base.job"
        # The LoRA job: the base folder, its own seed, a learning rate that moves the adapters.
        { printf '%s\n' "model = ./base" "${head[@]}" "batch = 8" "seq = 32" "steps = 20" "lr = 2e-2" "seed = 11" \
            "train_data = train.jsonl" "eval_data = eval.jsonl"; echo "$lora" | tr ';' '\n'; } >"$c/lora.job"
        if "$bin" run "$c/base.job" --device cpu --save-dir "$c/base" >"$c/base.log" 2>&1 &&
            "$bin" run "$c/lora.job" --device cpu --save "$c/lora.safetensors" --save-dir "$c/lora" \
                --metrics "$c/metrics.jsonl" >"$c/lora.log" 2>&1 &&
            "$bin" predict "$c/lora.job" --weights "$c/lora.safetensors" --device cpu -o "$c/logits.jsonl" \
                >"$c/predict.log" 2>&1; then
            eval_loss "$c/metrics.jsonl" >"$c/eval_loss"
            cp "$c/eval.jsonl" "$c/eval-data.jsonl"
            echo 32 >"$c/seq"
            echo "prepared $name: $(tail -1 "$c/predict.log")"
        else
            echo "FAIL $name: tunegraph failed (logs in $c)"
            failed=1
        fi
    done < <(cases)

    # The BBC News LoRA run, when examples/bbc-news/run-lora.sh has made it.
    local run=build/examples/bbc-news-lora
    if [ -f "$run/lora/adapter/adapter_config.json" ] && [ -f "$run/lora-metrics.jsonl" ]; then
        local c=$dir/bbc-news-lora
        rm -rf "$c" && mkdir -p "$c"
        ln -s "$(pwd)/$run/base" "$c/base"
        ln -s "$(pwd)/$run/lora" "$c/lora"
        "$bin" inspect "$run/lora.plan" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["train"]["seq"])' \
            >"$c/seq" 2>/dev/null || echo 128 >"$c/seq"
        eval_loss "$run/lora-metrics.jsonl" >"$c/eval_loss"
        if "$bin" data dump "$run/tech/eval" -o "$c/eval-data.jsonl" >"$c/dump.log" 2>&1 &&
            python3 -c 'import json,sys
rows = [json.loads(l) for l in open(sys.argv[1])][:2]
with open(sys.argv[2], "w") as f:
    for r in rows: f.write(json.dumps({"input_ids": r["input_ids"][:16]}) + "\n")' "$c/eval-data.jsonl" "$c/short.jsonl" &&
            "$bin" predict "$run/lora.plan" --weights "$run/lora.safetensors" --data "$c/short.jsonl" --device cpu \
                -o "$c/logits.jsonl" >"$c/predict.log" 2>&1; then
            echo "prepared bbc-news-lora: seq $(cat "$c/seq"), eval loss $(cat "$c/eval_loss"); $(tail -1 "$c/predict.log")"
        else
            echo "FAIL bbc-news-lora: tunegraph failed (logs in $c)"
            failed=1
        fi
    fi
    return $failed
}

check() {
    local python=${1:-python3} failed=0 n=0
    for c in "$dir"/*/; do
        c=${c%/}
        [ -d "$c/lora" ] || continue
        local name=${c##*/} log=$c/check.log
        n=$((n + 1))
        PYTHONUNBUFFERED=1 "$python" tests/golden/check_peft_export.py "$c/base" "$c/lora" --logits "$c/logits.jsonl" \
            --eval-data "$c/eval-data.jsonl" --eval-loss "$(cat "$c/eval_loss")" --seq "$(cat "$c/seq")" >"$log" 2>&1
        local rc=$?
        grep -E '^(  ok|  FAIL|[^ ].*: \[)' "$log"
        if [ $rc -eq 0 ]; then
            echo "PASS $name"
        else
            echo "FAIL $name (log: $log)"
            failed=1
        fi
    done
    [ $n -gt 0 ] || { echo "FAIL: no prepared case in $dir"; return 1; }
    return $failed
}

case $phase in
prepare) prepare "$@" ;;
check) check "$@" ;;
*) echo "usage: tests/golden/peft_export_check.sh prepare|check DIR ..." >&2; exit 2 ;;
esac
