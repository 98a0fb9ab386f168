/* The trainer's ring of steps in flight (runtime/trainer.c), run on the CPU reference
 * behind a pipelining executor: the CPU executor's vtable with step_start taking several
 * steps at once (run one after the other, results queued for step_wait), the ring widened
 * after open to what a CUDA executor would have. The pipelined runs must compute the same
 * losses bit for bit as the plain one, start steps in the groups the limits allow (never
 * past a checkpoint step or a stop), and every executor failure, met in a step or in the
 * drain before a read, write, eval, profile or save, must come back as the call's error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/front.h"
#include "runtime/half_convert.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

enum { STEPS = 8, QUEUE = 64 };

/* The pipelining executor (one at a time: its vtable functions see only impl). */
static struct {
    tg_executor_vtbl vt;
    const tg_executor_vtbl *real;
    const tg_trainer *tr;
    tg_step_result queue[QUEUE];
    int head, tail;
    int starts[QUEUE], n_starts;   /* how many steps each start took */
    int crossed;                   /* starts that ran past the next checkpoint step */
    int fail_start, fail_wait, fail_read, fail_write, fail_run, fail_profile, fail_select;
    int fail_read_from;            /* > 0: reads fail from this one on (1-based) */
    int reads;
    int mixed_buckets;             /* starts whose steps were not all of one bucket */
    float period_ms;               /* handed out as each step's period where > 0 */
    int derive_labels;             /* LM: derive the marked label rows, as CUDA's step does */
    uint8_t *scratch;              /* a batch with its label rows derived */
    int marked;                    /* batches that came with marked rows */
    int writes, fail_write_from;   /* > 0: writes fail from this one on (1-based) */
    int rewrite;                   /* step_wait hands out the loss, norm and scale below */
    float loss, grad_norm, loss_scale;
} fake;

static int fake_step_start(void *impl, const void *const *batches, int steps, tg_err *err) {
    if (fake.fail_start) return tg_fail(err, "fake executor: step_start refused");
    const tg_trainer *t = fake.tr;
    if (t->checkpoint_every > 0 &&
        t->launched + steps > (t->returned / t->checkpoint_every + 1) * t->checkpoint_every)
        fake.crossed++;
    for (int j = 1; j < steps; j++)
        fake.mixed_buckets += t->staging_bucket[(t->launched + j) % t->n_staging] !=
                              t->staging_bucket[t->launched % t->n_staging];
    for (int j = 0; j < steps; j++) {
        const void *batch = batches[j];
        if (fake.derive_labels) {
            const tg_plan *p = t->plan;
            const tg_tensor *lab = &p->tensors[p->io.labels];
            memcpy(fake.scratch, batch, p->pool_bytes[TG_POOL_INPUTS]);
            int32_t *labels = (int32_t *)(fake.scratch + lab->offset);
            fake.marked += labels[0] == TG_LABELS_FROM_IDS;
            tg_batch_derive_label_rows(labels, (const int32_t *)(fake.scratch + p->tensors[p->io.input_ids].offset),
                                       (const float *)(fake.scratch + p->tensors[p->io.attention_mask].offset),
                                       (int32_t)lab->shape[0], (int32_t)lab->shape[1]);
            batch = fake.scratch;
        }
        if (fake.real->step_start(impl, &batch, 1, err) ||
            fake.real->step_wait(impl, &fake.queue[fake.tail % QUEUE], err))
            return -1;
        fake.tail++;
    }
    if (fake.n_starts < QUEUE) fake.starts[fake.n_starts++] = steps;
    return 0;
}

static int fake_step_wait(void *impl, tg_step_result *r, tg_err *err) {
    if (fake.fail_wait) return tg_fail(err, "fake executor: step_wait refused");
    if (fake.head == fake.tail) return tg_fail(err, "fake executor: no step in flight");
    *r = fake.queue[fake.head++ % QUEUE];
    if (fake.period_ms > 0) r->period_ms = fake.period_ms;
    if (fake.rewrite) r->loss = fake.loss, r->grad_norm = fake.grad_norm, r->loss_scale = fake.loss_scale;
    return 0;
}

static int fake_read(void *impl, int tensor, void *host, tg_err *err) {
    fake.reads++;
    if (fake.fail_read || (fake.fail_read_from > 0 && fake.reads >= fake.fail_read_from))
        return tg_fail(err, "fake executor: read refused");
    return fake.real->read(impl, tensor, host, err);
}

static int fake_write(void *impl, int tensor, const void *host, tg_err *err) {
    fake.writes++;
    if (fake.fail_write || (fake.fail_write_from > 0 && fake.writes >= fake.fail_write_from))
        return tg_fail(err, "fake executor: write refused");
    return fake.real->write(impl, tensor, host, err);
}

static int fake_run(void *impl, int first, int last, int training, tg_err *err) {
    return fake.fail_run ? tg_fail(err, "fake executor: run refused") : fake.real->run(impl, first, last, training, err);
}

static int fake_profile(void *impl, int repeats, double *op_ms, tg_err *err) {
    return fake.fail_profile ? tg_fail(err, "fake executor: profile refused")
                             : fake.real->profile(impl, repeats, op_ms, err);
}

static int fake_select(void *impl, int bucket, tg_err *err) {
    return fake.fail_select ? tg_fail(err, "fake executor: select_bucket refused")
                            : fake.real->select_bucket(impl, bucket, err);
}

