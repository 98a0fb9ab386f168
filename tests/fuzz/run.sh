#!/usr/bin/env bash
# Runs libFuzzer targets: run.sh FUZZ_DIR SECONDS TARGET...
# Each target FUZZ_DIR/fuzz_T starts from a fresh copy of its seeds (tests/fuzz/corpus/T,
# and FUZZ_DIR/corpus/T where generated) in FUZZ_DIR/work/T, runs for SECONDS, and leaves
# its log in FUZZ_DIR/logs/T.log and any crashing input in FUZZ_DIR/crashes/T/. Targets run
# side by side, one per core. One summary line per target; exits 1 if any target found
# something (crash, leak, timeout, out-of-memory or sanitizer report).
set -uo pipefail

fuzz_dir=$1 seconds=$2
shift 2
targets=("$@")
here=$(cd "$(dirname "$0")" && pwd)
jobs=$(nproc 2>/dev/null || echo 2)

# 2 cores and 24 GiB is the smallest machine this runs on: a few GiB per target.
rss_mb=${FUZZ_RSS_MB:-4096}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

run_one() {
    local t=$1
    local work=$fuzz_dir/work/$t crashes=$fuzz_dir/crashes/$t log=$fuzz_dir/logs/$t.log
    rm -rf "$work" "$crashes"
    mkdir -p "$work" "$crashes" "$fuzz_dir/logs"
    for seeds in "$here/corpus/$t" "$fuzz_dir/corpus/$t"; do
        [ -d "$seeds" ] && cp "$seeds"/* "$work"/
    done
    "$fuzz_dir/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb="$rss_mb" \
        -print_final_stats=1 -artifact_prefix="$crashes/" "$work" >"$log" 2>&1
    echo $? >"$log.rc"
}

pids=()
for t in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    run_one "$t" &
    pids+=($!)
done
wait "${pids[@]}"

failed=0
for t in "${targets[@]}"; do
    log=$fuzz_dir/logs/$t.log
    rc=$(cat "$log.rc" 2>/dev/null || echo 1)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    found=$(find "$fuzz_dir/crashes/$t" -type f ! -name 'slow-unit-*' | wc -l)
    corpus=$(find "$fuzz_dir/work/$t" -type f | wc -l)
    printf 'fuzz %-13s %10s executions in %ss, %d crashes, corpus %d inputs%s\n' "$t" "${execs:-?}" "$seconds" \
        "$found" "$corpus" "$([ "$rc" = 0 ] || echo ", exit $rc: see $log")"
    if [ "$rc" != 0 ] || [ "$found" != 0 ]; then
        failed=1
        grep -m1 -E 'ERROR: |runtime error|fuzz invariant failed|SUMMARY' "$log" | sed 's/^/    /'
        find "$fuzz_dir/crashes/$t" -type f ! -name 'slow-unit-*' | sed 's/^/    input: /'
    fi
done
exit $failed
