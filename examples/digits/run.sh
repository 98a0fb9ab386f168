#!/usr/bin/env bash
# A real image classifier: MobileNetV2, from random weights, learns scikit-learn's
# handwritten digits (1,797 images of 8 x 8 pixels, from PyPI scikit-learn).
#
#   examples/digits/run.sh [--device cpu|cuda] [--image-size N] [--set key=value]...
#
# 1. fetches the scikit-learn wheel with pip into build/assets/ and takes its
#    digits.csv.gz (scripts/fetch_assets.sh digits; kept once there),
# 2. writes the training images (4 of every 5: 1,437) as MNIST distributes its files,
#    gzip'd IDX, and the test images (every 5th: 360) as PNG files in a folder per label
#    (examples/digits/make_digits.py),
# 3. converts both into image shard sets at 100 x 100 (--image-size N: another size; the
#    job's image_size follows): `data convert --format idx` for the .gz files,
#    `data convert --format images --channels 1` for the PNG folders,
# 4. compiles examples/digits/digits.job and reports the test accuracy of the untrained
#    model (before),
# 5. trains and reports the test accuracy after.
# On the GPU (the default where build/gpu/tunegraph and a GPU exist) it runs the job as
# written (10 epochs). The CPU fallback trains 2 epochs (88 steps), a few minutes on 2
# cores. Outputs go to build/examples/digits/.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=build/examples/digits
usage="usage: examples/digits/run.sh [--device cpu|cuda] [--image-size N] [--set key=value]..."
size=100
args=()
while [ $# -gt 0 ]; do
    case $1 in
    --image-size) size=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
    esac
done
source examples/digits/../bbc-news/options.sh "${args[@]+"${args[@]}"}"
fallback=()
# The CPU fallback's length, unless --set gives one (steps and epochs exclude each other).
if [ "$device" = cpu ] && ! printf '%s\n' "${sets[@]+"${sets[@]}"}" | grep -qE '^(steps|epochs)='; then
    fallback=(--set epochs=2)
fi

scripts/fetch_assets.sh digits
mkdir -p "$out"
python3 examples/digits/make_digits.py build/assets/digits/digits.csv.gz "$out/files"
"$tg" data convert "$out/files/train-images-idx3-ubyte.gz" -o "$out/train" --format idx --image-size "$size"
"$tg" data convert "$out/files/test" -o "$out/test" --format images --channels 1 --image-size "$size"
"$tg" compile examples/digits/digits.job -o "$out/digits.plan" --set image_size="$size" \
    "${fallback[@]+"${fallback[@]}"}" "${sets[@]+"${sets[@]}"}"

echo "== before training (random weights)"
"$tg" predict "$out/digits.plan" -o "$out/before-logits.jsonl" --device "$device" --init-missing

echo "== training on $device"
start=$(date +%s.%N)
"$tg" run "$out/digits.plan" --device "$device" --metrics "$out/metrics.jsonl" --save "$out/weights.safetensors"
end=$(date +%s.%N)
echo "== after: see the eval line above; the whole run took $(awk "BEGIN{printf \"%.1f\", $end - $start}") s"
