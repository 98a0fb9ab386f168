/* The background batch loader (runtime/batch_loader.c): which batches it fills and when,
 * parking while a fill is in progress, and a start that cannot have its thread or its
 * memory, alone and inside tg_trainer_open (runtime/trainer.c), which then fails cleanly
 * naming the loader. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/front.h"
#include "base/alloc.h"
#include "runtime/batch_loader.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

typedef struct fills {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t seen[32];
    int n;
    int64_t hold;   /* the fill of this batch waits until `hold` changes (-1: none waits) */
    int holding;    /* a fill is waiting at `hold` */
} fills;

static void record_fill(void *ctx, int64_t j) {
    fills *f = ctx;
    pthread_mutex_lock(&f->mu);
    if (j == f->hold) {
        f->holding = 1;
        pthread_cond_broadcast(&f->cv);
        while (f->hold == j) pthread_cond_wait(&f->cv, &f->mu);
        f->holding = 0;
    }
    if (f->n < 32) f->seen[f->n++] = j;
    pthread_mutex_unlock(&f->mu);
}

static int fills_seen(fills *f, int64_t *out) {
    pthread_mutex_lock(&f->mu);
    const int n = f->n;
    memcpy(out, f->seen, sizeof f->seen);
    pthread_mutex_unlock(&f->mu);
    return n;
}

typedef struct park_call {
    tg_batch_loader *l;
    int64_t next;
    int started, done;
} park_call;

static void *park_main(void *arg) {
    park_call *p = arg;
    __atomic_store_n(&p->started, 1, __ATOMIC_SEQ_CST);
    p->next = tg_batch_loader_park(p->l);
    __atomic_store_n(&p->done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static int same_fills(fills *f, const int64_t *want, int n_want, const char *what) {
    int64_t got[32];
    const int n = fills_seen(f, got);
    int same = n == n_want;
    for (int i = 0; same && i < n; i++) same = got[i] == want[i];
    char text[256] = "";
    for (int i = 0; i < n && i < 16; i++) snprintf(text + strlen(text), sizeof text - strlen(text), " %lld", (long long)got[i]);
    return CHECK(same, "%s: filled%s (%d batches, want %d)", what, text, n, n_want);
}

TG_TEST(test_batch_loader_fills_parks_and_resumes) {
    fills f = {.hold = -1};
    pthread_mutex_init(&f.mu, NULL);
    pthread_cond_init(&f.cv, NULL);
    tg_batch_loader *l = NULL;
    tg_err err;
    REQUIRE(tg_batch_loader_start(&l, record_fill, &f, &err) == 0 && l, "%s", err.msg);
    usleep(2000);
    same_fills(&f, NULL, 0, "started parked");
    tg_batch_loader_resume(l, 0, 2);
    tg_batch_loader_wait(l, 2);
    same_fills(&f, (const int64_t[]){0, 1}, 2, "resumed below 2");
    CHECK(tg_batch_loader_wait(l, 2) == 0.0, "waiting for batches filled already took time");
    tg_batch_loader_allow(l, 1); /* lower: ignored */
    tg_batch_loader_allow(l, 2); /* the same: nothing to do */
    usleep(2000);
    same_fills(&f, (const int64_t[]){0, 1}, 2, "limit never lowered");
    tg_batch_loader_allow(l, 4);
    tg_batch_loader_wait(l, 4);
    same_fills(&f, (const int64_t[]){0, 1, 2, 3}, 4, "limit raised to 4");

    /* Parking waits for the fill in progress (batch 4, held inside fill) and returns the
     * first batch not filled: 5. */
    pthread_mutex_lock(&f.mu);
    f.hold = 4;
    pthread_mutex_unlock(&f.mu);
    tg_batch_loader_allow(l, 6);
    pthread_mutex_lock(&f.mu);
    while (!f.holding) pthread_cond_wait(&f.cv, &f.mu);
    pthread_mutex_unlock(&f.mu);
    park_call p = {.l = l};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, park_main, &p) == 0, "park thread");
    /* The park thread running first (a loaded machine may start it late), then time for it
     * to take the lock and wait for the fill. */
    while (!__atomic_load_n(&p.started, __ATOMIC_SEQ_CST)) usleep(1000);
    usleep(20000);
    CHECK(!__atomic_load_n(&p.done, __ATOMIC_SEQ_CST), "park returned while batch 4 was being filled");
    pthread_mutex_lock(&f.mu);
    f.hold = -1;
    pthread_cond_broadcast(&f.cv);
    pthread_mutex_unlock(&f.mu);
    pthread_join(th, NULL);
    CHECK(p.next == 5, "park returned %lld, want 5 (batch 4 done, 5 not started)", (long long)p.next);
    usleep(2000);
    same_fills(&f, (const int64_t[]){0, 1, 2, 3, 4}, 5, "parked after batch 4");
    /* A parked loader fills nothing: waiting for more returns at once. */
    CHECK(tg_batch_loader_wait(l, 6) >= 0, "wait on a parked loader");
    CHECK(tg_batch_loader_park(l) == 5, "parking again moved the loader");
    /* Resumed elsewhere: from 7, below 9. */
    tg_batch_loader_resume(l, 7, 9);
    tg_batch_loader_wait(l, 9);
    same_fills(&f, (const int64_t[]){0, 1, 2, 3, 4, 7, 8}, 7, "resumed at 7 below 9");
    tg_batch_loader_stop(l);
    tg_batch_loader_stop(NULL);
    pthread_cond_destroy(&f.cv);
    pthread_mutex_destroy(&f.mu);
}

