#!/usr/bin/env bash
# Reports the line and branch coverage of the CPU sources from the gcov counts that a run of
# the instrumented suite left in COVDIR (`make coverage` builds and runs it): one line per
# file, then the totals, and writes COVDIR/coverage.json (gcovr's --json-summary: per file
# and in total, lines and branches covered, total and percent).
# usage: scripts/coverage.sh COVDIR
# The CPU sources: compiler/, plan/, runtime/ less the CUDA executor (runtime/cuda/, which
# the CPU build does not compile), models/, datasets/, cli/, api/ and base/; the tests and
# fuzz targets are not counted. gcovr (PyPI, pinned) is installed with pip into
# COVDIR/venv when missing; exits 1, saying why, where it cannot be.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -eq 1 ] || { echo "usage: $0 COVDIR" >&2; exit 2; }
cov=$(cd "$1" && pwd)
python=${PYTHON:-python3}
GCOVR="gcovr==8.8"
source "$root/scripts/pinned_venv.sh"
venv=$cov/venv
pinned_venv coverage "$venv" "$GCOVR"

filters=()
for dir in compiler plan runtime models datasets cli api base; do
    filters+=(--filter "$root/$dir/")
done
# gcovr runs gcov (GCOV overrides it, e.g. for another gcc than cc). The CPU kernels' inner
# loops really run billions of times in the suite: no count is taken as gcov's overflow.
cd "$root"
"$venv/bin/gcovr" --root "$root" --gcov-suspicious-hits-threshold 0 -j "$(nproc 2>/dev/null || echo 2)" \
    "${filters[@]}" --exclude "$root/runtime/cuda/" --exclude "$root/tests/" \
    --exclude-directory "$cov/venv" --json-summary-pretty --json-summary "$cov/coverage.json" "$cov" >/dev/null

"$venv/bin/python" - "$cov/coverage.json" "${1%/}/coverage.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
def cell(covered, total):
    pct = f"{100.0 * covered / total:5.1f}%" if total else "    -"
    return f"{covered:6d}/{total:<6d} {pct}"
width = max([len(f["filename"]) for f in s["files"]] + [5])
print(f"{'file':<{width}}  {'lines':^20}  {'branches':^20}")
for f in sorted(s["files"], key=lambda f: f["filename"]):
    print(f"{f['filename']:<{width}}  {cell(f['line_covered'], f['line_total'])}  "
          f"{cell(f['branch_covered'], f['branch_total'])}")
print(f"{'TOTAL':<{width}}  {cell(s['line_covered'], s['line_total'])}  "
      f"{cell(s['branch_covered'], s['branch_total'])}")
print(f"coverage: lines {s['line_percent']:.1f}%, branches {s['branch_percent']:.1f}% "
      f"over {len(s['files'])} files of the CPU sources; summary in {sys.argv[2]}")
EOF
