# Sourced by the BBC News examples: bbc_articles OUT writes the articles under
# build/assets/bbc-news one per line, in name order, their own line breaks become spaces
# (the one file that is not UTF-8 is left out), through OUT.tmp so that OUT is whole.
bbc_articles() {
    : >"$1.tmp"
    find build/assets/bbc-news -name '*.txt' | LC_ALL=C sort | while read -r f; do
        if iconv -f UTF-8 -t UTF-8 "$f" >/dev/null 2>&1; then
            tr '\n' ' ' <"$f" | tr -s ' ' >>"$1.tmp"
            echo >>"$1.tmp"
        fi
    done
    mv "$1.tmp" "$1"
}