/* Puts the pipelining executor under an open trainer and widens its ring to `depth` steps
 * in flight, started `group` at a time. */
static int pipeline(tg_trainer *t, int depth, int group) {
    memset(&fake, 0, sizeof fake);
    fake.real = t->ex.vt;
    fake.tr = t;
    fake.vt = *t->ex.vt;
    fake.vt.step_start = fake_step_start, fake.vt.step_wait = fake_step_wait;
    fake.vt.read = fake_read, fake.vt.write = fake_write, fake.vt.run = fake_run, fake.vt.profile = fake_profile;
    fake.vt.select_bucket = fake_select;
    fake.vt.max_in_flight = depth, fake.vt.step_group = group;
    for (int k = t->n_staging; k < depth + 2; k++)
        if (!(t->staging[k] = t->ex.vt->host_alloc(t->ex.impl, t->plan->pool_bytes[TG_POOL_INPUTS]))) return 0;
    t->n_staging = depth + 2;
    t->max_in_flight = depth;
    t->step_group = group;
    t->ex.vt = &fake.vt;
    return 1;
}

typedef struct run {
    tg_plan plan;
    tg_trainer tr;
    int open;
} run;

/* tiny-bert classifying 24 sentiment rows, batch 4, seq 48, 8 steps (with eval_data
 * where `eval` is set). */
static int open_run(run *r, int no_loader, int eval) {
    memset(r, 0, sizeof *r);
    const char *dir = tg_test_tmpdir();
    char cmd[1200], job[700], text[700];
    snprintf(cmd, sizeof cmd, "head -n 24 examples/data/sentiment-train.jsonl > '%s/train.jsonl'", dir);
    if (!CHECK(system(cmd) == 0, "%s", cmd)) return 0;
    snprintf(job, sizeof job, "%s/job.job", dir);
    snprintf(text, sizeof text,
             "model = tiny-bert\ntask = classify\nbatch = 4\nseq = 48\nsteps = %d\nlr = 2e-3\ntrain_data = "
             "train.jsonl\n%s",
             STEPS, eval ? "eval_data = train.jsonl\n" : "");
    if (!CHECK(tg_test_write_file(job, text) == 0, "write %s", job)) return 0;
    tg_err err;
    if (!CHECK(tg_front_compile_file(job, NULL, 0, &r->plan, &err) == 0, "%s", err.msg)) return 0;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 2, .load_data = 1, .no_loader_thread = no_loader};
    if (!CHECK(tg_trainer_open(&r->tr, &r->plan, &o, &err) == 0, "%s", err.msg)) {
        tg_plan_free(&r->plan);
        return 0;
    }
    r->open = 1;
    return 1;
}

static void close_run(run *r) {
    if (r->open) tg_trainer_close(&r->tr), tg_plan_free(&r->plan);
    r->open = 0;
}

/* The losses of the plain run (one step at a time on the CPU). */
static int reference_losses(float *loss) {
    run r;
    if (!open_run(&r, 1, 0)) return 0;
    tg_err err;
    int ok = 1;
    for (int i = 0; ok && i < STEPS; i++) {
        tg_step_stats s;
        ok = CHECK(tg_trainer_step(&r.tr, &s, &err) == 0 && s.step == i + 1, "reference step %d: %s", i + 1, err.msg);
        loss[i] = s.loss;
    }
    close_run(&r);
    return ok;
}

static void check_pipelined(int no_loader, int depth, int group, int checkpoint_every, const int *want_starts,
                            int n_want, const char *what) {
    static float want[STEPS];
    static int have_want;
    if (!have_want && !(have_want = reference_losses(want))) return;
    run r;
    if (!open_run(&r, no_loader, 0)) return;
    REQUIRE(pipeline(&r.tr, depth, group), "%s: staging buffers", what);
    r.tr.checkpoint_every = checkpoint_every;
    tg_err err;
    for (int i = 0; i < STEPS; i++) {
        tg_step_stats s;
        if (!CHECK(tg_trainer_step(&r.tr, &s, &err) == 0, "%s: step %d: %s", what, i + 1, err.msg)) break;
        CHECK(s.step == i + 1 && s.loss == want[i], "%s: step %d: loss %.9g, the plain run's %.9g", what, s.step, s.loss,
              want[i]);
        CHECK(s.tokens > 0 && s.seq == 48 && s.slots == 4 * 48, "%s: step %d: %lld tokens, seq %d", what, s.step,
              (long long)s.tokens, s.seq);
        /* No start passes the next checkpoint step: with every step handed out there, a
         * checkpoint can be taken; one step before, it is refused while steps are in flight. */
        if (checkpoint_every > 0 && s.step % checkpoint_every == 0) {
            tg_checkpoint ck;
            CHECK(tg_trainer_checkpoint(&r.tr, &ck, 0, &err) == 0, "%s: checkpoint at step %d: %s", what, s.step,
                  err.msg);
            tg_checkpoint_free(&ck);
        }
    }
    CHECK(fake.crossed == 0, "%s: %d starts ran past a checkpoint step", what, fake.crossed);
    int same = fake.n_starts == n_want;
    for (int i = 0; same && i < n_want; i++) same = fake.starts[i] == want_starts[i];
    char got[256] = "";
    for (int i = 0; i < fake.n_starts && i < 20; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), " %d", fake.starts[i]);
    CHECK(same, "%s: steps per start:%s (%d starts, want %d)", what, got, fake.n_starts, n_want);
    close_run(&r);
}

