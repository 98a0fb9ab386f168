/* Gradient accumulation (job key grad_accumulation) on the CUDA executor: a step of 4
 * micro-batches of B rows against one step on 4B rows (fp32 within 1e-5, bf16 within 2e-2;
 * dropout off), for classification and LM; windows of 2 against the CPU reference (dropout
 * on: each micro-step draws the same masks on both); the captured step against op-by-op
 * launches and pipelined steps against steps taken one at a time, bit for bit; with two
 * GPUs, two data-parallel replicas (NCCL) against one replica of the whole batch. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

/* accum_job.lm: the demo job of the task. */
enum { TASK_CLASSIFY = 0, TASK_LM = 1, TASK_MLM = 2 };
static const char *const task_names[] = {"classify", "lm", "mlm"};

typedef struct accum_job {
    int lm, batch, accum, steps, precision, dropout; /* lm: TASK_* */
    int replicas; /* data_parallel; 0: 1 */
} accum_job;

static int compile_accum(const accum_job *j, tg_plan *p) {
    tg_err err;
    tg_job job;
    char b[32], a[32], s[32];
    snprintf(b, sizeof b, "batch=%d", j->batch);
    snprintf(a, sizeof a, "grad_accumulation=%d", j->accum);
    snprintf(s, sizeof s, "steps=%d", j->steps);
    char r[32];
    snprintf(r, sizeof r, "data_parallel=%d", j->replicas > 1 ? j->replicas : 1);
    const char *sets[] = {b, a, s, "warmup_steps=2", j->precision == TG_PREC_BF16 ? "precision=bf16" : "precision=fp32", r};
    const char *path = j->lm == TASK_MLM ? "examples/demo-mlm.job"
                       : j->lm         ? "examples/demo-lm.job"
                                       : "examples/demo-classify.job";
    if (!CHECK(tg_job_load(path, sets, 6, &job, &err) == 0, "%s", err.msg)) return 0;
    tg_model_config cfg;
    if (!CHECK(tg_model_config_load(job.model, &cfg, &err) == 0, "%s", err.msg)) return 0;
    if (!j->dropout) cfg.hidden_dropout = cfg.attention_dropout = cfg.embedding_dropout = cfg.classifier_dropout = 0;
    return CHECK(tg_compile_with_config(&job, &cfg, p, &err) == 0, "%s", err.msg);
}

typedef struct accum_run {
    tg_device device;
    int no_graphs, depth; /* depth 0: tg_trainer_next_batch + tg_trainer_run_step */
    int rank;
    void *comm;           /* data-parallel replicas: this one's NCCL communicator */
} accum_run;

typedef struct outcome {
    float *params, *m, *v;
    int64_t n;
    float loss[16];
} outcome;

static void outcome_free(outcome *o) { free(o->params), free(o->m), free(o->v); }

static float *read_f32(tg_trainer *tr, int tensor) {
    const int64_t n = tg_tensor_numel(&tr->plan->tensors[tensor]);
    float *x = malloc(sizeof *x * (size_t)n);
    tg_err err;
    if (x && !CHECK(tg_trainer_read_f32(tr, tensor, x, &err) == 0, "%s", err.msg)) free(x), x = NULL;
    return x;
}

static int train(const tg_plan *p, const accum_run *r, int steps, outcome *o) {
    memset(o, 0, sizeof *o);
    tg_err err;
    tg_trainer tr;
    tg_trainer_options opts = {.device = r->device, .threads = 1, .load_data = 1, .no_graphs = r->no_graphs,
                               .max_in_flight = r->depth, .rank = r->rank, .comm = r->comm};
    if (!CHECK(tg_trainer_open(&tr, p, &opts, &err) == 0, "%s", err.msg)) return 0;
    int ok = 1;
    for (int s = 0; s < steps && ok; s++) {
        tg_step_stats st;
        if (r->depth == 0) tg_trainer_next_batch(&tr);
        ok = CHECK((r->depth == 0 ? tg_trainer_run_step(&tr, &st, &err) : tg_trainer_step(&tr, &st, &err)) == 0,
                   "step %d: %s", s + 1, err.msg);
        if (ok && s < 16) o->loss[s] = st.loss;
    }
    o->n = tg_tensor_numel(&p->tensors[p->io.params_all]);
    o->params = ok ? read_f32(&tr, p->io.params_all) : NULL;
    o->m = ok ? read_f32(&tr, p->io.m_all) : NULL;
    o->v = ok ? read_f32(&tr, p->io.v_all) : NULL;
    tg_trainer_close(&tr);
    return ok && o->params && o->m && o->v;
}

