/* Tokenizer files in, encodings out: opening (vocab.txt, tokenizer.json, vocab.json +
 * merges.txt, GPT-2's encoder.json + vocab.bpe, a Hugging Face model folder), the
 * vocabulary map, added tokens, templates, truncation and padding. The models are
 * wordpiece.c and bpe.c. Behaviour follows Hugging Face `tokenizers` (the Rust library
 * behind transformers' fast tokenizers) step for step; the comments name its parts. */
#include "datasets/tokenizer_impl.h"
#include "base/json_strict.h"
#include "base/alloc.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* Ids beyond this are refused: an embedding table that large is no tokenizer's. */
#define TOK_MAX_ID (1 << 22)

/* ---- vocabulary -------------------------------------------------------------------- */

uint64_t tok_hash(const void *s, size_t len) { return XXH3_64bits(s, len); }

static int vocab_grow_slots(tok_vocab *v, tg_err *err) {
    uint32_t size = v->mask ? (v->mask + 1) * 2 : 1024;
    int32_t *slots = tg_malloc((size_t)size * sizeof *slots);
    if (!slots) return tg_fail(err, "out of memory for a vocabulary of %d entries", v->n);
    memset(slots, 0xff, (size_t)size * sizeof *slots);
    for (int32_t e = 0; e < v->n; e++) {
        uint32_t i = (uint32_t)v->entries[e].hash & (size - 1);
        while (slots[i] >= 0) i = (i + 1) & (size - 1);
        slots[i] = e;
    }
    free(v->slots);
    v->slots = slots;
    v->mask = size - 1;
    return 0;
}

int32_t tok_vocab_get_hashed(const tok_vocab *v, const char *s, size_t len, uint64_t hash) {
    if (!v->mask) return -1;
    for (uint32_t i = (uint32_t)hash & v->mask;; i = (i + 1) & v->mask) {
        const int32_t e = v->slots[i];
        if (e < 0) return -1;
        const tok_entry *en = &v->entries[e];
        /* GCOVR_EXCL_BR_START: a 64-bit hash shared by entries of different bytes does not occur in tests */
        if (en->hash == hash && en->len == len && !memcmp(v->text + en->off, s, len)) return en->id;
        /* GCOVR_EXCL_BR_STOP */
    }
}

int tok_vocab_put(tok_vocab *v, const char *s, size_t len, int32_t id, tg_err *err) {
    if (len > UINT32_MAX / 2) return tg_fail(err, "a vocabulary entry of %zu bytes", len);
    const uint64_t hash = tok_hash(s, len);
    if (v->mask) {
        for (uint32_t i = (uint32_t)hash & v->mask;; i = (i + 1) & v->mask) {
            const int32_t e = v->slots[i];
            if (e < 0) break;
            tok_entry *en = &v->entries[e];
            if (en->hash == hash && en->len == len && !memcmp(v->text + en->off, s, len)) { /* GCOVR_EXCL_BR_LINE: no hash collisions */
                en->id = id;
                if (id >= v->n_ids) v->n_ids = id + 1;
                return 0;
            }
        }
    }
    if ((int64_t)(v->n + 1) * 2 > (int64_t)v->mask + 1 && vocab_grow_slots(v, err)) return -1;
    if (v->n == v->cap) {
        if (v->cap >= INT32_MAX / 2) return tg_fail(err, "too many vocabulary entries"); /* GCOVR_EXCL_BR_LINE: 2^30 entries take 24 GiB for the entries alone, from vocabulary files of GiBs (vocab.txt stops at 2^22 lines) */
        int32_t cap = v->cap ? 2 * v->cap : 1024;
        tok_entry *e = tg_realloc(v->entries, (size_t)cap * sizeof *e);
        if (!e) return tg_fail(err, "out of memory for a vocabulary of %d entries", v->n);
        v->entries = e;
        v->cap = cap;
    }
    if (v->text_len + len + 1 > v->text_cap) {
        size_t cap = v->text_cap ? v->text_cap : 65536;
        while (cap < v->text_len + len + 1) cap *= 2;
        if (cap > UINT32_MAX) return tg_fail(err, "vocabulary text over 4 GiB"); /* GCOVR_EXCL_BR_LINE: the vocabulary's text would need tokenizer files of over 4 GiB */
        char *t = tg_realloc(v->text, cap);
        if (!t) return tg_fail(err, "out of memory for the vocabulary text");
        v->text = t;
        v->text_cap = cap;
    }
    memcpy(v->text + v->text_len, s, len);
    v->text[v->text_len + len] = 0;
    v->entries[v->n] = (tok_entry){hash, (uint32_t)v->text_len, (uint32_t)len, id};
    v->text_len += len + 1;
    uint32_t i = (uint32_t)hash & v->mask;
    while (v->slots[i] >= 0) i = (i + 1) & v->mask;
    v->slots[i] = v->n++;
    if (id >= v->n_ids) v->n_ids = id + 1;
    if (len > v->max_len) v->max_len = (uint32_t)len;
    return 0;
}

int tok_vocab_index_ids(tok_vocab *v, tg_err *err) {
    free(v->by_id);
    v->by_id = tg_malloc((size_t)(v->n_ids ? v->n_ids : 1) * sizeof *v->by_id);
    if (!v->by_id) return tg_fail(err, "out of memory for %d vocabulary ids", v->n_ids);
    memset(v->by_id, 0xff, (size_t)v->n_ids * sizeof *v->by_id);
    /* A duplicate moves its entry to the later id: the id it left keeps no entry (HF's
     * reverse map). */
    for (int32_t e = 0; e < v->n; e++) v->by_id[v->entries[e].id] = e;
    return 0;
}

const char *tok_vocab_token(const tok_vocab *v, int32_t id, uint32_t *len) {
    if (!v->by_id || id < 0 || id >= v->n_ids || v->by_id[id] < 0) return NULL;
    const tok_entry *e = &v->entries[v->by_id[id]];
    if (len) *len = e->len;
    return v->text + e->off;
}

void tok_vocab_free(tok_vocab *v) {
    free(v->text);
    free(v->entries);
    free(v->slots);
    free(v->by_id);
    memset(v, 0, sizeof *v);
}

/* ---- token lists --------------------------------------------------------------------- */

int tok_list_reserve(tok_list *l, int64_t extra, tg_err *err) {
    if ((int64_t)l->n + extra <= l->cap) return 0;
    if ((int64_t)l->n + extra > INT32_MAX / 2) return tg_fail(err, "more than %d tokens in one text", INT32_MAX / 2);
    int32_t cap = l->cap ? l->cap : 256;
    while (cap < (int64_t)l->n + extra) cap *= 2;
    int32_t *ids = tg_realloc(l->ids, (size_t)cap * sizeof *ids);
    if (ids) l->ids = ids;
    int64_t *s = tg_realloc(l->start, (size_t)cap * sizeof *s);
    if (s) l->start = s;
    int64_t *e = tg_realloc(l->end, (size_t)cap * sizeof *e);
    if (e) l->end = e;
    uint8_t *a = tg_realloc(l->added, (size_t)cap);
    if (a) l->added = a;
    if (!ids || !s || !e || !a) return tg_fail(err, "out of memory for %d tokens", cap);
    l->cap = cap;
    return 0;
}

void tok_list_free(tok_list *l) {
    free(l->ids);
    free(l->start);
    free(l->end);
    free(l->added);
    memset(l, 0, sizeof *l);
}

/* ---- character classes --------------------------------------------------------------- */

int tok_is_whitespace(uint32_t cp) {
    if (cp < 0x80) return cp == ' ' || (cp >= 9 && cp <= 13);
    if (cp == 0x85) return 1;
    const utf8proc_propval_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

/* Rust regex's \w, which HF's single_word rule tests on the characters beside a match. */
static int is_word_char(uint32_t cp) {
    if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
    if (cp == 0x200C || cp == 0x200D) return 1;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC: return 1;
    default: return 0;
    }
}

/* The first byte of the UTF-8 character that ends at text[end - 1]. */
static int64_t char_before(const char *text, int64_t end) {
    int64_t i = end - 1;
    while (i > 0 && ((unsigned char)text[i] & 0xC0) == 0x80) i--;
    return i;
}

/* Byte offset of the first invalid UTF-8 sequence (overlong forms, surrogates and code
 * points past U+10FFFF included), or -1. */
static int64_t utf8_invalid_at(const char *text, size_t len) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        /* eight ASCII bytes at a time */
        while (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= len) break;
        const unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t cp, min;
        if (c >= 0xC2 && c <= 0xDF) n = 2, cp = c & 0x1F, min = 0x80;
        else if (c >= 0xE0 && c <= 0xEF) n = 3, cp = c & 0x0F, min = 0x800;
        else if (c >= 0xF0 && c <= 0xF4) n = 4, cp = c & 0x07, min = 0x10000;
        else return (int64_t)i;
        if (i + n > len) return (int64_t)i;
        for (size_t k = 1; k < n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return (int64_t)i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return (int64_t)i;
        i += n;
    }
    return -1;
}

/* ---- added tokens -------------------------------------------------------------------- */

static int splits_push(tok_splits *o, int64_t start, int64_t end, int32_t id, tg_err *err) {
    if (o->n == o->cap) {
        if (o->cap >= INT32_MAX / 2) return tg_fail(err, "too many added-token splits"); /* GCOVR_EXCL_BR_LINE: 2^30 + 1 splits, each of a byte or more, need over a GiB of text (encode stops at INT32_MAX / 2 bytes) and 24 GiB of splits */
        int32_t cap = o->cap ? 2 * o->cap : 64;
        tok_split *s = tg_realloc(o->s, (size_t)cap * sizeof *s);
        if (!s) return tg_fail(err, "out of memory for added-token splits");
        o->s = s;
        o->cap = cap;
    }
    o->s[o->n++] = (tok_split){start, end, id};
    return 0;
}

