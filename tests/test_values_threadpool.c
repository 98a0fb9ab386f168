/* The CPU thread pool's barrier (runtime/cpu/threadpool.c): tg_parallel_for returns only
 * once every chunk has run to its end. Chunks other than the caller's sleep before they
 * write, so a call that returned early would be seen right after it returns. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "runtime/cpu/threadpool.h"
#include "tests/harness.h"

enum { MAX_N = 64 };

typedef struct slow_ctx {
    _Atomic int done[MAX_N];
    _Atomic int calls;
} slow_ctx;

static void sleep_ms(int ms) {
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* Chunks past the first sleep longer the later they start, then mark their indices. */
static void slow_chunk(void *p, int64_t begin, int64_t end) {
    slow_ctx *c = p;
    atomic_fetch_add(&c->calls, 1);
    if (begin > 0) sleep_ms(5 + (int)(begin % 4) * 5);
    for (int64_t i = begin; i < end; i++) atomic_fetch_add(&c->done[i], 1);
}

/* Every index written exactly once at the moment tg_parallel_for returns. */
static int check_call(tg_threadpool *tp, int64_t n, const char *what) {
    static slow_ctx c;
    memset(&c, 0, sizeof c);
    tg_parallel_for(tp, n, slow_chunk, &c);
    int missing = 0, twice = 0;
    for (int64_t i = 0; i < MAX_N; i++) {
        int d = atomic_load(&c.done[i]);
        missing += i < n && d == 0;
        twice += d > (i < n);
    }
    int threads = tg_threadpool_size(tp), chunks = n < threads ? (int)n : threads;
    return CHECK(!missing && !twice, "%s, %d threads, n=%lld: %d indices unwritten, %d written wrongly when it returned",
                 what, threads, (long long)n, missing, twice) &&
           CHECK(atomic_load(&c.calls) == (n > 0 ? chunks : 0), "%s, %d threads, n=%lld: %d chunks ran, want %d",
                 what, threads, (long long)n, atomic_load(&c.calls), n > 0 ? chunks : 0);
}

TG_TEST(test_values_threadpool_waits_for_every_chunk) {
    static const int threads[] = {2, 3, 4, 8};
    static const int64_t sizes[] = {1, 2, 3, 7, 8, 9, 33, MAX_N};
    for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
        tg_threadpool *tp = tg_threadpool_create(threads[t]);
        REQUIRE(tp, "pool of %d threads", threads[t]);
        CHECK(tg_threadpool_size(tp) == threads[t], "size %d, want %d", tg_threadpool_size(tp), threads[t]);
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (int rep = 0; rep < 2; rep++) check_call(tp, sizes[s], "one caller");
        tg_threadpool_destroy(tp);
    }
}

/* Two threads calling into one pool at once: each call still returns only when its own
 * chunks are done (the calls take turns). */
typedef struct caller {
    tg_threadpool *tp;
    int bad;
    slow_ctx c;
} caller;

static void *call_repeatedly(void *p) {
    caller *k = p;
    for (int rep = 0; rep < 5 && !k->bad; rep++) {
        memset(&k->c, 0, sizeof k->c);
        tg_parallel_for(k->tp, 16, slow_chunk, &k->c);
        for (int i = 0; i < 16; i++) k->bad += atomic_load(&k->c.done[i]) != 1;
    }
    return NULL;
}

TG_TEST(test_values_threadpool_concurrent_callers) {
    tg_threadpool *tp = tg_threadpool_create(4);
    REQUIRE(tp, "pool");
    caller a = {.tp = tp}, b = {.tp = tp};
    pthread_t ta, tb;
    REQUIRE(pthread_create(&ta, NULL, call_repeatedly, &a) == 0, "thread");
    if (pthread_create(&tb, NULL, call_repeatedly, &b) != 0) b.bad = -1;
    else pthread_join(tb, NULL);
    pthread_join(ta, NULL);
    CHECK(a.bad == 0 && b.bad == 0, "concurrent callers saw %d and %d indices not done once", a.bad, b.bad);
    tg_threadpool_destroy(tp);
}
