/* The run command's checkpoint coordination (cli/checkpoints.c; linked into the suite with
 * the other CLI sources by test_cli_metrics.c): the launch gate and the stop step it
 * settles on, and replica 0 waiting for the other replicas' parts, refusing a part of
 * another step, and a trainer that cannot take a checkpoint. The replicas' side is played
 * by this thread through the struct's fields. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/front.h"
#include "cli/checkpoints.h"
#include "tests/harness.h"

static void init_for(run_checkpoints *c, int every, int replicas, int zero, int32_t start,
                     const volatile sig_atomic_t *stop) {
    static tg_plan p;
    memset(&p, 0, sizeof p);
    p.run.checkpoint_every = every, p.run.keep_checkpoints = 3, p.train.replicas = replicas,
    p.train.zero_stage = zero;
    run_checkpoints_init(c, "ck", &p, start, stop);
}

/* Steps are reserved as launched; once a stop is asked for, the stop step is the most
 * reserved, and the gate lets each replica launch only up to it. */
TG_TEST(test_cli_checkpoints_gate) {
    volatile sig_atomic_t stop = 0;
    run_checkpoints c;
    init_for(&c, 4, 2, 1, 10, &stop);
    CHECK(c.every == 4 && c.keep == 3 && c.replicas == 2 && c.parts == 1 && c.reserved == 10 && c.stop_at == -1,
          "init: every %d, keep %d, replicas %d, parts %d", c.every, c.keep, c.replicas, c.parts);
    int none_handed = 1;
    for (int r = 0; r < TG_MAX_DATA_PARALLEL; r++) none_handed &= c.part_step[r] == -1 && c.part[r].n_tensors == 0;
    CHECK(none_handed, "init: a replica's part handed over already");
    CHECK(run_checkpoints_due(&c, 12) && !run_checkpoints_due(&c, 13), "due at multiples of 4");
    CHECK(run_checkpoints_gate(&c, 10, 3) == 3 && c.reserved == 13, "reserved %lld", (long long)c.reserved);
    CHECK(run_checkpoints_gate(&c, 11, 1) == 1 && c.reserved == 13, "a replica behind: reserved %lld",
          (long long)c.reserved);
    CHECK(run_checkpoints_stop_step(&c) == -1, "a stop without a signal");
    stop = 1;
    CHECK(run_checkpoints_gate(&c, 11, 4) == 2, "to the stop step 13 from 11");
    CHECK(c.stop_at == 13, "stop at %lld", (long long)c.stop_at);
    CHECK(run_checkpoints_gate(&c, 10, 1) == 1, "three steps to go, one asked");
    CHECK(run_checkpoints_gate(&c, 12, 1) == 1, "one step to go, one asked");
    CHECK(run_checkpoints_gate(&c, 13, 2) == 0 && run_checkpoints_gate(&c, 14, 2) == 0, "past the stop step");
    CHECK(run_checkpoints_stop_step(&c) == 13 && c.reserved == 13, "the stop step stays 13");
    run_checkpoints_free(&c);

    run_checkpoints one;
    init_for(&one, 0, 1, 1, 0, &stop);
    CHECK(one.replicas == 1 && one.parts == 0 && !run_checkpoints_due(&one, 4), "one replica: no parts, never due");
    CHECK(run_checkpoints_stop_step(&one) == 0, "a stop asked before any step: stop at 0");
    run_checkpoints_free(&one);
    stop = 0;
    init_for(&one, 2, 4, 0, 0, &stop);
    CHECK(one.replicas == 4 && one.parts == 0, "data parallel without ZeRO: no parts");
    run_checkpoints_free(&one);
}

typedef struct trained {
    tg_plan plan;
    tg_trainer tr;
} trained;

/* A tiny-bert trainer after `steps` steps. */
static int open_trained(trained *t, const char *dir, int steps) {
    char cmd[1200], job[700], text[400];
    snprintf(cmd, sizeof cmd, "head -n 16 examples/data/sentiment-train.jsonl > '%s/train.jsonl'", dir);
    if (!CHECK(system(cmd) == 0, "cannot write the data")) return 0;
    snprintf(job, sizeof job, "%s/job.job", dir);
    snprintf(text, sizeof text, "model = tiny-bert\ntask = classify\nbatch = 4\nseq = 16\nsteps = 8\n"
                                "train_data = train.jsonl\n");
    tg_test_write_file(job, text);
    tg_err err;
    if (!CHECK(tg_front_compile_file(job, NULL, 0, &t->plan, &err) == 0, "%s", err.msg)) return 0;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .load_data = 1, .max_in_flight = 1};
    if (!CHECK(tg_trainer_open(&t->tr, &t->plan, &o, &err) == 0, "%s", err.msg)) {
        tg_plan_free(&t->plan);
        return 0;
    }
    for (int s = 0; s < steps; s++) {
        tg_step_stats st;
        if (!CHECK(tg_trainer_step(&t->tr, &st, &err) == 0, "%s", err.msg)) return 0;
    }
    return 1;
}