TG_TEST(test_trainer_pipeline_groups_match_plain_run) {
    check_pipelined(1, 4, 2, 0, (const int[]){2, 2, 2, 2}, 4, "depth 4, groups of 2, no loader");
    check_pipelined(0, 4, 2, 0, (const int[]){2, 2, 2, 2}, 4, "depth 4, groups of 2, loader thread");
    /* Single steps keep up to 3 in flight. */
    check_pipelined(1, 3, 1, 0, (const int[]){1, 1, 1, 1, 1, 1, 1, 1}, 8, "depth 3, single steps");
    /* Checkpoints every 3 steps: groups of 2 never cross 3 or 6; the steps left before one
     * start singly. */
    check_pipelined(0, 4, 2, 3, (const int[]){2, 1, 2, 1, 2}, 5, "depth 4, groups of 2, checkpoint every 3");
}

TG_TEST(test_trainer_pipeline_in_flight_refusals) {
    run r;
    if (!open_run(&r, 0, 1)) return;
    REQUIRE(pipeline(&r.tr, 4, 2), "staging buffers");
    tg_err err = {{0}};
    tg_step_stats s;
    REQUIRE(tg_trainer_step(&r.tr, &s, &err) == 0 && s.step == 1, "step 1: %s", err.msg);
    CHECK(r.tr.launched == 4 && r.tr.returned == 1, "launched %lld, returned %lld", (long long)r.tr.launched,
          (long long)r.tr.returned);
    tg_checkpoint ck;
    CHECK(tg_trainer_checkpoint(&r.tr, &ck, 1, &err) == -1 &&
              strstr(err.msg, "checkpoint: 3 steps are in flight; hold the trainer and take them first"),
          "checkpoint with steps in flight: %s", err.msg);
    /* Each call that waits for the steps in flight first fails with the executor's error. */
    fake.fail_wait = 1;
    float one;
    const int loss = r.plan.io.loss;
    struct { const char *what; int rc; } calls[6];
    calls[0].what = "read", calls[0].rc = tg_trainer_read(&r.tr, loss, &one, &err);
    calls[1].what = "write", calls[1].rc = tg_trainer_write(&r.tr, loss, &one, &err);
    calls[2].what = "run", calls[2].rc = tg_trainer_run(&r.tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 0, &err);
    tg_eval_stats es;
    calls[3].what = "eval", calls[3].rc = tg_trainer_eval(&r.tr, &es, &err);
    tg_step_stats rs;
    calls[4].what = "run_step", calls[4].rc = tg_trainer_run_step(&r.tr, &rs, &err);
    calls[5].what = "step", calls[5].rc = tg_trainer_step(&r.tr, &rs, &err);
    for (int i = 0; i < 6; i++)
        CHECK(calls[i].rc == -1, "%s with a failing wait returned %d", calls[i].what, calls[i].rc);
    CHECK(strstr(err.msg, "fake executor: step_wait refused") != NULL, "message: %s", err.msg);
    /* The inputs stay reachable (the failure reports itself at the next read). */
    CHECK(tg_trainer_input(&r.tr, r.plan.io.input_ids) != NULL, "input ids");
    fake.fail_wait = 0;
    /* Waiting works again: the steps still in flight are waited for. */
    CHECK(tg_trainer_read(&r.tr, loss, &one, &err) == 0 && r.tr.returned == r.tr.launched, "drained: %s", err.msg);
    /* Held: nothing starts and, with nothing in flight, the step is refused. */
    tg_trainer_hold(&r.tr, 1);
    char want[96];
    snprintf(want, sizeof want, "no step to take: the run stops at step %lld", (long long)r.tr.launched);
    CHECK(tg_trainer_step(&r.tr, &s, &err) == -1 && strstr(err.msg, want), "held: %s", err.msg);
    tg_trainer_hold(&r.tr, 0);
    CHECK(r.tr.stop_at == -1, "released: stop at %lld", (long long)r.tr.stop_at);
    /* A step on the caller's batch in staging[cur], which the last start handed the
     * executor as its next: the executor is given a copy (the caller may have rewritten it). */
    CHECK(r.tr.handed == r.tr.cur, "handed %d, cur %d", r.tr.handed, r.tr.cur);
    const int32_t done = r.tr.steps_done;
    fake.period_ms = 7.5f;
    CHECK(tg_trainer_run_step(&r.tr, &s, &err) == 0 && s.step == done + 1 && isfinite(s.loss) && s.step_ms == 7.5,
          "run_step on the handed buffer: %s (step %d, %g ms)", err.msg, s.step, s.step_ms);
    /* The step's own device time is its phases (what calibrate fits a GPU step to), not the
     * period since the step before ended. */
    const double phases = (double)s.phase_ms[0] + s.phase_ms[1] + s.phase_ms[2] + s.phase_ms[3];
    CHECK(phases > 0 && tg_step_device_ms(&s) == phases, "device time %g ms, phases %g ms, period %g ms",
          tg_step_device_ms(&s), phases, s.step_ms);
    CHECK(r.tr.handed == -1, "handed %d after run_step", r.tr.handed);
    fake.period_ms = 0;
    /* A bucket the executor cannot select: every call that selects one fails with it. */
    fake.fail_select = 1;
    r.tr.bucket = 99; /* as if another bucket were selected */
    CHECK(tg_trainer_run_step(&r.tr, &s, &err) == -1 && strstr(err.msg, "fake executor: select_bucket refused"),
          "run_step: %s", err.msg);
    CHECK(tg_trainer_run(&r.tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 0, &err) == -1 &&
              strstr(err.msg, "select_bucket refused"),
          "run: %s", err.msg);
    CHECK(tg_trainer_step(&r.tr, &s, &err) == -1 && strstr(err.msg, "select_bucket refused"), "step: %s", err.msg);
    fake.fail_select = 0;
    CHECK(tg_trainer_run(&r.tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 0, &err) == 0 && r.tr.bucket == 0, "run: %s",
          err.msg);
    close_run(&r);
}

