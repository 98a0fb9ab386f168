/* The run's batch order: tg_sampler's shuffle cut into global batches, with the last batch
 * of an epoch padded, dropped or wrapped, and optionally grouped by length bucket
 * (datasets/batch_sampler.h). */
#include "datasets/batch_sampler.h"
#include "base/alloc.h"

#include <stdlib.h>
#include <string.h>

#include "base/checked.h"

/* malloc of count int32s, the size checked (count comes from the dataset's size). */
static int32_t *alloc_i32(int64_t count, const char *what, tg_err *err) {
    uint64_t bytes;
    if (count < 1 || tg_mul_u64((uint64_t)count, sizeof(int32_t), &bytes) || bytes > SIZE_MAX) { /* GCOVR_EXCL_BR_LINE: count is 1 to 2 * INT32_MAX (n >= 1 and per_epoch >= 1 are checked above): 4 * count fits */
        tg_fail(err, "batch sampler: %s of %lld entries is too large", what, (long long)count);
        return NULL;
    }
    int32_t *p = tg_malloc((size_t)bytes);
    if (!p) tg_fail(err, "batch sampler: out of memory for %s (%lld entries)", what, (long long)count);
    return p;
}

/* Builds epoch `epoch`'s batches into order/start/rows/bucket.
 *
 * Without buckets, batch i is the shuffled order's [i * G, (i + 1) * G).
 *
 * With buckets, order holds 2n entries: the second half receives the shuffle, and the first
 * is laid out as every bucket's full batches (ascending bucket, the shuffle's order within
 * each) followed by every bucket's leftovers (ascending bucket), so that canonical batch k
 * is order[k * G ..] whichever part it falls in. The batches then take the seeded order
 * of the TG_ORDER_BATCHES stream: start first receives that permutation, rows the
 * canonical batches' buckets, and both are then rewritten in place. Nothing is allocated
 * here, so drawing a batch cannot fail. */
static void build_epoch(tg_batch_sampler *s, int32_t epoch) {
    const int32_t n = s->n, G = s->global_batch, P = s->per_epoch;
    if (s->n_buckets <= 1) {
        tg_seeded_order(s->order, n, s->seed, epoch, TG_ORDER_EXAMPLES);
        for (int32_t i = 0; i < P; i++) {
            const int64_t first = (int64_t)i * G, left = n - first;
            s->start[i] = (int32_t)first;
            s->rows[i] = (int32_t)(left < G ? left : G);
            s->bucket[i] = 0;
        }
        s->built_epoch = epoch;
        return;
    }

    const int nb = s->n_buckets;
    int32_t *shuffled = s->order + n;
    tg_seeded_order(shuffled, n, s->seed, epoch, TG_ORDER_EXAMPLES);
    int64_t count[TG_MAX_BUCKETS] = {0};
    for (int32_t i = 0; i < n; i++) count[s->example_bucket[i]]++;
    /* Where each bucket's full-batch part and leftover part begin in order. */
    int64_t full_at[TG_MAX_BUCKETS], left_at[TG_MAX_BUCKETS], full_len[TG_MAX_BUCKETS], total_full = 0;
    for (int b = 0; b < nb; b++) {
        full_len[b] = count[b] / G * G;
        full_at[b] = total_full;
        total_full += full_len[b];
    }
    int64_t next_left = total_full;
    for (int b = 0; b < nb; b++) {
        left_at[b] = next_left;
        next_left += count[b] - full_len[b];
    }
    int64_t seen[TG_MAX_BUCKETS] = {0};
    for (int32_t i = 0; i < n; i++) {
        const int32_t ex = shuffled[i];
        const int b = s->example_bucket[ex];
        const int64_t j = seen[b]++;
        s->order[j < full_len[b] ? full_at[b] + j : left_at[b] + (j - full_len[b])] = ex;
    }

    /* Canonical batch k's bucket: its bucket for a full one, else that of its longest
     * member (the largest bucket among its members). */
    int32_t *canon_bucket = s->rows;
    for (int32_t k = 0; k < P; k++) {
        const int64_t first = (int64_t)k * G, left = n - first, rows = left < G ? left : G;
        int32_t top = 0;
        for (int64_t r = 0; r < rows; r++) {
            const int32_t b = s->example_bucket[s->order[first + r]];
            if (b > top) top = b;
        }
        canon_bucket[k] = top;
    }
    tg_seeded_order(s->start, P, s->seed, epoch, TG_ORDER_BATCHES);
    for (int32_t i = 0; i < P; i++) s->bucket[i] = canon_bucket[s->start[i]];
    for (int32_t i = 0; i < P; i++) {
        const int64_t first = (int64_t)s->start[i] * G, left = n - first;
        s->start[i] = (int32_t)first;
        s->rows[i] = (int32_t)(left < G ? left : G);
    }
    s->built_epoch = epoch;
}

