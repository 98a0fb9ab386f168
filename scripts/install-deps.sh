#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages tunegraph builds against, when any is missing.
set -euo pipefail
missing=()
for pair in jansson.h:libjansson-dev zstd.h:libzstd-dev xxhash.h:libxxhash-dev; do
    header=${pair%%:*}
    [ -f "/usr/include/$header" ] || missing+=("${pair##*:}")
done
command -v cc >/dev/null 2>&1 || missing+=(build-essential)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then sudo=""; elif command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
