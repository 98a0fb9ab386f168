# Sourced by the examples' scripts: parses [--device cpu|cuda] [--set key=value]... into
# $device (cuda where build/gpu/tunegraph and a GPU exist, else cpu), $tg (the binary for
# it; $TUNEGRAPH overrides) and the array sets, given the usage line in $usage.
device=""
sets=()
while [ $# -gt 0 ]; do
    case $1 in
    --device) device=$2; shift 2 ;;
    --set) sets+=(--set "$2"); shift 2 ;;
    *) echo "$usage" >&2; exit 2 ;;
    esac
done
if [ -z "$device" ]; then
    device=cpu
    if [ -x build/gpu/tunegraph ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        device=cuda
    fi
fi
if [ "$device" = cuda ]; then
    tg=${TUNEGRAPH:-build/gpu/tunegraph}
else
    tg=${TUNEGRAPH:-build/tunegraph}
    [ -x "$tg" ] || make -s build/tunegraph
fi
