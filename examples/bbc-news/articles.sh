# Sourced by the BBC News examples: bbc_articles OUT [TOPIC...] writes the articles under
# build/assets/bbc-news one per line, in name order, their own line breaks become spaces
# (the one file that is not UTF-8 is left out), through OUT.tmp so that OUT is whole. With
# TOPIC names (folders of build/assets/bbc-news: business, entertainment, politics,
# sports, tech), only the articles of those topics.
bbc_articles() {
    local out=$1 dirs=()
    shift
    if [ $# -eq 0 ]; then
        dirs=(build/assets/bbc-news)
    else
        local t
        for t in "$@"; do
            [ -d "build/assets/bbc-news/$t" ] || { echo "bbc_articles: no topic folder build/assets/bbc-news/$t" >&2; return 1; }
            dirs+=("build/assets/bbc-news/$t")
        done
    fi
    : >"$out.tmp"
    find "${dirs[@]}" -name '*.txt' | LC_ALL=C sort | while read -r f; do
        if iconv -f UTF-8 -t UTF-8 "$f" >/dev/null 2>&1; then
            tr '\n' ' ' <"$f" | tr -s ' ' >>"$out.tmp"
            echo >>"$out.tmp"
        fi
    done
    mv "$out.tmp" "$out"
}