/* A tiny-bert trainer after `steps` steps and checkpoints every step into dir/ck (ck_dir)
 * for 2 replicas with ZeRO-1 parts: 1, or 0 with the failure CHECKed. */
static int open_checkpointing(trained *t, run_checkpoints *c, volatile sig_atomic_t *stop, char *ck_dir, size_t cap,
                              int steps) {
    const char *dir = tg_test_tmpdir();
    if (!open_trained(t, dir, steps)) return 0;
    snprintf(ck_dir, cap, "%s/ck", dir);
    if (!CHECK(tg_checkpoint_dir_prepare(ck_dir, &(tg_err){{0}}) == 0, "folder %s", ck_dir)) {
        tg_trainer_close(&t->tr);
        tg_plan_free(&t->plan);
        return 0;
    }
    init_for(c, 1, 2, 1, 0, stop);
    c->dir = ck_dir;
    return 1;
}

typedef struct writing {
    run_checkpoints *c;
    tg_trainer *tr;
    char *path;
    tg_err err;
    int rc;
    volatile int done;
} writing;

static void *write_thread(void *arg) {
    writing *w = arg;
    w->rc = run_checkpoints_write(w->c, w->tr, &w->path, &w->err);
    w->done = 1;
    return NULL;
}

static void *hand_over_thread(void *arg) {
    writing *w = arg;
    w->rc = run_checkpoints_hand_over(w->c, w->tr, &w->err);
    w->done = 1;
    return NULL;
}

/* Replica r's part as the replica would hand it over, at `step`. */
static void hand(run_checkpoints *c, int r, int32_t step) {
    tg_checkpoint part;
    tg_checkpoint_init(&part);
    tg_err err;
    float *m = malloc(2 * sizeof *m);
    m[0] = 1.5f, m[1] = -2.0f;
    char name[32];
    snprintf(name, sizeof name, "part.%d", r);
    CHECK(tg_checkpoint_add_tensor(&part, name, -1, TG_F32, 1, (const int64_t[]){2}, m, &err) == 0, "%s", err.msg);
    pthread_mutex_lock(&c->lock);
    c->part[r] = part;
    c->part_step[r] = step;
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
}

/* Replica 0 writes once every other replica's part of its step is there, waiting for a
 * late one; a part of another step is refused, naming both steps; a trainer with steps in
 * flight cannot hand over or write. */
