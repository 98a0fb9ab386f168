# Sourced by the scripts that need one pinned PyPI package (coverage.sh: gcovr;
# mutate.sh: universalmutator): pinned_venv NAME VENV SPEC installs SPEC ("pkg==version")
# into the venv VENV with pip, unless it already holds that version; on failure it says
# why, prefixed with NAME, and exits 1. Needs $python.
pinned_venv() {
    local name=$1 venv=$2 spec=$3 log="$2.log"
    local pkg=${spec%%==*} version=${spec##*==}
    local flags=(--disable-pip-version-check --retries 1 --timeout 30 -q)
    "$venv/bin/python" -m pip show "$pkg" 2>/dev/null | grep -qx "Version: $version" && return 0
    rm -rf "$venv"
    if ! "$python" -m venv "$venv" >"$log" 2>&1; then
        echo "$name: $python -m venv failed (python3-venv missing?): $(tail -1 "$log")" >&2
        exit 1
    fi
    if ! "$venv/bin/python" -m pip install "${flags[@]}" "$spec" >>"$log" 2>&1; then
        echo "$name: pip install $spec failed: $(grep -m1 '^ERROR' "$log" || tail -1 "$log")" >&2
        exit 1
    fi
}
