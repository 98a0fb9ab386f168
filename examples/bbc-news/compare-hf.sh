#!/usr/bin/env bash
# The same fine-tune in Hugging Face transformers, for comparing accuracy: dumps the
# split that examples/bbc-news/bbc-news.job trains on (tunegraph data dump; the shard set
# is made as run.sh makes it when missing), runs examples/bbc-news/hf_reference.py on
# it, and prints tunegraph's eval accuracy after training (the summary line of
# build/examples/bbc-news/metrics.jsonl, which run.sh writes) beside Hugging Face's.
#
#   examples/bbc-news/compare-hf.sh [hf_reference.py options: --device cpu|cuda --epochs N ...]
#
# Needs python3 with torch and transformers ($PYTHON overrides python3). Outputs go to
# build/examples/bbc-news/hf/: train.jsonl, eval.jsonl and summary.json.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=build/examples/bbc-news
python=${PYTHON:-python3}
tg=${TUNEGRAPH:-build/tunegraph}
[ -n "${TUNEGRAPH:-}" ] || make -s build/tunegraph

scripts/fetch_assets.sh minilm
examples/bbc-news/convert.sh "$tg"
mkdir -p "$out/hf"
"$tg" data dump "$out/shards" -o "$out/hf/train.jsonl"
"$tg" data dump "$out/shards/eval" -o "$out/hf/eval.jsonl"

echo "== Hugging Face transformers, the same job on the same split"
"$python" examples/bbc-news/hf_reference.py --model build/assets/all-minilm-l6-v2 \
    --train "$out/hf/train.jsonl" --eval "$out/hf/eval.jsonl" --out "$out/hf/summary.json" "$@"

echo "== eval accuracy after fine-tuning"
python3 - "$out/metrics.jsonl" "$out/hf/summary.json" <<'PY'
import json, os, sys
metrics, hf_path = sys.argv[1], sys.argv[2]
hf = json.load(open(hf_path))
tg = None
if os.path.exists(metrics):
    for line in open(metrics):
        line = line.strip()
        if line:
            obj = json.loads(line)
            if obj.get("summary"):
                tg = obj
if tg is None or tg.get("eval_accuracy") is None:
    print(f"  tunegraph:    no eval accuracy in {metrics} (examples/bbc-news/run.sh writes it)")
else:
    print(f"  tunegraph:    {tg['eval_accuracy']:.4f}  ({tg.get('steps')} steps on {tg.get('device')}, "
          f"{tg.get('train_s', 0):.1f} s of training; {metrics})")
print(f"  Hugging Face: {hf['after_accuracy']:.4f}  ({hf['steps']} steps on {hf['device_name']}, {hf['precision']}, "
      f"{hf['train_seconds']:.1f} s of training; before {hf['before']['eval_accuracy']:.4f})")
if tg is not None and tg.get("steps") != hf["steps"]:
    print(f"  (the runs differ in length: tunegraph {tg.get('steps')} steps, Hugging Face {hf['steps']}; the CPU "
          "fallback of run.sh trains one epoch of 128-token articles)")
PY