TG_TEST(test_trainer_pipeline_executor_failures) {
    run r;
    if (!open_run(&r, 1, 1)) return;
    REQUIRE(pipeline(&r.tr, 2, 1), "staging buffers");
    tg_err err = {{0}};
    tg_step_stats s;
    fake.fail_start = 1;
    CHECK(tg_trainer_step(&r.tr, &s, &err) == -1 && strstr(err.msg, "fake executor: step_start refused"),
          "step, start refused: %s", err.msg);
    CHECK(tg_trainer_run_step(&r.tr, &s, &err) == -1 && strstr(err.msg, "fake executor: step_start refused"),
          "run_step, start refused: %s", err.msg);
    fake.fail_start = 0;
    fake.fail_wait = 1;
    CHECK(tg_trainer_step(&r.tr, &s, &err) == -1 && strstr(err.msg, "fake executor: step_wait refused"),
          "step, wait refused: %s", err.msg);
    fake.fail_wait = 0;
    /* Writes: the inputs' upload before a run, eval or profile. */
    fake.fail_write = 1;
    tg_eval_stats es;
    double op_ms[4096];
    REQUIRE(r.plan.n_ops <= 4096, "%d ops", r.plan.n_ops);
    CHECK(tg_trainer_run(&r.tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 0, &err) == -1 &&
              strstr(err.msg, "fake executor: write refused"),
          "run, write refused: %s", err.msg);
    CHECK(tg_trainer_eval(&r.tr, &es, &err) == -1 && strstr(err.msg, "write refused"), "eval: %s", err.msg);
    CHECK(tg_trainer_profile(&r.tr, 1, op_ms, &err) == -1 && strstr(err.msg, "write refused"), "profile: %s", err.msg);
    fake.fail_write = 0;
    fake.fail_run = 1;
    CHECK(tg_trainer_eval(&r.tr, &es, &err) == -1 && strstr(err.msg, "fake executor: run refused"), "eval, run: %s",
          err.msg);
    fake.fail_run = 0;
    fake.fail_profile = 1;
    CHECK(tg_trainer_profile(&r.tr, 1, op_ms, &err) == -1 && strstr(err.msg, "fake executor: profile refused"),
          "profile: %s", err.msg);
    fake.fail_profile = 0;
    /* Reads: the eval's loss, a save's parameters, a checkpoint's tensors. */
    fake.fail_read = 1;
    CHECK(tg_trainer_eval(&r.tr, &es, &err) == -1 && strstr(err.msg, "fake executor: read refused"), "eval, read: %s",
          err.msg);
    char path[800];
    snprintf(path, sizeof path, "%s/saved.safetensors", tg_test_tmpdir());
    CHECK(tg_trainer_save(&r.tr, path, &err) == -1 && strstr(err.msg, "read refused"), "save: %s", err.msg);
    tg_checkpoint ck;
    CHECK(tg_trainer_checkpoint(&r.tr, &ck, 1, &err) == -1 && strstr(err.msg, "read refused") && ck.n_tensors == 0,
          "whole checkpoint: %s", err.msg);
    CHECK(tg_trainer_checkpoint(&r.tr, &ck, 0, &err) == 0 && ck.n_tensors == 0,
          "optimizer-only checkpoint of one replica reads nothing: %s", err.msg);
    tg_checkpoint_free(&ck);
    float f;
    CHECK(tg_trainer_read_f32(&r.tr, r.plan.io.loss, &f, &err) == -1, "read_f32");
    fake.fail_read = 0;
    /* The eval's second read, its logits, refused. */
    fake.reads = 0, fake.fail_read_from = 2;
    CHECK(tg_trainer_eval(&r.tr, &es, &err) == -1 && strstr(err.msg, "read refused") && fake.reads == 2,
          "eval, logits read: %s (%d reads)", err.msg, fake.reads);
    fake.fail_read_from = 0;
    /* A trainer that started steps resumes nothing, though none was handed out. */
    CHECK(r.tr.steps_done == 0 && r.tr.launched > 0, "done %d, launched %lld", r.tr.steps_done,
          (long long)r.tr.launched);
    CHECK(tg_trainer_restore(&r.tr, &ck, "ck", &err) == -1 && strstr(err.msg, "a trainer that has taken steps"),
          "restore after started steps: %s", err.msg);
    /* An int tensor is no float tensor. */
    memset(&err, 0, sizeof err);
    CHECK(tg_trainer_read_f32(&r.tr, r.plan.io.labels, &f, &err) == -1 &&
              strstr(err.msg, " is not a float tensor") && strstr(err.msg, r.plan.tensors[r.plan.io.labels].name),
          "labels as floats: %s", err.msg);
    /* With nothing refused, the same trainer still steps and evaluates. */
    CHECK(tg_trainer_step(&r.tr, &s, &err) == 0 && s.step == 1 && isfinite(s.loss), "step: %s", err.msg);
    CHECK(tg_trainer_eval(&r.tr, &es, &err) == 0 && es.examples == 24 && es.counted == 24, "eval: %s (%d examples)",
          err.msg, es.examples);
    close_run(&r);
}

