#include "datasets/labels.h"
#include "base/alloc.h"

#include <stdlib.h>
#include <string.h>

#define MAX_LABELS (1 << 20)

typedef struct name_ref {
    const char *p;
    size_t len;
} name_ref;

/* -?(0|[1-9][0-9]*), not "-0", at most 18 digits: a whole number spelled one way only. */
static int is_whole(const char *p, size_t n) {
    size_t i = n && p[0] == '-';
    if (i == n || n - i > 18) return 0;
    if (p[i] == '0' && (n - i > 1 || i)) return 0;
    for (; i < n; i++)
        if (p[i] < '0' || p[i] > '9') return 0;
    return 1;
}

static int by_bytes(const void *a, const void *b) {
    const name_ref *x = a, *y = b;
    int c = memcmp(x->p, y->p, x->len < y->len ? x->len : y->len);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

static int by_value(const void *a, const void *b) {
    const name_ref *x = a, *y = b;
    long long u = strtoll(x->p, NULL, 10), v = strtoll(y->p, NULL, 10); /* NUL-terminated in the arena */
    return (u > v) - (u < v);
}

static int ids_by_name(const void *a, const void *b, void *set) {
    const tg_label_set *ls = set;
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    name_ref x = {ls->names[i], ls->lens[i]}, y = {ls->names[j], ls->lens[j]};
    return by_bytes(&x, &y);
}

static int set_from(tg_label_set *ls, const name_ref *refs, int32_t n, tg_err *err) {
    memset(ls, 0, sizeof *ls);
    ls->names = tg_calloc((size_t)n, sizeof *ls->names);
    ls->lens = tg_calloc((size_t)n, sizeof *ls->lens);
    ls->sorted = tg_calloc((size_t)n, sizeof *ls->sorted);
    if (!ls->names || !ls->lens || !ls->sorted) {
        tg_labels_free(ls);
        return tg_fail(err, "out of memory for %d label names", n);
    }
    for (int32_t i = 0; i < n; i++) {
        if (!(ls->names[i] = tg_malloc(refs[i].len + 1))) {
            ls->n = i;
            tg_labels_free(ls);
            return tg_fail(err, "out of memory for label name %d", i);
        }
        memcpy(ls->names[i], refs[i].p, refs[i].len);
        ls->names[i][refs[i].len] = 0;
        ls->lens[i] = refs[i].len;
        ls->sorted[i] = i;
    }
    ls->n = n;
    qsort_r(ls->sorted, (size_t)n, sizeof *ls->sorted, ids_by_name, ls);
    return 0;
}

int tg_labels_parse_list(const char *list, tg_label_set *ls, tg_err *err) {
    memset(ls, 0, sizeof *ls);
    int32_t n = 1;
    for (const char *p = list; *p; p++) n += *p == ',';
    if (n > MAX_LABELS) return tg_fail(err, "--labels: more than %d names", MAX_LABELS);
    name_ref *refs = tg_calloc((size_t)n, sizeof *refs);
    if (!refs) return tg_fail(err, "--labels: out of memory");
    const char *p = list;
    for (int32_t i = 0; i < n; i++) {
        size_t len = strcspn(p, ",");
        const char *s = p;
        p += len + (p[len] == ',');
        while (len && (*s == ' ' || *s == '\t')) s++, len--;
        while (len && (s[len - 1] == ' ' || s[len - 1] == '\t')) len--;
        if (!len) {
            free(refs);
            return tg_fail(err, "--labels: name %d of '%s' is empty", i + 1, list);
        }
        for (int32_t j = 0; j < i; j++)
            if (refs[j].len == len && !memcmp(refs[j].p, s, len)) {
                free(refs);
                return tg_fail(err, "--labels: '%.*s' is listed twice", (int)len, s);
            }
        refs[i] = (name_ref){s, len};
    }
    int rc = set_from(ls, refs, n, err);
    free(refs);
    return rc;
}

/* The set of the distinct names among refs[0..n) (refs is reordered): sorted by value when
 * every name is a whole number, else by bytes. */
static int set_of_distinct(name_ref *refs, int64_t n, int whole, tg_label_set *ls, tg_err *err) {
    /* Bytes first even for numbers, so equal names sit together for the dedup. */
    qsort(refs, (size_t)n, sizeof *refs, by_bytes);
    int64_t distinct = 0;
    for (int64_t i = 0; i < n; i++)
        if (!distinct || by_bytes(&refs[distinct - 1], &refs[i])) refs[distinct++] = refs[i];
    if (distinct > MAX_LABELS)
        return tg_fail(err, "%lld distinct labels, more than %d (is the label column the right one?)",
                       (long long)distinct, MAX_LABELS);
    if (whole) qsort(refs, (size_t)distinct, sizeof *refs, by_value);
    return set_from(ls, refs, (int32_t)distinct, err);
}

int tg_labels_of_names(const char *const *names, int32_t n, tg_label_set *ls, tg_err *err) {
    memset(ls, 0, sizeof *ls);
    if (n <= 0) return 0;
    name_ref *refs = tg_malloc((size_t)n * sizeof *refs);
    if (!refs) return tg_fail(err, "out of memory for %d label names", n);
    int whole = 1;
    for (int32_t i = 0; i < n; i++) {
        refs[i] = (name_ref){names[i], strlen(names[i])};
        whole &= is_whole(refs[i].p, refs[i].len);
    }
    int rc = set_of_distinct(refs, n, whole, ls, err);
    free(refs);
    return rc;
}

int tg_labels_collect(const tg_text_rows *rows, tg_label_set *ls, tg_err *err) {
    memset(ls, 0, sizeof *ls);
    int64_t n = 0;
    for (int64_t i = 0; i < rows->n; i++) n += rows->rows[i].label >= 0;
    if (n == 0) return 0;
    name_ref *refs = tg_malloc((size_t)n * sizeof *refs);
    if (!refs) return tg_fail(err, "out of memory collecting %lld labels", (long long)n);
    int whole = 1;
    n = 0;
    for (int64_t i = 0; i < rows->n; i++) {
        const tg_text_row *r = &rows->rows[i];
        if (r->label < 0) continue;
        refs[n] = (name_ref){tg_text_rows_at(rows, r->label), (size_t)r->label_len};
        whole &= is_whole(refs[n].p, refs[n].len);
        n++;
    }
    int rc = set_of_distinct(refs, n, whole, ls, err);
    free(refs);
    return rc;
}

int32_t tg_labels_find(const tg_label_set *ls, const char *name, size_t len) {
    const name_ref key = {name, len};
    int32_t lo = 0, hi = ls->n;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2, id = ls->sorted[mid];
        const name_ref at = {ls->names[id], ls->lens[id]};
        int c = by_bytes(&at, &key);
        if (c == 0) return id;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

void tg_labels_free(tg_label_set *ls) {
    if (ls->names)
        for (int32_t i = 0; i < ls->n; i++) free(ls->names[i]);
    free(ls->names);
    free(ls->lens);
    free(ls->sorted);
    memset(ls, 0, sizeof *ls);
}