/* HF's AddedVocabulary::find_matches: leftmost-longest matches of the added tokens whose
 * `normalized` flag is `normalized`, the single_word ones only between non-word
 * characters, lstrip / rstrip taking the whitespace beside a match into it. */
int tok_split_added(const tg_tokenizer *t, const char *text, int64_t len, int normalized, tok_splits *out,
                    tg_err *err) {
    out->n = 0;
    int64_t start_offset = 0;
    int any = 0;
    for (int32_t k = 0; k < t->n_added; k++) any |= t->added[k].normalized == normalized;
    if (any) {
        int64_t pos = 0;
        while (pos < len) {
            /* the leftmost position where a token matches, and the longest one there */
            int32_t best = -1;
            int64_t at = pos;
            const uint8_t *first = t->added_first[normalized];
            for (; at < len; at++) {
                if (!first[(unsigned char)text[at]]) continue;
                uint32_t best_len = 0;
                for (int32_t k = 0; k < t->n_added; k++) {
                    const tok_added *a = &t->added[k];
                    if (a->normalized != normalized || a->len <= best_len || a->len > (uint64_t)(len - at) ||
                        a->content[0] != text[at] || memcmp(a->content, text + at, a->len))
                        continue;
                    best = k;
                    best_len = a->len;
                }
                if (best >= 0) break;
            }
            if (best < 0) break;
            const tok_added *a = &t->added[best];
            int64_t start = at, stop = at + a->len;
            pos = stop; /* the search goes on after the match (before any rstrip), kept or not */
            if (a->single_word) {
                int start_space = 1, stop_space = 1;
                if (start > 0) {
                    int64_t i = char_before(text, start);
                    start_space = !is_word_char(tok_utf8_next((const unsigned char *)text, &i));
                }
                if (stop < len) {
                    int64_t i = stop;
                    stop_space = !is_word_char(tok_utf8_next((const unsigned char *)text, &i));
                }
                if (!start_space || !stop_space) continue;
            }
            if (a->lstrip) {
                int64_t s = start;
                while (s > 0) {
                    int64_t i = char_before(text, s), j = i;
                    if (!tok_is_whitespace(tok_utf8_next((const unsigned char *)text, &j))) break;
                    s = i;
                }
                start = s;
            }
            if (a->rstrip) {
                while (stop < len) {
                    int64_t j = stop;
                    if (!tok_is_whitespace(tok_utf8_next((const unsigned char *)text, &j))) break;
                    stop = j;
                }
            }
            if (start_offset < start && splits_push(out, start_offset, start, -1, err)) return -1;
            if (splits_push(out, start, stop, a->id, err)) return -1;
            start_offset = stop;
        }
    }
    if (start_offset < len || len == 0) { /* an empty text is one empty piece */
        if (splits_push(out, start_offset, len, -1, err)) return -1;
    }
    return 0;
}

/* ---- loading ------------------------------------------------------------------------- */

/* What a folder's tokenizer_config.json and config.json say, for the files that do not
 * say it themselves (vocab.txt, vocab.json + merges.txt). -1: not said. */
typedef struct tok_hints {
    int lowercase, strip_accents, chinese, add_prefix_space;
    char tokenizer_class[64], model_type[64];
} tok_hints;

/* What loading builds: the tokenizer, and the hash of what defines its output. */
typedef struct tok_loader {
    tg_tokenizer *t;
    XXH64_state_t *hash;
} tok_loader;

static int read_file(const char *path, char **out, size_t *len, tg_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return tg_fail(err, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            cap = cap ? cap * 2 : 1 << 20;
            char *b = tg_realloc(buf, cap);
            if (!b) {
                free(buf);
                fclose(f);
                return tg_fail(err, "%s: out of memory", path);
            }
            buf = b;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return tg_fail(err, "%s: read failed", path);
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static void join(char *out, size_t n, const char *dir, const char *name) {
    snprintf(out, n, "%s%s%s", dir, dir[0] && dir[strlen(dir) - 1] != '/' ? "/" : "", name); /* GCOVR_EXCL_BR_LINE: dir is never empty: tg_tokenizer_open refuses an empty path and dir_of gives '.' or a prefix of a character or more */
}

static void dir_of(const char *path, char *out, size_t n) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, n, ".");
    else snprintf(out, n, "%.*s", (int)(slash - path + (slash == path)), path);
}

static int json_flag(json_t *o, const char *key, int *out, const char *file, tg_err *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0; /* GCOVR_EXCL_BR_LINE: json_is_null's own NULL test: !v returned first */
    if (!json_is_boolean(v)) return tg_fail(err, "%s: %s is not true or false", file, key); /* GCOVR_EXCL_BR_LINE: json_is_true / json_is_false's NULL tests: !v returned above */
    *out = json_is_true(v); /* GCOVR_EXCL_BR_LINE: json_is_true's NULL test: !v returned above */
    return 0;
}

static int read_hints(const char *dir, tok_hints *h, tg_err *err) {
    *h = (tok_hints){-1, -1, -1, -1, "", ""};
    char path[4096];
    join(path, sizeof path, dir, "tokenizer_config.json");
    if (is_file(path)) {
        json_error_t je;
        json_t *o = tg_json_load_file(path, JSON_REJECT_DUPLICATES, &je);
        if (!o && tg_json_out_of_memory(&je)) return tg_fail(err, "%s: out of memory parsing the JSON", path);
        if (!o) return tg_fail(err, "%s:%d: %s", path, je.line, je.text);
        int rc = json_flag(o, "do_lower_case", &h->lowercase, path, err) ||
                 json_flag(o, "strip_accents", &h->strip_accents, path, err) ||
                 json_flag(o, "tokenize_chinese_chars", &h->chinese, path, err) ||
                 json_flag(o, "add_prefix_space", &h->add_prefix_space, path, err);
        json_t *cls = json_object_get(o, "tokenizer_class");
        if (json_is_string(cls)) snprintf(h->tokenizer_class, sizeof h->tokenizer_class, "%s", json_string_value(cls));
        json_decref(o);
        if (rc) return -1;
    }
    join(path, sizeof path, dir, "config.json");
    if (is_file(path)) {
        json_error_t je;
        json_t *o = tg_json_load_file(path, JSON_REJECT_DUPLICATES, &je);
        if (!o && tg_json_out_of_memory(&je)) return tg_fail(err, "%s: out of memory parsing the JSON", path);
        if (!o) return tg_fail(err, "%s:%d: %s", path, je.line, je.text);
        json_t *mt = json_object_get(o, "model_type");
        if (json_is_string(mt)) snprintf(h->model_type, sizeof h->model_type, "%s", json_string_value(mt));
        json_decref(o);
    }
    return 0;
}

static int add_added(tg_tokenizer *t, const char *content, size_t len, int32_t id, int special, int lstrip,
                     int rstrip, int single_word, int normalized, tg_err *err) {
    if (!len) return tg_fail(err, "an added token with empty content (id %d)", id);
    for (int32_t k = 0; k < t->n_added; k++)
        if (t->added[k].len == len && !memcmp(t->added[k].content, content, len)) {
            /* HF keeps one entry per content; a later one replaces the earlier */
            free(t->added[k].content);
            memmove(t->added + k, t->added + k + 1, (size_t)(t->n_added - k - 1) * sizeof *t->added);
            t->n_added--;
            break;
        }
    if (t->n_added == t->cap_added) {
        int32_t cap = t->cap_added ? 2 * t->cap_added : 16;
        tok_added *a = tg_realloc(t->added, (size_t)cap * sizeof *a);
        if (!a) return tg_fail(err, "out of memory for added tokens");
        t->added = a;
        t->cap_added = cap;
    }
    char *c = tg_malloc(len + 1);
    if (!c) return tg_fail(err, "out of memory for added tokens");
    memcpy(c, content, len);
    c[len] = 0;
    t->added[t->n_added++] = (tok_added){c, (uint32_t)len, id, (uint8_t)special, (uint8_t)lstrip, (uint8_t)rstrip,
                                         (uint8_t)single_word, (uint8_t)normalized};
    if (normalized) t->has_normalized_added = 1;
    t->added_first[normalized ? 1 : 0][(unsigned char)content[0]] = 1;
    return 0;
}

static tok_vocab *model_vocab(tg_tokenizer *t) {
    return t->family == TG_TOKENIZER_WORDPIECE ? &t->wp.vocab : &t->bpe.vocab;
}

int32_t tg_tokenizer_token_id(const tg_tokenizer *tok, const char *token) {
    if (!tok || !token) return -1;
    const size_t len = strlen(token);
    /* added tokens take precedence, as in HF's token_to_id */
    for (int32_t k = 0; k < tok->n_added; k++)
        if (tok->added[k].len == len && !memcmp(tok->added[k].content, token, len)) return tok->added[k].id;
    return tok_vocab_get(tok->family == TG_TOKENIZER_WORDPIECE ? &tok->wp.vocab : &tok->bpe.vocab, token, len);
}

/* The template pieces: a special token by name (looked up in the vocabulary) or id. */
static int tmpl_special(tok_template *tm, tok_piece *p, const int32_t *ids, int32_t n, int32_t type_id, tg_err *err) {
    if (tm->n_ids + n > TOK_TEMPLATE_IDS) return tg_fail(err, "post_processor: more than %d special token ids", TOK_TEMPLATE_IDS);
    *p = (tok_piece){TOK_PIECE_SPECIAL, type_id, tm->n_ids, n};
    memcpy(tm->ids + tm->n_ids, ids, (size_t)n * sizeof *ids);
    tm->n_ids += n;
    return 0;
}

