#!/usr/bin/env bash
# The layering rules, checked on every `#include "..."` in the sources (*.c *.h *.cu *.cuh):
#
#   base/                 -> base/
#   plan/                 -> base/ plan/
#   models/               -> base/ plan/ models/
#   datasets/             -> base/ plan/ datasets/
#   compiler/             -> base/ plan/ models/ compiler/
#   kernels/              -> base/ plan/ kernels/
#   runtime/              -> base/ plan/ models/ datasets/ kernels/ runtime/
#   cli/                  -> base/ plan/ datasets/ runtime/ api/ cli/   (the compiler through api/front.h)
#   api/                  -> anything
#
# and no code under runtime/ kernels/ datasets/ models/ plan/ names tg_job (the compiler's
# input; what those layers need travels in the plan). tests/ examples/ bench/ are exempt,
# as are folders no rule names. An include without a folder is taken from the includer's own.
#
# usage: scripts/check_layers.sh [ROOT]   (ROOT: the tree to check, by default this repository)
# Prints each violation as FILE:LINE: what and the rule, and exits 1 if there is any.
set -u

root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || { echo "check_layers: cannot enter $root" >&2; exit 2; }

allowed_for() {
    case $1 in
    base) echo "base" ;;
    plan) echo "base plan" ;;
    models) echo "base plan models" ;;
    datasets) echo "base plan datasets" ;;
    compiler) echo "base plan models compiler" ;;
    kernels) echo "base plan kernels" ;;
    runtime) echo "base plan models datasets kernels runtime" ;;
    cli) echo "base plan datasets runtime api cli" ;;
    *) echo "*" ;; # api/ and folders without a rule
    esac
}

bad=0
report() {
    echo "$1" >&2
    bad=1
}

files=$(find . \( -path ./tests -o -path ./examples -o -path ./bench -o -path ./build -o -path ./.git \) -prune -o \
    -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print | sed 's|^\./||' | sort)

for f in $files; do
    layer=${f%%/*}
    [ "$layer" = "$f" ] && layer=.
    allowed=$(allowed_for "$layer")
    if [ "$allowed" != "*" ]; then
        # FILE:LINE:included-path for every quoted include.
        while IFS=: read -r line inc; do
            [ -n "$line" ] || continue
            target=${inc%%/*}
            [ "$target" = "$inc" ] && target=$layer
            case " $allowed " in
            *" $target "*) ;;
            *) report "check_layers: $f:$line: includes \"$inc\": $layer/ may include only $(echo "$allowed" | sed 's|\([a-z]*\)|\1/|g')" ;;
            esac
        done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" | sed 's/^\([0-9]*\):[^"]*"\([^"]*\)".*/\1:\2/')
    fi
    case $layer in
    runtime | kernels | datasets | models | plan)
        while IFS=: read -r line name; do
            [ -n "$line" ] || continue
            report "check_layers: $f:$line: names $name: $layer/ reads the plan (tg_plan_train, tg_plan_run), never the job"
        done < <(grep -nwo 'tg_job[A-Za-z0-9_]*' "$f")
        ;;
    esac
done

if [ "$bad" -ne 0 ]; then
    echo "check_layers: layering violated (rules in scripts/check_layers.sh)" >&2
    exit 1
fi
echo "check_layers: ok ($(echo "$files" | wc -w) files)"
