#!/usr/bin/env bash
# Lists the branches that the last `make coverage` run left untaken, file by file: each
# source line with a branch never taken, as "file:line: taken/total | source". Reads the gcov
# counts in COVDIR (build/coverage) with the gcovr that scripts/coverage.sh installed there.
# usage: scripts/coverage_gaps.sh COVDIR FILE...   (FILE relative to the tree, e.g. cli/main.c)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 2 ] || { echo "usage: $0 COVDIR FILE..." >&2; exit 2; }
cov=$(cd "$1" && pwd)
shift
gcovr=$cov/venv/bin/gcovr
[ -x "$gcovr" ] || { echo "$0: no gcovr in $cov/venv: run make coverage first" >&2; exit 1; }
filters=()
for f in "$@"; do
    [ -f "$root/$f" ] || { echo "$0: no such source file: $f" >&2; exit 2; }
    filters+=(--filter "$root/$f")
done
out=$(mktemp)
trap 'rm -f "$out"' EXIT
cd "$root"
"$gcovr" --root "$root" --gcov-suspicious-hits-threshold 0 "${filters[@]}" \
    --exclude-directory "$cov/venv" --json "$out" "$cov" >/dev/null
"$cov/venv/bin/python" - "$out" "$root" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
for f in sorted(report["files"], key=lambda f: f["file"]):
    src = open(f"{sys.argv[2]}/{f['file']}", errors="replace").read().split("\n")
    for line in f["lines"]:
        # Branches under a GCOVR_EXCL marker are out of the count (gcovr marks them).
        branches = [b for b in line.get("branches", []) if not b.get("gcovr/excluded")]
        taken = sum(1 for b in branches if b["count"] > 0)
        if branches and taken < len(branches):
            n = line["line_number"]
            print(f"{f['file']}:{n}: {taken}/{len(branches)} | {src[n - 1].strip()}")
PY