/* [cls] A [sep] and [cls] A [sep] (sep2) B [sep]: BERT's and RoBERTa's templates. Six
 * ids at most, from an empty table of TOK_TEMPLATE_IDS: tmpl_special cannot refuse them. */
static void tmpl_cls_sep(tok_template *tm, int32_t cls, int32_t sep, int roberta) {
    tm->n_single = tm->n_pair = tm->n_ids = 0;
    const int32_t b_type = roberta ? 0 : 1;
    (void)tmpl_special(tm, &tm->single[tm->n_single++], &cls, 1, 0, NULL);
    tm->single[tm->n_single++] = (tok_piece){TOK_PIECE_A, 0, 0, 0};
    (void)tmpl_special(tm, &tm->single[tm->n_single++], &sep, 1, 0, NULL);
    (void)tmpl_special(tm, &tm->pair[tm->n_pair++], &cls, 1, 0, NULL);
    tm->pair[tm->n_pair++] = (tok_piece){TOK_PIECE_A, 0, 0, 0};
    (void)tmpl_special(tm, &tm->pair[tm->n_pair++], &sep, 1, 0, NULL);
    if (roberta) (void)tmpl_special(tm, &tm->pair[tm->n_pair++], &sep, 1, 0, NULL);
    tm->pair[tm->n_pair++] = (tok_piece){TOK_PIECE_B, b_type, 0, 0};
    (void)tmpl_special(tm, &tm->pair[tm->n_pair++], &sep, 1, b_type, NULL);
}

static void tmpl_plain(tok_template *tm) {
    tm->n_single = tm->n_pair = tm->n_ids = 0;
    tm->single[tm->n_single++] = (tok_piece){TOK_PIECE_A, 0, 0, 0};
    tm->pair[tm->n_pair++] = (tok_piece){TOK_PIECE_A, 0, 0, 0};
    tm->pair[tm->n_pair++] = (tok_piece){TOK_PIECE_B, 1, 0, 0};
}

static int32_t template_added(const tok_template *tm, int pair) {
    int32_t n = 0;
    const tok_piece *p = pair ? tm->pair : tm->single;
    for (int32_t i = 0; i < (pair ? tm->n_pair : tm->n_single); i++)
        if (p[i].kind == TOK_PIECE_SPECIAL) n += p[i].n_ids;
    return n;
}

int32_t tg_tokenizer_added_count(const tg_tokenizer *tok, int pair) {
    return tok ? template_added(&tok->tmpl, pair) : 0;
}

/* vocab.txt: one token a line, its id the line number; HF trims each line's end. */
static int load_vocab_txt(tok_loader *L, const char *path, const tok_hints *h, tg_err *err) {
    tg_tokenizer *t = L->t;
    char *buf;
    size_t len;
    if (read_file(path, &buf, &len, err)) return -1;
    XXH64_update(L->hash, "vocab.txt", 9);
    XXH64_update(L->hash, buf, len);
    t->family = TG_TOKENIZER_WORDPIECE;
    tok_wordpiece *w = &t->wp;
    int32_t id = 0;
    int rc = 0;
    size_t i = 0;
    while (i < len && !rc) {
        size_t e = i;
        while (e < len && buf[e] != '\n') e++;
        size_t next = e + (e < len);
        if (utf8_invalid_at(buf + i, e - i) >= 0) {
            rc = tg_fail(err, "%s:%d: invalid UTF-8", path, id + 1);
            break;
        }
        /* trim_end: trailing Unicode whitespace */
        while (e > i) {
            int64_t c = char_before(buf + i, (int64_t)(e - i)), j = c;
            if (!tok_is_whitespace(tok_utf8_next((const unsigned char *)buf + i, &j))) break;
            e = i + (size_t)c;
        }
        if (id >= TOK_MAX_ID) rc = tg_fail(err, "%s: more than %d lines", path, TOK_MAX_ID);
        else rc = tok_vocab_put(&w->vocab, buf + i, e - i, id++, err);
        i = next;
    }
    free(buf);
    if (rc) return -1;
    if (w->vocab.n == 0) return tg_fail(err, "%s: empty vocabulary", path);
    /* transformers' BertTokenizerFast: BertNormalizer from the config, the usual names. */
    w->has_normalizer = 1;
    w->clean_text = 1;
    w->lowercase = h->lowercase < 0 ? 1 : h->lowercase;
    w->strip_accents = h->strip_accents < 0 ? w->lowercase : h->strip_accents;
    w->chinese = h->chinese < 0 ? 1 : h->chinese;
    snprintf(w->unk_token, sizeof w->unk_token, "[UNK]");
    snprintf(w->prefix, sizeof w->prefix, "##");
    w->prefix_len = 2;
    w->max_chars = 100;
    static const char *const specials[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    for (size_t k = 0; k < sizeof specials / sizeof *specials; k++) {
        int32_t sid = tok_vocab_get(&w->vocab, specials[k], strlen(specials[k]));
        if (sid >= 0 && add_added(t, specials[k], strlen(specials[k]), sid, 1, 0, 0, 0, 0, err)) return -1;
    }
    const int32_t cls = tok_vocab_get(&w->vocab, "[CLS]", 5), sep = tok_vocab_get(&w->vocab, "[SEP]", 5);
    if (cls < 0 || sep < 0) return tg_fail(err, "%s: no [CLS] or [SEP] in the vocabulary", path);
    tmpl_cls_sep(&t->tmpl, cls, sep, 0);
    return 0;
}

/* A JSON object of token -> id into a vocabulary. */
static int load_vocab_object(json_t *obj, tok_vocab *v, const char *where, tg_err *err) {
    if (!json_is_object(obj)) return tg_fail(err, "%s is not an object of token: id", where);
    const char *key;
    json_t *val;
    json_object_foreach(obj, key, val) { /* GCOVR_EXCL_BR_LINE: the macro's value test cannot fail for a key it found */
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= TOK_MAX_ID) /* GCOVR_EXCL_BR_LINE: json_is_integer's NULL test: the foreach gives a value */
            return tg_fail(err, "%s: '%s' has no id from 0 to %d", where, key, TOK_MAX_ID - 1);
        if (tok_vocab_put(v, key, strlen(key), (int32_t)json_integer_value(val), err))
            return tg_fail_context(err, "%s", where);
    }
    if (v->n == 0) return tg_fail(err, "%s: empty vocabulary", where);
    return 0;
}

static int add_merge(tok_bpe *b, const char *l, size_t ll, const char *r, size_t rl, int32_t rank, const char *where,
                     tg_err *err) {
    const int32_t li = tok_vocab_get(&b->vocab, l, ll), ri = tok_vocab_get(&b->vocab, r, rl);
    if (li < 0 || ri < 0)
        return tg_fail(err, "%s: merge %d: '%.*s' is not in the vocabulary", where, rank + 1, li < 0 ? (int)ll : (int)rl,
                       li < 0 ? l : r);
    char stack[512];
    char *joined = ll + rl <= sizeof stack ? stack : tg_malloc(ll + rl);
    if (!joined) return tg_fail(err, "%s: merge %d: out of memory", where, rank + 1);
    memcpy(joined, l, ll);
    memcpy(joined + ll, r, rl);
    const int32_t ni = tok_vocab_get(&b->vocab, joined, ll + rl);
    if (joined != stack) free(joined);
    if (ni < 0) return tg_fail(err, "%s: merge %d: '%.*s%.*s' is not in the vocabulary", where, rank + 1, (int)ll, l, (int)rl, r);
    return tok_bpe_add_merge(b, li, ri, rank, ni, err);
}

/* merges.txt / vocab.bpe: "left right" a line, after an optional "#version" line. */
static int load_merges_txt(tok_loader *L, const char *path, tg_err *err) {
    char *buf;
    size_t len;
    if (read_file(path, &buf, &len, err)) return -1;
    XXH64_update(L->hash, "merges", 6);
    XXH64_update(L->hash, buf, len);
    tok_bpe *b = &L->t->bpe;
    int32_t rank = 0, line = 0;
    int rc = 0;
    size_t i = 0;
    while (i < len && !rc) {
        size_t e = i;
        while (e < len && buf[e] != '\n') e++;
        size_t next = e + (e < len);
        line++;
        if (e - i >= 8 && !memcmp(buf + i, "#version", 8)) {
            i = next;
            continue;
        }
        const char *sp = memchr(buf + i, ' ', e - i);
        /* exactly two parts split on ' ' */
        if (!sp || sp == buf + i || sp + 1 >= buf + e || memchr(sp + 1, ' ', (size_t)(buf + e - sp - 1)))
            rc = tg_fail(err, "%s:%d: not two tokens separated by one space", path, line);
        else if (rank >= TOK_MAX_ID)
            rc = tg_fail(err, "%s: more than %d merges", path, TOK_MAX_ID);
        else
            rc = add_merge(b, buf + i, (size_t)(sp - buf - (ptrdiff_t)i), sp + 1, (size_t)(buf + e - sp - 1), rank++, path, err);
        i = next;
    }
    free(buf);
    return rc;
}

