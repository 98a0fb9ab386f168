/* Length buckets on the CPU reference executor: a plan of buckets at seq 16 and 32 (tests/
 * bucket_plan.h assembles it from two compiles), run on bucket 0, computes bit for bit what
 * an executor of the seq-16 plan alone computes; alternating buckets trains as the two
 * single-length plans taking turns on one training state; select_bucket refuses a bucket
 * the plan lacks, and the executor refuses bucket plans that break plan.h's rules. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/executor.h"
#include "tests/bucket_plan.h"
#include "tests/harness.h"

enum { STEPS = 6 };
static const int bucket_seqs[2] = {16, 32};

static int open_cpu(tg_executor *ex, const tg_plan *p) {
    tg_err err;
    tg_executor_options o = {.device = TG_DEVICE_CPU, .threads = 2, .seed = 5};
    return CHECK(tg_executor_open(ex, p, &o, &err) == 0, "%s", err.msg);
}

/* One training step through step_start/step_wait on the batch of `step` laid out by plan
 * p (the bucket the executor runs). */
static int train_step(tg_executor *ex, const tg_plan *p, int step, tg_step_result *r) {
    tg_err err;
    void *image = ex->vt->host_alloc(ex->impl, p->pool_bytes[TG_POOL_INPUTS]);
    if (!CHECK(image != NULL, "out of memory")) return 0;
    tg_test_fill_batch_image(p, step, image);
    const void *batches[2] = {image, NULL};
    int ok = CHECK(ex->vt->step_start(ex->impl, batches, 1, &err) == 0 && ex->vt->step_wait(ex->impl, r, &err) == 0,
                   "step %d (seq %d): %s", step, p->train.seq, err.msg);
    ex->vt->host_free(ex->impl, image);
    return ok;
}

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

/* Whether tensor t (as plan p has it) holds the same bytes on both executors. The buffers
 * hold the tensor as large as either executor's plan has it, so that an executor reading
 * by another bucket's table fails the comparison instead of writing past them. */
static int same_tensor(tg_executor *a, tg_executor *b, const tg_plan *p, int t, const char *what) {
    tg_err err;
    const size_t n = (size_t)p->tensors[t].bytes;
    const size_t room = max_size(n, max_size(a->plan->tensors[t].bytes, b->plan->tensors[t].bytes));
    void *x = calloc(1, room), *y = calloc(1, room);
    int ok = CHECK(x && y, "out of memory") &&
             CHECK(tg_executor_read(a, t, x, &err) == 0 && tg_executor_read(b, t, y, &err) == 0, "%s", err.msg) &&
             CHECK(memcmp(x, y, n) == 0, "%s: %s differs", what, p->tensors[t].name);
    free(x), free(y);
    return ok;
}

/* Bucket 0 of the 2-bucket plan against the seq-16 plan alone: a training step (loss,
 * learning rate, gradient norm, every gradient and parameter) and an eval forward (the
 * logits), bit for bit. */
static void bucket0_matches_its_plan(const char *preset, int task) {
    tg_plan plan, alone;
    if (!tg_test_bucket_plan(preset, task, TG_PREC_FP32, bucket_seqs, 2, STEPS, &plan)) return;
    if (!tg_test_compile_job_text(preset, task, TG_PREC_FP32, bucket_seqs[0], STEPS, &alone)) {
        tg_plan_free(&plan);
        return;
    }
    tg_executor ex, ref;
    int opened = open_cpu(&ex, &plan);
    opened += opened && open_cpu(&ref, &alone);
    tg_err err;
    const tg_plan *b0 = tg_plan_bucket(&plan, 0);
    int ok = opened == 2 && CHECK(b0 != &plan && b0->train.seq == bucket_seqs[0], "bucket 0 is not the seq-16 plan") &&
             tg_test_upload_values(&ex, &plan, 11, STEPS) && tg_test_upload_values(&ref, &alone, 11, STEPS) &&
             CHECK(tg_executor_select_bucket(&ex, 0, &err) == 0, "%s", err.msg);
    tg_step_result a, b;
    ok = ok && train_step(&ex, b0, 0, &a) && train_step(&ref, &alone, 0, &b);
    if (ok) {
        CHECK(a.loss == b.loss && a.lr == b.lr && a.grad_norm == b.grad_norm,
              "%s: bucket 0 step: loss %.9g lr %.9g norm %.9g, seq-16 plan: %.9g %.9g %.9g", preset, a.loss, a.lr,
              a.grad_norm, b.loss, b.lr, b.grad_norm);
        same_tensor(&ex, &ref, &alone, alone.io.grads_all, preset);
        same_tensor(&ex, &ref, &alone, alone.io.params_all, preset);
        same_tensor(&ex, &ref, &alone, alone.io.m_all, preset);
        /* The eval forward on the step's batch, left in place. */
        ok = CHECK(tg_executor_run(&ex, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 0, &err) == 0 &&
                       tg_executor_run(&ref, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 0, &err) == 0,
                   "%s", err.msg);
        if (ok) same_tensor(&ex, &ref, &alone, alone.io.logits, preset);
    }
    if (opened > 0) tg_executor_close(&ex);
    if (opened > 1) tg_executor_close(&ref);
    tg_plan_free(&plan);
    tg_plan_free(&alone);
}