int tg_batch_sampler_init(tg_batch_sampler *s, const int32_t *lengths, int32_t n, int32_t global_batch,
                          int last_batch, int n_buckets, const int32_t *bucket_seq, uint64_t seed, tg_err *err) {
    memset(s, 0, sizeof *s);
    s->built_epoch = -1;
    if (n <= 0) return tg_fail(err, "batch sampler: the dataset has no examples");
    if (global_batch < 1) return tg_fail(err, "batch sampler: global batch %d must be at least 1", global_batch);
    if (last_batch < 0 || last_batch >= TG_LAST_BATCH_COUNT)
        return tg_fail(err, "batch sampler: last_batch %d is not pad, drop or wrap", last_batch);
    if (n_buckets > TG_MAX_BUCKETS)
        return tg_fail(err, "batch sampler: %d length buckets, more than the %d allowed", n_buckets, TG_MAX_BUCKETS);
    const int bucketed = n_buckets > 1;
    if (bucketed) {
        if (!bucket_seq || !lengths)
            return tg_fail(err, "batch sampler: %d length buckets need their lengths and the examples' lengths",
                           n_buckets);
        if (bucket_seq[0] < 1)
            return tg_fail(err, "batch sampler: bucket_seq[0] = %d must be at least 1", bucket_seq[0]);
        for (int b = 1; b < n_buckets; b++)
            if (bucket_seq[b] <= bucket_seq[b - 1])
                return tg_fail(err, "batch sampler: bucket_seq is not ascending (bucket_seq[%d] = %d after %d)", b,
                               bucket_seq[b], bucket_seq[b - 1]);
        if (last_batch == TG_LAST_BATCH_WRAP)
            return tg_fail(err, "batch sampler: last_batch = wrap cannot be used with length buckets "
                                "(a batch would cross epochs and buckets); use pad or drop");
    }
    /* Every mode has ceil(n / G) batches an epoch but drop, which leaves the short one out. */
    const int64_t per_epoch =
        last_batch == TG_LAST_BATCH_DROP ? (int64_t)n / global_batch : ((int64_t)n + global_batch - 1) / global_batch;
    if (per_epoch == 0)
        return tg_fail(err, "batch sampler: last_batch = drop leaves no batch: %d examples, global batch %d", n,
                       global_batch);

    s->n = n;
    s->global_batch = global_batch;
    s->last_batch = last_batch;
    s->n_buckets = bucketed ? n_buckets : 1;
    if (bucketed) memcpy(s->bucket_seq, bucket_seq, sizeof *bucket_seq * (size_t)n_buckets);
    s->seed = seed;
    s->per_epoch = (int32_t)per_epoch;

    if (last_batch == TG_LAST_BATCH_WRAP) {
        if (tg_sampler_init(&s->stream, n, seed, err)) return -1;
        return 0;
    }
    s->order = alloc_i32(bucketed ? 2 * (int64_t)n : n, "the example order", err);
    s->start = s->order ? alloc_i32(per_epoch, "the batch starts", err) : NULL;
    s->rows = s->start ? alloc_i32(per_epoch, "the batch rows", err) : NULL;
    s->bucket = s->rows ? alloc_i32(per_epoch, "the batch buckets", err) : NULL;
    s->example_bucket = s->bucket && bucketed ? alloc_i32(n, "the example buckets", err) : NULL;
    if (!s->bucket || (bucketed && !s->example_bucket)) {
        tg_batch_sampler_free(s);
        return -1;
    }
    if (bucketed)
        for (int32_t i = 0; i < n; i++) {
            int b = 0;
            while (b + 1 < n_buckets && lengths[i] > bucket_seq[b]) b++;
            s->example_bucket[i] = b;
        }
    return 0;
}

void tg_batch_sampler_free(tg_batch_sampler *s) {
    if (!s) return;
    free(s->example_bucket);
    free(s->order);
    free(s->start);
    free(s->rows);
    free(s->bucket);
    tg_sampler_free(&s->stream);
    memset(s, 0, sizeof *s);
    s->built_epoch = -1;
}

int32_t tg_batch_sampler_next(tg_batch_sampler *s, int32_t *idx, int32_t *bucket) {
    if (s->last_batch == TG_LAST_BATCH_WRAP) {
        tg_sampler_next(&s->stream, idx, s->global_batch);
        s->epoch = s->stream.epoch;
        s->pos = s->stream.pos;
        *bucket = 0;
        return s->global_batch;
    }
    if (s->pos == s->per_epoch) {
        s->epoch++;
        s->pos = 0;
    }
    if (s->built_epoch != s->epoch) build_epoch(s, s->epoch);
    const int32_t i = s->pos++;
    memcpy(idx, s->order + s->start[i], sizeof *idx * (size_t)s->rows[i]);
    *bucket = s->bucket[i];
    return s->rows[i];
}

int tg_batch_sampler_seek(tg_batch_sampler *s, int32_t epoch, int32_t pos, tg_err *err) {
    if (s->last_batch == TG_LAST_BATCH_WRAP) {
        if (epoch < 0 || pos < 0 || pos > s->n)
            return tg_fail(err, "batch sampler: epoch %d, position %d is outside an epoch of %d examples "
                                "(last_batch = wrap counts examples)",
                           epoch, pos, s->n);
        if (tg_sampler_seek(&s->stream, epoch, pos, err)) return -1; /* GCOVR_EXCL_BR_LINE: s->stream was made with s->n examples, and those bounds were refused just above */
    } else if (epoch < 0 || pos < 0 || pos > s->per_epoch) {
        return tg_fail(err, "batch sampler: epoch %d, position %d is outside an epoch of %d batches", epoch, pos,
                       s->per_epoch);
    }
    s->epoch = epoch;
    s->pos = pos;
    return 0;
}
