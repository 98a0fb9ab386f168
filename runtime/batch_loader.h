/* A background thread that fills a run's training batches ahead of the steps that take
 * them: batch j (0, 1, 2, ... in order) by one call of fill(ctx, j), never j at or past the
 * limit the consumer allows (the staging buffers still in use bound it). The consumer
 * waits only when a step needs a batch that is not filled yet; the time it waits is the
 * run's batch wait.
 *
 * While the thread runs it alone calls fill (and so owns whatever fill touches: the
 * sampler, the staging buffers past those in use); tg_batch_loader_park hands all of
 * that back to the caller until tg_batch_loader_resume. */
#ifndef TUNEGRAPH_BATCH_LOADER_H
#define TUNEGRAPH_BATCH_LOADER_H

#include <stdint.h>

#include "base/error.h"

typedef void (*tg_batch_fill_fn)(void *ctx, int64_t batch);

typedef struct tg_batch_loader tg_batch_loader;

/* Starts the thread, parked: it fills nothing before tg_batch_loader_resume. */
int tg_batch_loader_start(tg_batch_loader **l, tg_batch_fill_fn fill, void *ctx, tg_err *err);
/* Stops the thread (after the fill in progress) and frees the loader; NULL is allowed. */
void tg_batch_loader_stop(tg_batch_loader *l);

/* Fills from batch `next` on, below `limit`. */
void tg_batch_loader_resume(tg_batch_loader *l, int64_t next, int64_t limit);
/* Raises the limit (never lowers it). */
void tg_batch_loader_allow(tg_batch_loader *l, int64_t limit);
/* Waits until every batch below `end` is filled (end <= the limit); returns the seconds
 * waited (0 when they already were). */
double tg_batch_loader_wait(tg_batch_loader *l, int64_t end);
/* Waits for the fill in progress and keeps the thread from starting another; returns the
 * first batch not filled. A parked loader stays parked. */
int64_t tg_batch_loader_park(tg_batch_loader *l);

#endif