TG_TEST(test_buckets_cpu_bert_bucket0_matches_seq16_plan) { bucket0_matches_its_plan("tiny-bert", TG_TASK_CLASSIFY); }
TG_TEST(test_buckets_cpu_gpt2_bucket0_matches_seq16_plan) { bucket0_matches_its_plan("tiny-gpt2", TG_TASK_LM); }

/* Buckets 0, 1, 0, 1, 1, 0 on one executor against the seq-16 and seq-32 plans alone taking
 * turns on one training state (copied to the one whose turn it is): the same losses and,
 * after every step, the same parameters and AdamW moments, bit for bit. */
static void alternating_buckets_match_plans(const char *preset, int task) {
    static const int order[STEPS] = {0, 1, 0, 1, 1, 0};
    tg_plan plan, alone[2];
    int compiled = tg_test_bucket_plan(preset, task, TG_PREC_FP32, bucket_seqs, 2, STEPS, &plan);
    for (int k = 0; compiled == k + 1 && k < 2; k++)
        compiled += tg_test_compile_job_text(preset, task, TG_PREC_FP32, bucket_seqs[k], STEPS, &alone[k]);
    tg_executor ex, ref[2];
    int opened = compiled == 3 && open_cpu(&ex, &plan);
    for (int k = 0; opened == k + 1 && k < 2; k++) opened += open_cpu(&ref[k], &alone[k]);
    int ok = opened == 3 && tg_test_upload_values(&ex, &plan, 7, STEPS) &&
             tg_test_upload_values(&ref[0], &alone[0], 7, STEPS) && tg_test_upload_values(&ref[1], &alone[1], 7, STEPS);
    int last = 0; /* the reference executor holding the current state */
    for (int s = 0; ok && s < STEPS; s++) {
        const int k = order[s];
        tg_err err;
        tg_step_result a, b;
        ok = CHECK(tg_executor_select_bucket(&ex, k, &err) == 0, "%s", err.msg) &&
             (k == last || tg_test_copy_state(&ref[last], &ref[k], &alone[k])) &&
             train_step(&ex, tg_plan_bucket(&plan, k), s, &a) && train_step(&ref[k], &alone[k], s, &b);
        last = k;
        if (!ok) break;
        CHECK(a.loss == b.loss && a.lr == b.lr && a.grad_norm == b.grad_norm,
              "%s step %d (bucket %d): loss %.9g norm %.9g, seq-%d plan: %.9g %.9g", preset, s, k, a.loss, a.grad_norm,
              bucket_seqs[k], b.loss, b.grad_norm);
        char what[64];
        snprintf(what, sizeof what, "%s after step %d (bucket %d)", preset, s, k);
        ok = same_tensor(&ex, &ref[k], &alone[k], alone[k].io.params_all, what) &&
             same_tensor(&ex, &ref[k], &alone[k], alone[k].io.m_all, what) &&
             same_tensor(&ex, &ref[k], &alone[k], alone[k].io.v_all, what);
    }
    if (opened > 0) tg_executor_close(&ex);
    for (int k = 0; k + 1 < opened; k++) tg_executor_close(&ref[k]);
    if (compiled > 0) tg_plan_free(&plan);
    for (int k = 0; k + 1 < compiled; k++) tg_plan_free(&alone[k]);
}