static void set_special_ids(tg_tokenizer *t) {
    tg_special_ids *s = &t->special;
    *s = (tg_special_ids){-1, -1, -1, -1, -1, -1, -1};
    switch (t->family) { /* GCOVR_EXCL_BR_LINE: loading sets one of the four families */
    case TG_TOKENIZER_WORDPIECE:
        s->cls = tg_tokenizer_token_id(t, "[CLS]");
        s->sep = tg_tokenizer_token_id(t, "[SEP]");
        s->pad = tg_tokenizer_token_id(t, "[PAD]");
        s->unk = t->wp.unk_id;
        s->mask = tg_tokenizer_token_id(t, "[MASK]");
        break;
    case TG_TOKENIZER_BPE_ROBERTA:
        s->cls = s->bos = tg_tokenizer_token_id(t, "<s>");
        s->sep = s->eos = tg_tokenizer_token_id(t, "</s>");
        s->pad = tg_tokenizer_token_id(t, "<pad>");
        s->unk = t->bpe.unk_id >= 0 ? t->bpe.unk_id : tg_tokenizer_token_id(t, "<unk>");
        s->mask = tg_tokenizer_token_id(t, "<mask>");
        break;
    case TG_TOKENIZER_BPE_GPT2:
        s->bos = s->eos = tg_tokenizer_token_id(t, "<|endoftext|>");
        s->unk = t->bpe.unk_id >= 0 ? t->bpe.unk_id : s->eos;
        break;
    case TG_TOKENIZER_BPE_LLAMA:
        /* the template's first token, <|end_of_text|> and no pad, where tokenizer_config.json
         * does not say; no cls or sep (the template's last token is no sep) */
        s->bos = t->config_bos != -2 ? t->config_bos : t->tmpl.ids[t->tmpl.single[0].first];
        s->eos = t->config_eos != -2 ? t->config_eos : tg_tokenizer_token_id(t, "<|end_of_text|>");
        s->pad = t->config_pad != -2 ? t->config_pad : -1;
        s->unk = t->bpe.unk_id;
        return;
    }
    /* The template's own tokens are the cls / sep where it has them. */
    const tok_template *tm = &t->tmpl;
    if (tm->n_pair >= 3 && tm->pair[0].kind == TOK_PIECE_SPECIAL && tm->pair[0].n_ids == 1 &&
        t->family != TG_TOKENIZER_BPE_GPT2) {
        s->cls = tm->ids[tm->pair[0].first];
        const tok_piece *last = &tm->pair[tm->n_pair - 1];
        if (last->kind == TOK_PIECE_SPECIAL && last->n_ids == 1) s->sep = tm->ids[last->first];
        if (t->family == TG_TOKENIZER_BPE_ROBERTA) s->bos = s->cls, s->eos = s->sep;
    }
}

/* vocab.json (or encoder.json) + merges.txt (or vocab.bpe): GPT-2 or RoBERTa as the
 * folder's config says, else RoBERTa when the vocabulary has <s> and </s>. */
static int load_vocab_json(tok_loader *L, const char *vocab_path, const char *merges_path, const tok_hints *h,
                           tg_err *err) {
    tg_tokenizer *t = L->t;
    char *buf;
    size_t len;
    if (read_file(vocab_path, &buf, &len, err)) return -1;
    XXH64_update(L->hash, "vocab.json", 10);
    XXH64_update(L->hash, buf, len);
    json_error_t je;
    json_t *root = tg_json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    free(buf);
    if (!root && tg_json_out_of_memory(&je)) return tg_fail(err, "%s: out of memory parsing the JSON", vocab_path);
    if (!root) return tg_fail(err, "%s:%d: %s", vocab_path, je.line, je.text);
    tok_bpe *b = &t->bpe;
    t->family = TG_TOKENIZER_BPE_GPT2;
    int rc = load_vocab_object(root, &b->vocab, vocab_path, err);
    json_decref(root);
    if (rc || load_merges_txt(L, merges_path, err)) return -1;
    int roberta;
    if (!strncmp(h->tokenizer_class, "Roberta", 7) || !strcmp(h->model_type, "roberta")) roberta = 1;
    else if (!strncmp(h->tokenizer_class, "GPT2", 4) || !strcmp(h->model_type, "gpt2")) roberta = 0;
    else roberta = tok_vocab_get(&b->vocab, "<s>", 3) >= 0 && tok_vocab_get(&b->vocab, "</s>", 4) >= 0;
    b->add_prefix_space = h->add_prefix_space > 0;
    b->unk_id = -1;
    if (roberta) {
        /* transformers' RobertaTokenizerFast: these as special tokens, <mask> taking the
         * whitespace before it; RobertaProcessing trims offsets. */
        t->family = TG_TOKENIZER_BPE_ROBERTA;
        static const char *const names[] = {"<s>", "<pad>", "</s>", "<unk>", "<mask>"};
        for (size_t k = 0; k < 5; k++) {
            int32_t id = tok_vocab_get(&b->vocab, names[k], strlen(names[k]));
            if (id >= 0 && add_added(t, names[k], strlen(names[k]), id, 1, k == 4, 0, 0, 0, err)) return -1;
        }
        const int32_t cls = tok_vocab_get(&b->vocab, "<s>", 3), sep = tok_vocab_get(&b->vocab, "</s>", 4);
        if (cls < 0 || sep < 0) return tg_fail(err, "%s: a RoBERTa vocabulary without <s> or </s>", vocab_path);
        tmpl_cls_sep(&t->tmpl, cls, sep, 1);
        t->tmpl.trim_offsets = 1;
        t->tmpl.trim_add_prefix_space = b->add_prefix_space;
    } else {
        int32_t id = tok_vocab_get(&b->vocab, "<|endoftext|>", 13);
        if (id >= 0 && add_added(t, "<|endoftext|>", 13, id, 1, 0, 0, 0, 1, err)) return -1;
        tmpl_plain(&t->tmpl);
    }
    return 0;
}

/* ---- tokenizer.json ------------------------------------------------------------------ */

static const char *jtype(json_t *o) {
    json_t *ty = json_object_get(o, "type");
    return json_is_string(ty) ? json_string_value(ty) : "";
}

static int jbool(json_t *o, const char *key, int dflt) {
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt; /* GCOVR_EXCL_BR_LINE: json_is_true / json_is_false test v for NULL again after json_is_boolean's first test */
}

static int parse_normalizer(tg_tokenizer *t, json_t *n, const char *p, tg_err *err) {
    if (!n || json_is_null(n)) return 0; /* GCOVR_EXCL_BR_LINE: json_is_null's own NULL test: !n returned first */
    const char *ty = jtype(n);
    if (t->family != TG_TOKENIZER_WORDPIECE || strcmp(ty, "BertNormalizer"))
        return tg_fail(err, "%s: normalizer '%s' is not supported (WordPiece takes BertNormalizer; byte-level BPE none)", p, ty);
    tok_wordpiece *w = &t->wp;
    w->has_normalizer = 1;
    w->clean_text = jbool(n, "clean_text", 1);
    w->chinese = jbool(n, "handle_chinese_chars", 1);
    w->lowercase = jbool(n, "lowercase", 1);
    json_t *sa = json_object_get(n, "strip_accents");
    w->strip_accents = json_is_boolean(sa) ? json_is_true(sa) : w->lowercase; /* null: as lowercase */ /* GCOVR_EXCL_BR_LINE: json_is_true / json_is_false test sa for NULL again after json_is_boolean's first test */
    return 0;
}

/* Llama 3's pre-tokenizer: Sequence [Split {a Regex pattern, Isolated, not inverted},
 * ByteLevel {no regex, no prefix space}]: the pattern's matches and the text between
 * them are the words, each word's bytes the byte-level characters. */
static int parse_split_byte_level(tg_tokenizer *t, json_t *pt, const char *p, tg_err *err) {
    json_t *list = json_object_get(pt, "pretokenizers");
    json_t *split = json_array_get(list, 0), *bl = json_array_get(list, 1);
    if (json_array_size(list) != 2 || strcmp(jtype(split), "Split") || strcmp(jtype(bl), "ByteLevel"))
        return tg_fail(err, "%s: pre_tokenizer Sequence: only [Split, ByteLevel] (Llama 3's) is supported", p);
    json_t *re = json_object_get(json_object_get(split, "pattern"), "Regex");
    if (!json_is_string(re))
        return tg_fail(err, "%s: pre_tokenizer.pretokenizers[0].pattern is not {\"Regex\": pattern} (the one supported)", p);
    json_t *behavior = json_object_get(split, "behavior");
    const char *bh = json_is_string(behavior) ? json_string_value(behavior) : "";
    if (strcmp(bh, "Isolated"))
        return tg_fail(err, "%s: pre_tokenizer.pretokenizers[0].behavior '%s' is not supported (Isolated is)", p, bh);
    if (jbool(split, "invert", 0)) return tg_fail(err, "%s: pre_tokenizer.pretokenizers[0].invert true is not supported", p);
    if (jbool(bl, "use_regex", 1))
        return tg_fail(err, "%s: pre_tokenizer.pretokenizers[1]: ByteLevel with use_regex after a Split is not supported", p);
    if (jbool(bl, "add_prefix_space", 1))
        return tg_fail(err, "%s: pre_tokenizer.pretokenizers[1]: ByteLevel with add_prefix_space after a Split is not supported",
                       p);
    char where[4200];
    snprintf(where, sizeof where, "%s: pre_tokenizer.pretokenizers[0].pattern.Regex", p);
    return tok_bpe_set_pattern(&t->bpe, json_string_value(re), json_string_length(re), where, err);
}

