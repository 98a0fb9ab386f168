/* The order a run reads its training examples in: a seeded shuffle per epoch, cut into
 * global batches (every replica's rows of one step), with the last partial batch of an
 * epoch handled as the run asks (tg_last_batch) and, with length buckets, examples grouped
 * by bucket so that a batch is padded only to its bucket's length.
 *
 * Without buckets, epoch e's order is tg_sampler's (datasets/dataset.h) and batch i holds
 * its examples [i * G, (i + 1) * G) (G the global batch): pad keeps the short last one,
 * drop leaves it out, wrap completes it from the next epoch's order (tg_sampler's stream,
 * batches crossing epochs).
 *
 * With buckets: each example belongs to the smallest bucket whose seq holds it (the last
 * when none does). Epoch e's shuffled order is split by bucket, keeping that order within
 * each; each bucket's examples are cut into full batches of G; what is left over of every
 * bucket, taken in ascending bucket order, is cut into batches of G in turn, each run in
 * the bucket of its longest example; the last, short one is kept (pad) or left out
 * (drop). The epoch's batches are then put in a seeded random order, so that the lengths
 * a run sees do not follow a pattern. wrap is not allowed with buckets.
 *
 * Everything depends only on the seed, the epoch and the examples' lengths, identically
 * on every machine, so replicas agree on each global batch and a resumed run finds its
 * place from (epoch, position) alone. */
#ifndef TUNEGRAPH_BATCH_SAMPLER_H
#define TUNEGRAPH_BATCH_SAMPLER_H

#include <stdint.h>

#include "base/error.h"
#include "datasets/dataset.h"
#include "plan/plan.h"

typedef struct tg_batch_sampler {
    int32_t n;                  /* examples */
    int32_t global_batch;       /* G: rows of one step over every replica */
    int32_t last_batch;         /* tg_last_batch */
    int32_t n_buckets;          /* 1: none */
    int32_t bucket_seq[TG_MAX_BUCKETS];
    uint64_t seed;
    int32_t *example_bucket;    /* each example's bucket (buckets only) */
    int32_t per_epoch;          /* batches in every epoch (wrap: ceil(n / G)) */
    int32_t epoch;              /* the epoch the next batch comes from */
    /* Batches of `epoch` drawn so far; wrap: examples of its order drawn (tg_sampler's pos). */
    int32_t pos;
    /* The epoch's batches (not wrap): batch i is order[start[i] .. start[i] + rows[i]) in
     * bucket[i]. */
    int32_t *order, *start, *rows, *bucket;
    int32_t built_epoch;        /* the epoch those arrays hold, -1: none */
    tg_sampler stream;          /* wrap: the example stream */
} tg_batch_sampler;

/* lengths[i]: example i's token count (n examples). n_buckets <= 1 (bucket_seq unused)
 * means no buckets. Fails with a message when there are no examples, when drop leaves an
 * epoch with no batch (n < G, or with buckets fewer than G examples in all), or when wrap
 * is asked for with buckets. */
int tg_batch_sampler_init(tg_batch_sampler *s, const int32_t *lengths, int32_t n, int32_t global_batch,
                          int last_batch, int n_buckets, const int32_t *bucket_seq, uint64_t seed, tg_err *err);
void tg_batch_sampler_free(tg_batch_sampler *s);

/* Writes the next global batch's example indices into idx (room for global_batch) and its
 * bucket into *bucket; returns its rows (1 .. global_batch; fewer only for pad's last
 * batch of an epoch). Crosses into the next epoch as needed. */
int32_t tg_batch_sampler_next(tg_batch_sampler *s, int32_t *idx, int32_t *bucket);

/* Puts the sampler where one that had drawn up to (epoch, pos) would be: a resumed run's
 * data position (runtime/checkpoint.h). Fails on a position outside the epoch. */
int tg_batch_sampler_seek(tg_batch_sampler *s, int32_t epoch, int32_t pos, tg_err *err);

#endif
