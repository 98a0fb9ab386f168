#!/usr/bin/env bash
# Mutation testing of the CPU sources (`make mutate`): scripts/mutate.py makes mutants with
# universalmutator's C rules, runs a seeded sample against the suite in worker copies of
# the tree under OUTDIR (OUTDIR/w1..wJ, each with its own build/), prints the score per
# file and every survivor, and writes OUTDIR/report.json.
# usage: scripts/mutate.sh OUTDIR [--mutants N] [--seed S] [--jobs J] [--files "GLOB..."]
# universalmutator (PyPI, pinned) is installed with pip into OUTDIR/venv when missing;
# exits 1, saying why, where it cannot be.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 1 ] || { echo "usage: $0 OUTDIR [--mutants N] [--seed S] [--jobs J] [--files GLOBS]" >&2; exit 2; }
mkdir -p "$1"
out=$(cd "$1" && pwd)
shift
python=${PYTHON:-python3}
MUTATOR="universalmutator==1.14.1"
PIP_FLAGS=(--disable-pip-version-check --retries 1 --timeout 30 -q)

venv=$out/venv
if ! "$venv/bin/python" -m pip show universalmutator 2>/dev/null | grep -qx "Version: ${MUTATOR##*==}"; then
    rm -rf "$venv"
    if ! "$python" -m venv "$venv" >"$out/venv.log" 2>&1; then
        echo "mutate: $python -m venv failed (python3-venv missing?): $(tail -1 "$out/venv.log")" >&2
        exit 1
    fi
    if ! "$venv/bin/python" -m pip install "${PIP_FLAGS[@]}" "$MUTATOR" >>"$out/venv.log" 2>&1; then
        echo "mutate: pip install $MUTATOR failed: $(grep -m1 '^ERROR' "$out/venv.log" || tail -1 "$out/venv.log")" >&2
        exit 1
    fi
fi

exec "$venv/bin/python" "$root/scripts/mutate.py" --root "$root" --out "$out" "$@"