/* Makes every later thread of the process ask for a stack no machine has (glibc's default
 * thread attributes), so that pthread_create fails; restore puts the default back. */
static int refuse_threads(pthread_attr_t *saved) {
    pthread_attr_t huge;
    if (pthread_getattr_default_np(saved) || pthread_attr_init(&huge)) return -1;
    int rc = pthread_attr_setstacksize(&huge, (size_t)1 << 60) || pthread_setattr_default_np(&huge);
    pthread_attr_destroy(&huge);
    return rc ? -1 : 0;
}

static void allow_threads(pthread_attr_t *saved) {
    pthread_setattr_default_np(saved);
    pthread_attr_destroy(saved);
}

static void noop_fill(void *ctx, int64_t j) {}

TG_TEST(test_batch_loader_start_failures) {
    tg_batch_loader *l = (tg_batch_loader *)&l;
    tg_err err = {{0}};
    tg_alloc_fail_after(0);
    int rc = tg_batch_loader_start(&l, noop_fill, NULL, &err);
    tg_alloc_fail_after(-1);
    CHECK(rc == -1 && l == NULL, "started without memory (rc %d)", rc);
    CHECK(strstr(err.msg, "out of memory for the batch loader") != NULL, "message: %s", err.msg);

    pthread_attr_t saved;
    REQUIRE(refuse_threads(&saved) == 0, "cannot set the default thread attributes");
    l = (tg_batch_loader *)&l;
    memset(&err, 0, sizeof err);
    rc = tg_batch_loader_start(&l, noop_fill, NULL, &err);
    allow_threads(&saved);
    CHECK(rc == -1 && l == NULL, "started without a thread (rc %d)", rc);
    CHECK(strstr(err.msg, "cannot start the batch loader thread (error ") != NULL, "message: %s", err.msg);
    /* Threads start again once the default is back. */
    REQUIRE(tg_batch_loader_start(&l, noop_fill, NULL, &err) == 0, "%s", err.msg);
    tg_batch_loader_stop(l);
}

TG_TEST(test_trainer_open_loader_thread_refused) {
    const char *dir = tg_test_tmpdir();
    char path[800], text[300];
    snprintf(path, sizeof path, "%s/train.jsonl", dir);
    REQUIRE(tg_test_write_file(path, "{\"input_ids\": [5, 6, 7], \"label\": 0}\n{\"input_ids\": [8, 9], \"label\": 1}\n"
                                     "{\"input_ids\": [10, 11, 12], \"label\": 1}\n") == 0,
            "write %s", path);
    snprintf(path, sizeof path, "%s/job.job", dir);
    snprintf(text, sizeof text,
             "model = tiny-bert\ntask = classify\nbatch = 2\nseq = 8\nsteps = 2\ntrain_data = train.jsonl\n");
    REQUIRE(tg_test_write_file(path, text) == 0, "write %s", path);
    tg_plan plan;
    tg_err err = {{0}};
    REQUIRE(tg_front_compile_file(path, NULL, 0, &plan, &err) == 0, "%s", err.msg);
    /* One executor thread (no workers), so that the loader's is the only one asked for. */
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1};
    tg_trainer tr;
    pthread_attr_t saved;
    REQUIRE(refuse_threads(&saved) == 0, "cannot set the default thread attributes");
    const int refused = tg_trainer_open(&tr, &plan, &o, &err);
    const int cleared = tr.plan == NULL && tr.loader == NULL && tr.staging[0] == NULL && tr.ex.vt == NULL;
    char refused_msg[sizeof err.msg];
    memcpy(refused_msg, err.msg, sizeof refused_msg);
    /* Without the loader thread the same open succeeds, with threads still refused. */
    o.no_loader_thread = 1;
    const int unthreaded = tg_trainer_open(&tr, &plan, &o, &err);
    allow_threads(&saved);
    CHECK(refused == -1, "opened without its loader thread");
    CHECK(cleared, "the failed open left the trainer holding something");
    CHECK(strstr(refused_msg, "cannot start the batch loader thread (error ") != NULL, "message: %s", refused_msg);
    if (CHECK(unthreaded == 0, "no_loader_thread: %s", err.msg)) {
        CHECK(tr.loader == NULL && tr.has_train && tr.total_steps == 2, "loader %p, train %d, steps %d",
              (void *)tr.loader, tr.has_train, tr.total_steps);
        tg_step_stats s;
        CHECK(tg_trainer_step(&tr, &s, &err) == 0 && s.step == 1 && isfinite(s.loss), "step: %s", err.msg);
        tg_trainer_close(&tr);
    }
    tg_plan_free(&plan);
}
