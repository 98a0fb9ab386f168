#!/usr/bin/env bash
# Length buckets on real text: all-MiniLM-L6-v2 classifying BBC News, once on the articles
# (cut to 512 tokens; most are 200 to 512+ long) and once on their paragraphs (1 to ~250
# tokens: widely varying lengths), each for one epoch with one sequence length and with
# seq_buckets. Reports, per case, the padding share of the token slots, the training time
# of the epoch, the median step, the batch wait and the eval accuracy.
#
#   bench/buckets.sh prepare            converts both shard sets into build/bench-buckets/
#                                       (needs build/assets: scripts/fetch_assets.sh minilm bbcnews)
#   bench/buckets.sh run OUTDIR [--device cpu|cuda] [--epochs N]
#                                       runs every case with build/bench-buckets/ and
#                                       build/assets/all-minilm-l6-v2 in place; writes each
#                                       case's metrics and OUTDIR/buckets-summary.txt
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
data=build/bench-buckets
model=${BENCH_MODEL:-build/assets/all-minilm-l6-v2} # BENCH_MODEL: another copy of the model folder

prepare() {
    local tg=${TUNEGRAPH:-build/tunegraph}
    [ -x "$tg" ] || make -s build/tunegraph
    [ -f "$model/tokenizer.json" ] || scripts/fetch_assets.sh minilm
    [ -d build/assets/bbc-news ] || scripts/fetch_assets.sh bbcnews
    rm -rf "$data"
    mkdir -p "$data"
    "$tg" data convert build/assets/bbc-news --format folders -o "$data/articles" --tokenizer "$model" \
        --seq 512 --eval-fraction 0.2 --seed 1 --skip-invalid
    # One record per paragraph (blank-line separated, the title line included as its own),
    # labelled with its article's topic.
    python3 - "$data/paragraphs.jsonl" <<'PY'
import json, pathlib, sys
out = open(sys.argv[1], "w")
for topic in sorted(pathlib.Path("build/assets/bbc-news").iterdir()):
    for f in sorted(topic.glob("*.txt")):
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # sports/199.txt: Latin-1, as the example leaves it out
        for para in text.split("\n\n"):
            para = " ".join(para.split())
            if para:
                out.write(json.dumps({"text": para, "label": topic.name}) + "\n")
PY
    "$tg" data convert "$data/paragraphs.jsonl" --format jsonl --text-column text --label-column label \
        -o "$data/paragraphs" --tokenizer "$model" --seq 256 --eval-fraction 0.2 --seed 1
    rm "$data/paragraphs.jsonl"
}

# case NAME SETS... : compiles and runs one case, appends its summary to the table.
run_case() {
    local name=$1 set_name=$2 seq=$3 buckets=$4
    local job=$out/$name.job plan=$out/$name.plan
    {
        echo "model = $root/$model"
        echo "task = classify"
        echo "num_labels = 5"
        echo "batch = 32"
        echo "seq = $seq"
        [ -n "$buckets" ] && echo "seq_buckets = $buckets"
        echo "precision = $precision"
        echo "lr = 1e-4"
        echo "warmup_steps = 10"
        echo "epochs = $epochs"
        echo "weight_decay = 0.01"
        echo "grad_clip = 1.0"
        echo "seed = 42"
        echo "log_every = 1000"
        echo "train_data = $root/$data/$set_name"
        echo "eval_data = $root/$data/$set_name/eval"
    } >"$job"
    "$tg" compile "$job" -o "$plan"
    "$tg" run "$plan" --device "$device" --metrics "$out/$name.jsonl" 2>&1 | tee "$out/$name.log"
    python3 - "$out/$name.jsonl" "$name" "${buckets:-$seq}" "$epochs" >>"$out/buckets-summary.txt" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
s = [l for l in lines if l.get("summary")][-1]
steps = [l for l in lines if "step" in l and "summary" not in l]
# Step time without each bucket's first step (which waits for its graph's capture and GEMM
# timing), and the mean step per length.
by_seq, seen, steps_ms = {}, set(), 0.0
for l in steps:
    if l["seq"] in seen:
        steps_ms += l["step_ms"]
        by_seq.setdefault(l["seq"], []).append(l["step_ms"])
    seen.add(l["seq"])
per_seq = " ".join(f"{q}:{sum(v) / len(v):.3f}x{len(v) + 1}" for q, v in sorted(by_seq.items()))
print(f"{sys.argv[2]:<20} {sys.argv[3]:<16} {s['steps']:>6} {100 * s['padding_fraction']:>8.1f}% "
      f"{s['train_s'] / int(sys.argv[4]):>9.3f} {steps_ms / 1e3 / int(sys.argv[4]):>9.3f} {s['median_step_ms']:>8.3f} "
      f"{1e3 * s['batch_wait_s']:>8.1f} {100 * s['batch_wait_share']:>6.2f}% "
      f"{s.get('eval_accuracy', float('nan')):>7.4f}  {per_seq}")
PY
}

case ${1:-} in
prepare) prepare ;;
run)
    out=${2:?usage: bench/buckets.sh run OUTDIR [--device cpu|cuda] [--epochs N]}
    shift 2
    device=cuda
    epochs=1
    while [ $# -gt 0 ]; do
        case $1 in
        --device) device=$2; shift 2 ;;
        --epochs) epochs=$2; shift 2 ;;
        *) echo "bench/buckets.sh: unknown option $1" >&2; exit 2 ;;
        esac
    done
    if [ "$device" = cuda ]; then tg=${TUNEGRAPH:-build/gpu/tunegraph}; precision=bf16
    else tg=${TUNEGRAPH:-build/tunegraph}; precision=fp32; fi
    mkdir -p "$out"
    # epoch_s: training time per epoch; steps_s: its steps alone (each bucket's first left
    # out); ms by seq: mean step ms x steps, per length.
    printf "%-20s %-16s %6s %9s %9s %9s %8s %8s %7s %7s  %s\n" case seq steps padding epoch_s steps_s step_ms \
        wait_ms wait acc "ms by seq" \
        >"$out/buckets-summary.txt"
    run_case articles-seq512 articles 512 ""
    run_case articles-buckets articles 512 "128,256,384,512"
    run_case paragraphs-seq256 paragraphs 256 ""
    run_case paragraphs-buckets paragraphs 256 "32,64,128,256"
    cat "$out/buckets-summary.txt"
    ;;
*) echo "usage: bench/buckets.sh prepare | run OUTDIR [--device cpu|cuda] [--epochs N]" >&2; exit 2 ;;
esac