static double rel_diff(const float *a, const float *b, int64_t n) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        const double x = (double)a[i] - (double)b[i];
        d += x * x, s += (double)b[i] * (double)b[i];
    }
    return s > 0 ? sqrt(d / s) : sqrt(d);
}

/* Tensor by tensor, ||a - b|| / ||b|| of the parameters and AdamW's m and v within tol,
 * leaving out the attention key biases: their gradient is 0 in exact arithmetic, and AdamW
 * scales the rounding noise left of it to full-size steps (tests/test_grad_accumulation.c). */
static void check_close(const tg_plan *p, const char *what, const outcome *a, const outcome *b, int steps,
                        double tol) {
    for (int t = 0; t < p->n_tensors; t++) {
        const tg_tensor *x = &p->tensors[t];
        if (!(x->flags & TG_TENSOR_PARAM) || (x->flags & TG_TENSOR_VIEW)) continue;
        const int64_t at = (int64_t)(x->offset / 4), n = tg_tensor_numel(x);
        int64_t from = 0, to = 0;
        if (strstr(x->name, "attention.self.key.bias")) continue;
        if (strstr(x->name, "attn.c_attn.bias")) from = n / 3, to = 2 * n / 3;
        double worst = 0;
        const float *pa[3] = {a->params, a->m, a->v}, *pb[3] = {b->params, b->m, b->v};
        for (int k = 0; k < 3; k++) {
            worst = fmax(worst, rel_diff(pa[k] + at, pb[k] + at, from));
            worst = fmax(worst, rel_diff(pa[k] + at + to, pb[k] + at + to, n - to));
        }
        CHECK(worst <= tol, "%s: %s (or its m, v) differs by %.3g relative", what, x->name, worst);
    }
    for (int s = 0; s < steps && s < 16; s++)
        CHECK(fabs((double)a->loss[s] - (double)b->loss[s]) <= tol * fmax(1.0, fabs((double)b->loss[s])),
              "%s: step %d loss %.9g against %.9g", what, s + 1, a->loss[s], b->loss[s]);
}

/* 4 micro-batches of B rows against one batch of 4B rows, on CUDA. */
static void cuda_matches_large_batch(int lm, int precision, double tol) {
    enum { STEPS = 4 };
    const int B = lm ? 3 : 4;
    const accum_job small = {lm, B, 4, STEPS, precision, 0, 1}, large = {lm, 4 * B, 1, STEPS, precision, 0, 1};
    tg_plan ps, pl;
    if (!compile_accum(&small, &ps) || !compile_accum(&large, &pl)) return;
    const accum_run cuda = {TG_DEVICE_CUDA, 0, 2, 0, NULL};
    outcome a = {0}, b = {0};
    char what[96];
    snprintf(what, sizeof what, "%s %s, 4 x %d rows against %d", task_names[lm], tg_precision_name(precision), B,
             4 * B);
    if (train(&ps, &cuda, STEPS, &a) && train(&pl, &cuda, STEPS, &b)) check_close(&ps, what, &a, &b, STEPS, tol);
    outcome_free(&a), outcome_free(&b);
    tg_plan_free(&ps), tg_plan_free(&pl);
}

TG_TEST(test_gpu_grad_accumulation_classify_fp32) { cuda_matches_large_batch(0, TG_PREC_FP32, 1e-5); }
TG_TEST(test_gpu_grad_accumulation_lm_fp32) { cuda_matches_large_batch(1, TG_PREC_FP32, 1e-5); }
TG_TEST(test_gpu_grad_accumulation_classify_bf16) { cuda_matches_large_batch(0, TG_PREC_BF16, 2e-2); }
TG_TEST(test_gpu_grad_accumulation_lm_bf16) { cuda_matches_large_batch(1, TG_PREC_BF16, 2e-2); }
/* mlm: each micro-batch masks its rows as the large batch does (io.mlm_stream) and divides
 * by the window's masked positions (io.loss_norm). */
TG_TEST(test_gpu_grad_accumulation_mlm_fp32) { cuda_matches_large_batch(TASK_MLM, TG_PREC_FP32, 1e-5); }

/* Windows of 2, dropout on: CUDA as the CPU within float rounding (1e-4, as the other CUDA
 * steps against the CPU); on CUDA the captured step as op-by-op launches and pipelined
 * steps (fetched windows, two in flight) as steps each uploaded first, bit for bit. */
