#!/usr/bin/env bash
# scripts/check_layers.sh against small trees: a clean one passes; each kind of violation
# fails with FILE:LINE and the rule it breaks. Run by `make test`.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
check="$here/scripts/check_layers.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tg-layers.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
failed=0

fail() {
    echo "FAIL test_check_layers: $*" >&2
    failed=1
}

put() { # put FILE TEXT: writes TEXT (with \n escapes) to FILE under the tree
    mkdir -p "$(dirname "$tmp/tree/$1")"
    printf '%b' "$2" >"$tmp/tree/$1"
}

# A tree that keeps every rule, each layer including what it may.
put base/error.h '#include <stdio.h>\n'
put plan/plan.h '#include "base/error.h"\n#include "plan/ops.h"\n'
put plan/ops.h '/* ops */\n'
put models/config.h '#include "plan/plan.h"\n#include "models/other.h"\n'
put models/other.h '\n'
put datasets/batch.c '#include "datasets/batch.h"\n#include "plan/ops.h"\n'
put datasets/batch.h '#include "base/error.h"\n'
put compiler/compile.c '#include "models/config.h"\n#include "compiler/job.h"\ntg_job j;\n'
put compiler/job.h '#include "plan/plan.h"\n'
put kernels/ops.cu '#include "kernels/ops.cuh"\n#include "plan/plan.h"\n'
put kernels/ops.cuh '#include "base/error.h"\n'
put runtime/trainer.c '#include "datasets/batch.h"\n#include "kernels/ops.cuh"\n#include "models/config.h"\n#include "local.h"\n'
put runtime/local.h '\n'
put cli/main.c '#include "api/front.h"\n#include "runtime/trainer.h"\n'
put api/front.c '#include "compiler/compile.h"\n'
put tests/test_x.c '#include "compiler/job.h"\ntg_job j;\n'

out=$("$check" "$tmp/tree" 2>&1)
[ $? -eq 0 ] || fail "a clean tree is refused: $out"

# Each violation, and the line the script must print for it.
expect_violation() { # FILE TEXT WANT
    rm -rf "$tmp/bad"
    cp -r "$tmp/tree" "$tmp/bad"
    mkdir -p "$(dirname "$tmp/bad/$1")"
    printf '%b' "$2" >"$tmp/bad/$1"
    out=$("$check" "$tmp/bad" 2>&1)
    local rc=$?
    [ $rc -eq 1 ] || fail "$1: exit $rc, want 1 (output: $out)"
    case $out in
    *"$3"*) ;;
    *) fail "$1: output lacks '$3': $out" ;;
    esac
}

expect_violation runtime/trainer.c '#include "plan/plan.h"\n\n#include "compiler/compile.h"\n' \
    'check_layers: runtime/trainer.c:3: includes "compiler/compile.h": runtime/ may include only base/ plan/ models/ datasets/ kernels/ runtime/'
expect_violation plan/plan.h '#include "base/error.h"\n#include "models/config.h"\n' \
    'check_layers: plan/plan.h:2: includes "models/config.h": plan/ may include only base/ plan/'
expect_violation kernels/ops.cu '  #  include "runtime/local.h"\n' \
    'check_layers: kernels/ops.cu:1: includes "runtime/local.h": kernels/ may include only base/ plan/ kernels/'
expect_violation datasets/batch.c '#include "models/config.h"\n' \
    'check_layers: datasets/batch.c:1: includes "models/config.h": datasets/ may include only base/ plan/ datasets/'
expect_violation base/error.h '#include "plan/plan.h"\n' \
    'check_layers: base/error.h:1: includes "plan/plan.h": base/ may include only base/'
expect_violation compiler/job.h '#include "runtime/local.h"\n' \
    'check_layers: compiler/job.h:1: includes "runtime/local.h": compiler/ may include only base/ plan/ models/ compiler/'
expect_violation models/config.h '#include "plan/plan.h"\nint pad(const tg_job *j);\n' \
    'check_layers: models/config.h:2: names tg_job: models/ reads the plan (tg_plan_train, tg_plan_run), never the job'
expect_violation runtime/local.h '/* see tg_job_pad_id */\n' \
    'check_layers: runtime/local.h:1: names tg_job_pad_id: runtime/'
expect_violation cli/main.c '#include "runtime/trainer.h"\n#include "compiler/job.h"\n' \
    'check_layers: cli/main.c:2: includes "compiler/job.h": cli/ may include only base/ plan/ datasets/ runtime/ api/ cli/'

if [ $failed -ne 0 ]; then exit 1; fi
echo "ok   test_check_layers (clean tree passes, 9 violations caught)"