TG_TEST(test_cli_checkpoints_parts) {
    trained t;
    volatile sig_atomic_t stop = 0;
    run_checkpoints c;
    char ck_dir[700];
    if (!open_checkpointing(&t, &c, &stop, ck_dir, sizeof ck_dir, 3)) return;

    /* Replica 1's part comes after replica 0 has begun to wait for it. */
    writing w = {.c = &c, .tr = &t.tr};
    pthread_t th;
    pthread_create(&th, NULL, write_thread, &w);
    usleep(50000);
    CHECK(!w.done, "the write did not wait for replica 1's part");
    hand(&c, 1, 3);
    pthread_join(th, NULL);
    char want[800];
    snprintf(want, sizeof want, "%s/step-000003.tgckpt", ck_dir);
    CHECK(w.rc == 0 && w.path && !strcmp(w.path, want), "write: rc %d, %s, %s", w.rc, w.path ? w.path : "(none)",
          w.err.msg);
    CHECK(c.part_step[1] == -1 && c.part[1].n_tensors == 0, "replica 1's part not taken: step %d", c.part_step[1]);
    tg_checkpoint back;
    tg_err err;
    if (CHECK(tg_checkpoint_read(want, &back, &err) == 0, "%s", err.msg)) {
        const tg_checkpoint_tensor *m1 = tg_checkpoint_find(&back, "part.1", -1);
        float got[2] = {0, 0}; /* decoded data sits unaligned in the payload */
        if (m1 && m1->bytes == sizeof got) memcpy(got, m1->data, sizeof got);
        CHECK(m1 && got[0] == 1.5f && got[1] == -2.0f && back.state.step == 3 &&
                  tg_checkpoint_find(&back, "optim.m", -1),
              "replica 1's part is not in the file as handed over");
        tg_checkpoint_free(&back);
    }
    free(w.path);

    /* Three replicas, replica 1's part of step 4: refused, and replica 2's never awaited. */
    c.replicas = 3;
    hand(&c, 1, 4);
    char *path = (char *)"unset";
    CHECK(run_checkpoints_write(&c, &t.tr, &path, &err) == -1 && !path &&
              !strcmp(err.msg, "checkpoint at step 3: replica 1 handed over its part at step 4"),
          "%s", err.msg);
    CHECK(c.part_step[1] == -1 && c.part[1].n_tensors == 0, "the refused part was kept");
    c.replicas = 2;

    /* A replica's previous part unclaimed: the next hand-over waits until it is taken. */
    c.part_step[t.tr.rank] = 2;
    writing h = {.c = &c, .tr = &t.tr};
    pthread_create(&th, NULL, hand_over_thread, &h);
    usleep(50000);
    CHECK(!h.done, "the hand-over did not wait for the unclaimed part");
    pthread_mutex_lock(&c.lock);
    c.part_step[t.tr.rank] = -1;
    pthread_cond_broadcast(&c.changed);
    pthread_mutex_unlock(&c.lock);
    pthread_join(th, NULL);
    CHECK(h.rc == 0 && c.part_step[t.tr.rank] == 3, "hand-over: rc %d, step %d: %s", h.rc, c.part_step[t.tr.rank],
          h.err.msg);
    tg_checkpoint_free(&c.part[t.tr.rank]);
    c.part_step[t.tr.rank] = -1;

    /* Steps in flight: no checkpoint of either kind. */
    t.tr.launched++;
    CHECK(run_checkpoints_hand_over(&c, &t.tr, &err) == -1 && strstr(err.msg, "1 steps are in flight"), "%s",
          err.msg);
    path = (char *)"unset";
    CHECK(run_checkpoints_write(&c, &t.tr, &path, &err) == -1 && !path && strstr(err.msg, "1 steps are in flight"),
          "%s", err.msg);
    t.tr.launched--;
    CHECK(c.part_step[t.tr.rank] == -1, "a failed hand-over left a part");

    /* Without ZeRO parts the hand-over has nothing to do. */
    c.parts = 0;
    CHECK(run_checkpoints_hand_over(&c, &t.tr, &err) == 0 && c.part_step[t.tr.rank] == -1, "no parts: %s", err.msg);
    /* ... and replica 0 writes without waiting for any. */
    c.part_step[1] = 7; /* a stale part would be refused if it were looked at */
    CHECK(run_checkpoints_write(&c, &t.tr, &path, &err) == 0 && path && !strcmp(path, want), "no parts: %s", err.msg);
    free(path);
    c.part_step[1] = -1;
    run_checkpoints_free(&c);
    tg_trainer_close(&t.tr);
    tg_plan_free(&t.plan);
}

/* Replica 1 waiting to hand over its next part while its previous one is unclaimed, as
 * run_checkpoints_hand_over waits: the waiter is played here on the struct's fields, and
 * marks under the lock that it waits, so that it is inside pthread_cond_wait before replica
 * 0 takes the part. */
typedef struct part_waiter {
    run_checkpoints *c;
    int waiting;
    volatile int done;
} part_waiter;

static void *wait_for_claim(void *arg) {
    part_waiter *w = arg;
    pthread_mutex_lock(&w->c->lock);
    w->waiting = 1;
    while (w->c->part_step[1] >= 0) pthread_cond_wait(&w->c->changed, &w->c->lock);
    pthread_mutex_unlock(&w->c->lock);
    w->done = 1;
    return NULL;
}

/* Replica 0 taking a part wakes the replica waiting for it to be taken. */
TG_TEST(test_cli_checkpoints_taking_a_part_wakes_its_replica) {
    trained t;
    volatile sig_atomic_t stop = 0;
    run_checkpoints c;
    char ck_dir[700];
    if (!open_checkpointing(&t, &c, &stop, ck_dir, sizeof ck_dir, 2)) return;
    hand(&c, 1, 2);
    part_waiter w = {.c = &c};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, wait_for_claim, &w) == 0, "thread");
    for (int waiting = 0; !waiting;) {
        pthread_mutex_lock(&c.lock);
        waiting = w.waiting;
        pthread_mutex_unlock(&c.lock);
        if (!waiting) usleep(1000);
    }
    char *path = NULL;
    tg_err err = {{0}};
    CHECK(run_checkpoints_write(&c, &t.tr, &path, &err) == 0 && path && strstr(path, "/ck/step-000002.tgckpt"),
          "write: %s", err.msg);
    free(path);
    for (int ms = 0; ms < 5000 && !w.done; ms++) usleep(1000);
    CHECK(w.done, "the replica waiting for its part to be taken was not woken");
    pthread_mutex_lock(&c.lock); /* releases it all the same, so the test ends */
    pthread_cond_broadcast(&c.changed);
    pthread_mutex_unlock(&c.lock);
    pthread_join(th, NULL);
    run_checkpoints_free(&c);
    tg_trainer_close(&t.tr);
    tg_plan_free(&t.plan);
}

