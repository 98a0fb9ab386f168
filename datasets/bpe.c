/* Byte-level BPE as GPT-2, RoBERTa and Llama 3 use it, as HF `tokenizers` runs it: a
 * pre-tokenisation pattern (PCRE2, UTF and Unicode properties; GPT-2's, or the one of a
 * tokenizer.json's Split pre-tokenizer) splits the text into words; each word's bytes
 * become GPT-2's printable byte characters, and merges apply lowest rank first (leftmost
 * first among equals) until none applies. Words' tokens are cached. */
#include "datasets/tokenizer_impl.h"
#include "base/alloc.h"

#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* GPT-2's pattern, as HF's ByteLevel pre-tokenizer has it:
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * with \s spelled out as Oniguruma (HF's regex engine) has it: tab to carriage return,
 * U+0085 and the separators \p{Z}. PCRE2's \s also takes U+180E (Mongolian vowel
 * separator, a format character since Unicode 6.3), where HF splits differently. */
#define SPACE "\\t-\\r\\x{85}\\p{Z}"
static const char gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" SPACE "\\p{L}\\p{N}]+|[" SPACE
                                   "]+(?![^" SPACE "])|[" SPACE "]+";

/* Words longer than this are not cached (HF's limit too); the cache holds at most
 * CACHE_MAX words and CACHE_ARENA bytes, and is emptied when either is reached. */
#define CACHE_KEY_MAX 256
#define CACHE_MAX (1 << 14)
#define CACHE_ARENA (4 << 20)

uint32_t tok_byte_char(uint8_t b) {
    /* printable bytes stand for themselves; the others, in order, from U+0100 */
    if (b >= 0x21 && b <= 0x7E) return b;
    if (b >= 0xA1 && b <= 0xAC) return b;
    if (b >= 0xAE) return b;
    if (b <= 0x20) return 0x100u + b;
    if (b <= 0xA0) return 0x100u + 33 + (b - 0x7Fu);
    return 0x100u + 33 + 34; /* 0xAD */
}

/* ---- merges -------------------------------------------------------------------------- */

static inline uint32_t merge_slot(uint64_t key, uint32_t mask) {
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

static inline const tok_merge *merge_find(const tok_bpe *b, int32_t left, int32_t right) {
    if (!b->merges) return NULL;
    const uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (uint32_t i = merge_slot(key, b->merges_mask);; i = (i + 1) & b->merges_mask) {
        const tok_merge *m = &b->merges[i];
        if (m->key == key) return m;
        if (m->key == UINT64_MAX) return NULL;
    }
}

static int merges_grow(tok_bpe *b, tg_err *err) {
    const uint32_t size = b->merges ? (b->merges_mask + 1) * 2 : 1024;
    tok_merge *m = tg_malloc((size_t)size * sizeof *m);
    if (!m) return tg_fail(err, "out of memory for %d merges", b->n_merges);
    for (uint32_t i = 0; i < size; i++) m[i].key = UINT64_MAX;
    if (b->merges)
        for (uint32_t i = 0; i <= b->merges_mask; i++) {
            if (b->merges[i].key == UINT64_MAX) continue;
            uint32_t j = merge_slot(b->merges[i].key, size - 1);
            while (m[j].key != UINT64_MAX) j = (j + 1) & (size - 1);
            m[j] = b->merges[i];
        }
    free(b->merges);
    b->merges = m;
    b->merges_mask = size - 1;
    return 0;
}

/* A pair merged again later in the file takes the later rank (HF builds a map). */
int tok_bpe_add_merge(tok_bpe *b, int32_t left, int32_t right, int32_t rank, int32_t new_id, tg_err *err) {
    if ((!b->merges || (int64_t)(b->n_merges + 1) * 2 > (int64_t)b->merges_mask + 1) && merges_grow(b, err)) return -1;
    const uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    uint32_t i = merge_slot(key, b->merges_mask);
    while (b->merges[i].key != UINT64_MAX && b->merges[i].key != key) i = (i + 1) & b->merges_mask;
    if (b->merges[i].key == UINT64_MAX) b->n_merges++;
    b->merges[i] = (tok_merge){key, rank, new_id};
    return 0;
}

/* ---- setup --------------------------------------------------------------------------- */

static void *pcre2_alloc(size_t bytes, void *data) { return tg_malloc(bytes); }
static void pcre2_release(void *p, void *data) { free(p); }

/* Compiles pattern (PCRE2's syntax, len bytes) into b->re and b->match_data; `what`
 * names it in messages. */
static int compile_pattern(tok_bpe *b, const char *pattern, size_t len, const char *what, tg_err *err) {
    /* PCRE2 allocates through tg_alloc's hook too (a general context), so that its
     * allocations fail in the tests like every other. */
    const long failures = tg_alloc_failures();
    pcre2_general_context *gc = pcre2_general_context_create(pcre2_alloc, pcre2_release, NULL);
    pcre2_compile_context *cc = gc ? pcre2_compile_context_create(gc) : NULL;
    int code = 0;
    PCRE2_SIZE at = 0;
    pcre2_code *re = cc ? pcre2_compile((PCRE2_SPTR)pattern, len, PCRE2_UTF | PCRE2_UCP, &code, &at, cc) : NULL;
    pcre2_compile_context_free(cc);
    /* JIT where the library has it; pcre2_match falls back to the interpreter otherwise */
    if (re) pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    pcre2_match_data *md = re ? pcre2_match_data_create_from_pattern(re, gc) : NULL;
    pcre2_general_context_free(gc);
    if (!md) {
        pcre2_code_free(re);
        if (tg_alloc_failures() != failures) return tg_fail(err, "out of memory compiling %s (PCRE2)", what);
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return tg_fail(err, "%s does not compile: %s at byte %zu of its PCRE2 form '%.*s'", what, (const char *)msg,
                       (size_t)at, len > 300 ? 300 : (int)len, pattern);
    }
    b->re = re;
    b->match_data = md;
    return 0;
}

/* ---- Split patterns ------------------------------------------------------------------ */

/* HF compiles a Split pre-tokenizer's pattern with Oniguruma (Ruby's syntax). It is taken
 * into PCRE2's syntax construct by construct, for the constructs the two read alike:
 * literal characters; groups (...), (?:...), (?i:...) and the lookarounds (?=, (?!, (?<=,
 * (?<!; alternation; the quantifiers ? * + {n} {n,} {n,m}, with ? (lazy) or + (possessive,
 * not after {...}) behind them; classes [...] and [^...] with ranges; and the escapes \s
 * and \S (Oniguruma's: White_Space, spelled out as in GPT-2's pattern above; \S not inside
 * a class), \p{..} and \P{..} of a general category, \r \n \t and escaped ASCII
 * punctuation. Everything else is refused, naming it: what the two engines read
 * differently (^ and $ are line anchors in Ruby's syntax, {n,m}+ is no possessive there,
 * a class inside a class or [a&&b] is a set operation there, \h a hex digit; in a
 * case-insensitive group Oniguruma folds characters into several, so that ss there
 * matches ß: ss, st, ff, fi and fl, the ASCII ones (also with group brackets or {n,m}
 * between the two letters), and any character past ASCII are refused there), and what
 * tokenizers' patterns do not use. */
static const char *const general_categories[] = {
    "L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "Mn", "Mc", "Me", "N", "Nd", "Nl", "No", "P", "Pc", "Pd", "Pe",
    "Pf", "Pi", "Po", "Ps", "S", "Sc", "Sk", "Sm", "So", "Z", "Zl", "Zp", "Zs", "C", "Cc", "Cf", "Cn", "Co", "Cs"};

typedef struct pattern_out {
    char *s;
    size_t n;
} pattern_out;

static void out_put(pattern_out *o, const char *s, size_t n) {
    memcpy(o->s + o->n, s, n);
    o->n += n;
}

/* The escape at s[i] ('\\'), in a class or not: appends its PCRE2 form and returns the
 * bytes it takes, or 0 when it is refused. */
static size_t escape_at(const char *s, size_t n, size_t i, int in_class, pattern_out *o) {
    if (i + 1 == n) return 0;
    const unsigned char c = (unsigned char)s[i + 1];
    if (c == 's') {
        if (in_class) out_put(o, SPACE, strlen(SPACE));
        else out_put(o, "[" SPACE "]", strlen("[" SPACE "]"));
        return 2;
    }
    if (c == 'S' && !in_class) {
        out_put(o, "[^" SPACE "]", strlen("[^" SPACE "]"));
        return 2;
    }
    if (c == 'p' || c == 'P') { /* \p{Name} or \p{^Name} of a general category */
        if (i + 2 == n || s[i + 2] != '{') return 0;
        size_t k = i + 3;
        if (k < n && s[k] == '^') k++;
        const size_t name = k;
        while (k < n && s[k] != '}') k++;
        if (k == n) return 0;
        for (size_t g = 0; g < sizeof general_categories / sizeof *general_categories; g++)
            if (strlen(general_categories[g]) == k - name && !memcmp(general_categories[g], s + name, k - name)) {
                out_put(o, s + i, k + 1 - i);
                return k + 1 - i;
            }
        return 0;
    }
    /* \r \n \t, and ASCII punctuation standing for itself */
    if (c == 'r' || c == 'n' || c == 't' || (c > 0x20 && c < 0x7F && !(c >= '0' && c <= '9') &&
                                             !((c | 0x20) >= 'a' && (c | 0x20) <= 'z'))) {
        out_put(o, s + i, 2);
        return 2;
    }
    return 0;
}

/* The bytes of the UTF-8 character at s[i] (the pattern is valid UTF-8: JSON text). */
static size_t char_len(const char *s, size_t i) {
    int64_t j = (int64_t)i;
    tok_utf8_next((const unsigned char *)s, &j);
    return (size_t)j - i;
}

static const char caseless_non_ascii[] =
    "a character past ASCII in a case-insensitive group (Oniguruma folds some into several characters)";

/* The class at s[i] ('['): appends it and returns the bytes it takes, or 0 with *bad set
 * to the byte refused and *why to the reason. */
static size_t class_at(const char *s, size_t n, size_t i, int caseless, pattern_out *o, size_t *bad,
                       const char **why) {
    size_t k = i + 1;
    out_put(o, "[", 1);
    if (k < n && s[k] == '^') out_put(o, "^", 1), k++;
    if (k < n && s[k] == ']') {
        *bad = k, *why = "']' first in a class (write \\])";
        return 0;
    }
    while (k < n && s[k] != ']') {
        if (s[k] == '[' || (s[k] == '&' && k + 1 < n && s[k + 1] == '&')) {
            *bad = k, *why = "a set operation inside a class ([...] or &&)";
            return 0;
        }
        if (s[k] == '\\') {
            const size_t e = escape_at(s, n, k, 1, o);
            if (!e) {
                *bad = k, *why = "this escape in a class";
                return 0;
            }
            k += e;
            continue;
        }
        if (caseless && (unsigned char)s[k] >= 0x80) {
            *bad = k, *why = caseless_non_ascii;
            return 0;
        }
        const size_t len = char_len(s, k);
        out_put(o, s + k, len);
        k += len;
    }
    if (k == n) {
        *bad = i, *why = "a class without its ']'";
        return 0;
    }
    out_put(o, "]", 1);
    return k + 1 - i;
}

/* {n}, {n,} or {n,m} at s[i]: its length, or 0. */
static size_t braces_at(const char *s, size_t n, size_t i) {
    size_t k = i + 1, digits = 0;
    while (k < n && s[k] >= '0' && s[k] <= '9') k++, digits++;
    if (!digits) return 0;
    if (k < n && s[k] == ',') {
        k++;
        while (k < n && s[k] >= '0' && s[k] <= '9') k++;
    }
    return k < n && s[k] == '}' ? k + 1 - i : 0;
}

int tok_bpe_set_pattern(tok_bpe *b, const char *pattern, size_t len, const char *where, tg_err *err) {
    /* the longest expansion: \S (2 bytes) into [^SPACE] */
    const size_t cap = len * (sizeof "[^" SPACE "]" - 1) / 2 + 1;
    pattern_out o = {tg_malloc(cap), 0};
    if (!o.s) return tg_fail(err, "%s: out of memory for a pattern of %zu bytes", where, len);
    static const char *const groups[] = {"(?:", "(?i:", "(?=", "(?!", "(?<=", "(?<!"};
    size_t i = 0, take = 0, bad = 0;
    const char *why = NULL;
    int after_braces = 0; /* the last item was {...} (or {...}?): a + there is no possessive */
    int depth = 0, caseless_at = 0; /* groups open; the depth of the (?i: open, or 0 */
    /* the last ASCII letter in a (?i: group, where only group brackets and {n,m} came
     * after it: Oniguruma joins s(?:t) and s{1}t into the string st, and folds that */
    char letter = 0;
    size_t letter_at = 0;
    for (; i < len; i += take) {
        const char c = pattern[i];
        const char before = letter;
        bad = i;
        take = 0;
        letter = 0;
        if (c == '\\') {
            take = escape_at(pattern, len, i, 0, &o);
            why = "this escape";
        } else if (c == '[') {
            take = class_at(pattern, len, i, caseless_at, &o, &bad, &why);
        } else if (c == '(') {
            if (i + 1 == len || (pattern[i + 1] != '?' && pattern[i + 1] != '*')) take = 1;
            for (size_t g = 0; g < sizeof groups / sizeof *groups && !take; g++)
                if (len - i >= strlen(groups[g]) && !memcmp(pattern + i, groups[g], strlen(groups[g])))
                    take = strlen(groups[g]);
            why = "this kind of group";
            if (take) {
                out_put(&o, pattern + i, take);
                depth++;
                if (!caseless_at && take == 4 && pattern[i + 2] == 'i') caseless_at = depth;
            }
            letter = before;
        } else if (c == ')') {
            if (depth == caseless_at) caseless_at = 0;
            depth -= depth > 0;
            take = 1;
            out_put(&o, ")", 1);
            letter = before;
        } else if (caseless_at && (unsigned char)c >= 0x80) {
            why = caseless_non_ascii;
        } else if (caseless_at && (c | 0x20) >= 'a' && (c | 0x20) <= 'z') {
            /* two letters a character folds into: ss (\u00df), st, ff, fi, fl (ligatures) */
            const char pair[3] = {(char)(before | 0x20), (char)(c | 0x20), 0};
            if (before && strstr("ss st ff fi fl", pair)) {
                bad = letter_at;
                why = "ss, st, ff, fi or fl in a case-insensitive group (Oniguruma matches a ligature or \u00df there)";
            } else {
                take = 1;
                out_put(&o, pattern + i, 1);
                letter = c;
                letter_at = i;
            }
        } else if (c == '{') {
            take = braces_at(pattern, len, i);
            why = "'{' that is no {n}, {n,} or {n,m} quantifier (write \\{)";
            if (take) out_put(&o, pattern + i, take);
            letter = before;
        } else if (c == '+' && after_braces) {
            why = "'+' after {n,m} (a repeat in Oniguruma's syntax, a possessive in PCRE2's)";
        } else if (c == '^' || c == '$' || c == '.') {
            why = c == '.' ? "'.'" : "'^' and '$' (line anchors in Oniguruma's syntax)";
        } else {
            take = char_len(pattern, i);
            out_put(&o, pattern + i, take);
        }
        if (!take) {
            const int shown = (int)(len - bad < 12 ? len - bad : 12);
            tg_fail(err, "%s: %s at byte %zu ('%.*s') is not supported", where, why, bad, shown, pattern + bad);
            free(o.s);
            return -1;
        }
        after_braces = c == '{' || (after_braces && c == '?');
    }
    const int rc = compile_pattern(b, o.s, o.n, where, err);
    free(o.s);
    return rc;
}

int tok_bpe_prepare(tok_bpe *b, tg_err *err) {
    for (int c = 0; c < 256; c++) {
        char u[4];
        const int n = tok_utf8_put(tok_byte_char((uint8_t)c), u);
        b->byte_id[c] = tok_vocab_get(&b->vocab, u, (size_t)n);
    }
    /* GPT-2's pattern, unless a Split pre-tokenizer's is in place */
    if (!b->re && compile_pattern(b, gpt2_pattern, sizeof gpt2_pattern - 1, "the pre-tokenisation pattern", err))
        return -1;
    b->cache_slots = tg_malloc((size_t)2 * CACHE_MAX * sizeof *b->cache_slots);
    b->cache = tg_malloc((size_t)CACHE_MAX * sizeof *b->cache);
    if (!b->cache_slots || !b->cache) return tg_fail(err, "out of memory for the merge cache");
    memset(b->cache_slots, 0xff, (size_t)2 * CACHE_MAX * sizeof *b->cache_slots);
    b->cache_mask = 2 * CACHE_MAX - 1;
    return 0;
}

void tok_bpe_free(tok_bpe *b) {
    tok_vocab_free(&b->vocab);
    free(b->merges);
    if (b->match_data) pcre2_match_data_free((pcre2_match_data *)b->match_data);
    if (b->re) pcre2_code_free((pcre2_code *)b->re);
    free(b->cache);
    free(b->cache_slots);
    free(b->cache_arena);
    free(b->sym_id);
    free(b->sym_prev);
    free(b->sym_next);
    free(b->sym_span);
    free(b->heap);
    free(b->out_ids);
    free(b->prefixed);
    free(b->level);
    memset(b, 0, sizeof *b);
}

/* ---- the cache ----------------------------------------------------------------------- */

/* Each cached word: its bytes, then per token (id, start byte, end byte). */
static const int32_t *cache_get(const tok_bpe *b, const unsigned char *p, int64_t n, uint64_t hash, int32_t *count) {
    for (uint32_t i = (uint32_t)hash & b->cache_mask;; i = (i + 1) & b->cache_mask) {
        const int32_t e = b->cache_slots[i];
        if (e < 0) return NULL;
        const tok_cache_entry *c = &b->cache[e];
        /* a 64-bit hash shared by words of different bytes does not occur in tests */
        if (c->hash == hash && c->key_len == n && !memcmp(b->cache_arena + c->key_off, p, (size_t)n)) { /* GCOVR_EXCL_BR_LINE: no hash collisions */
            *count = (int32_t)c->n;
            return (const int32_t *)(b->cache_arena + c->val_off);
        }
    }
}

static void cache_put(tok_bpe *b, const unsigned char *p, int64_t n, uint64_t hash, const int32_t *val, int32_t count) {
    const size_t key_off = (b->cache_arena_len + 3) & ~(size_t)3;
    const size_t val_off = (key_off + (size_t)n + 3) & ~(size_t)3;
    const size_t need = val_off + (size_t)count * 3 * sizeof(int32_t);
    if (b->cache_n == CACHE_MAX || need > CACHE_ARENA) { /* full: start over */
        memset(b->cache_slots, 0xff, (size_t)(b->cache_mask + 1) * sizeof *b->cache_slots);
        b->cache_n = 0;
        b->cache_arena_len = 0;
        cache_put(b, p, n, hash, val, count);
        return;
    }
    if (need > b->cache_arena_cap) {
        size_t cap = b->cache_arena_cap ? b->cache_arena_cap : 65536;
        while (cap < need) cap *= 2;
        char *a = tg_realloc(b->cache_arena, cap);
        if (!a) return; /* the cache is an optimisation: go without */
        b->cache_arena = a;
        b->cache_arena_cap = cap;
    }
    memcpy(b->cache_arena + key_off, p, (size_t)n);
    memcpy(b->cache_arena + val_off, val, (size_t)count * 3 * sizeof(int32_t));
    b->cache_arena_len = need;
    b->cache[b->cache_n] = (tok_cache_entry){hash, (uint32_t)key_off, (uint32_t)n, (uint32_t)val_off, (uint32_t)count};
    uint32_t i = (uint32_t)hash & b->cache_mask;
    while (b->cache_slots[i] >= 0) i = (i + 1) & b->cache_mask;
    b->cache_slots[i] = b->cache_n++;
}

/* ---- one word -------------------------------------------------------------------------- */

static int sym_reserve(tok_bpe *b, int64_t n, tg_err *err) {
    if (n <= b->sym_cap) return 0;
    int64_t cap = b->sym_cap ? b->sym_cap : 256;
    while (cap < n) cap *= 2;
    int32_t *a = tg_realloc(b->sym_id, (size_t)cap * sizeof *a);
    if (a) b->sym_id = a;
    int32_t *p = tg_realloc(b->sym_prev, (size_t)cap * sizeof *p);
    if (p) b->sym_prev = p;
    int32_t *x = tg_realloc(b->sym_next, (size_t)cap * sizeof *x);
    if (x) b->sym_next = x;
    /* each symbol's start and end byte */
    int32_t *l = tg_realloc(b->sym_span, (size_t)cap * 2 * sizeof *l);
    if (l) b->sym_span = l;
    /* heap: (rank << 32 | pos) and the merge's new id, at most three pushes a symbol */
    int64_t *h = tg_realloc(b->heap, (size_t)cap * 3 * 2 * sizeof *h);
    if (h) b->heap = h;
    int32_t *o = tg_realloc(b->out_ids, (size_t)cap * 3 * sizeof *o);
    if (o) b->out_ids = o;
    if (!a || !p || !x || !l || !h || !o) return tg_fail(err, "out of memory for a word of %lld bytes", (long long)n);
    b->sym_cap = cap;
    return 0;
}

/* A binary min-heap of (key, new_id) pairs in b->heap. */
static void heap_push(int64_t *h, int64_t *n, int64_t key, int64_t new_id) {
    int64_t i = (*n)++;
    while (i > 0) {
        const int64_t parent = (i - 1) / 2;
        if (h[2 * parent] <= key) break;
        h[2 * i] = h[2 * parent];
        h[2 * i + 1] = h[2 * parent + 1];
        i = parent;
    }
    h[2 * i] = key;
    h[2 * i + 1] = new_id;
}

static void heap_pop(int64_t *h, int64_t *n, int64_t *key, int64_t *new_id) {
    *key = h[0];
    *new_id = h[1];
    const int64_t last = --(*n);
    const int64_t lk = h[2 * last], lv = h[2 * last + 1];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= last) break;
        if (c + 1 < last && h[2 * (c + 1)] < h[2 * c]) c++;
        if (lk <= h[2 * c]) break;
        h[2 * i] = h[2 * c];
        h[2 * i + 1] = h[2 * c + 1];
        i = c;
    }
    h[2 * i] = lk;
    h[2 * i + 1] = lv;
}