static int parse_pre_tokenizer(tg_tokenizer *t, json_t *pt, const char *p, tg_err *err) {
    const char *ty = pt && !json_is_null(pt) ? jtype(pt) : "none"; /* GCOVR_EXCL_BR_LINE: json_is_null's own NULL test: pt && came first */
    if (t->family == TG_TOKENIZER_WORDPIECE) {
        if (strcmp(ty, "BertPreTokenizer"))
            return tg_fail(err, "%s: pre_tokenizer '%s' is not supported with WordPiece (BertPreTokenizer is)", p, ty);
        return 0;
    }
    if (!strcmp(ty, "Sequence")) return parse_split_byte_level(t, pt, p, err);
    if (strcmp(ty, "ByteLevel"))
        return tg_fail(err, "%s: pre_tokenizer '%s' is not supported with BPE (ByteLevel, or Sequence [Split, ByteLevel], is)",
                       p, ty);
    if (!jbool(pt, "use_regex", 1))
        return tg_fail(err, "%s: pre_tokenizer ByteLevel without use_regex is not supported", p);
    t->bpe.add_prefix_space = jbool(pt, "add_prefix_space", 1);
    return 0;
}

/* A [name, id] pair of BertProcessing / RobertaProcessing. */
static int name_id(json_t *a, const char *what, const char *p, int32_t *id, tg_err *err) {
    json_t *v = json_array_get(a, 1);
    if (!json_is_array(a) || json_array_size(a) != 2 || !json_is_string(json_array_get(a, 0)) || !json_is_integer(v) || /* GCOVR_EXCL_BR_LINE: items 0 and 1 of an array of size 2 are not NULL (json_is_string / json_is_integer's NULL tests) */
        json_integer_value(v) < 0 || json_integer_value(v) >= TOK_MAX_ID)
        return tg_fail(err, "%s: post_processor %s is not [token, id]", p, what);
    *id = (int32_t)json_integer_value(v);
    return 0;
}

static int parse_template_list(tok_template *tm, json_t *list, json_t *specials, int pair, const char *p, tg_err *err) {
    const char *which = pair ? "pair" : "single";
    if (!json_is_array(list)) return tg_fail(err, "%s: post_processor.%s is not a list", p, which);
    tok_piece *out = pair ? tm->pair : tm->single;
    int32_t *n = pair ? &tm->n_pair : &tm->n_single;
    *n = 0;
    size_t i;
    json_t *item;
    json_array_foreach(list, i, item) { /* GCOVR_EXCL_BR_LINE: json_array_foreach's item test: json_array_get below the size does not give NULL */
        if (*n == TOK_TEMPLATE_MAX) return tg_fail(err, "%s: post_processor.%s has over %d pieces", p, which, TOK_TEMPLATE_MAX);
        json_t *seq = json_object_get(item, "Sequence"), *sp = json_object_get(item, "SpecialToken");
        json_t *body = seq ? seq : sp;
        json_t *tid = json_object_get(body, "type_id"), *id = json_object_get(body, "id");
        if (!json_is_object(body) || !json_is_integer(tid) || json_integer_value(tid) < 0 ||
            json_integer_value(tid) > 255 || !json_is_string(id))
            return tg_fail(err, "%s: post_processor.%s[%zu] is not a Sequence or SpecialToken with id and type_id", p,
                           which, i);
        const int32_t type_id = (int32_t)json_integer_value(tid);
        if (seq) {
            const char *s = json_string_value(id);
            if (strcmp(s, "A") && strcmp(s, "B"))
                return tg_fail(err, "%s: post_processor.%s[%zu]: sequence '%s' is not A or B", p, which, i, s);
            if (s[0] == 'B' && !pair) return tg_fail(err, "%s: post_processor.single names sequence B", p);
            out[(*n)++] = (tok_piece){s[0] == 'A' ? TOK_PIECE_A : TOK_PIECE_B, type_id, 0, 0};
            continue;
        }
        json_t *st = json_object_get(specials, json_string_value(id)), *ids = json_object_get(st, "ids");
        if (!json_is_array(ids) || json_array_size(ids) == 0)
            return tg_fail(err, "%s: post_processor: special token '%s' has no ids in special_tokens", p,
                           json_string_value(id));
        int32_t buf[TOK_TEMPLATE_IDS];
        size_t k;
        json_t *v;
        if (json_array_size(ids) > TOK_TEMPLATE_IDS) return tg_fail(err, "%s: post_processor: too many ids", p);
        json_array_foreach(ids, k, v) { /* GCOVR_EXCL_BR_LINE: json_array_foreach's item test: json_array_get below the size does not give NULL */
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= TOK_MAX_ID) /* GCOVR_EXCL_BR_LINE: json_is_integer's NULL test: the foreach gives an item */
                return tg_fail(err, "%s: post_processor: special token '%s' has a bad id", p, json_string_value(id));
            buf[k] = (int32_t)json_integer_value(v);
        }
        if (tmpl_special(tm, &out[(*n)++], buf, (int32_t)json_array_size(ids), type_id, err)) return -1;
    }
    int seen_a = 0, seen_b = 0;
    for (int32_t k = 0; k < *n; k++) seen_a += out[k].kind == TOK_PIECE_A, seen_b += out[k].kind == TOK_PIECE_B;
    if (seen_a != 1 || seen_b != pair)
        return tg_fail(err, "%s: post_processor.%s must name sequence A once%s", p, which, pair ? " and B once" : "");
    return 0;
}

/* One post-processor; *shaped is set when it defines the template (more than one does:
 * refused). */
static int parse_post_processor(tg_tokenizer *t, json_t *pp, int *shaped, const char *p, tg_err *err) {
    const char *ty = jtype(pp);
    tok_template *tm = &t->tmpl;
    if (!strcmp(ty, "Sequence")) {
        json_t *list = json_object_get(pp, "processors");
        if (!json_is_array(list)) return tg_fail(err, "%s: post_processor Sequence has no processors list", p);
        size_t i;
        json_t *item;
        json_array_foreach(list, i, item) if (parse_post_processor(t, item, shaped, p, err)) return -1; /* GCOVR_EXCL_BR_LINE: json_array_foreach's item test: json_array_get below the size does not give NULL */
        return 0;
    }
    if (!strcmp(ty, "ByteLevel")) {
        tm->trim_offsets = jbool(pp, "trim_offsets", 1);
        tm->trim_add_prefix_space = jbool(pp, "add_prefix_space", 1);
        return 0;
    }
    if ((*shaped)++) return tg_fail(err, "%s: post_processor: more than one template", p);
    if (!strcmp(ty, "BertProcessing") || !strcmp(ty, "RobertaProcessing")) {
        const int roberta = ty[0] == 'R';
        int32_t cls, sep;
        if (name_id(json_object_get(pp, "cls"), "cls", p, &cls, err) ||
            name_id(json_object_get(pp, "sep"), "sep", p, &sep, err))
            return -1;
        tmpl_cls_sep(tm, cls, sep, roberta);
        if (roberta) {
            if (t->family == TG_TOKENIZER_WORDPIECE) return tg_fail(err, "%s: RobertaProcessing with a WordPiece model", p);
            t->family = TG_TOKENIZER_BPE_ROBERTA;
            tm->trim_offsets = jbool(pp, "trim_offsets", 1);
            tm->trim_add_prefix_space = jbool(pp, "add_prefix_space", 1);
        }
        return 0;
    }
    if (!strcmp(ty, "TemplateProcessing")) {
        json_t *specials = json_object_get(pp, "special_tokens");
        tm->n_ids = 0;
        if (parse_template_list(tm, json_object_get(pp, "single"), specials, 0, p, err) ||
            parse_template_list(tm, json_object_get(pp, "pair"), specials, 1, p, err))
            return -1;
        /* A BPE model whose template adds <s> ... </s> is RoBERTa's family; one whose
         * template starts with one token (a bos, <|begin_of_text|>) otherwise, Llama's. */
        if (t->family != TG_TOKENIZER_WORDPIECE && template_added(tm, 0) > 0) {
            if (tok_vocab_get(&t->bpe.vocab, "<s>", 3) >= 0) t->family = TG_TOKENIZER_BPE_ROBERTA;
            else if (tm->single[0].kind == TOK_PIECE_SPECIAL && tm->single[0].n_ids == 1)
                t->family = TG_TOKENIZER_BPE_LLAMA;
        }
        return 0;
    }
    return tg_fail(err, "%s: post_processor '%s' is not supported", p, ty);
}

static int parse_wordpiece_model(tg_tokenizer *t, json_t *m, const char *p, tg_err *err) {
    tok_wordpiece *w = &t->wp;
    char where[4200];
    snprintf(where, sizeof where, "%s: model.vocab", p);
    if (load_vocab_object(json_object_get(m, "vocab"), &w->vocab, where, err)) return -1;
    json_t *unk = json_object_get(m, "unk_token"), *pre = json_object_get(m, "continuing_subword_prefix"),
           *mc = json_object_get(m, "max_input_chars_per_word");
    snprintf(w->unk_token, sizeof w->unk_token, "%s", json_is_string(unk) ? json_string_value(unk) : "[UNK]");
    const char *prefix = json_is_string(pre) ? json_string_value(pre) : "##";
    if (strlen(prefix) >= sizeof w->prefix) return tg_fail(err, "%s: model.continuing_subword_prefix is too long", p);
    snprintf(w->prefix, sizeof w->prefix, "%s", prefix);
    w->prefix_len = (uint32_t)strlen(prefix);
    if (mc && !json_is_integer(mc)) return tg_fail(err, "%s: model.max_input_chars_per_word is not an integer", p); /* GCOVR_EXCL_BR_LINE: json_is_integer's NULL test: mc && came first */
    const json_int_t mcv = mc ? json_integer_value(mc) : 100;
    if (mcv < 0 || mcv > INT32_MAX) return tg_fail(err, "%s: model.max_input_chars_per_word %lld is out of range", p, (long long)mcv);
    w->max_chars = (int32_t)mcv;
    return 0;
}