TG_TEST(test_buckets_cpu_bert_alternating_matches_plans) {
    alternating_buckets_match_plans("tiny-bert", TG_TASK_CLASSIFY);
}
TG_TEST(test_buckets_cpu_gpt2_alternating_matches_plans) { alternating_buckets_match_plans("tiny-gpt2", TG_TASK_LM); }

/* A bucket outside the plan's is refused with a message naming it and the plan's count;
 * a plan without buckets has bucket 0 alone. */
TG_TEST(test_buckets_select_out_of_range) {
    tg_plan plan, plain;
    if (!tg_test_bucket_plan("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, bucket_seqs, 2, 1, &plan)) return;
    if (!tg_test_compile_job_text("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 16, 1, &plain)) {
        tg_plan_free(&plan);
        return;
    }
    tg_executor ex, one;
    tg_err err;
    if (open_cpu(&ex, &plan)) {
        const int bad[] = {-1, 2, 1 << 20};
        for (int i = 0; i < 3; i++) {
            err.msg[0] = 0;
            CHECK(tg_executor_select_bucket(&ex, bad[i], &err) == -1, "bucket %d accepted", bad[i]);
            char want[64];
            snprintf(want, sizeof want, "length bucket %d asked for: the plan has 2 (0 .. 1)", bad[i]);
            CHECK(strstr(err.msg, want) != NULL, "message: %s", err.msg);
        }
        CHECK(tg_executor_select_bucket(&ex, 1, &err) == 0 && tg_executor_select_bucket(&ex, 0, &err) == 0, "%s",
              err.msg);
        tg_executor_close(&ex);
    }
    if (open_cpu(&one, &plain)) {
        CHECK(tg_executor_select_bucket(&one, 0, &err) == 0, "%s", err.msg);
        CHECK(tg_executor_select_bucket(&one, 1, &err) == -1 && strstr(err.msg, "without seq_buckets"),
              "a plan without buckets: %s", err.msg);
        tg_executor_close(&one);
    }
    tg_plan_free(&plan);
    tg_plan_free(&plain);
}

/* Bucket plans the executors cannot serve: none held, too many named, a bucket's pool of
 * another size, a bucket of other tensors. */
TG_TEST(test_buckets_open_refuses_broken_bucket_plans) {
    tg_plan plan;
    if (!tg_test_bucket_plan("tiny-gpt2", TG_TASK_LM, TG_PREC_FP32, bucket_seqs, 2, 1, &plan)) return;
    tg_executor ex;
    tg_err err;
    tg_executor_options o = {.device = TG_DEVICE_CPU, .threads = 1};
    tg_plan *held = plan.buckets;
    plan.buckets = NULL;
    CHECK(tg_executor_open(&ex, &plan, &o, &err) == -1 && strstr(err.msg, "holds no bucket plans"), "no buckets: %s",
          err.msg);
    plan.buckets = held;
    plan.train.n_buckets = TG_MAX_BUCKETS + 1;
    CHECK(tg_executor_open(&ex, &plan, &o, &err) == -1 && strstr(err.msg, "length buckets, more than"),
          "too many: %s", err.msg);
    plan.train.n_buckets = 2;
    held[0].pool_bytes[TG_POOL_ACTIVATIONS] -= 256;
    CHECK(tg_executor_open(&ex, &plan, &o, &err) == -1 && strstr(err.msg, "activations pool"), "pool size: %s",
          err.msg);
    held[0].pool_bytes[TG_POOL_ACTIVATIONS] += 256;
    held[0].n_tensors--;
    CHECK(tg_executor_open(&ex, &plan, &o, &err) == -1 && strstr(err.msg, "length bucket 0 (seq 16)"),
          "tensor count: %s", err.msg);
    held[0].n_tensors++;
    if (CHECK(tg_executor_open(&ex, &plan, &o, &err) == 0, "restored: %s", err.msg)) tg_executor_close(&ex);
    tg_plan_free(&plan);
}