static inline void push_pair(tok_bpe *b, int64_t *hn, int32_t pos, int32_t left, int32_t right) {
    const tok_merge *m = merge_find(b, left, right);
    if (m) heap_push(b->heap, hn, (int64_t)m->rank << 32 | pos, m->new_id);
}

/* The tokens of word p[0, n) into b->out_ids as (id, start, end) triples; returns their
 * count, or -1. */
static int32_t bpe_word(tok_bpe *b, const unsigned char *p, int64_t n, tg_err *err) {
    if (sym_reserve(b, n + 1, err)) return -1;
    int32_t *out = b->out_ids;
    if (b->ignore_merges) { /* a word the vocabulary has whole is that token */
        if (n * 2 > b->level_cap) {
            char *l = tg_realloc(b->level, (size_t)n * 2);
            if (!l) return tg_fail(err, "out of memory for a word of %lld bytes", (long long)n);
            b->level = l;
            b->level_cap = n * 2;
        }
        int64_t k = 0;
        for (int64_t i = 0; i < n; i++) k += tok_utf8_put(tok_byte_char(p[i]), b->level + k);
        const int32_t id = tok_vocab_get(&b->vocab, b->level, (size_t)k);
        if (id >= 0) {
            out[0] = id, out[1] = 0, out[2] = (int32_t)n;
            return 1;
        }
    }
    uint64_t hash = 0;
    if (n <= CACHE_KEY_MAX) {
        int32_t count;
        hash = tok_hash(p, (size_t)n);
        const int32_t *hit = cache_get(b, p, n, hash, &count);
        if (hit) {
            memcpy(out, hit, (size_t)count * 3 * sizeof *out);
            return count;
        }
    }
    /* one symbol a byte; a byte without an id is the unk token (fused with an unk
     * before it when fuse_unk), or dropped when there is none */
    int32_t *id = b->sym_id, *prev = b->sym_prev, *next = b->sym_next, *se = b->sym_span;
    int32_t ns = 0, last_unk = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t t = b->byte_id[p[i]];
        if (t < 0) {
            if (b->unk_id < 0) continue;
            if (b->fuse_unk && last_unk) { /* last_unk: the symbol before is an unk */
                se[2 * (ns - 1) + 1] = (int32_t)i + 1;
                continue;
            }
            t = b->unk_id;
            last_unk = 1;
        } else {
            last_unk = 0;
        }
        id[ns] = t;
        se[2 * ns] = (int32_t)i;
        se[2 * ns + 1] = (int32_t)i + 1;
        prev[ns] = ns - 1;
        next[ns] = ns + 1;
        ns++;
    }
    if (ns > 0) next[ns - 1] = -1;
    int64_t hn = 0;
    for (int32_t i = 0; i + 1 < ns; i++) push_pair(b, &hn, i, id[i], id[i + 1]);
    while (hn > 0) {
        int64_t key, new_id;
        heap_pop(b->heap, &hn, &key, &new_id);
        const int32_t pos = (int32_t)(key & 0xffffffff);
        if (se[2 * pos] < 0 || next[pos] < 0) continue; /* merged away, or last */
        const int32_t r = next[pos];
        const tok_merge *m = merge_find(b, id[pos], id[r]);
        if (!m || m->new_id != new_id) continue; /* a stale entry */
        id[pos] = (int32_t)new_id;
        se[2 * pos + 1] = se[2 * r + 1];
        se[2 * r] = -1;
        next[pos] = next[r];
        if (next[r] >= 0) prev[next[r]] = pos;
        if (prev[pos] >= 0) push_pair(b, &hn, prev[pos], id[prev[pos]], id[pos]);
        if (next[pos] >= 0) push_pair(b, &hn, pos, id[pos], id[next[pos]]);
    }
    int32_t count = 0;
    for (int32_t i = ns > 0 ? 0 : -1; i >= 0; i = next[i]) {
        out[3 * count] = id[i];
        out[3 * count + 1] = se[2 * i];
        out[3 * count + 2] = se[2 * i + 1];
        count++;
    }
    if (n <= CACHE_KEY_MAX) cache_put(b, p, n, hash, out, count);
    return count;
}