/* tiny-gpt2 on 12 rows of ids, batch 2, seq 16, 6 steps; `derive`: behind the pipelining
 * executor that derives marked LM label rows itself. Returns the losses. */
static int lm_run(int derive, float *loss, int32_t *labels_after, size_t labels_bytes) {
    const char *dir = tg_test_tmpdir();
    char path[800], rows[2400] = "";
    for (int r = 0; r < 12; r++) {
        char row[200] = "{\"input_ids\": [";
        const int len = 3 + (r * 5) % 11;
        for (int i = 0; i < len; i++)
            snprintf(row + strlen(row), sizeof row - strlen(row), "%s%d", i ? ", " : "", 1 + (r * 7 + i * 3) % 40);
        snprintf(rows + strlen(rows), sizeof rows - strlen(rows), "%s]}\n", row);
    }
    snprintf(path, sizeof path, "%s/lm.jsonl", dir);
    if (!CHECK(tg_test_write_file(path, rows) == 0, "write %s", path)) return 0;
    snprintf(path, sizeof path, "%s/lm.job", dir);
    if (!CHECK(tg_test_write_file(path, "model = tiny-gpt2\ntask = lm\nbatch = 2\nseq = 16\nsteps = 6\n"
                                        "train_data = lm.jsonl\n") == 0,
               "write %s", path))
        return 0;
    tg_plan plan;
    tg_err err;
    if (!CHECK(tg_front_compile_file(path, NULL, 0, &plan, &err) == 0, "%s", err.msg)) return 0;
    tg_trainer t;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 2, .load_data = 1, .no_loader_thread = 1};
    int ok = CHECK(tg_trainer_open(&t, &plan, &o, &err) == 0, "%s", err.msg);
    if (ok && derive) {
        ok = pipeline(&t, 3, 1);
        fake.vt.lm_label_rows = 1;
        fake.derive_labels = 1;
        fake.scratch = malloc(plan.pool_bytes[TG_POOL_INPUTS]);
        ok = ok && fake.scratch;
    }
    for (int i = 0; ok && i < 6; i++) {
        tg_step_stats s;
        ok = CHECK(tg_trainer_step(&t, &s, &err) == 0 && s.step == i + 1, "LM step %d: %s", i + 1, err.msg);
        loss[i] = s.loss;
    }
    if (ok) {
        /* The caller's view of the next batch: its label rows as the ids make them. */
        const int32_t *labels = tg_trainer_input(&t, plan.io.labels);
        memcpy(labels_after, labels, labels_bytes);
    }
    if (t.plan) tg_trainer_close(&t);
    free(fake.scratch);
    fake.scratch = NULL;
    tg_plan_free(&plan);
    return ok;
}

TG_TEST(test_trainer_pipeline_lm_label_rows_derived_by_the_step) {
    float plain[6], marked[6];
    static int32_t labels_plain[2 * 16], labels_marked[2 * 16];
    if (!lm_run(0, plain, labels_plain, sizeof labels_plain) || !lm_run(1, marked, labels_marked, sizeof labels_marked))
        return;
    CHECK(fake.marked == 6, "%d of 6 batches came with their label rows marked", fake.marked);
    for (int i = 0; i < 6; i++)
        CHECK(marked[i] == plain[i], "step %d: loss %.9g with rows derived by the step, %.9g filled", i + 1, marked[i],
              plain[i]);
    CHECK(memcmp(labels_plain, labels_marked, sizeof labels_plain) == 0,
          "the next batch's labels, read by the caller, differ from the filled ones");
}

/* Length buckets: a start runs one bucket's steps only, the losses are the plain run's. */
TG_TEST(test_trainer_pipeline_buckets_start_one_bucket_at_a_time) {
    const char *dir = tg_test_tmpdir();
    char cmd[1200], job[700];
    snprintf(cmd, sizeof cmd, "head -n 24 examples/data/sentiment-train.jsonl > '%s/train.jsonl'", dir);
    REQUIRE(system(cmd) == 0, "%s", cmd);
    snprintf(job, sizeof job, "%s/job.job", dir);
    REQUIRE(tg_test_write_file(job, "model = tiny-bert\ntask = classify\nbatch = 4\nseq = 48\nsteps = 12\n"
                                    "seq_buckets = 16,32,48\ntrain_data = train.jsonl\n") == 0,
            "write %s", job);
    tg_plan plan;
    tg_err err;
    REQUIRE(tg_front_compile_file(job, NULL, 0, &plan, &err) == 0, "%s", err.msg);
    float plain[12], piped[12];
    int32_t seq[12];
    for (int pass = 0; pass < 2; pass++) {
        tg_trainer t;
        /* An explicit group is kept with buckets (capped by the depth: 1 on the CPU). */
        tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 2, .load_data = 1, .no_loader_thread = 1,
                                .step_group = 2};
        if (!CHECK(tg_trainer_open(&t, &plan, &o, &err) == 0, "%s", err.msg)) break;
        CHECK(t.step_group == 1, "group %d at depth 1", t.step_group);
        if (pass == 1 && !CHECK(pipeline(&t, 4, 2), "staging")) {
            tg_trainer_close(&t);
            break;
        }
        for (int i = 0; i < 12; i++) {
            tg_step_stats s;
            if (!CHECK(tg_trainer_step(&t, &s, &err) == 0, "pass %d, step %d: %s", pass, i + 1, err.msg)) break;
            (pass ? piped : plain)[i] = s.loss;
            if (pass == 0) seq[i] = s.seq;
            else CHECK(s.seq == seq[i], "step %d at seq %d, the plain run's %d", i + 1, s.seq, seq[i]);
        }
        tg_trainer_close(&t);
    }
    int changes = 0;
    for (int i = 1; i < 12; i++) changes += seq[i] != seq[i - 1];
    CHECK(changes >= 2, "the bucket changed %d times in 12 steps", changes);
    CHECK(fake.mixed_buckets == 0, "%d starts mixed buckets", fake.mixed_buckets);
    CHECK(fake.n_starts > 6 && fake.n_starts < 12, "%d starts for 12 steps in groups of up to 2", fake.n_starts);
    for (int i = 0; i < 12; i++) CHECK(piped[i] == plain[i], "step %d: %.9g, plain %.9g", i + 1, piped[i], plain[i]);
    tg_plan_free(&plan);
}

