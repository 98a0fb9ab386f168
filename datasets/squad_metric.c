#include "datasets/squad_metric.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/alloc.h"

/* A byte that is not valid UTF-8 travels as this plus its value: no character has it. */
#define RAW_BYTE 0x110000

static int category_is_letter_or_number(int32_t cp) {
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
        return 1;
    default:
        return 0;
    }
}

/* Python's re \w in str patterns: str.isalnum() or '_'. */
static int is_word(int32_t cp) {
    if (cp >= RAW_BYTE) return 0;
    if (cp < 0x80) return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') || cp == '_'; /* GCOVR_EXCL_BR_LINE: is_word sees the lowered text with ASCII punctuation removed: no 'A' to 'Z' and no '_' reach it */
    return category_is_letter_or_number(cp);
}

/* Python's str.isspace(), which str.split() splits on. */
static int is_space(int32_t cp) {
    if ((cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
        (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
        cp == 0x3000)
        return 1;
    return 0;
}

/* Python's string.punctuation: the ASCII punctuation characters only. */
static int is_ascii_punctuation(int32_t cp) {
    return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
           (cp >= 0x7B && cp <= 0x7E);
}

/* Unicode's Cased and Case_Ignorable, which decide Python's final-sigma rule: the letter
 * categories with case, and marks, format characters, modifiers and the word-internal
 * punctuation (apostrophes, full stops, colons, middle dots). */
static int is_cased(int32_t cp) {
    if (cp >= RAW_BYTE) return 0;
    /* Other_Lowercase and Other_Uppercase outside those categories and Case_Ignorable:
     * the ordinal indicators, Roman numerals, circled and squared letters */
    if (cp == 0xAA || cp == 0xBA || (cp >= 0x2160 && cp <= 0x217F) || (cp >= 0x24B6 && cp <= 0x24E9) ||
        (cp >= 0x1F130 && cp <= 0x1F149) || (cp >= 0x1F150 && cp <= 0x1F169) || (cp >= 0x1F170 && cp <= 0x1F189))
        return 1;
    const int c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

static int is_case_ignorable(int32_t cp) {
    if (cp >= RAW_BYTE) return 0;
    switch (cp) {
    case 0x27: case 0x2E: case 0x3A: case 0x5E: case 0x60: case 0xA8: case 0xAD: case 0xAF: case 0xB4:
    case 0xB7: case 0xB8: case 0x387: case 0x5F4: case 0x2018: case 0x2019: case 0x2024: case 0x2027:
    case 0xFE13: case 0xFE52: case 0xFE55: case 0xFF07: case 0xFF0E: case 0xFF1A:
        return 1;
    default:
        break;
    }
    const int c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_ME || c == UTF8PROC_CATEGORY_CF ||
           c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_SK;
}

/* Python lowers a capital sigma to the final form when a cased letter precedes it and none
 * follows it (case-ignorable characters skipped either way). */
static int final_sigma(const int32_t *cp, size_t n, size_t i) {
    size_t j = i;
    while (j > 0 && is_case_ignorable(cp[j - 1])) j--;
    if (j == 0 || !is_cased(cp[j - 1])) return 0;
    j = i + 1;
    while (j < n && is_case_ignorable(cp[j])) j++;
    return j == n || !is_cased(cp[j]);
}

/* Python's str.lower() into out (room for 2n): full lower-case mapping, where U+0130 (I with
 * dot above) becomes "i" and a combining dot, and capital sigma follows the final-sigma rule;
 * every other character takes its one-character mapping. */
static size_t lower(const int32_t *cp, size_t n, int32_t *out) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (cp[i] >= RAW_BYTE) {
            out[m++] = cp[i];
        } else if (cp[i] == 0x130) {
            out[m++] = 'i';
            out[m++] = 0x307;
        } else if (cp[i] == 0x3A3) {
            out[m++] = final_sigma(cp, n, i) ? 0x3C2 : 0x3C3;
        } else {
            out[m++] = utf8proc_tolower(cp[i]);
        }
    }
    return m;
}

static size_t decode(const char *text, size_t len, int32_t *cp) {
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t c;
        const utf8proc_ssize_t used =
            utf8proc_iterate((const utf8proc_uint8_t *)text + i, (utf8proc_ssize_t)(len - i), &c);
        if (used < 1) {
            cp[n++] = RAW_BYTE + (uint8_t)text[i];
            i++;
        } else {
            cp[n++] = c;
            i += (size_t)used;
        }
    }
    return n;
}

