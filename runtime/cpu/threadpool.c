/* Persistent pthread workers for tg_parallel_for. One job runs at a time: the caller
 * publishes it under the mutex and bumps a generation counter, every thread (caller
 * included, as chunk 0) runs its contiguous chunk, and the caller waits until the
 * remaining-chunk count drops to zero. */
#include "runtime/cpu/threadpool.h"
#include "base/alloc.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

struct tg_threadpool {
    int n_threads;  /* workers + the calling thread */
    pthread_t *workers;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;  /* workers wait here for a new generation */
    pthread_cond_t done_cv;  /* the caller waits here for pending == 0 */
    pthread_mutex_t call_mu; /* serializes concurrent tg_parallel_for callers */
    uint64_t generation;
    int pending;
    int stop;
    /* The current job. */
    tg_range_fn fn;
    void *arg;
    int64_t n;
    int chunks;
};

typedef struct worker_start {
    tg_threadpool *tp;
    int index;
} worker_start;

/* Set while a thread runs a chunk, so a nested parallel_for runs inline instead of
 * deadlocking on the single job slot. */
static _Thread_local int in_worker;

static void chunk_bounds(int64_t n, int chunks, int c, int64_t *b, int64_t *e) {
    *b = n * c / chunks;
    *e = n * (c + 1) / chunks;
}

static void *worker_main(void *p) {
    worker_start ws = *(worker_start *)p;
    free(p);
    tg_threadpool *tp = ws.tp;
    in_worker = 1;
    uint64_t seen = 0;
    pthread_mutex_lock(&tp->mu);
    for (;;) {
        while (!tp->stop && tp->generation == seen) pthread_cond_wait(&tp->work_cv, &tp->mu);
        if (tp->stop) break;
        seen = tp->generation;
        if (ws.index >= tp->chunks) continue; /* too few elements for this worker */
        tg_range_fn fn = tp->fn;
        void *arg = tp->arg;
        int64_t b, e;
        chunk_bounds(tp->n, tp->chunks, ws.index, &b, &e);
        pthread_mutex_unlock(&tp->mu);
        fn(arg, b, e);
        pthread_mutex_lock(&tp->mu);
        if (--tp->pending == 0) pthread_cond_signal(&tp->done_cv);
    }
    pthread_mutex_unlock(&tp->mu);
    return NULL;
}

tg_threadpool *tg_threadpool_create(int n_threads) {
    if (n_threads <= 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = cores > 0 ? (int)cores : 1; /* GCOVR_EXCL_BR_LINE: Linux always knows its online cores */
    }
    tg_threadpool *tp = tg_calloc(1, sizeof *tp);
    if (!tp) return NULL;
    tp->n_threads = n_threads;
    /* GCOVR_EXCL_BR_START: glibc's initialisers with default attributes always return 0 */
    if (pthread_mutex_init(&tp->mu, NULL) || pthread_mutex_init(&tp->call_mu, NULL) ||
        pthread_cond_init(&tp->work_cv, NULL) || pthread_cond_init(&tp->done_cv, NULL)) {
        /* GCOVR_EXCL_BR_STOP */
        free(tp);
        return NULL;
    }
    tp->workers = tg_calloc((size_t)n_threads, sizeof *tp->workers);
    if (!tp->workers) {
        free(tp);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        worker_start *ws = tg_malloc(sizeof *ws);
        if (ws) *ws = (worker_start){tp, i};
        if (!ws || pthread_create(&tp->workers[i], NULL, worker_main, ws) != 0) {
            free(ws);
            tp->n_threads = i; /* destroy joins only the workers that started */
            tg_threadpool_destroy(tp);
            return NULL;
        }
    }
    return tp;
}

void tg_threadpool_destroy(tg_threadpool *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    tp->stop = 1;
    pthread_cond_broadcast(&tp->work_cv);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 1; i < tp->n_threads; i++) pthread_join(tp->workers[i], NULL);
    pthread_cond_destroy(&tp->work_cv);
    pthread_cond_destroy(&tp->done_cv);
    pthread_mutex_destroy(&tp->mu);
    pthread_mutex_destroy(&tp->call_mu);
    free(tp->workers);
    free(tp);
}

int tg_threadpool_size(const tg_threadpool *tp) { return tp ? tp->n_threads : 1; }

void tg_parallel_for(tg_threadpool *tp, int64_t n, tg_range_fn fn, void *arg) {
    if (n <= 0) return;
    if (!tp || tp->n_threads <= 1 || n == 1 || in_worker) {
        fn(arg, 0, n);
        return;
    }
    int chunks = n < tp->n_threads ? (int)n : tp->n_threads;
    pthread_mutex_lock(&tp->call_mu);
    pthread_mutex_lock(&tp->mu);
    tp->fn = fn;
    tp->arg = arg;
    tp->n = n;
    tp->chunks = chunks;
    tp->pending = chunks - 1;
    tp->generation++;
    pthread_cond_broadcast(&tp->work_cv);
    pthread_mutex_unlock(&tp->mu);

    int64_t b, e;
    chunk_bounds(n, chunks, 0, &b, &e);
    in_worker = 1;
    fn(arg, b, e);
    in_worker = 0;

    pthread_mutex_lock(&tp->mu);
    while (tp->pending > 0) pthread_cond_wait(&tp->done_cv, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
    pthread_mutex_unlock(&tp->call_mu);
}