/* ---- failures part way through a checkpoint or a resume, and results no step makes ---- */

/* A run of `text` (a job over the 24 sentiment rows, train.jsonl, or 12 rows of token ids
 * from 3 to 42 tokens long, ids.jsonl) under the pipelining executor, one step in flight. */
static int open_text(run *r, const char *text) {
    memset(r, 0, sizeof *r);
    const char *dir = tg_test_tmpdir();
    char cmd[1200], job[700], rows[2400] = "";
    snprintf(cmd, sizeof cmd, "head -n 24 examples/data/sentiment-train.jsonl > '%s/train.jsonl'", dir);
    if (!CHECK(system(cmd) == 0, "%s", cmd)) return 0;
    for (int k = 0; k < 12; k++) {
        char row[300] = "{\"input_ids\": [";
        const int len = 3 + (k * 13) % 40;
        for (int i = 0; i < len; i++)
            snprintf(row + strlen(row), sizeof row - strlen(row), "%s%d", i ? ", " : "", 5 + (k * 7 + i * 3) % 90);
        snprintf(rows + strlen(rows), sizeof rows - strlen(rows), "%s]}\n", row);
    }
    snprintf(job, sizeof job, "%s/ids.jsonl", dir);
    if (!CHECK(tg_test_write_file(job, rows) == 0, "write %s", job)) return 0;
    snprintf(job, sizeof job, "%s/job.job", dir);
    if (!CHECK(tg_test_write_file(job, text) == 0, "write %s", job)) return 0;
    tg_err err;
    if (!CHECK(tg_front_compile_file(job, NULL, 0, &r->plan, &err) == 0, "%s", err.msg)) return 0;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 2, .load_data = 1, .no_loader_thread = 1};
    if (!CHECK(tg_trainer_open(&r->tr, &r->plan, &o, &err) == 0, "%s", err.msg)) {
        tg_plan_free(&r->plan);
        return 0;
    }
    r->open = 1;
    if (!CHECK(pipeline(&r->tr, 1, 1), "staging buffers")) return close_run(r), 0;
    return 1;
}

static const char fp32_job[] = "model = tiny-bert\ntask = classify\nbatch = 4\nseq = 48\nsteps = 4\n"
                               "train_data = train.jsonl\n";
static const char fp16_job[] = "model = tiny-bert\ntask = classify\nbatch = 4\nseq = 48\nsteps = 4\n"
                               "precision = fp16\nskip_nonfinite = false\ntrain_data = train.jsonl\n";

/* A whole checkpoint whose step counter was read but whose first tensor read is refused:
 * the error, and nothing left in it. */
TG_TEST(test_trainer_pipeline_checkpoint_tensor_read_refused) {
    run r;
    if (!open_text(&r, fp32_job)) return;
    tg_err err = {{0}};
    tg_checkpoint ck;
    fake.reads = 0, fake.fail_read_from = 2;
    CHECK(tg_trainer_checkpoint(&r.tr, &ck, 1, &err) == -1 && strstr(err.msg, "fake executor: read refused") &&
              ck.n_tensors == 0 && fake.reads == 2,
          "whole checkpoint, second read refused: %s (%d tensors, %d reads)", err.msg, ck.n_tensors, fake.reads);
    close_run(&r);
}

/* Resuming: the parameters' upload refused, then (the upload done) the last state tensor's
 * write refused; each the call's error. */
TG_TEST(test_trainer_pipeline_restore_writes_refused) {
    run r;
    if (!open_text(&r, fp32_job)) return;
    tg_err err = {{0}};
    tg_checkpoint ck;
    REQUIRE(tg_trainer_checkpoint(&r.tr, &ck, 1, &err) == 0, "%s", err.msg);
    close_run(&r);
    /* The writes of a resume that succeeds. */
    int writes = 0;
    if (open_text(&r, fp32_job)) {
        fake.writes = 0;
        CHECK(tg_trainer_restore(&r.tr, &ck, "ck", &err) == 0, "restore: %s", err.msg);
        writes = fake.writes;
        close_run(&r);
    }
    if (open_text(&r, fp32_job)) {
        fake.fail_write = 1;
        CHECK(tg_trainer_restore(&r.tr, &ck, "ck", &err) == -1 && strstr(err.msg, "fake executor: write refused") &&
                  fake.writes == 1,
              "restore, parameters' upload refused: %s (%d writes)", err.msg, fake.writes);
        close_run(&r);
    }
    if (writes > 1 && open_text(&r, fp32_job)) {
        fake.writes = 0, fake.fail_write_from = writes;
        CHECK(tg_trainer_restore(&r.tr, &ck, "ck", &err) == -1 && strstr(err.msg, "fake executor: write refused") &&
                  fake.writes == writes,
              "restore, last state write refused: %s (%d of %d writes)", err.msg, fake.writes, writes);
        close_run(&r);
    }
    tg_checkpoint_free(&ck);
}