static int parse_bpe_model(tok_loader *L, json_t *m, const char *p, tg_err *err) {
    tok_bpe *b = &L->t->bpe;
    char where[4200];
    snprintf(where, sizeof where, "%s: model.vocab", p);
    if (load_vocab_object(json_object_get(m, "vocab"), &b->vocab, where, err)) return -1;
    json_t *dropout = json_object_get(m, "dropout");
    if (dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0)) /* GCOVR_EXCL_BR_LINE: the macros' NULL tests: dropout && came first */
        return tg_fail(err, "%s: model.dropout is not supported (it makes encodings random)", p);
    static const char *const empty_keys[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        json_t *v = json_object_get(m, empty_keys[k]);
        if (v && !json_is_null(v) && !(json_is_string(v) && !json_string_value(v)[0])) /* GCOVR_EXCL_BR_LINE: the macros' NULL tests: v && came first */
            return tg_fail(err, "%s: model.%s is not supported with byte-level BPE", p, empty_keys[k]);
    }
    if (jbool(m, "byte_fallback", 0)) return tg_fail(err, "%s: model.byte_fallback is not supported", p);
    b->fuse_unk = jbool(m, "fuse_unk", 0);
    b->ignore_merges = jbool(m, "ignore_merges", 0);
    json_t *unk = json_object_get(m, "unk_token");
    b->unk_id = -1;
    if (json_is_string(unk)) {
        b->unk_id = tok_vocab_get(&b->vocab, json_string_value(unk), strlen(json_string_value(unk)));
        if (b->unk_id < 0) return tg_fail(err, "%s: model.unk_token '%s' is not in the vocabulary", p, json_string_value(unk));
    }
    json_t *merges = json_object_get(m, "merges");
    if (!json_is_array(merges)) return tg_fail(err, "%s: model.merges is not a list", p);
    snprintf(where, sizeof where, "%s: model.merges", p);
    size_t i;
    json_t *mg;
    json_array_foreach(merges, i, mg) { /* GCOVR_EXCL_BR_LINE: json_array_foreach's item test: json_array_get below the size does not give NULL */
        if (i >= TOK_MAX_ID) return tg_fail(err, "%s: more than %d merges", where, TOK_MAX_ID);
        const char *l, *r;
        size_t ll, rl;
        if (json_is_string(mg)) { /* "left right" */ /* GCOVR_EXCL_BR_LINE: json_is_string's NULL test: the foreach gives an item */
            l = json_string_value(mg);
            const char *sp = strchr(l, ' ');
            if (!sp || sp == l || !sp[1] || strchr(sp + 1, ' '))
                return tg_fail(err, "%s[%zu]: '%s' is not two tokens separated by one space", where, i, l);
            ll = (size_t)(sp - l);
            r = sp + 1;
            rl = strlen(r);
        } else if (json_is_array(mg) && json_array_size(mg) == 2 && json_is_string(json_array_get(mg, 0)) && /* GCOVR_EXCL_BR_LINE: the macros' NULL tests: mg is a foreach item, and items 0 and 1 of an array of size 2 exist */
                   json_is_string(json_array_get(mg, 1))) { /* ["left", "right"] */
            l = json_string_value(json_array_get(mg, 0));
            r = json_string_value(json_array_get(mg, 1));
            ll = strlen(l);
            rl = strlen(r);
        } else {
            return tg_fail(err, "%s[%zu] is neither \"a b\" nor [\"a\", \"b\"]", where, i);
        }
        if (add_merge(b, l, ll, r, rl, (int32_t)i, where, err)) return -1;
    }
    return 0;
}

static int parse_added_tokens(tg_tokenizer *t, json_t *list, const char *p, tg_err *err) {
    if (!list || json_is_null(list)) return 0; /* GCOVR_EXCL_BR_LINE: json_is_null's own NULL test: !list returned first */
    if (!json_is_array(list)) return tg_fail(err, "%s: added_tokens is not a list", p); /* GCOVR_EXCL_BR_LINE: json_is_array's NULL test: !list returned above */
    size_t i;
    json_t *a;
    json_array_foreach(list, i, a) { /* GCOVR_EXCL_BR_LINE: json_array_foreach's item test: json_array_get below the size does not give NULL */
        json_t *id = json_object_get(a, "id"), *content = json_object_get(a, "content");
        if (!json_is_integer(id) || !json_is_string(content))
            return tg_fail(err, "%s: added_tokens[%zu] has no integer id and string content", p, i);
        const json_int_t idv = json_integer_value(id);
        if (idv < 0 || idv >= TOK_MAX_ID) return tg_fail(err, "%s: added_tokens[%zu].id %lld is out of range", p, i, (long long)idv);
        const int special = jbool(a, "special", 0);
        if (add_added(t, json_string_value(content), json_string_length(content), (int32_t)idv, special,
                      jbool(a, "lstrip", 0), jbool(a, "rstrip", 0), jbool(a, "single_word", 0),
                      jbool(a, "normalized", !special), err))
            return tg_fail_context(err, "%s: added_tokens[%zu]", p, i);
    }
    return 0;
}

/* The id of the added token of this content, or -1. */
static int32_t added_id(const tg_tokenizer *t, const char *content) {
    for (int32_t k = 0; k < t->n_added; k++)
        if (!strcmp(t->added[k].content, content)) return t->added[k].id;
    return -1;
}

/* A token tokenizer_config.json names (key): its content, or an object with "content"
 * (transformers' AddedToken), or null (none). Absent: *out is left as it is. */
static int config_token(const tg_tokenizer *t, json_t *o, const char *key, int32_t *out, const char *path,
                        tg_err *err) {
    json_t *v = json_object_get(o, key);
    if (!v) return 0;
    if (json_is_null(v)) { /* GCOVR_EXCL_BR_LINE: json_is_null's own NULL test: !v returned first */
        *out = -1;
        return 0;
    }
    if (json_is_object(v)) v = json_object_get(v, "content"); /* GCOVR_EXCL_BR_LINE: json_is_object's own NULL test: !v returned above */
    if (!json_is_string(v)) return tg_fail(err, "%s: %s is not a token (a string, an object with content, or null)", path, key);
    *out = tg_tokenizer_token_id(t, json_string_value(v));
    if (*out < 0)
        return tg_fail(err, "%s: %s '%s' is neither in the vocabulary nor an added token of the tokenizer.json", path, key,
                       json_string_value(v));
    return 0;
}

/* Llama's tokenizer_config.json, where one lies beside the tokenizer.json: the bos, eos
 * and pad tokens it names; add_bos_token and add_eos_token as the template has them (true
 * and false: transformers would otherwise rebuild the template); added_tokens_decoder's
 * tokens among the tokenizer.json's added tokens (transformers would add the others). Its
 * other keys (the chat template, model_max_length, decoding settings) change no id. */
static int read_llama_config(tg_tokenizer *t, const char *tokenizer_json, tg_err *err) {
    char dir[4096], path[4200];
    dir_of(tokenizer_json, dir, sizeof dir);
    join(path, sizeof path, dir, "tokenizer_config.json");
    if (!is_file(path)) return 0;
    json_error_t je;
    json_t *o = tg_json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!o && tg_json_out_of_memory(&je)) return tg_fail(err, "%s: out of memory parsing the JSON", path);
    if (!o) return tg_fail(err, "%s:%d: %s", path, je.line, je.text);
    int rc = 0;
    json_t *add_bos = json_object_get(o, "add_bos_token"), *add_eos = json_object_get(o, "add_eos_token");
    json_t *decoder = json_object_get(o, "added_tokens_decoder");
    if (!json_is_object(o)) rc = tg_fail(err, "%s is not a JSON object", path); /* GCOVR_EXCL_BR_LINE: json_is_object's own NULL test: !o returned above */
    else if (config_token(t, o, "bos_token", &t->config_bos, path, err) ||
             config_token(t, o, "eos_token", &t->config_eos, path, err) ||
             config_token(t, o, "pad_token", &t->config_pad, path, err))
        rc = -1;
    else if (add_bos && !json_is_null(add_bos) && !json_is_true(add_bos)) /* GCOVR_EXCL_BR_LINE: the macros' NULL tests: add_bos && came first */
        rc = tg_fail(err, "%s: add_bos_token is not supported unless true (the template of the tokenizer.json adds the "
                          "bos token)", path);
    else if (add_eos && !json_is_null(add_eos) && !json_is_false(add_eos)) /* GCOVR_EXCL_BR_LINE: the macros' NULL tests: add_eos && came first */
        rc = tg_fail(err, "%s: add_eos_token is not supported unless false (the template of the tokenizer.json is used)",
                     path);
    else if (decoder && !json_is_object(decoder)) /* GCOVR_EXCL_BR_LINE: json_is_object's own NULL test: decoder && came first */
        rc = tg_fail(err, "%s: added_tokens_decoder is not an object of id: token", path);
    const char *key;
    json_t *tok;
    if (!rc && decoder) {
        json_object_foreach(decoder, key, tok) { /* GCOVR_EXCL_BR_LINE: the macro's value test cannot fail for a key it found */
            json_t *content = json_object_get(tok, "content");
            char *end;
            const long id = strtol(key, &end, 10);
            if (!json_is_string(content) || !key[0] || *end || added_id(t, json_string_value(content)) != id) {
                rc = tg_fail(err, "%s: added_tokens_decoder['%s'] is not an added token of the tokenizer.json with that "
                                  "id and content",
                             path, key);
                break;
            }
        }
    }
    json_decref(o);
    return rc;
}

