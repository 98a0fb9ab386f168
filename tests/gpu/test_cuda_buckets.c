/* Length buckets on the CUDA executor: a plan of buckets at seq 16 and 32 (tests/
 * bucket_plan.h) trained through the pipelined step_start/step_wait with captured graphs,
 * buckets alternating and steps of both in flight together (single starts and groups of
 * two, each bucket with its own graphs), against the CPU reference running the same
 * buckets one step at a time: the loss and gradient norm of every step, and in fp32 every
 * gradient of the last step and every parameter after it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/executor.h"
#include "tests/bucket_plan.h"
#include "tests/harness.h"

enum { STEPS = 8, MAX_IN_FLIGHT = 4 };
static const int bucket_seqs[2] = {16, 32};
/* The bucket of each step, and the starts that run them on CUDA: 0 | 1 | 0 0 | 1 1 | 0 | 1. */
static const int order[STEPS] = {0, 1, 0, 0, 1, 1, 0, 1};
static const int starts[] = {1, 1, 2, 2, 1, 1};

static int open_on(tg_executor *ex, const tg_plan *p, tg_device device) {
    tg_err err;
    tg_executor_options o = {.device = device, .threads = 0, .use_graphs = 1, .seed = 5};
    return CHECK(tg_executor_open(ex, p, &o, &err) == 0, "%s: %s", device == TG_DEVICE_CUDA ? "cuda" : "cpu", err.msg);
}

/* The CPU reference: each step on its bucket, one at a time. */
static int train_cpu(tg_executor *ex, const tg_plan *plan, tg_step_result *res) {
    tg_err err;
    void *image = ex->vt->host_alloc(ex->impl, plan->pool_bytes[TG_POOL_INPUTS]);
    int ok = CHECK(image != NULL, "out of memory");
    for (int s = 0; ok && s < STEPS; s++) {
        tg_test_fill_batch_image(tg_plan_bucket(plan, order[s]), s, image);
        const void *batches[2] = {image, NULL};
        ok = CHECK(tg_executor_select_bucket(ex, order[s], &err) == 0 &&
                       ex->vt->step_start(ex->impl, batches, 1, &err) == 0 &&
                       ex->vt->step_wait(ex->impl, &res[s], &err) == 0,
                   "cpu step %d (bucket %d): %s", s, order[s], err.msg);
    }
    if (image) ex->vt->host_free(ex->impl, image);
    return ok;
}

/* CUDA: every batch image filled up front (each laid out for its step's bucket), the
 * starts of `starts` queued behind each other with up to MAX_IN_FLIGHT steps in flight,
 * each step fetching the next one's image beside its forward. */
static int train_cuda(tg_executor *ex, const tg_plan *plan, tg_step_result *res) {
    tg_err err;
    const void *images[STEPS + 1] = {NULL};
    int ok = 1;
    for (int s = 0; ok && s < STEPS; s++) {
        void *image = ex->vt->host_alloc(ex->impl, plan->pool_bytes[TG_POOL_INPUTS]);
        ok = CHECK(image != NULL, "cannot allocate the pinned image of step %d", s);
        if (ok) tg_test_fill_batch_image(tg_plan_bucket(plan, order[s]), s, image);
        images[s] = image;
    }
    int started = 0, waited = 0;
    for (size_t k = 0; ok && k < sizeof starts / sizeof starts[0]; k++) {
        const int n = starts[k];
        for (int j = 1; j < n; j++)
            ok = ok && CHECK(order[started + j] == order[started], "start %zu mixes buckets", k);
        ok = ok && CHECK(tg_executor_select_bucket(ex, order[started], &err) == 0 &&
                             ex->vt->step_start(ex->impl, &images[started], n, &err) == 0,
                         "cuda start of steps %d..%d (bucket %d): %s", started, started + n - 1, order[started],
                         err.msg);
        if (ok) started += n;
        /* Steps of both buckets stay queued together: waited for only past MAX_IN_FLIGHT - 1. */
        for (; ok && started - waited > MAX_IN_FLIGHT - 1; waited++)
            ok = CHECK(ex->vt->step_wait(ex->impl, &res[waited], &err) == 0, "cuda step %d: %s", waited, err.msg);
    }
    for (; ok && waited < started; waited++)
        ok = CHECK(ex->vt->step_wait(ex->impl, &res[waited], &err) == 0, "cuda step %d: %s", waited, err.msg);
    ok = ok && CHECK(started == STEPS, "started %d of %d steps", started, STEPS);
    /* Steps still in flight after a failure are waited for before their images go. */
    for (tg_step_result dropped; !ok && waited < started; waited++)
        if (ex->vt->step_wait(ex->impl, &dropped, &err)) break;
    for (int s = 0; s < STEPS; s++)
        if (images[s]) ex->vt->host_free(ex->impl, (void *)images[s]);
    return ok;
}

static float *read_tensor(tg_executor *ex, const tg_plan *p, int t) {
    tg_err err;
    float *buf = malloc((size_t)p->tensors[t].bytes);
    if (buf && !CHECK(tg_executor_read(ex, t, buf, &err) == 0, "%s", err.msg)) free(buf), buf = NULL;
    return buf;
}

/* Every trainable parameter's gradient (the last step's) and value, as the whole-step GPU
 * tests compare them (tests/gpu/test_cuda_step.c). */