/* fp16: a whole checkpoint with the loss scale's read refused, then its growth tracker's;
 * the checkpoint of a step resumed by a fresh trainer, loss scale and tracker included. */
TG_TEST(test_trainer_pipeline_fp16_checkpoint_loss_scale) {
    run r;
    if (!open_text(&r, fp16_job)) return;
    tg_err err = {{0}};
    tg_step_stats s;
    REQUIRE(tg_trainer_step(&r.tr, &s, &err) == 0, "%s", err.msg);
    tg_checkpoint ck;
    fake.reads = 0;
    REQUIRE(tg_trainer_checkpoint(&r.tr, &ck, 1, &err) == 0, "%s", err.msg);
    /* The last four reads: loss scale, growth tracker, then m and v. */
    const int reads = fake.reads;
    for (int back = 4; back >= 3; back--) {
        tg_checkpoint bad;
        fake.reads = 0, fake.fail_read_from = reads - back + 1;
        CHECK(tg_trainer_checkpoint(&r.tr, &bad, 1, &err) == -1 && strstr(err.msg, "read refused") &&
                  bad.n_tensors == 0 && fake.reads == reads - back + 1,
              "read %d of %d refused: %s (%d reads)", reads - back + 1, reads, err.msg, fake.reads);
    }
    fake.fail_read_from = 0;
    const tg_plan *p = &r.plan;
    const tg_checkpoint_tensor *scale = tg_checkpoint_find(&ck, p->tensors[p->io.loss_scale].name, -1);
    const tg_checkpoint_tensor *growth = tg_checkpoint_find(&ck, p->tensors[p->io.loss_scale_growth].name, -1);
    REQUIRE(scale && growth, "the checkpoint lacks the loss scale or its tracker");
    float want_scale, want_growth;
    memcpy(&want_scale, scale->data, sizeof want_scale);
    memcpy(&want_growth, growth->data, sizeof want_growth);
    close_run(&r);
    if (open_text(&r, fp16_job)) {
        float got_scale = 0, got_growth = -1;
        CHECK(tg_trainer_restore(&r.tr, &ck, "ck", &err) == 0 &&
                  tg_trainer_read_f32(&r.tr, r.plan.io.loss_scale, &got_scale, &err) == 0 &&
                  tg_trainer_read_f32(&r.tr, r.plan.io.loss_scale_growth, &got_growth, &err) == 0,
              "restore: %s", err.msg);
        CHECK(got_scale == want_scale && got_growth == want_growth && want_growth == 1,
              "resumed loss scale %g tracker %g, the checkpoint's %g %g", got_scale, got_growth, want_scale,
              want_growth);
        close_run(&r);
    }
    tg_checkpoint_free(&ck);
}

/* A read of a half tensor into floats, refused: the call's error. */
TG_TEST(test_trainer_pipeline_half_read_refused) {
    run r;
    if (!open_text(&r, fp16_job)) return;
    int half = -1;
    for (int i = 0; i < r.plan.n_tensors && half < 0; i++)
        if (tg_dtype_is_half(r.plan.tensors[i].dtype)) half = i;
    REQUIRE(half >= 0, "an fp16 plan without a half tensor");
    float *buf = malloc(sizeof(float) * (size_t)tg_tensor_numel(&r.plan.tensors[half]));
    REQUIRE(buf, "out of memory");
    tg_err err = {{0}};
    fake.fail_read = 1;
    CHECK(tg_trainer_read_f32(&r.tr, half, buf, &err) == -1 && strstr(err.msg, "fake executor: read refused"),
          "half read of %s: %s", r.plan.tensors[half].name, err.msg);
    fake.fail_read = 0;
    CHECK(tg_trainer_read_f32(&r.tr, half, buf, &err) == 0, "half read: %s", err.msg);
    free(buf);
    close_run(&r);
}

/* Results as no healthy step makes them: a non-finite loss with a finite norm stops the
 * run; with fp16 a non-finite norm is the scaler's overflow only at a scale of 1 or more
 * and a finite loss, otherwise skip_nonfinite = false stops the run. */
