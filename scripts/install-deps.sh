#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages tunegraph builds against, when any is missing.
# `install-deps.sh fuzz` also makes sure of what `make fuzz` needs: clang and its
# compiler-rt (libclang-rt-dev: libFuzzer and the sanitizer runtimes, which clang's
# package only recommends).
set -euo pipefail
missing=()
for pair in jansson.h:libjansson-dev zstd.h:libzstd-dev xxhash.h:libxxhash-dev utf8proc.h:libutf8proc-dev \
    png.h:libpng-dev jpeglib.h:libjpeg-dev zlib.h:zlib1g-dev \
    pcre2.h:libpcre2-dev; do
    header=${pair%%:*}
    # Found by the compiler, wherever it looks (CPATH and -I included), not only in /usr/include.
    echo "#include <$header>" | "${CC:-cc}" -E -DPCRE2_CODE_UNIT_WIDTH=8 -x c - >/dev/null 2>&1 || missing+=("${pair##*:}")
done
command -v cc >/dev/null 2>&1 || missing+=(build-essential)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
# Open MPI: the CPU reference's ranks as processes (runtime/comm_mpi.c) and mpirun to start
# them. MPI=0, as make takes it, builds without and installs neither.
if [ "${MPI:-1}" != 0 ]; then
    pkg-config --exists ompi-c 2>/dev/null || missing+=(libopenmpi-dev)
    command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
fi
if [ "${1:-}" = fuzz ]; then
    # The real test: can clang link a libFuzzer target with ASan and UBSan?
    probe='int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return 0; }'
    if ! command -v clang >/dev/null 2>&1 ||
        ! echo "$probe" | clang -x c -fsanitize=fuzzer,address,undefined - -o /dev/null >/dev/null 2>&1; then
        missing+=(clang libclang-rt-dev)
    fi
fi
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then sudo=""; elif command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