/* ---- a piece of text ------------------------------------------------------------------- */

/* The tokens of word subj[ws, we) with offsets into text: subj is text[start, ...) behind
 * `virt` added bytes (the prefix space, which stands for the first character); a token
 * that ends inside a character covers all of it, as HF's alignments do. */
static int emit_word(tok_bpe *b, const unsigned char *subj, int64_t ws, int64_t we, int64_t virt, const char *text,
                     int64_t start, int64_t end, tok_list *out, tg_err *err) {
    const int32_t count = bpe_word(b, subj + ws, we - ws, err);
    if (count < 0 || tok_list_reserve(out, count, err)) return -1;
    const unsigned char *src = (const unsigned char *)text + start;
    const int64_t n = end - start;
    for (int32_t k = 0; k < count; k++) {
        int64_t os = ws + b->out_ids[3 * k + 1] - virt, oe = ws + b->out_ids[3 * k + 2] - virt;
        if (os < 0) os = 0;
        if (oe <= 0) oe = 1; /* the prefix space alone: the first character */
        while (os > 0 && (src[os] & 0xC0) == 0x80) os--;
        while (oe < n && (src[oe] & 0xC0) == 0x80) oe++;
        tok_list_push(out, b->out_ids[3 * k], start + os, start + oe, 0);
    }
    return 0;
}

