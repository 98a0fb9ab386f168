/* A fixed pool of worker threads for the CPU executor's parallel loops. */
#ifndef TUNEGRAPH_THREADPOOL_H
#define TUNEGRAPH_THREADPOOL_H

#include <stdint.h>

typedef struct tg_threadpool tg_threadpool;

/* n_threads <= 0: one per online core. Returns NULL on failure. */
tg_threadpool *tg_threadpool_create(int n_threads);
void tg_threadpool_destroy(tg_threadpool *tp);
int tg_threadpool_size(const tg_threadpool *tp);

/* Calls fn(arg, begin, end) over [0, n) split into contiguous chunks, one per thread,
 * and returns when all are done. tp may be NULL (runs fn(arg, 0, n) inline). */
typedef void (*tg_range_fn)(void *arg, int64_t begin, int64_t end);
void tg_parallel_for(tg_threadpool *tp, int64_t n, tg_range_fn fn, void *arg);

#endif
