#!/usr/bin/env bash
# Times two tunegraph builds on the same GPU in one call, interleaved (A, B, A, B, ...), on
# the benchmark cases: the median step time of each run (its metrics summary) and, per case,
# the median over runs and B / A. Both builds read the same jobs and synthetic data.
# usage: bench/compare_builds.sh OUT BIN_A BIN_B [REPEATS] [case...]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/cases.sh
out=${1:?usage: bench/compare_builds.sh OUT BIN_A BIN_B [REPEATS] [case...]}
bin_a=${2:?}
bin_b=${3:?}
repeats=${4:-3}
shift 4 || shift $#
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=("${bench_default_cases[@]}")
mkdir -p "$out"
summary="$out/compare.txt"
printf '%-24s %-6s %s\n' case build "median step ms per run" > "$summary"
for c in "${cases[@]}"; do
    bench_make_case_data "$c"
    declare -A runs=([A]="" [B]="")
    for r in $(seq 1 "$repeats"); do
        for which in A B; do
            bin=$bin_a
            [ $which = B ] && bin=$bin_b
            m="$out/$c-$which-$r.jsonl"
            "$bin" run "bench/jobs/$c.job" --metrics "$m" 2> "$out/$c-$which-$r.log" ||
                { echo "$c $which run $r failed:" >&2; tail -3 "$out/$c-$which-$r.log" >&2; exit 1; }
            ms=$(python3 -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if "summary" in l][-1]["median_step_ms"])' "$m")
            runs[$which]="${runs[$which]} $ms"
        done
    done
    for which in A B; do printf '%-24s %-6s%s\n' "$c" "$which" "${runs[$which]}" >> "$summary"; done
    python3 - "$c" "${runs[A]}" "${runs[B]}" >> "$summary" <<'PY'
import statistics, sys
a = [float(x) for x in sys.argv[2].split()]
b = [float(x) for x in sys.argv[3].split()]
ma, mb = statistics.median(a), statistics.median(b)
print(f"{sys.argv[1]:<24} median A {ma:.3f} ms, B {mb:.3f} ms, B/A {mb / ma:.4f}")
PY
done
cat "$summary"