int tg_squad_normalize(const char *text, size_t len, char **out, size_t *out_len, tg_err *err) {
    *out = NULL;
    *out_len = 0;
    int32_t *cp = tg_malloc(sizeof *cp * (len + 1));
    int32_t *low = tg_malloc(sizeof *low * (2 * len + 1));
    char *s = tg_malloc(8 * len + 1);
    if (!cp || !low || !s) {
        free(cp), free(low), free(s);
        return tg_fail(err, "out of memory for the normalized form of a %zu-byte answer", len);
    }
    const size_t n = lower(cp, decode(text, len, cp), low);
    /* Punctuation goes first, so "the." loses its article and "don't" is one word. */
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (!is_ascii_punctuation(low[i])) low[m++] = low[i];
    /* \b(a|an|the)\b: a run of word characters that is exactly one of the articles. */
    size_t k = 0;
    for (size_t i = 0; i < m;) {
        if (!is_word(low[i])) {
            low[k++] = low[i++];
            continue;
        }
        size_t j = i;
        while (j < m && is_word(low[j])) j++;
        const size_t w = j - i;
        const int article = (w == 1 && low[i] == 'a') || (w == 2 && low[i] == 'a' && low[i + 1] == 'n') ||
                            (w == 3 && low[i] == 't' && low[i + 1] == 'h' && low[i + 2] == 'e');
        if (article) {
            low[k++] = ' ';
        } else {
            memmove(low + k, low + i, sizeof *low * w);
            k += w;
        }
        i = j;
    }
    /* ' '.join(text.split()) */
    size_t b = 0;
    int pending_space = 0;
    for (size_t i = 0; i < k; i++) {
        if (is_space(low[i])) {
            pending_space = b > 0;
            continue;
        }
        if (pending_space) s[b++] = ' ', pending_space = 0;
        if (low[i] >= RAW_BYTE)
            s[b++] = (char)(low[i] - RAW_BYTE);
        else
            b += (size_t)utf8proc_encode_char(low[i], (utf8proc_uint8_t *)s + b);
    }
    s[b] = 0;
    free(cp);
    free(low);
    *out = s;
    *out_len = b;
    return 0;
}

typedef struct token {
    const char *s;
    size_t len;
} token;

static int token_cmp(const void *a, const void *b) {
    const token *x = a, *y = b;
    const size_t n = x->len < y->len ? x->len : y->len;
    const int c = memcmp(x->s, y->s, n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* The normalized string's tokens (split on its single spaces), sorted; *n tokens. */
static token *tokens_of(const char *s, size_t len, size_t *n) {
    size_t count = 0;
    for (size_t i = 0; i < len; i++) count += s[i] == ' ';
    token *t = tg_malloc(sizeof *t * (count + 1));
    if (!t) return NULL;
    *n = 0;
    for (size_t i = 0; i < len;) {
        size_t j = i;
        while (j < len && s[j] != ' ') j++;
        t[(*n)++] = (token){s + i, j - i};
        i = j + 1;
    }
    qsort(t, *n, sizeof *t, token_cmp);
    return t;
}

/* F1 of two normalized answers: tokens in common counted as bags (Counter & Counter). */
static int f1_of(const char *pred, size_t pred_len, const char *gold, size_t gold_len, double *f1) {
    size_t np = 0, ng = 0;
    token *tp = tokens_of(pred, pred_len, &np), *tgold = tp ? tokens_of(gold, gold_len, &ng) : NULL;
    if (!tp || !tgold) {
        free(tp);
        return -1;
    }
    if (np == 0) { /* gold answers are never empty here (see tg_squad_score) */
        *f1 = 0.0;
    } else {
        size_t same = 0;
        for (size_t i = 0, j = 0; i < np && j < ng;) {
            const int c = token_cmp(&tp[i], &tgold[j]);
            if (c == 0) same++, i++, j++;
            else if (c < 0) i++;
            else j++;
        }
        if (same == 0) {
            *f1 = 0.0;
        } else {
            const double precision = (double)same / (double)np, recall = (double)same / (double)ng;
            *f1 = 2.0 * precision * recall / (precision + recall);
        }
    }
    free(tp);
    free(tgold);
    return 0;
}

int tg_squad_score(const char *pred, size_t pred_len, const char *const *gold, const size_t *gold_len, int n_gold,
                   double *exact, double *f1, tg_err *err) {
    *exact = *f1 = 0.0;
    char *p = NULL;
    size_t p_len = 0;
    if (tg_squad_normalize(pred, pred_len, &p, &p_len, err)) return -1;
    int scored = 0;
    for (int g = 0; g < n_gold; g++) {
        char *q = NULL;
        size_t q_len = 0;
        if (tg_squad_normalize(gold[g], gold_len[g], &q, &q_len, err)) {
            free(p);
            return -1;
        }
        if (q_len > 0) { /* the script keeps only golds that normalize to something */
            double f = 0.0;
            if (f1_of(p, p_len, q, q_len, &f)) {
                free(q), free(p);
                return tg_fail(err, "out of memory for the tokens of a %zu-byte answer", pred_len);
            }
            const double e = p_len == q_len && !memcmp(p, q, p_len);
            if (e > *exact) *exact = e;
            if (f > *f1) *f1 = f;
            scored = 1;
        }
        free(q);
    }
    if (!scored) *exact = *f1 = p_len == 0; /* against the empty answer */
    free(p);
    return 0;
}

void tg_squad_totals_add(tg_squad_totals *t, int has_answer, double exact, double f1) {
    t->exact += exact;
    t->f1 += f1;
    t->total++;
    if (has_answer) {
        t->has_exact += exact;
        t->has_f1 += f1;
        t->has_total++;
    } else {
        t->no_exact += exact;
        t->no_f1 += f1;
        t->no_total++;
    }
}

double tg_squad_percent(double sum, int64_t count) { return count > 0 ? 100.0 * sum / (double)count : 0.0; }