/* A world's gather played here: it fails, naming `failing`'s cause, or hands every rank
 * `flags[r]` (4 bytes each), counting its calls. */
typedef struct fake_world {
    int calls, fail;
    int32_t flags[4];
} fake_world;

static int fake_gather(void *ctx, const void *mine, void *all, size_t bytes, tg_err *err) {
    fake_world *w = ctx;
    w->calls++;
    if (w->fail) return tg_fail(err, "rank 1: the gather's peer is gone");
    if (bytes == sizeof(int32_t)) {
        memcpy(all, w->flags, sizeof w->flags);
        memcpy(all, mine, bytes); /* rank 0's own */
    }
    return 0;
}

/* Rank processes: a ZeRO-1 part that cannot be gathered fails the checkpoint (rank 0's
 * write and another rank's hand-over alike) naming the step, the tensor and the cause; the
 * stop agreement gathers at its steps and at the end only, stops every rank at that step
 * with the first rank's signal when any asked, and names a failed gather. */
TG_TEST(test_cli_checkpoints_world_gather) {
    trained t;
    volatile sig_atomic_t stop = 0;
    run_checkpoints c;
    char ck_dir[700];
    if (!open_checkpointing(&t, &c, &stop, ck_dir, sizeof ck_dir, 3)) return;
    fake_world w = {.fail = 1};
    run_checkpoints_use_world(&c, fake_gather, &w, 4);
    CHECK(c.agree_every == 4 && c.stop_with == 0, "agree every %d", c.agree_every);
    char *path = (char *)"unset";
    tg_err err = {{0}};
    static const char want[] = "checkpoint at step 3: gathering optim.m from the ranks: rank 1: the gather's peer is gone";
    CHECK(run_checkpoints_write(&c, &t.tr, &path, &err) == -1 && !path && !strcmp(err.msg, want), "write: %s", err.msg);
    CHECK(run_checkpoints_hand_over(&c, &t.tr, &err) == -1 && !strcmp(err.msg, want), "hand-over: %s", err.msg);
    CHECK(run_checkpoints_world_stop(&c, 8, 20, &err) == -1 &&
              !strcmp(err.msg, "agreeing on a stop at step 8: rank 1: the gather's peer is gone"),
          "agreement: %s", err.msg);

    /* A request of this rank's alone chooses no stop step; the agreement does. */
    w = (fake_world){0};
    stop = SIGINT;
    CHECK(run_checkpoints_stop_step(&c) == -1, "a rank's own request chose a stop step");
    stop = 0;
    CHECK(run_checkpoints_world_stop(&c, 5, 20, &err) == 0 && w.calls == 0, "a gather between agreement steps");
    CHECK(run_checkpoints_world_stop(&c, 8, 20, &err) == 0 && w.calls == 1 && run_checkpoints_stop_step(&c) == -1,
          "nobody asked: stop step %lld", (long long)run_checkpoints_stop_step(&c));
    w.flags[1] = SIGTERM;
    CHECK(run_checkpoints_world_stop(&c, 9, 10, &err) == 0 && w.calls == 1, "a gather between agreement steps");
    CHECK(run_checkpoints_world_stop(&c, 10, 10, &err) == 0 && w.calls == 2 && run_checkpoints_stop_step(&c) == 10 &&
              c.stop_with == SIGTERM,
          "rank 1 asked at the end: stop step %lld, signal %d", (long long)run_checkpoints_stop_step(&c), c.stop_with);
    CHECK(run_checkpoints_world_stop(&c, 12, 20, &err) == 0 && w.calls == 2, "agreed again after the stop");
    run_checkpoints_free(&c);

    /* Rank 0's own request first: its signal; the default cadence is every step. */
    init_for(&c, 1, 2, 1, 0, &stop);
    run_checkpoints_use_world(&c, fake_gather, &w, 0);
    stop = SIGINT;
    CHECK(c.agree_every == 1 && run_checkpoints_world_stop(&c, 3, 20, &err) == 0 && run_checkpoints_stop_step(&c) == 3 &&
              c.stop_with == SIGINT,
          "rank 0 asked: every %d, stop step %lld, signal %d", c.agree_every, (long long)run_checkpoints_stop_step(&c),
          c.stop_with);
    run_checkpoints_free(&c);
    tg_trainer_close(&t.tr);
    tg_plan_free(&t.plan);
}
