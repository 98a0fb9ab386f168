#include "runtime/batch_loader.h"
#include "base/alloc.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"

struct tg_batch_loader {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work;   /* to the thread: resumed, limit raised, or stop */
    pthread_cond_t done;   /* to the consumer: a batch filled, or the thread went idle */
    tg_batch_fill_fn fill;
    void *ctx;
    int64_t next;          /* the first batch not filled */
    int64_t limit;         /* batches below it may be filled */
    int running;           /* resumed and not parked */
    int busy;              /* inside fill */
    int stop;
};

/* The mutex is error-checking: a lock taken twice or an unlock without the lock (a broken
 * edit of the hand-off below) fails loudly at once instead of racing unseen. Either is a
 * defect of this file, never of the input: it aborts, saying which. */
static void loader_lock(tg_batch_loader *l) {
    const int rc = pthread_mutex_lock(&l->mu);
    if (rc) { /* GCOVR_EXCL_BR_LINE: only a defect of this file fails it */
        fprintf(stderr, "tunegraph: batch loader: taking its lock failed: %s\n", strerror(rc));
        abort();
    }
}

static void loader_unlock(tg_batch_loader *l) {
    const int rc = pthread_mutex_unlock(&l->mu);
    if (rc) { /* GCOVR_EXCL_BR_LINE: only a defect of this file fails it */
        fprintf(stderr, "tunegraph: batch loader: releasing its lock failed: %s\n", strerror(rc));
        abort();
    }
}

static void *loader_main(void *arg) {
    tg_batch_loader *l = arg;
    loader_lock(l);
    for (;;) {
        while (!l->stop && !(l->running && l->next < l->limit)) pthread_cond_wait(&l->work, &l->mu);
        if (l->stop) break;
        const int64_t j = l->next;
        l->busy = 1;
        loader_unlock(l);
        l->fill(l->ctx, j);
        loader_lock(l);
        l->busy = 0;
        l->next = j + 1;
        pthread_cond_broadcast(&l->done);
    }
    loader_unlock(l);
    return NULL;
}

int tg_batch_loader_start(tg_batch_loader **out, tg_batch_fill_fn fill, void *ctx, tg_err *err) {
    *out = NULL;
    tg_batch_loader *l = tg_calloc(1, sizeof *l);
    if (!l) return tg_fail(err, "out of memory for the batch loader");
    l->fill = fill, l->ctx = ctx;
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ERRORCHECK);
    pthread_mutex_init(&l->mu, &attr);
    pthread_mutexattr_destroy(&attr);
    pthread_cond_init(&l->work, NULL);
    pthread_cond_init(&l->done, NULL);
    const int rc = pthread_create(&l->thread, NULL, loader_main, l);
    if (rc) {
        pthread_cond_destroy(&l->done);
        pthread_cond_destroy(&l->work);
        pthread_mutex_destroy(&l->mu);
        free(l);
        return tg_fail(err, "cannot start the batch loader thread (error %d)", rc);
    }
    *out = l;
    return 0;
}

void tg_batch_loader_stop(tg_batch_loader *l) {
    if (!l) return;
    loader_lock(l);
    l->stop = 1;
    pthread_cond_signal(&l->work);
    loader_unlock(l);
    pthread_join(l->thread, NULL);
    pthread_cond_destroy(&l->done);
    pthread_cond_destroy(&l->work);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

void tg_batch_loader_resume(tg_batch_loader *l, int64_t next, int64_t limit) {
    loader_lock(l);
    l->next = next, l->limit = limit, l->running = 1;
    pthread_cond_signal(&l->work);
    loader_unlock(l);
}

void tg_batch_loader_allow(tg_batch_loader *l, int64_t limit) {
    loader_lock(l);
    if (limit > l->limit) {
        l->limit = limit;
        pthread_cond_signal(&l->work);
    }
    loader_unlock(l);
}

double tg_batch_loader_wait(tg_batch_loader *l, int64_t end) {
    loader_lock(l);
    double waited = 0;
    if (l->next < end) {
        const double t0 = tg_wall_s();
        while (l->next < end && l->running) pthread_cond_wait(&l->done, &l->mu);
        waited = tg_wall_s() - t0;
    }
    loader_unlock(l);
    return waited;
}

int64_t tg_batch_loader_park(tg_batch_loader *l) {
    loader_lock(l);
    l->running = 0;
    while (l->busy) pthread_cond_wait(&l->done, &l->mu);
    const int64_t next = l->next;
    loader_unlock(l);
    return next;
}