static void compare_parameters(tg_executor *cpu, tg_executor *gpu, const tg_plan *p, const char *what) {
    float *ga = read_tensor(cpu, p, p->io.grads_all), *gb = read_tensor(gpu, p, p->io.grads_all);
    float *pa = read_tensor(cpu, p, p->io.params_all), *pb = read_tensor(gpu, p, p->io.params_all);
    double grad_max = 0;
    int64_t total = (int64_t)(p->pool_bytes[TG_POOL_GRADS] / 4), left_out = 0;
    for (int64_t i = 0; ga && i < total; i++) grad_max = fmax(grad_max, fabs(ga[i]));
    for (int t = 0; ga && gb && pa && pb && t < p->n_tensors; t++) {
        const tg_tensor *x = &p->tensors[t];
        if (!(x->flags & TG_TENSOR_PARAM) || (x->flags & TG_TENSOR_VIEW)) continue;
        int64_t off = (int64_t)(x->offset / 4), n = tg_tensor_numel(x);
        double rg = tg_rel_err(gb + off, ga + off, n), dg = tg_l2_diff(gb + off, ga + off, n);
        double rp = tg_rel_err_after_update(pb + off, pa + off, ga + off, gb + off, n, 1e-9 * grad_max, &left_out);
        CHECK(rg <= 1e-4 || dg <= 1e-9 * grad_max, "%s: gradient of %s: relative error %.3g", what, x->name, rg);
        CHECK(rp <= 1e-4, "%s: %s after %d steps: relative error %.3g", what, x->name, STEPS, rp);
    }
    CHECK(left_out <= (int64_t)p->model.layers * p->model.hidden + total / 1000,
          "%s: %lld elements with noise-level gradients", what, (long long)left_out);
    free(ga), free(gb), free(pa), free(pb);
}

static void buckets_match_cpu(const char *preset, int task, int precision) {
    tg_plan plan;
    if (!tg_test_bucket_plan(preset, task, precision, bucket_seqs, 2, STEPS, &plan)) return;
    tg_executor cpu, gpu;
    int opened = open_on(&cpu, &plan, TG_DEVICE_CPU);
    opened += opened && open_on(&gpu, &plan, TG_DEVICE_CUDA);
    tg_step_result want[STEPS], got[STEPS];
    /* The host writes every label of a bucketed plan: the executor must not claim LM rows. */
    int ok = opened == 2 && CHECK(gpu.vt->lm_label_rows == 0, "%s: a bucketed plan's executor derives label rows",
                                  preset);
    ok = ok && tg_test_upload_values(&cpu, &plan, 13, STEPS) && tg_test_upload_values(&gpu, &plan, 13, STEPS) &&
         train_cpu(&cpu, &plan, want) && train_cuda(&gpu, &plan, got);
    const int fp32 = precision == TG_PREC_FP32;
    const float loss_tol = fp32 ? 1e-4f : 2e-2f, norm_tol = fp32 ? 1e-4f : 5e-2f;
    for (int s = 0; ok && s < STEPS; s++) {
        CHECK(isfinite(got[s].loss) && fabsf(got[s].loss - want[s].loss) <= loss_tol * fabsf(want[s].loss),
              "%s %s step %d (bucket %d): loss cpu %.7g cuda %.7g", preset, tg_precision_name(precision), s, order[s],
              want[s].loss, got[s].loss);
        CHECK(isfinite(got[s].grad_norm) && fabsf(got[s].grad_norm - want[s].grad_norm) <= norm_tol * want[s].grad_norm,
              "%s %s step %d (bucket %d): gradient norm cpu %.7g cuda %.7g", preset, tg_precision_name(precision), s,
              order[s], want[s].grad_norm, got[s].grad_norm);
    }
    /* The steps trained on their batches: the losses move. */
    int distinct = 0;
    for (int s = 1; ok && s < STEPS; s++) distinct += want[s].loss != want[s - 1].loss;
    CHECK(!ok || distinct >= STEPS / 2, "%s: the losses barely change (%d of %d)", preset, distinct, STEPS - 1);
    /* The last step ran on bucket 1, the plan itself: its table reads both executors. */
    if (ok && fp32) compare_parameters(&cpu, &gpu, &plan, preset);
    if (opened > 0) tg_executor_close(&cpu);
    if (opened > 1) tg_executor_close(&gpu);
    tg_plan_free(&plan);
}

TG_TEST(test_gpu_buckets_bert_alternating_matches_cpu) {
    buckets_match_cpu("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32);
}
TG_TEST(test_gpu_buckets_gpt2_alternating_matches_cpu) { buckets_match_cpu("tiny-gpt2", TG_TASK_LM, TG_PREC_FP32); }
TG_TEST(test_gpu_buckets_gpt2_bf16_alternating_matches_cpu) {
    buckets_match_cpu("tiny-gpt2", TG_TASK_LM, TG_PREC_BF16);
}

/* A plan without buckets keeps deriving LM label rows on the device, and has bucket 0
 * alone. */
TG_TEST(test_gpu_buckets_plain_plan_keeps_label_rows) {
    tg_plan plan;
    if (!tg_test_compile_job_text("tiny-gpt2", TG_TASK_LM, TG_PREC_FP32, 16, 1, &plan)) return;
    tg_executor gpu;
    tg_err err;
    if (open_on(&gpu, &plan, TG_DEVICE_CUDA)) {
        CHECK(gpu.vt->lm_label_rows == 1, "a plan without buckets: label rows not derived");
        CHECK(tg_executor_select_bucket(&gpu, 0, &err) == 0, "%s", err.msg);
        CHECK(tg_executor_select_bucket(&gpu, 1, &err) == -1 && strstr(err.msg, "length bucket 1"), "bucket 1: %s",
              err.msg);
        tg_executor_close(&gpu);
    }
    tg_plan_free(&plan);
}