static int load_tokenizer_json(tok_loader *L, const char *path, json_t *root, tg_err *err) {
    tg_tokenizer *t = L->t;
    json_t *model = json_object_get(root, "model");
    const char *mt = jtype(model);
    if (!strcmp(mt, "WordPiece")) t->family = TG_TOKENIZER_WORDPIECE;
    else if (!strcmp(mt, "BPE")) t->family = TG_TOKENIZER_BPE_GPT2;
    else return tg_fail(err, "%s: model type '%s' is not supported (WordPiece and BPE are)", path, mt);
    if (t->family == TG_TOKENIZER_WORDPIECE ? parse_wordpiece_model(t, model, path, err) : parse_bpe_model(L, model, path, err))
        return -1;
    if (parse_normalizer(t, json_object_get(root, "normalizer"), path, err) ||
        parse_pre_tokenizer(t, json_object_get(root, "pre_tokenizer"), path, err) ||
        parse_added_tokens(t, json_object_get(root, "added_tokens"), path, err))
        return -1;
    tmpl_plain(&t->tmpl);
    json_t *pp = json_object_get(root, "post_processor");
    int shaped = 0;
    if (pp && !json_is_null(pp) && parse_post_processor(t, pp, &shaped, path, err)) return -1; /* GCOVR_EXCL_BR_LINE: json_is_null's own NULL test: pp && came first */
    if (t->family == TG_TOKENIZER_BPE_LLAMA) return read_llama_config(t, path, err);
    return 0;
}

/* A file that starts with '{' is JSON: a tokenizer.json when it has "model", else a
 * vocab.json whose merges lie beside it. Anything else is a vocab.txt. */
