/* WordPiece as BERT uses it, as HF `tokenizers` runs it: BertNormalizer (clean text,
 * CJK characters spaced out, accents stripped by NFD and dropping Mn, lower-casing),
 * BertPreTokenizer (split on whitespace, each punctuation character a word of its own),
 * then greedy longest-match-first WordPiece with the "##" prefix. Character properties
 * come from utf8proc. */
#include "datasets/tokenizer_impl.h"
#include "base/alloc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* HF's is_control: Cc, Cf, Co and Cs, but tab, newline and carriage return. */
static int is_control(uint32_t cp) {
    if (cp == '\t' || cp == '\n' || cp == '\r') return 0;
    if (cp < 0x80) return cp < 0x20 || cp == 0x7F;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CS: return 1;
    default: return 0;
    }
}

/* The CJK blocks as HF's BertNormalizer lists them. */
static int is_chinese(uint32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
           (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

/* BERT's punctuation beyond ASCII (ascii_class below has ASCII's): Unicode's P*. */
static int is_punct(uint32_t cp) {
    const utf8proc_propval_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

/* ---- the normalizer ------------------------------------------------------------------ */

/* A character out of NFD, waiting for its run of combining marks to be put in canonical
 * order. change is HF's: 0 for the first character of a decomposition, which takes the
 * next original character's place; 1 for the others, inserted after it. */
typedef struct tok_nchar {
    uint32_t cp;
    int32_t ccc;
    int32_t seq; /* arrival order in its run, for a stable sort */
    int32_t change;
} nchar;

/* Runs of combining marks longer than this are sorted once at their end (qsort on class
 * and arrival) rather than by insertion, which is quadratic. */
#define INSERTION_MAX 32

typedef struct normalizer {
    tok_wordpiece *w;
    int64_t n;         /* bytes written to w->norm */
    int32_t n_pending; /* NFD: w->pending holds the characters since the last starter */
    int unsorted;      /* the run outgrew insertion: sort it before it goes out */
    /* HF's alignments through NFD are positional: the original ranges of the characters
     * that went in (w->fifo[head, tail)), handed out in order to the characters that come
     * out with change 0; a change 1 character gets the last one handed out. */
    int64_t head, tail, last_os, last_oe;
    int failed;
} normalizer;

static int by_class_then_arrival(const void *a, const void *b) {
    const nchar *x = a, *y = b;
    if (x->ccc != y->ccc) return x->ccc < y->ccc ? -1 : 1;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

static int norm_reserve(tok_wordpiece *w, int64_t need) {
    if (need <= w->norm_cap) return 0;
    int64_t cap = w->norm_cap ? w->norm_cap : 4096;
    while (cap < need) cap *= 2;
    char *t = tg_realloc(w->norm, (size_t)cap);
    if (t) w->norm = t;
    int64_t *s = tg_realloc(w->norm_start, (size_t)cap * sizeof *s);
    if (s) w->norm_start = s;
    int64_t *e = tg_realloc(w->norm_end, (size_t)cap * sizeof *e);
    if (e) w->norm_end = e;
    if (!t || !s || !e) return -1;
    w->norm_cap = cap;
    return 0;
}

/* Last stage: lower-casing (Rust's char::to_lowercase: utf8proc's simple mapping, and
 * U+0130 to "i" + U+0307, the one unconditional multi-character lower case), then out. */
static void emit(normalizer *N, uint32_t cp, int64_t os, int64_t oe) {
    tok_wordpiece *w = N->w;
    if (norm_reserve(w, N->n + 8)) {
        N->failed = 1;
        return;
    }
    if (w->lowercase) {
        if (cp < 0x80) {
            if (cp >= 'A' && cp <= 'Z') cp += 32;
        } else if (cp == 0x130) {
            emit(N, 'i', os, oe);
            cp = 0x307;
        } else {
            cp = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
        }
    }
    const int k = tok_utf8_put(cp, w->norm + N->n);
    for (int i = 0; i < k; i++) w->norm_start[N->n + i] = os, w->norm_end[N->n + i] = oe;
    N->n += k;
}

static void flush_pending(normalizer *N) {
    tok_wordpiece *w = N->w;
    /* a run's starter has class 0 and stays first; the marks after it in class order */
    if (N->unsorted) qsort(w->pending, (size_t)N->n_pending, sizeof *w->pending, by_class_then_arrival);
    N->unsorted = 0;
    for (int32_t i = 0; i < N->n_pending; i++) {
        const nchar *c = &w->pending[i];
        /* each character in pushed one range and gives one change-0 character */
        if (c->change == 0 && N->head < N->tail) { /* GCOVR_EXCL_BR_LINE: one range per change-0 character */
            N->last_os = w->fifo[2 * N->head];
            N->last_oe = w->fifo[2 * N->head + 1];
            N->head++;
        }
        if (c->cp >= 0x80 && utf8proc_category((utf8proc_int32_t)c->cp) == UTF8PROC_CATEGORY_MN) continue;
        emit(N, c->cp, N->last_os, N->last_oe);
    }
    N->n_pending = 0;
    if (N->head == N->tail) N->head = N->tail = 0;
}

static int fifo_push(normalizer *N, int64_t os, int64_t oe) {
    tok_wordpiece *w = N->w;
    if (N->tail == w->fifo_cap) {
        if (N->head > 0) {
            memmove(w->fifo, w->fifo + 2 * N->head, (size_t)(N->tail - N->head) * 2 * sizeof *w->fifo);
            N->tail -= N->head;
            N->head = 0;
        }
        if (N->tail == w->fifo_cap) {
            const int64_t cap = w->fifo_cap ? 2 * w->fifo_cap : 64;
            int64_t *f = tg_realloc(w->fifo, (size_t)cap * 2 * sizeof *f);
            if (!f) return -1;
            w->fifo = f;
            w->fifo_cap = cap;
        }
    }
    w->fifo[2 * N->tail] = os;
    w->fifo[2 * N->tail + 1] = oe;
    N->tail++;
    return 0;
}

/* Accent stripping: NFD (decomposition, then combining marks in canonical order, which
 * HF's nfd() applies over the whole text), then the nonspacing marks (Mn) dropped. */
static void strip_stage(normalizer *N, uint32_t cp, int64_t os, int64_t oe) {
    if (!N->w->strip_accents) {
        emit(N, cp, os, oe);
        return;
    }
    if (cp < 0x80) { /* a starter of its own: the run before it goes out, then it */
        flush_pending(N);
        N->last_os = os, N->last_oe = oe;
        emit(N, cp, os, oe);
        return;
    }
    if (fifo_push(N, os, oe)) {
        N->failed = 1;
        return;
    }
    utf8proc_int32_t d[32];
    utf8proc_ssize_t n = utf8proc_decompose_char((utf8proc_int32_t)cp, d, 32, UTF8PROC_DECOMPOSE, NULL);
    /* valid code points decompose into at most 4 (NFD) */
    if (n < 1 || n > 32) d[0] = (utf8proc_int32_t)cp, n = 1; /* GCOVR_EXCL_BR_LINE: valid cp, 1 to 4 */
    for (utf8proc_ssize_t k = 0; k < n; k++) {
        const int32_t ccc = utf8proc_get_property(d[k])->combining_class;
        if (ccc == 0) flush_pending(N);
        tok_wordpiece *w = N->w;
        if (N->n_pending == w->pending_cap) {
            const int32_t cap = w->pending_cap ? 2 * w->pending_cap : 64;
            nchar *p = cap < INT32_MAX / 2 ? tg_realloc(w->pending, (size_t)cap * sizeof *p) : NULL; /* GCOVR_EXCL_BR_LINE: 2^29 combining marks in one run need half a GiB of text and 8 GiB for this buffer */
            if (!p) {
                N->failed = 1;
                return;
            }
            w->pending = p;
            w->pending_cap = cap;
        }
        const int32_t seq = N->n_pending;
        int32_t j = N->n_pending++;
        /* a stable sort on the class: the canonical ordering algorithm */
        if (j >= INSERTION_MAX) N->unsorted = 1;
        while (!N->unsorted && ccc != 0 && j > 0 && w->pending[j - 1].ccc > ccc) {
            w->pending[j] = w->pending[j - 1];
            j--;
        }
        w->pending[j] = (nchar){(uint32_t)d[k], ccc, seq, k > 0};
    }
}

/* BertNormalizer over text[start, end) into w->norm; returns the bytes written, or -1. */
static int64_t normalize(tok_wordpiece *w, const char *text, int64_t start, int64_t end) {
    normalizer N = {.w = w, .last_os = start, .last_oe = start};
    const unsigned char *s = (const unsigned char *)text;
    if (norm_reserve(w, (end - start) + 16)) return -1;
    int64_t i = start;
    while (i < end && !N.failed) {
        /* a run of ASCII with no accent state pending: the common case, done in place */
        if (s[i] < 0x80 && N.n_pending == 0) {
            int64_t j = i;
            while (j < end && s[j] < 0x80) j++;
            if (norm_reserve(w, N.n + (j - i) + 8)) return -1;
            char *o = w->norm;
            int64_t n = N.n;
            for (; i < j; i++) {
                unsigned char c = s[i];
                if (w->clean_text) {
                    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
                    else if (c < 0x20 || c == 0x7F) continue;
                }
                if (w->lowercase && c >= 'A' && c <= 'Z') c += 32;
                o[n] = (char)c;
                w->norm_start[n] = i;
                w->norm_end[n] = i + 1;
                n++;
            }
            if (n > N.n) N.last_os = w->norm_start[n - 1], N.last_oe = w->norm_end[n - 1];
            N.n = n;
            continue;
        }
        const int64_t os = i;
        uint32_t cp = tok_utf8_next(s, &i);
        if (w->clean_text) {
            if (cp == 0 || cp == 0xFFFD || is_control(cp)) continue;
            if (tok_is_whitespace(cp)) cp = ' ';
        }
        if (w->chinese && is_chinese(cp)) {
            strip_stage(&N, ' ', os, i);
            strip_stage(&N, cp, os, i);
            strip_stage(&N, ' ', os, i);
        } else {
            strip_stage(&N, cp, os, i);
        }
    }
    flush_pending(&N);
    return N.failed ? -1 : N.n;
}

/* ---- WordPiece ----------------------------------------------------------------------- */

static int word_reserve(tok_wordpiece *w, int64_t need) {
    if (need <= w->word_cap) return 0;
    int64_t cap = w->word_cap ? w->word_cap : 256;
    while (cap < need) cap *= 2;
    char *p = tg_realloc(w->word, (size_t)cap);
    if (!p) return -1;
    w->word = p;
    w->word_cap = cap;
    return 0;
}

/* One word, norm[ws, we): the longest vocabulary entry from the left, then "##" + the
 * longest from where it ended, and so on; the whole word is the unk token when a piece
 * has no entry or the word is longer than max_chars characters. */
static int wordpiece_word(tok_wordpiece *w, int64_t ws, int64_t we, tok_list *out, tg_err *err) {
    const char *norm = w->norm;
    int64_t chars = 0;
    for (int64_t i = ws; i < we; i++) chars += ((unsigned char)norm[i] & 0xC0) != 0x80;
    if (tok_list_reserve(out, (we - ws) + 1, err)) return -1;
    const int32_t first = out->n;
    if (chars <= w->max_chars) {
        int64_t start = ws;
        while (start < we) {
            const char *key;
            uint32_t pre = 0;
            if (start == ws) {
                key = norm + start;
            } else {
                /* the prefix and as much of the rest as the longest entry can hold */
                pre = w->prefix_len;
                const int64_t n = we - start < (int64_t)w->vocab.max_len ? we - start : (int64_t)w->vocab.max_len;
                if (word_reserve(w, pre + n)) return tg_fail(err, "out of memory for a word of %lld bytes", (long long)(pre + n));
                memcpy(w->word, w->prefix, pre);
                memcpy(w->word + pre, norm + start, (size_t)n);
                key = w->word;
            }
            /* longer than the longest entry cannot match: start there, on a character */
            int64_t end = we;
            if ((int64_t)pre + (end - start) > (int64_t)w->vocab.max_len) {
                end = start + ((int64_t)w->vocab.max_len - pre);
                while (end > start && ((unsigned char)norm[end] & 0xC0) == 0x80) end--;
            }
            int32_t id = -1;
            while (end > start) {
                id = tok_vocab_get(&w->vocab, key, (size_t)(pre + (end - start)));
                if (id >= 0) break;
                do end--;
                while (end > start && ((unsigned char)norm[end] & 0xC0) == 0x80);
            }
            if (id < 0) break;
            tok_list_push(out, id, w->norm_start[start], w->norm_end[end - 1], 0);
            start = end;
        }
        if (start == we) return 0;
    }
    if (w->unk_id < 0)
        return tg_fail(err, "the vocabulary has no unk token '%s' for a word it cannot spell", w->unk_token);
    out->n = first;
    tok_list_push(out, w->unk_id, w->norm_start[ws], w->norm_end[we - 1], 0);
    return 0;
}

/* Word boundaries by class of ASCII byte: 0 part of a word, 1 whitespace, 2 punctuation. */
static const unsigned char ascii_class[128] = {
    ['\t'] = 1, ['\n'] = 1, [0x0B] = 1, [0x0C] = 1, ['\r'] = 1, [' '] = 1,
    ['!'] = 2, ['"'] = 2, ['#'] = 2, ['$'] = 2, ['%'] = 2, ['&'] = 2, ['\''] = 2, ['('] = 2, [')'] = 2,
    ['*'] = 2, ['+'] = 2, [','] = 2, ['-'] = 2, ['.'] = 2, ['/'] = 2, [':'] = 2, [';'] = 2, ['<'] = 2,
    ['='] = 2, ['>'] = 2, ['?'] = 2, ['@'] = 2, ['['] = 2, ['\\'] = 2, [']'] = 2, ['^'] = 2, ['_'] = 2,
    ['`'] = 2, ['{'] = 2, ['|'] = 2, ['}'] = 2, ['~'] = 2,
};

/* BertPreTokenizer then WordPiece over norm[a, b). */
static int pretokenize(tok_wordpiece *w, int64_t a, int64_t b, tok_list *out, tg_err *err) {
    const unsigned char *s = (const unsigned char *)w->norm;
    int64_t word = -1, i = a;
    while (i < b) {
        const int64_t cs = i;
        int cls;
        if (s[i] < 0x80) {
            cls = ascii_class[s[i]];
            i++;
        } else {
            const uint32_t cp = tok_utf8_next(s, &i);
            cls = tok_is_whitespace(cp) ? 1 : is_punct(cp) ? 2 : 0;
        }
        if (cls == 0) {
            if (word < 0) word = cs;
            continue;
        }
        if (word >= 0 && wordpiece_word(w, word, cs, out, err)) return -1;
        word = -1;
        if (cls == 2 && wordpiece_word(w, cs, i, out, err)) return -1;
    }
    if (word >= 0 && wordpiece_word(w, word, b, out, err)) return -1;
    return 0;
}

int tok_wordpiece_encode(tg_tokenizer *t, const char *text, int64_t start, int64_t end, tok_list *out, tg_err *err) {
    tok_wordpiece *w = &t->wp;
    int64_t n;
    if (!w->has_normalizer) {
        /* the text as it is, each byte standing for its own character's bytes */
        if (norm_reserve(w, end - start + 1)) return tg_fail(err, "out of memory normalizing %lld bytes of text", (long long)(end - start));
        memcpy(w->norm, text + start, (size_t)(end - start));
        for (int64_t i = start; i < end;) {
            int64_t j = i;
            tok_utf8_next((const unsigned char *)text, &j);
            for (int64_t k = i; k < j; k++) w->norm_start[k - start] = i, w->norm_end[k - start] = j;
            i = j;
        }
        n = end - start;
    } else {
        n = normalize(w, text, start, end);
        if (n < 0) return tg_fail(err, "out of memory normalizing %lld bytes", (long long)(end - start));
    }
    if (!t->has_normalized_added) return pretokenize(w, 0, n, out, err);
    /* the added tokens that match normalized text, then the pieces between them */
    if (tok_split_added(t, w->norm, n, 1, &t->norm_splits, err)) return -1;
    for (int32_t k = 0; k < t->norm_splits.n; k++) {
        const tok_split u = t->norm_splits.s[k];
        if (u.id >= 0) {
            if (tok_list_reserve(out, 1, err)) return -1;
            tok_list_push(out, u.id, w->norm_start[u.start], w->norm_end[u.end - 1], 1);
        } else if (pretokenize(w, u.start, u.end, out, err)) {
            return -1;
        }
    }
    return 0;
}

void tok_wordpiece_free(tok_wordpiece *w) {
    tok_vocab_free(&w->vocab);
    free(w->norm);
    free(w->norm_start);
    free(w->norm_end);
    free(w->word);
    free(w->pending);
    free(w->fifo);
    memset(w, 0, sizeof *w);
}
