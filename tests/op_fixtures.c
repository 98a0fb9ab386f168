#include "tests/op_fixtures.h"

#include <stdlib.h>

#include "tests/harness.h"

static tg_threadpool *g_pool;

tg_threadpool *pool3(void) {
    if (!g_pool) g_pool = tg_threadpool_create(3);
    return g_pool;
}
__attribute__((destructor)) static void pool3_free(void) { tg_threadpool_destroy(g_pool); }

float *falloc(int64_t n) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    if (!p) abort();
    return p;
}

float *frand(int64_t n, uint64_t seed, float lo, float hi) {
    float *p = falloc(n);
    tg_test_fill_uniform(p, n, seed, lo, hi);
    return p;
}

float *fconst(int64_t n, float v) {
    float *p = falloc(n);
    for (int64_t i = 0; i < n; i++) p[i] = v;
    return p;
}