int tok_bpe_encode(tg_tokenizer *t, const char *text, int64_t start, int64_t end, tok_list *out, tg_err *err) {
    tok_bpe *b = &t->bpe;
    const int64_t n = end - start;
    const unsigned char *subj = (const unsigned char *)text + start;
    int64_t virt = 0;
    /* HF's add_prefix_space: a space before a piece that does not start with one */
    if (b->add_prefix_space && n > 0 && text[start] != ' ') {
        if (n + 1 > b->prefixed_cap) {
            char *p = tg_realloc(b->prefixed, (size_t)n + 1);
            if (!p) return tg_fail(err, "out of memory for a text of %lld bytes", (long long)n + 1);
            b->prefixed = p;
            b->prefixed_cap = n + 1;
        }
        b->prefixed[0] = ' ';
        memcpy(b->prefixed + 1, text + start, (size_t)n);
        subj = (const unsigned char *)b->prefixed;
        virt = 1;
    }
    const int64_t sn = n + virt;
    pcre2_match_data *md = b->match_data;
    /* HF splits with the matches isolated: the text between matches is a word too, and an
     * empty match splits where it is. Like Oniguruma's search, the next one starts after
     * the match, or a character further after an empty one. GPT-2's and Llama 3's
     * patterns match at every character; a Split pattern from a file need not. */
    int64_t gap = 0, pos = 0;
    while (pos < sn) {
        const int rc = pcre2_match((const pcre2_code *)b->re, subj, (PCRE2_SIZE)sn, (PCRE2_SIZE)pos, PCRE2_NO_UTF_CHECK,
                                   md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) { /* past PCRE2's match limit (a pattern that backtracks without end) */
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return tg_fail(err, "pre-tokenisation failed at byte %lld: %s", (long long)(start + pos), (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        const int64_t ms = (int64_t)ov[0], me = (int64_t)ov[1];
        if (ms > gap && emit_word(b, subj, gap, ms, virt, text, start, end, out, err)) return -1;
        if (me == ms) { /* an empty match: a split, then on a character further */
            gap = ms;
            pos = ms + 1;
            while (pos < sn && (subj[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        if (emit_word(b, subj, ms, me, virt, text, start, end, out, err)) return -1;
        gap = pos = me;
    }
    if (sn > gap && emit_word(b, subj, gap, sn, virt, text, start, end, out, err)) return -1;
    return 0;
}
