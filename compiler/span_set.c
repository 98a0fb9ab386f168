#include "compiler/span_set.h"

#include <stdlib.h>
#include <string.h>

#include "compiler/compiler_alloc.h"

/* The first span ending at or after a: the spans are disjoint and sorted, so their ends
 * rise. */
static int first_ending_at(const tg_span_set *s, uint64_t a) {
    int lo = 0, hi = s->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (s->v[mid].b < a) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

int tg_span_set_add(tg_span_set *s, uint64_t a, uint64_t b) {
    if (a >= b) return 0;
    if (s->n == s->cap) {
        if (s->cap > INT32_MAX / 2) return -1;
        int cap = s->cap ? 2 * s->cap : 8;
        tg_span *v = tg_compiler_realloc(s->v, sizeof *v * (size_t)cap);
        if (!v) return -1;
        s->v = v, s->cap = cap;
    }
    int i = first_ending_at(s, a); /* first span that touches or follows [a, b) */
    int j = i;
    while (j < s->n && s->v[j].a <= b) { /* spans merged into the new one */
        if (s->v[j].a < a) a = s->v[j].a;
        if (s->v[j].b > b) b = s->v[j].b;
        j++;
    }
    if (j != i + 1) memmove(s->v + i + 1, s->v + j, sizeof *s->v * (size_t)(s->n - j));
    s->v[i] = (tg_span){a, b};
    s->n += 1 - (j - i);
    return 0;
}

void tg_span_set_free(tg_span_set *s) {
    free(s->v);
    s->v = NULL;
    s->n = s->cap = 0;
}