static void cuda_matches_cpu(int lm) {
    enum { STEPS = 4 };
    const accum_job job = {lm, 4, 2, STEPS, TG_PREC_FP32, 1, 1};
    tg_plan p;
    if (!compile_accum(&job, &p)) return;
    const accum_run runs[4] = {
        {TG_DEVICE_CPU, 0, 0, 0, NULL}, {TG_DEVICE_CUDA, 0, 0, 0, NULL}, {TG_DEVICE_CUDA, 1, 0, 0, NULL},
        {TG_DEVICE_CUDA, 0, 2, 0, NULL}};
    outcome o[4];
    memset(o, 0, sizeof o);
    int ok = 1;
    /* Separate CUDA runs compared bit for bit must pick the same GEMMs: the tuning pass
     * times candidates, and two near-equal ones can swap from one run to the next. */
    const char *tune = getenv("TUNEGRAPH_GEMM_TUNE");
    char *tune_saved = tune ? strdup(tune) : NULL;
    setenv("TUNEGRAPH_GEMM_TUNE", "0", 1);
    for (int r = 0; r < 4; r++) ok = ok && train(&p, &runs[r], STEPS, &o[r]);
    if (tune_saved) setenv("TUNEGRAPH_GEMM_TUNE", tune_saved, 1);
    else unsetenv("TUNEGRAPH_GEMM_TUNE");
    free(tune_saved);
    if (ok) {
        char what[64];
        snprintf(what, sizeof what, "%s, windows of 2: CUDA against the CPU", task_names[lm]);
        check_close(&p, what, &o[1], &o[0], STEPS, 1e-4);
        for (int r = 2; r < 4; r++)
            CHECK(!memcmp(o[r].params, o[1].params, sizeof(float) * (size_t)o[1].n) &&
                      !memcmp(o[r].loss, o[1].loss, sizeof o[1].loss),
                  "%s: %s differs from the captured step with each window uploaded", task_names[lm],
                  r == 2 ? "op-by-op launches" : "fetched windows, two in flight");
    }
    for (int r = 0; r < 4; r++) outcome_free(&o[r]);
    tg_plan_free(&p);
}

TG_TEST(test_gpu_grad_accumulation_classify_matches_cpu) { cuda_matches_cpu(0); }
TG_TEST(test_gpu_grad_accumulation_lm_matches_cpu) { cuda_matches_cpu(1); }
TG_TEST(test_gpu_grad_accumulation_mlm_matches_cpu) { cuda_matches_cpu(TASK_MLM); }

/* Two data-parallel replicas (one GPU each, NCCL) of windows of 2 micro-batches of 2 rows
 * against one replica of batch 8 (classification: each replica's window counts as many
 * rows), fp32 within 1e-5; the replicas' gradients summed once a window. */
typedef struct replica {
    const tg_plan *plan;
    accum_run run;
    int ok;
    outcome out;
} replica;

static void *run_replica(void *arg) {
    replica *r = arg;
    r->ok = train(r->plan, &r->run, 4, &r->out);
    return NULL;
}

TG_TEST(test_gpu_grad_accumulation_data_parallel) {
    if (tg_cuda_device_count() < 2) {
        printf("    2 replicas not run: %d GPU(s)\n", tg_cuda_device_count());
        return;
    }
    const accum_job dp_job = {0, 2, 2, 4, TG_PREC_FP32, 0, 2}, large_job = {0, 8, 1, 4, TG_PREC_FP32, 0, 1};
    tg_plan dp, large;
    if (!compile_accum(&dp_job, &dp) || !compile_accum(&large_job, &large)) return;
    void *comms[2] = {NULL, NULL};
    tg_err err;
    REQUIRE(tg_cuda_comms_create(comms, 2, &err) == 0, "%s", err.msg);
    replica r[2];
    memset(r, 0, sizeof r);
    pthread_t th[2];
    for (int k = 0; k < 2; k++) {
        r[k].plan = &dp, r[k].run = (accum_run){TG_DEVICE_CUDA, 0, 2, k, comms[k]};
        REQUIRE(pthread_create(&th[k], NULL, run_replica, &r[k]) == 0, "pthread_create");
    }
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    tg_cuda_comms_destroy(comms, 2);
    const accum_run one = {TG_DEVICE_CUDA, 0, 2, 0, NULL};
    outcome b = {0};
    if (CHECK(r[0].ok && r[1].ok, "a replica failed") && train(&large, &one, 4, &b)) {
        /* Replica 0 reports its own window's loss: the parameters and state are compared. */
        memcpy(r[0].out.loss, b.loss, sizeof b.loss);
        check_close(&dp, "2 replicas x 2 micro-batches x 2 rows against batch 8", &r[0].out, &b, 4, 1e-5);
        CHECK(!memcmp(r[0].out.params, r[1].out.params, sizeof(float) * (size_t)b.n), "the replicas' parameters differ");
    }
    outcome_free(&r[0].out), outcome_free(&r[1].out), outcome_free(&b);
    tg_plan_free(&dp), tg_plan_free(&large);
}