static int open_file(tok_loader *L, const char *path, tg_err *err) {
    char *buf;
    size_t len;
    if (read_file(path, &buf, &len, err)) return -1;
    size_t i = 0;
    while (i < len && (buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\n' || buf[i] == '\r')) i++;
    char dir[4096];
    dir_of(path, dir, sizeof dir);
    tok_hints h;
    if (i == len || buf[i] != '{') {
        free(buf);
        return read_hints(dir, &h, err) || load_vocab_txt(L, path, &h, err);
    }
    json_error_t je;
    json_t *root = tg_json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        free(buf);
        if (tg_json_out_of_memory(&je)) return tg_fail(err, "%s: out of memory parsing the JSON", path);
        return tg_fail(err, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    }
    int rc;
    if (json_object_get(root, "model")) {
        XXH64_update(L->hash, "tokenizer.json", 14);
        XXH64_update(L->hash, buf, len);
        rc = load_tokenizer_json(L, path, root, err);
    } else {
        char merges[4200];
        join(merges, sizeof merges, dir, "merges.txt");
        if (!is_file(merges)) join(merges, sizeof merges, dir, "vocab.bpe");
        if (!is_file(merges)) rc = tg_fail(err, "%s: a vocabulary without merges.txt or vocab.bpe beside it", path);
        else rc = read_hints(dir, &h, err) || load_vocab_json(L, path, merges, &h, err);
    }
    json_decref(root);
    free(buf);
    return rc;
}

static int open_folder(tok_loader *L, const char *dir, tg_err *err) {
    char a[4200], b[4200];
    join(a, sizeof a, dir, "tokenizer.json");
    if (is_file(a)) return open_file(L, a, err);
    tok_hints h;
    join(a, sizeof a, dir, "vocab.txt");
    if (is_file(a)) return read_hints(dir, &h, err) || load_vocab_txt(L, a, &h, err);
    static const char *const pairs[][2] = {{"vocab.json", "merges.txt"}, {"encoder.json", "vocab.bpe"}};
    for (int k = 0; k < 2; k++) {
        join(a, sizeof a, dir, pairs[k][0]);
        join(b, sizeof b, dir, pairs[k][1]);
        if (is_file(a) && is_file(b)) return read_hints(dir, &h, err) || load_vocab_json(L, a, b, &h, err);
    }
    return tg_fail(err, "%s: no tokenizer.json, vocab.txt, vocab.json + merges.txt or encoder.json + vocab.bpe", dir);
}

/* After the files: the ids every part refers to are in the vocabulary's range, the BPE
 * model is ready, and the identity covers the settings that came from hints. */
static int finish(tok_loader *L, tg_err *err) {
    tg_tokenizer *t = L->t;
    tok_vocab *v = model_vocab(t);
    if (tok_vocab_index_ids(v, err)) return -1;
    if (t->family == TG_TOKENIZER_WORDPIECE)
        t->wp.unk_id = tok_vocab_get(&t->wp.vocab, t->wp.unk_token, strlen(t->wp.unk_token));
    int32_t n = v->n_ids;
    for (int32_t k = 0; k < t->n_added; k++)
        if (t->added[k].id >= n) n = t->added[k].id + 1;
    for (int32_t k = 0; k < t->tmpl.n_ids; k++)
        if (t->tmpl.ids[k] >= n) n = t->tmpl.ids[k] + 1;
    t->vocab_size = n;
    if (t->family != TG_TOKENIZER_WORDPIECE && tok_bpe_prepare(&t->bpe, err)) return -1;
    set_special_ids(t);
    const tok_wordpiece *w = &t->wp;
    const int32_t settings[] = {(int32_t)t->family, w->has_normalizer, w->clean_text, w->chinese, w->strip_accents,
                                w->lowercase, w->max_chars, t->bpe.add_prefix_space, t->tmpl.n_single, t->tmpl.n_pair,
                                t->vocab_size};
    XXH64_update(L->hash, settings, sizeof settings);
    XXH64_update(L->hash, t->tmpl.ids, (size_t)t->tmpl.n_ids * sizeof *t->tmpl.ids);
    /* Llama's special ids may come from tokenizer_config.json: `data convert` writes its eos */
    if (t->family == TG_TOKENIZER_BPE_LLAMA) XXH64_update(L->hash, &t->special, sizeof t->special);
    for (int32_t k = 0; k < t->n_added; k++) {
        const tok_added *a = &t->added[k];
        const int32_t f[] = {a->id, a->special, a->lstrip, a->rstrip, a->single_word, a->normalized};
        XXH64_update(L->hash, f, sizeof f);
        XXH64_update(L->hash, a->content, a->len);
    }
    t->identity = XXH64_digest(L->hash);
    return 0;
}

int tg_tokenizer_open(const char *path, tg_tokenizer **out, tg_err *err) {
    *out = NULL;
    if (!path || !path[0]) return tg_fail(err, "no tokenizer path");
    tg_tokenizer *t = tg_calloc(1, sizeof *t);
    if (!t) return tg_fail(err, "%s: out of memory opening the tokenizer", path);
    /* On the stack (xxhash inlined): no allocation outside tg_alloc's hook. */
    XXH64_state_t hash_state, *hash = &hash_state;
    XXH64_reset(hash, 0);
    t->wp.unk_id = -1;
    t->bpe.unk_id = -1;
    t->config_bos = t->config_eos = t->config_pad = -2;
    tok_loader L = {t, hash};
    int rc;
    if (is_dir(path)) rc = open_folder(&L, path, err);
    else rc = open_file(&L, path, err);
    if (!rc) rc = finish(&L, err);
    if (rc) {
        tg_tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void tg_tokenizer_free(tg_tokenizer *tok) {
    if (!tok) return;
    tok_wordpiece_free(&tok->wp);
    tok_bpe_free(&tok->bpe);
    for (int32_t k = 0; k < tok->n_added; k++) free(tok->added[k].content);
    free(tok->added);
    tok_list_free(&tok->seq[0]);
    tok_list_free(&tok->seq[1]);
    free(tok->raw_splits.s);
    free(tok->norm_splits.s);
    free(tok);
}

tg_tokenizer_family tg_tokenizer_family_of(const tg_tokenizer *tok) { return tok->family; }
int32_t tg_tokenizer_vocab_size(const tg_tokenizer *tok) { return tok->vocab_size; }
tg_special_ids tg_tokenizer_special_ids(const tg_tokenizer *tok) { return tok->special; }
uint64_t tg_tokenizer_identity(const tg_tokenizer *tok) { return tok->identity; }

const char *tg_tokenizer_id_to_token(const tg_tokenizer *tok, int32_t id) {
    if (!tok) return NULL;
    for (int32_t k = 0; k < tok->n_added; k++)
        if (tok->added[k].id == id) return tok->added[k].content;
    return tok_vocab_token(tok->family == TG_TOKENIZER_WORDPIECE ? &tok->wp.vocab : &tok->bpe.vocab, id, NULL);
}

/* ---- encoding ------------------------------------------------------------------------ */

/* One text: split on the added tokens that match the raw text, the pieces between them
 * through the model (which splits on the normalized added tokens after normalizing). */
static int encode_sequence(tg_tokenizer *t, const char *text, int64_t len, tok_list *out, tg_err *err) {
    out->n = 0;
    if (tok_split_added(t, text, len, 0, &t->raw_splits, err)) return -1;
    for (int32_t i = 0; i < t->raw_splits.n; i++) {
        const tok_split s = t->raw_splits.s[i];
        if (s.id >= 0) {
            if (tok_list_reserve(out, 1, err)) return -1;
            tok_list_push(out, s.id, s.start, s.end, 1);
            continue;
        }
        if (t->family == TG_TOKENIZER_WORDPIECE) {
            if (tok_wordpiece_encode(t, text, s.start, s.end, out, err)) return -1;
            continue;
        }
        /* byte-level BPE has no normalizer: the normalized added tokens match the text */
        if (!t->has_normalized_added) {
            if (tok_bpe_encode(t, text, s.start, s.end, out, err)) return -1;
            continue;
        }
        if (tok_split_added(t, text + s.start, s.end - s.start, 1, &t->norm_splits, err)) return -1;
        for (int32_t k = 0; k < t->norm_splits.n; k++) {
            const tok_split u = t->norm_splits.s[k];
            if (u.id >= 0) {
                if (tok_list_reserve(out, 1, err)) return -1;
                tok_list_push(out, u.id, s.start + u.start, s.start + u.end, 1);
            } else if (tok_bpe_encode(t, text, s.start + u.start, s.start + u.end, out, err)) {
                return -1;
            }
        }
    }
    return 0;
}

/* Leading and trailing spaces of a token as HF's ByteLevel process_offsets counts them,
 * in bytes of the original text: the token's characters that are 'Ġ' (the byte-level
 * space, one byte ' ' of the text) or whitespace. HF counts them in the token's string:
 * the vocabulary's spelling for the model's tokens, the matched text for added tokens
 * (an lstrip / rstrip match holds the whitespace beside it). */
static void token_spaces(const tg_tokenizer *t, const tok_list *l, int32_t i, const char *text, int64_t *lead,
                         int64_t *trail, int64_t *lead_chars) {
    const char *s;
    int64_t n;
    if (l->added[i]) {
        s = text + l->start[i];
        n = l->end[i] - l->start[i];
    } else {
        s = tg_tokenizer_id_to_token(t, l->ids[i]);
        n = s ? (int64_t)strlen(s) : 0; /* GCOVR_EXCL_BR_LINE: the model's ids come from its vocabulary */
    }
    *lead = *trail = *lead_chars = 0;
    int64_t i0 = 0;
    while (i0 < n) {
        int64_t j = i0;
        const uint32_t cp = tok_utf8_next((const unsigned char *)s, &j);
        if (cp != 0x120 && !tok_is_whitespace(cp)) break;
        *lead += l->added[i] ? j - i0 : 1;
        (*lead_chars)++;
        i0 = j;
    }
    int64_t e = n;
    while (e > 0) {
        const int64_t c = char_before(s, e);
        int64_t j = c;
        const uint32_t cp = tok_utf8_next((const unsigned char *)s, &j);
        if (cp != 0x120 && !tok_is_whitespace(cp)) break;
        *trail += l->added[i] ? e - c : 1;
        e = c;
    }
}

static void trim_offsets(const tg_tokenizer *t, tok_list *l, const char *text) {
    for (int32_t i = 0; i < l->n; i++) {
        int64_t lead, trail, lead_chars;
        token_spaces(t, l, i, text, &lead, &trail, &lead_chars);
        if (!lead && !trail) continue;
        if (lead) {
            /* a first token's one leading space is likely the added prefix space */
            const int is_first = i == 0 || l->start[i] == 0;
            if (is_first && t->tmpl.trim_add_prefix_space && lead_chars == 1) lead = 0;
            l->start[i] = l->start[i] + lead < l->end[i] ? l->start[i] + lead : l->end[i];
        }
        if (trail && l->end[i] >= trail) l->end[i] = l->end[i] - trail > l->start[i] ? l->end[i] - trail : l->start[i];
    }
}

/* HF's truncate_encodings, longest first, on lengths: n[0] and n[1] (pair) cut to fit. */
static void truncate_longest_first(int32_t *n, int pair, int32_t max_len) {
    if (max_len == 0) {
        n[0] = 0;
        if (pair) n[1] = 0;
        return;
    }
    const int64_t total = (int64_t)n[0] + (pair ? n[1] : 0);
    if (total <= max_len) return;
    if (!pair) {
        n[0] = max_len;
        return;
    }
    int32_t n1 = n[0], n2 = n[1];
    int swap = 0;
    if (n1 > n2) {
        swap = 1;
        int32_t x = n1;
        n1 = n2;
        n2 = x;
    }
    if (n1 > max_len) n2 = n1;
    else n2 = n1 > max_len - n1 ? n1 : max_len - n1;
    if ((int64_t)n1 + n2 > max_len) {
        n1 = max_len / 2;
        n2 = n1 + max_len % 2;
    }
    if (swap) {
        int32_t x = n1;
        n1 = n2;
        n2 = x;
    }
    if (n1 < n[0]) n[0] = n1;
    if (n2 < n[1]) n[1] = n2;
}

static int encoding_reserve(tg_encoding *e, int32_t n, tg_err *err) {
    if (n <= e->cap) return 0;
    int32_t cap = e->cap ? e->cap : 64;
    while (cap < n) cap = cap > INT32_MAX / 2 ? n : cap * 2; /* GCOVR_EXCL_BR_LINE: n > 2^30: no caller pads (pad_to is 0 outside tests), and 2^30 tokens need texts of over a GiB */
    int32_t *ids = tg_realloc(e->ids, (size_t)cap * sizeof *ids);
    if (ids) e->ids = ids;
    int32_t *ty = tg_realloc(e->type_ids, (size_t)cap * sizeof *ty);
    if (ty) e->type_ids = ty;
    int32_t *sp = tg_realloc(e->special, (size_t)cap * sizeof *sp);
    if (sp) e->special = sp;
    int32_t *sq = tg_realloc(e->sequence, (size_t)cap * sizeof *sq);
    if (sq) e->sequence = sq;
    int64_t *st = tg_realloc(e->start, (size_t)cap * sizeof *st);
    if (st) e->start = st;
    int64_t *en = tg_realloc(e->end, (size_t)cap * sizeof *en);
    if (en) e->end = en;
    if (!ids || !ty || !sp || !sq || !st || !en) return tg_fail(err, "out of memory for an encoding of %d tokens", n);
    e->cap = cap;
    return 0;
}

int tg_tokenizer_encode(tg_tokenizer *tok, const char *text, size_t len, const char *pair, size_t pair_len,
                        const tg_encode_options *opt, tg_encoding *out, tg_err *err) {
    static const tg_encode_options defaults = {1, 0, 0};
    if (!opt) opt = &defaults;
    if (opt->max_len < 0 || opt->pad_to < 0)
        return tg_fail(err, "max_len %d and pad_to %d must not be negative", opt->max_len, opt->pad_to);
    if (!text && len) return tg_fail(err, "no text");
    const char *texts[2] = {text ? text : "", pair ? pair : ""};
    const size_t lens[2] = {len, pair_len};
    const int is_pair = pair != NULL;
    for (int s = 0; s <= is_pair; s++) {
        if (lens[s] > INT32_MAX / 2) return tg_fail(err, "%s of %zu bytes is longer than this reader takes", s ? "pair" : "text", lens[s]);
        const int64_t bad = utf8_invalid_at(texts[s], lens[s]);
        if (bad >= 0) return tg_fail(err, "%s: invalid UTF-8 at byte %lld", s ? "pair" : "text", (long long)bad);
    }
    for (int s = 0; s <= is_pair; s++) {
        if (encode_sequence(tok, texts[s], (int64_t)lens[s], &tok->seq[s], err)) return -1;
        if (tok->tmpl.trim_offsets) trim_offsets(tok, &tok->seq[s], texts[s]);
    }
    const tok_template *tm = &tok->tmpl;
    const int32_t added = opt->add_special_tokens ? template_added(tm, is_pair) : 0;
    int32_t n[2] = {tok->seq[0].n, is_pair ? tok->seq[1].n : 0};
    if (opt->max_len > 0) {
        if (opt->max_len < added)
            return tg_fail(err, "max_len %d is shorter than the %d special tokens the template adds", opt->max_len, added);
        truncate_longest_first(n, is_pair, opt->max_len - added);
    }
    const int32_t total = n[0] + n[1] + added;
    if (encoding_reserve(out, total > opt->pad_to ? total : opt->pad_to, err)) return -1;
    const tok_piece *pieces = is_pair ? tm->pair : tm->single;
    const int32_t n_pieces = is_pair ? tm->n_pair : tm->n_single;
    int32_t k = 0;
    for (int32_t p = 0; p < n_pieces; p++) {
        const tok_piece *pc = &pieces[p];
        if (pc->kind == TOK_PIECE_SPECIAL) {
            if (!opt->add_special_tokens) continue;
            for (int32_t i = 0; i < pc->n_ids; i++, k++) {
                out->ids[k] = tm->ids[pc->first + i];
                out->type_ids[k] = pc->type_id;
                out->special[k] = 1;
                out->sequence[k] = -1;
                out->start[k] = out->end[k] = -1;
            }
            continue;
        }
        const int s = pc->kind == TOK_PIECE_B;
        const tok_list *l = &tok->seq[s];
        for (int32_t i = 0; i < n[s]; i++, k++) {
            out->ids[k] = l->ids[i];
            out->type_ids[k] = pc->type_id;
            out->special[k] = 0;
            out->sequence[k] = s;
            out->start[k] = l->start[i];
            out->end[k] = l->end[i];
        }
    }
    out->n_real = k;
    if (opt->pad_to > k) {
        if (tok->special.pad < 0) return tg_fail(err, "padding asked for, but the tokenizer has no pad token");
        for (; k < opt->pad_to; k++) {
            out->ids[k] = tok->special.pad;
            out->type_ids[k] = 0;
            out->special[k] = 1;
            out->sequence[k] = -1;
            out->start[k] = out->end[k] = -1;
        }
    }
    out->n = k;
    return 0;
}

void tg_encoding_free(tg_encoding *enc) {
    if (!enc) return;
    free(enc->ids);
    free(enc->type_ids);
    free(enc->special);
    free(enc->sequence);
    free(enc->start);
    free(enc->end);
    memset(enc, 0, sizeof *enc);
}
