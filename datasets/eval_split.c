#include "datasets/eval_split.h"

#include <math.h>
#include <stdlib.h>

#include "base/alloc.h"

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int tg_eval_split_pick(int64_t n, double fraction, uint64_t seed, const char *what, uint8_t **in_eval, int64_t *n_eval,
                       tg_err *err) {
    *in_eval = tg_calloc((size_t)(n ? n : 1), 1); /* GCOVR_EXCL_BR_LINE: n > 0, none is refused before */
    if (!*in_eval) return tg_fail(err, "out of memory for the eval split of %lld %s", (long long)n, what);
    *n_eval = 0;
    if (fraction <= 0) return 0;
    int64_t k = (int64_t)ceil(fraction * (double)n - 1e-9);
    if (k >= n)
        return tg_fail(err, "--eval-fraction %g of %lld %s leaves nothing to train on", fraction, (long long)n, what);
    int64_t *order = tg_malloc((size_t)n * sizeof *order);
    if (!order) return tg_fail(err, "out of memory for the order of %lld %s", (long long)n, what);
    for (int64_t i = 0; i < n; i++) order[i] = i;
    uint64_t state = seed;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(splitmix64(&state) % (uint64_t)(i + 1));
        int64_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int64_t i = 0; i < k; i++) (*in_eval)[order[i]] = 1;
    free(order);
    *n_eval = k;
    return 0;
}