TG_TEST(test_trainer_pipeline_non_finite_results) {
    run r;
    tg_err err = {{0}};
    tg_step_stats s;
    if (open_text(&r, fp32_job)) {
        fake.rewrite = 1, fake.loss = INFINITY, fake.grad_norm = 2.0f, fake.loss_scale = 0;
        CHECK(tg_trainer_step(&r.tr, &s, &err) == -1 &&
                  !strcmp(err.msg, "step 1: loss is inf (diverged; lower lr or enable grad_clip)"),
              "infinite loss, finite norm: %s", err.msg);
        close_run(&r);
    }
    const struct {
        float loss, scale;
        int stops;
    } cases[] = {{1.5f, 2.0f, 0}, {NAN, 2.0f, 1}, {1.5f, 0.5f, 1}};
    for (int c = 0; c < 3; c++) {
        if (!open_text(&r, fp16_job)) return;
        fake.rewrite = 1, fake.loss = cases[c].loss, fake.grad_norm = NAN, fake.loss_scale = cases[c].scale;
        const int rc = tg_trainer_step(&r.tr, &s, &err);
        if (cases[c].stops)
            CHECK(rc == -1 && strstr(err.msg, "step 1: the gradient norm is nan (loss ") &&
                      strstr(err.msg, "skip_nonfinite = false stops here"),
                  "case %d (loss %g, scale %g): rc %d, %s", c, cases[c].loss, cases[c].scale, rc, err.msg);
        else
            CHECK(rc == 0 && s.skipped && r.tr.skipped_steps == 1, "case %d: rc %d (%s), skipped %d", c, rc, err.msg,
                  s.skipped);
        close_run(&r);
    }
}

/* Held at the end of the schedule: no step to take, and none started. */
TG_TEST(test_trainer_pipeline_hold_past_the_last_step) {
    run r;
    if (!open_text(&r, fp32_job)) return;
    tg_err err = {{0}};
    tg_step_stats s;
    for (int i = 0; i < 4; i++) REQUIRE(tg_trainer_step(&r.tr, &s, &err) == 0, "step %d: %s", i + 1, err.msg);
    tg_trainer_hold(&r.tr, 1);
    CHECK(tg_trainer_step(&r.tr, &s, &err) == -1 && !strcmp(err.msg, "no step to take: the run stops at step 4") &&
              r.tr.launched == 4,
          "held at step 4: %s (%lld launched)", err.msg, (long long)r.tr.launched);
    tg_trainer_hold(&r.tr, 0);
    CHECK(tg_trainer_step(&r.tr, &s, &err) == 0 && s.step == 5, "released past the end: %s", err.msg);
    close_run(&r);
}

/* mlm: the eval's reads of the masking op's labels (tg_trainer_eval), and of its masked ids
 * (with a logits callback), refused: the call's error. */
static int count_rows(void *ctx, const float *logits, int32_t first, int32_t rows, tg_err *err) {
    *(int *)ctx += rows;
    return 0;
}

TG_TEST(test_trainer_pipeline_mlm_eval_reads_refused) {
    run r;
    if (!open_text(&r, "model = tiny-bert\ntask = mlm\nbatch = 4\nseq = 48\nsteps = 2\ntrain_data = ids.jsonl\n"
                       "eval_data = ids.jsonl\n"))
        return;
    tg_err err = {{0}};
    tg_eval_stats es;
    int rows = 0;
    /* Reads: the loss, the masked labels; with the callback the loss, logits, labels, ids. */
    fake.reads = 0, fake.fail_read_from = 2;
    CHECK(tg_trainer_eval(&r.tr, &es, &err) == -1 && strstr(err.msg, "fake executor: read refused") && fake.reads == 2,
          "eval, masked labels' read refused: %s (%d reads)", err.msg, fake.reads);
    fake.reads = 0, fake.fail_read_from = 4;
    CHECK(tg_trainer_eval_logits(&r.tr, &es, count_rows, &rows, &err) == -1 &&
              strstr(err.msg, "fake executor: read refused") && fake.reads == 4 && rows == 0,
          "eval, masked ids' read refused: %s (%d reads, %d rows seen)", err.msg, fake.reads, rows);
    fake.fail_read_from = 0;
    CHECK(tg_trainer_eval_logits(&r.tr, &es, count_rows, &rows, &err) == 0 && rows == 12 && es.examples == 12,
          "eval: %s (%d rows seen)", err.msg, rows);
    close_run(&r);
}

/* LM with length buckets behind an executor that derives label rows: the batches still
 * come with every label written (the step fetching a batch has its own bucket's layout),
 * and the losses are those of the CPU's own run. */
TG_TEST(test_trainer_pipeline_lm_buckets_write_every_label) {
    static const char job[] = "model = tiny-gpt2\ntask = lm\nbatch = 2\nseq = 48\nsteps = 6\nseq_buckets = 16,48\n"
                              "train_data = ids.jsonl\n";
    float plain[6], derived[6];
    for (int pass = 0; pass < 2; pass++) {
        run r;
        if (!open_text(&r, job)) return;
        uint8_t *scratch = NULL;
        if (pass) {
            fake.vt.lm_label_rows = 1;
            fake.derive_labels = 1;
            scratch = fake.scratch = malloc(r.plan.pool_bytes[TG_POOL_INPUTS]);
        } else {
            r.tr.ex.vt = fake.real; /* the CPU executor itself */
        }
        tg_err err = {{0}};
        for (int i = 0; i < 6 && (!pass || scratch); i++) {
            tg_step_stats s;
            if (!CHECK(tg_trainer_step(&r.tr, &s, &err) == 0, "pass %d step %d: %s", pass, i + 1, err.msg)) break;
            (pass ? derived : plain)[i] = s.loss;
        }
        if (pass) CHECK(fake.marked == 0, "%d batches came with marked label rows under buckets", fake.marked);
        close_run(&r);
        free(scratch);
        fake.scratch = NULL;
    }
    for (int i = 0; i < 6; i++)
        CHECK(derived[i] == plain[i], "step %d: loss %.9g, the CPU's own %.9g", i + 1, derived[i], plain[i]);
}
