#!/usr/bin/env bash
# Fetches the liger-kernel wheel (pure Python: Triton kernels, no compiled code) from PyPI and
# unpacks it into build/dev/liger, the folder bench/pytorch_baseline.py puts on sys.path for its
# Llama cases' `liger` and `liger-compile` modes. Run it on a machine with PyPI access; the
# device has none, so build/dev travels with the device call (carry build/dev).
# Liger's own needs (torch >= 2.1.2, triton >= 2.3.1; transformers >= 5.0 for its patches) are
# already on the device (torch 2.11, triton 3.6, transformers 5.17): none is fetched.
# usage: bench/fetch_liger.sh [VERSION]   (default 0.8.5, or $LIGER_VERSION)
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-${LIGER_VERSION:-0.8.5}}
dest=build/dev/liger
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "liger-kernel==$version"
whl=$(ls "$tmp"/liger_kernel-*.whl)
rm -rf "$dest"
mkdir -p "$dest"
python3 -m zipfile -e "$whl" "$dest"
# the dist-info folder stays, so importlib.metadata reports the version from this folder
got=$(PYTHONPATH="$dest" python3 -c 'import importlib.metadata as m; print(m.version("liger-kernel"))')
[ "$got" = "$version" ] || { echo "fetch_liger: unpacked $got, wanted $version" >&2; exit 1; }
echo "liger-kernel $got unpacked into $dest ($(du -sh "$dest" | cut -f1)) from $(basename "$whl")"
