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
# One run at a time in OUTDIR (two would edit the same worker copies and venv under each
# other); the lock, on descriptor 9, stays held by mutate.py, which this shell becomes.
exec 9>"$out/.lock"
flock -n 9 || { echo "mutate: another run is using $out; wait for it or stop it first" >&2; exit 1; }
export TG_MUTATE_LOCKED=1
MUTATOR="universalmutator==1.14.1"
source "$root/scripts/pinned_venv.sh"
venv=$out/venv
pinned_venv mutate "$venv" "$MUTATOR"

exec "$venv/bin/python" "$root/scripts/mutate.py" --root "$root" --out "$out" "$@"
