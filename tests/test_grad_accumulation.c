/* Gradient accumulation (job key grad_accumulation = N): a step of N micro-batches of B rows
 * updates the weights as one step on a batch of N * B rows made of the same examples would
 * (fp32, within 1e-5), for classification (a mean over rows), LM (a mean over the window's
 * label tokens, micro-batches holding different counts of them), masked LM (a mean over the
 * window's masked positions, each micro-batch masked as its rows are in the large batch)
 * and question answering (each side of the span loss a mean over its counted rows); an epoch's last,
 * short window is updated on what it has; steps, checkpoints and resumes count windows; the
 * job key, the compile refusals and the plan field. */
#include <dirent.h>
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "plan/memory_estimate.h"
#include "plan/plan_codec.h"
#include "plan/validate.h"
#include "runtime/comm.h"
#include "runtime/cpu/cpu_kernels.h"
#include "runtime/trainer.h"
#include "datasets/convert.h"
#include "datasets/shard_format.h"
#include "runtime/cpu/cpu_exec.h"
#include "tests/byte_encoder.h"
#include "tests/cli_in_process.h"
#include "tests/harness.h"
#include "tests/text_fixtures.h"

/* A demo job (classify or lm) with batch rows a micro-batch, `accum` micro-batches a step,
 * dropout off (a window's micro-batches draw other masks than one large batch does), and
 * n_extra more settings. */
static int compile_job(int lm, int batch, int accum, const char *const *extra, int n_extra, tg_plan *p) {
    tg_err err;
    tg_job job;
    char b[32], a[32];
    snprintf(b, sizeof b, "batch=%d", batch);
    snprintf(a, sizeof a, "grad_accumulation=%d", accum);
    const char *sets[10] = {b, a};
    for (int k = 0; k < n_extra && k < 8; k++) sets[2 + k] = extra[k];
    const char *path = lm ? "examples/demo-lm.job" : "examples/demo-classify.job";
    if (!CHECK(tg_job_load(path, sets, 2 + n_extra, &job, &err) == 0, "%s", err.msg)) return 0;
    tg_model_config cfg;
    if (!CHECK(tg_model_config_load(job.model, &cfg, &err) == 0, "%s", err.msg)) return 0;
    cfg.hidden_dropout = cfg.attention_dropout = cfg.embedding_dropout = cfg.classifier_dropout = 0;
    return CHECK(tg_compile_with_config(&job, &cfg, p, &err) == 0, "%s", err.msg);
}

static int open_trainer(tg_trainer *tr, const tg_plan *p, tg_err *err) {
    tg_trainer_options o = {.device = tg_test_device(), .threads = 1, .load_data = 1};
    return tg_trainer_open(tr, p, &o, err);
}

/* What a run leaves: every parameter and the optimizer state, and each step's loss. */
typedef struct outcome {
    float *params, *m, *v;
    int64_t n_params, n_state;
    float loss[64];
    int steps;
    int32_t total_steps;
} outcome;

static void outcome_free(outcome *o) {
    free(o->params), free(o->m), free(o->v);
    memset(o, 0, sizeof *o);
}

static int read_state(tg_trainer *tr, outcome *o, tg_err *err) {
    const tg_plan *p = tr->plan;
    o->n_params = tg_tensor_numel(&p->tensors[p->io.params_all]);
    o->n_state = tg_tensor_numel(&p->tensors[p->io.m_all]);
    o->params = malloc(sizeof(float) * (size_t)o->n_params);
    o->m = malloc(sizeof(float) * (size_t)o->n_state);
    o->v = malloc(sizeof(float) * (size_t)o->n_state);
    if (!o->params || !o->m || !o->v) return tg_fail(err, "out of memory");
    return tg_trainer_read(tr, p->io.params_all, o->params, err) || tg_trainer_read(tr, p->io.m_all, o->m, err) ||
                   tg_trainer_read(tr, p->io.v_all, o->v, err)
               ? -1
               : 0;
}

/* Trains `steps` steps (0: the whole run) and reads the state. */
static int train(const tg_plan *p, int steps, outcome *o) {
    memset(o, 0, sizeof *o);
    tg_err err;
    tg_trainer tr;
    if (!CHECK(open_trainer(&tr, p, &err) == 0, "%s", err.msg)) return 0;
    o->total_steps = tr.total_steps;
    if (steps <= 0) steps = tr.total_steps;
    int ok = 1;
    for (int s = 0; s < steps && ok; s++) {
        tg_step_stats st;
        ok = CHECK(tg_trainer_step(&tr, &st, &err) == 0, "step %d: %s", s + 1, err.msg);
        if (ok && s < 64) o->loss[s] = st.loss;
        ok = ok && CHECK(st.step == s + 1, "step %d reported as %d", s + 1, st.step);
    }
    o->steps = steps;
    ok = ok && CHECK(read_state(&tr, o, &err) == 0, "%s", err.msg);
    tg_trainer_close(&tr);
    return ok;
}

/* ||a - b|| / ||b|| over n elements: how far apart two fp32 results are. Element by element
 * the relative difference says little: a gradient element that sums terms of both signs
 * cancels, and the order in which its micro-batches are added moves its last bits (the
 * same as any change of the reduction order, other thread counts or kernels). */
static double rel_diff(const float *a, const float *b, int64_t n) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        const double x = (double)a[i] - (double)b[i];
        d += x * x, s += (double)b[i] * (double)b[i];
    }
    return s > 0 ? sqrt(d / s) : sqrt(d);
}

/* The elements of parameter x whose gradient is 0 in exact arithmetic: the attention key
 * biases (a constant added to every score of a query's row, which its softmax ignores),
 * and in qa plans the span head's bias and the last LayerNorm's bias (a constant added to
 * every token's start or end logit, which the span loss's softmax over tokens ignores, as
 * tests/test_golden.c's shift_invariant). What fp32 leaves of their gradient is rounding
 * noise, which AdamW scales to full-size steps whatever its size, so they differ between
 * any two reduction orders. [*from, *to). */
static void key_bias_elements(const tg_plan *p, const tg_tensor *x, int64_t *from, int64_t *to) {
    const int64_t n = tg_tensor_numel(x);
    *from = *to = 0;
    char last_norm[96];
    snprintf(last_norm, sizeof last_norm, "encoder.layer.%d.output.LayerNorm.bias", p->model.layers - 1);
    if (strstr(x->name, "attention.self.key.bias")) *to = n;
    else if (p->train.task == TG_TASK_QA && (strstr(x->name, "qa_outputs.bias") || strstr(x->name, last_norm))) *to = n;
    else if (strstr(x->name, "attn.c_attn.bias")) *from = n / 3, *to = 2 * n / 3; /* GPT-2: [query | key | value] */
}

/* rel_diff over elements [0, n) less [from, to). */
static double rel_diff_outside(const float *a, const float *b, int64_t n, int64_t from, int64_t to) {
    const double head = rel_diff(a, b, from), tail = rel_diff(a + to, b + to, n - to);
    return head > tail ? head : tail;
}

/* Every trainable parameter, and its AdamW m and v (laid out as the parameters), of run a
 * within tol of run b, tensor by tensor (key biases aside); and each step's loss. */
static void check_same(const tg_plan *p, const char *what, const outcome *a, const outcome *b, double tol) {
    REQUIRE(a->n_params == b->n_params && a->n_state == b->n_state && a->n_state == a->n_params,
            "%s: state sizes differ", what);
    int tensors = 0;
    for (int t = 0; t < p->n_tensors; t++) {
        const tg_tensor *x = &p->tensors[t];
        if (!(x->flags & TG_TENSOR_PARAM) || (x->flags & TG_TENSOR_VIEW)) continue;
        const int64_t at = (int64_t)(x->offset / 4), n = tg_tensor_numel(x);
        int64_t from, to;
        key_bias_elements(p, x, &from, &to);
        if (from == 0 && to == n) continue;
        const double dp = rel_diff_outside(a->params + at, b->params + at, n, from, to),
                     dm = rel_diff_outside(a->m + at, b->m + at, n, from, to),
                     dv = rel_diff_outside(a->v + at, b->v + at, n, from, to);
        CHECK(dp <= tol && dm <= tol && dv <= tol, "%s: %s differs by %.3g (parameter), %.3g (m), %.3g (v) relative",
              what, x->name, dp, dm, dv);
        tensors++;
    }
    CHECK(tensors > 10, "%s: %d parameters compared", what, tensors);
    for (int s = 0; s < a->steps && s < b->steps && s < 64; s++)
        CHECK(fabs((double)a->loss[s] - (double)b->loss[s]) <= tol * fmax(1.0, fabs((double)b->loss[s])),
              "%s: step %d loss %.9g, the large batch's %.9g", what, s + 1, a->loss[s], b->loss[s]);
}

/* N = 4 micro-batches of B rows against one batch of 4B rows, several steps. */
static void accumulated_matches_large_batch(int lm, int micro_batch, int steps) {
    char st[32];
    snprintf(st, sizeof st, "steps=%d", steps);
    const char *extra[] = {st, "warmup_steps=2"};
    tg_plan small, large;
    if (!compile_job(lm, micro_batch, 4, extra, 2, &small) || !compile_job(lm, 4 * micro_batch, 1, extra, 2, &large))
        return;
    outcome a, b;
    if (train(&small, 0, &a) && train(&large, 0, &b)) {
        CHECK(a.total_steps == steps && b.total_steps == steps, "total steps %d and %d", a.total_steps, b.total_steps);
        check_same(&small, lm ? "lm, 4 x B against 4B" : "classify, 4 x B against 4B", &a, &b, 1e-5);
    }
    outcome_free(&a), outcome_free(&b);
    tg_plan_free(&small), tg_plan_free(&large);
}

TG_TEST(test_grad_accumulation_classify_matches_large_batch) { accumulated_matches_large_batch(0, 4, 5); }

/* The LM rows are of different lengths: each micro-batch counts other numbers of label
 * tokens, so only the window's count (io.loss_norm) gives the large batch's mean. */
TG_TEST(test_grad_accumulation_lm_matches_large_batch) { accumulated_matches_large_batch(1, 3, 4); }

/* The micro-batches' token counts differ in the LM case above (what makes it a test of the
 * normaliser): the first window's four micro-batches do not all hold as many label tokens. */
TG_TEST(test_grad_accumulation_lm_window_counts_differ) {
    const char *extra[] = {"steps=2"};
    tg_plan p;
    if (!compile_job(1, 3, 4, extra, 1, &p)) return;
    tg_err err;
    tg_trainer tr;
    REQUIRE(open_trainer(&tr, &p, &err) == 0, "%s", err.msg);
    tg_trainer_next_batch(&tr);
    const size_t image = p.pool_bytes[TG_POOL_INPUTS];
    const tg_tensor *labels = &p.tensors[p.io.labels];
    int64_t counts[4] = {0}, total = 0;
    for (int m = 0; m < 4; m++) {
        const int32_t *l = (const int32_t *)(tr.staging[tr.cur] + (size_t)m * image + labels->offset);
        for (int64_t i = 0; i < tg_tensor_numel(labels); i++) counts[m] += l[i] != TG_IGNORE_INDEX;
        total += counts[m];
    }
    int differ = 0;
    for (int m = 1; m < 4; m++) differ |= counts[m] != counts[0];
    CHECK(differ, "the window's micro-batches all count %lld label tokens", (long long)counts[0]);
    for (int m = 0; m < 4; m++) {
        const float norm = *(const float *)(tr.staging[tr.cur] + (size_t)m * image + p.tensors[p.io.loss_norm].offset);
        CHECK(norm == (float)total, "micro-batch %d: loss_norm %g, the window counts %lld", m, norm, (long long)total);
    }
    tg_trainer_close(&tr);
    tg_plan_free(&p);
}

/* A training set of `n` classification examples of varied lengths, written to the test
 * folder; returns its path. */
static const char *write_examples(int n) {
    static char path[600];
    snprintf(path, sizeof path, "%s/accum-train.jsonl", tg_test_tmpdir());
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    for (int i = 0; i < n; i++) {
        fprintf(f, "{\"input_ids\":[1");
        for (int t = 0; t < 3 + (i * 7) % 11; t++) fprintf(f, ",%d", 4 + (i * 13 + t * 5) % 120);
        fprintf(f, ",2],\"label\":%d}\n", (i * 5) % 3 == 0);
    }
    fclose(f);
    return path;
}

/* 22 examples in micro-batches of 2: 11 batches an epoch, so windows of 4 make 3 steps (4,
 * 4 and 3 batches; the last one updated on its 3), exactly as batches of 8 do (8, 8 and 6
 * rows): two epochs of each train alike, and count 6 steps. */
TG_TEST(test_grad_accumulation_epoch_last_window) {
    const char *path = write_examples(22);
    REQUIRE(path, "cannot write the examples");
    char data[700];
    snprintf(data, sizeof data, "train_data=%s", path);
    const char *extra[] = {data, "epochs=2", "warmup_steps=1"};
    tg_plan small, large;
    if (!compile_job(0, 2, 4, extra, 3, &small) || !compile_job(0, 8, 1, extra, 3, &large)) return;
    outcome a, b;
    if (train(&small, 0, &a) && train(&large, 0, &b)) {
        CHECK(a.total_steps == 6 && b.total_steps == 6, "total steps %d and %d, want 6", a.total_steps, b.total_steps);
        check_same(&small, "two epochs of 11 batches in windows of 4 against batches of 8", &a, &b, 1e-5);
    }
    outcome_free(&a), outcome_free(&b);
    /* Windows of 3 over 11 batches: 4 steps an epoch (3, 3, 3 and 2 batches). */
    tg_plan three;
    if (compile_job(0, 2, 3, extra, 3, &three)) {
        tg_err err;
        tg_trainer tr;
        REQUIRE(open_trainer(&tr, &three, &err) == 0, "%s", err.msg);
        CHECK(tr.total_steps == 8, "2 epochs of windows of 3 over 11 batches: %d steps, want 8", tr.total_steps);
        tg_trainer_close(&tr);
        tg_plan_free(&three);
    }
    tg_plan_free(&small), tg_plan_free(&large);
}

/* A run resumed from a checkpoint taken after step 3 of 6 ends where the uninterrupted run
 * ends, bit for bit. */
TG_TEST(test_grad_accumulation_resume_matches_uninterrupted) {
    const char *extra[] = {"steps=6", "warmup_steps=2"};
    tg_plan p;
    if (!compile_job(1, 3, 3, extra, 2, &p)) return;
    outcome whole;
    if (!train(&p, 0, &whole)) return;
    tg_err err;
    tg_trainer tr;
    REQUIRE(open_trainer(&tr, &p, &err) == 0, "%s", err.msg);
    tg_step_stats st;
    for (int s = 0; s < 3; s++) REQUIRE(tg_trainer_step(&tr, &st, &err) == 0, "%s", err.msg);
    tg_checkpoint ck;
    REQUIRE(tg_trainer_checkpoint(&tr, &ck, 1, &err) == 0, "%s", err.msg);
    tg_trainer_close(&tr);
    REQUIRE(open_trainer(&tr, &p, &err) == 0, "%s", err.msg);
    REQUIRE(tg_trainer_restore(&tr, &ck, "ck", &err) == 0, "%s", err.msg);
    tg_checkpoint_free(&ck);
    outcome resumed = {0};
    int ok = 1;
    for (int s = 3; s < 6 && ok; s++) {
        ok = CHECK(tg_trainer_step(&tr, &st, &err) == 0, "%s", err.msg);
        if (ok) resumed.loss[s] = st.loss;
        CHECK(!ok || st.step == s + 1, "resumed step %d reported as %d", s + 1, st.step);
    }
    if (ok && CHECK(read_state(&tr, &resumed, &err) == 0, "%s", err.msg)) {
        CHECK(!memcmp(resumed.params, whole.params, sizeof(float) * (size_t)whole.n_params) &&
                  !memcmp(resumed.m, whole.m, sizeof(float) * (size_t)whole.n_state) &&
                  !memcmp(resumed.v, whole.v, sizeof(float) * (size_t)whole.n_state),
              "the resumed run's weights or state differ from the uninterrupted run's");
        for (int s = 3; s < 6; s++)
            CHECK(resumed.loss[s] == whole.loss[s], "step %d: loss %.9g resumed, %.9g uninterrupted", s + 1,
                  resumed.loss[s], whole.loss[s]);
    }
    tg_trainer_close(&tr);
    outcome_free(&resumed), outcome_free(&whole);
    /* A checkpoint of windows of 3 does not resume a plan of windows of 2. */
    tg_plan other;
    if (compile_job(1, 3, 2, extra, 2, &other)) {
        REQUIRE(open_trainer(&tr, &p, &err) == 0, "%s", err.msg);
        REQUIRE(tg_trainer_step(&tr, &st, &err) == 0, "%s", err.msg);
        REQUIRE(tg_trainer_checkpoint(&tr, &ck, 1, &err) == 0, "%s", err.msg);
        tg_trainer_close(&tr);
        REQUIRE(open_trainer(&tr, &other, &err) == 0, "%s", err.msg);
        const int rc = tg_trainer_restore(&tr, &ck, "ck", &err);
        CHECK(rc == -1 && strstr(err.msg, "grad_accumulation: 3 in the checkpoint, 2 now"), "restore: %d '%s'", rc,
              rc ? err.msg : "");
        tg_trainer_close(&tr);
        tg_checkpoint_free(&ck);
        tg_plan_free(&other);
    }
    tg_plan_free(&p);
}

/* The trainer stops for checkpoints at multiples of checkpoint_every windows: with
 * checkpoint_every 2, no start runs past step 2 before step 2 is handed out. */
TG_TEST(test_grad_accumulation_checkpoint_cadence_counts_windows) {
    const char *extra[] = {"steps=5", "checkpoint_every=2"};
    tg_plan p;
    if (!compile_job(0, 2, 3, extra, 2, &p)) return;
    tg_err err;
    tg_trainer tr;
    REQUIRE(open_trainer(&tr, &p, &err) == 0, "%s", err.msg);
    CHECK(tr.total_steps == 5 && tr.checkpoint_every == 2, "total %d, every %d", tr.total_steps, tr.checkpoint_every);
    for (int s = 0; s < 5; s++) {
        tg_step_stats st;
        REQUIRE(tg_trainer_step(&tr, &st, &err) == 0, "%s", err.msg);
        CHECK(st.step == s + 1 && tr.launched <= (tr.returned / 2 + 1) * 2, "step %d: launched %lld, returned %lld",
              st.step, (long long)tr.launched, (long long)tr.returned);
        /* A step's statistics count the window's rows: 3 micro-batches of 2 rows of 48 slots. */
        CHECK(st.slots == 3 * 2 * 48, "step %d: %lld slots", st.step, (long long)st.slots);
    }
    tg_trainer_close(&tr);
    tg_plan_free(&p);
}

static int validate_all(const tg_plan *p, tg_err *err) {
    return tg_plan_validate_tables(p, "p", err) || tg_plan_validate_ops(p, "p", err) ? -1 : 0;
}

/* The job key: 1..1024, an integer, default 1; the compile refusals beside data_parallel
 * and seq_buckets; and the plan's schedule (N = 1 unchanged, N > 1: no first-writer
 * overwrites, no fused bias sums, the gradients cleared after the update). */
TG_TEST(test_grad_accumulation_job_key_and_plan) {
    static const struct {
        const char *set, *want;
    } bad[] = {
        {"grad_accumulation=0", "--set grad_accumulation=0: key 'grad_accumulation': 0 is out of range (must be 1..1024"},
        {"grad_accumulation=1025", "key 'grad_accumulation': 1025 is out of range (must be 1..1024"},
        {"grad_accumulation=two", "key 'grad_accumulation': 'two' is not an integer"},
        {"grad_accumulation=2.5", "key 'grad_accumulation': '2.5' is not an integer"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        tg_job job;
        tg_err err = {{0}};
        const int rc = tg_job_load("examples/demo-classify.job", &bad[k].set, 1, &job, &err);
        CHECK(rc == -1 && strstr(err.msg, bad[k].want), "%s: %d '%s'", bad[k].set, rc, err.msg);
    }
    tg_job job;
    tg_err err;
    REQUIRE(tg_job_load("examples/demo-classify.job", NULL, 0, &job, &err) == 0, "%s", err.msg);
    CHECK(job.grad_accumulation == 1, "default %d", job.grad_accumulation);
    const char *refused[][2] = {{"seq_buckets=16,48", "with seq_buckets is not supported yet"}};
    for (int k = 0; k < 1; k++) {
        const char *sets[] = {"grad_accumulation=2", refused[k][0]};
        tg_plan p;
        REQUIRE(tg_job_load("examples/demo-classify.job", sets, 2, &job, &err) == 0, "%s", err.msg);
        const int rc = tg_compile(&job, &p, &err);
        CHECK(rc == -1 && strstr(err.msg, "--set: key 'grad_accumulation': grad_accumulation 2 ") &&
                  strstr(err.msg, refused[k][1]),
              "%s: %d '%s'", refused[k][0], rc, err.msg);
        if (rc == 0) tg_plan_free(&p);
    }
    /* The schedules. */
    tg_plan one, four;
    /* The gradients apart in both, so that the pools compare (an accumulation window never
     * shares them: checked below). */
    const char *extra[] = {"steps=2", "share_grad_memory=false"};
    if (!compile_job(0, 4, 1, extra, 2, &one) || !compile_job(0, 4, 4, extra, 2, &four)) return;
    tg_plan shared_four;
    if (compile_job(0, 4, 4, extra, 1, &shared_four)) {
        CHECK(!shared_four.grads_share_activations, "an accumulation window shares its gradients");
        tg_plan_free(&shared_four);
    }
    CHECK(one.train.grad_accumulation == 1 && one.io.loss_norm == -1, "N = 1: %d, loss_norm %d",
          one.train.grad_accumulation, one.io.loss_norm);
    CHECK(four.train.grad_accumulation == 4 && four.io.loss_norm >= 0 &&
              four.tensors[four.io.loss_norm].pool == TG_POOL_INPUTS,
          "N = 4: %d, loss_norm %d", four.train.grad_accumulation, four.io.loss_norm);
    int overwrites = 0, fused_bias = 0, grad_zeros = 0, ce_norm = 0;
    for (int o = 0; o < four.n_ops; o++) {
        const tg_op *op = &four.ops[o];
        overwrites += (op->kind == TG_OP_MATMUL && op->out[0] >= 0 &&
                       four.tensors[op->out[0]].pool == TG_POOL_GRADS && !op->p.matmul.accumulate) ||
                      (op->kind == TG_OP_BIAS_GRAD && op->p.bias_grad.overwrite) ||
                      (op->kind == TG_OP_LAYERNORM_BWD && op->p.layernorm_bwd.overwrite) ||
                      (op->kind == TG_OP_RESIDUAL_LAYERNORM_BWD && op->p.residual_layernorm_bwd.overwrite);
        fused_bias += (op->kind == TG_OP_MATMUL && op->p.matmul.bias_grad) || (op->kind == TG_OP_GELU_BWD && op->out[1] >= 0);
        if (op->kind == TG_OP_ZERO && op->out[0] >= 0 && four.tensors[op->out[0]].pool == TG_POOL_GRADS) {
            grad_zeros++;
            CHECK(op->out[0] == four.io.grads_all && o == four.n_ops - 1 && op->phase == TG_PHASE_OPTIMIZER,
                  "op %d clears %s in phase %d", o, four.tensors[op->out[0]].name, op->phase);
        }
        if (op->kind == TG_OP_CROSS_ENTROPY) ce_norm += op->in[2] == four.io.loss_norm;
        if (op->kind == TG_OP_CROSS_ENTROPY_BWD) ce_norm += op->in[3] == four.io.loss_norm;
    }
    CHECK(overwrites == 0 && fused_bias == 0 && grad_zeros == 1 && ce_norm == 2,
          "N = 4: %d overwriting gradient writers, %d fused bias sums, %d gradient clears, %d losses normalised",
          overwrites, fused_bias, grad_zeros, ce_norm);
    /* N = 1 keeps its first-writer overwrites (and no clear in the optimizer phase). */
    int one_overwrites = 0;
    for (int o = 0; o < one.n_ops; o++) {
        const tg_op *op = &one.ops[o];
        one_overwrites += op->kind == TG_OP_MATMUL && !op->p.matmul.accumulate && op->out[0] >= 0 &&
                          one.tensors[op->out[0]].pool == TG_POOL_GRADS;
        CHECK(op->kind != TG_OP_ZERO || op->phase == TG_PHASE_BACKWARD, "N = 1: a zero in phase %d", op->phase);
        CHECK(op->kind != TG_OP_CROSS_ENTROPY || op->in[2] == -1, "N = 1: the loss reads a normaliser");
    }
    CHECK(one_overwrites > 0, "N = 1 lost its first-writer overwrites");
    /* The same pools (activations for one micro-batch); the staging the preflight counts
     * holds a window: 4 images of the inputs pool where N = 1 has one. */
    CHECK(one.pool_bytes[TG_POOL_ACTIVATIONS] == four.pool_bytes[TG_POOL_ACTIVATIONS] &&
              one.pool_bytes[TG_POOL_GRADS] == four.pool_bytes[TG_POOL_GRADS],
          "activations %llu and %llu bytes", (unsigned long long)one.pool_bytes[TG_POOL_ACTIVATIONS],
          (unsigned long long)four.pool_bytes[TG_POOL_ACTIVATIONS]);
    for (int device = 0; device < 2; device++) {
        tg_memory_estimate e1, e4;
        tg_estimate_memory(&one, device, &e1);
        tg_estimate_memory(&four, device, &e4);
        const uint64_t in1 = one.pool_bytes[TG_POOL_INPUTS], in4 = four.pool_bytes[TG_POOL_INPUTS];
        CHECK(device ? e4.part[TG_MEM_BATCH_STAGING] >= TG_MEM_STAGING_SLOTS * 4 * in4 &&
                           e1.part[TG_MEM_BATCH_STAGING] < TG_MEM_STAGING_SLOTS * 2 * in1
                     : e4.part[TG_MEM_BATCH_STAGING] == TG_MEM_CPU_STAGING_BUFFERS * 4 * in4 &&
                           e1.part[TG_MEM_BATCH_STAGING] == TG_MEM_CPU_STAGING_BUFFERS * in1,
              "%s: staging %llu bytes (N = 4), %llu (N = 1); inputs %llu and %llu", device ? "cuda" : "cpu",
              (unsigned long long)e4.part[TG_MEM_BATCH_STAGING], (unsigned long long)e1.part[TG_MEM_BATCH_STAGING],
              (unsigned long long)in4, (unsigned long long)in1);
    }

    /* Round trip through the plan payload, and validate's refusals of a damaged field. */
    uint8_t *payload = NULL;
    size_t len = 0;
    REQUIRE(tg_plan_payload_encode(&four, &payload, &len, &err) == 0, "%s", err.msg);
    tg_plan back;
    memset(&back, 0, sizeof back);
    REQUIRE(tg_plan_payload_decode(payload, len, "p", TG_PLAN_CHECK_ALL, &back, &err) == 0, "%s", err.msg);
    CHECK(back.train.grad_accumulation == 4 && back.io.loss_norm == four.io.loss_norm, "decoded %d, loss_norm %d",
          back.train.grad_accumulation, back.io.loss_norm);
    tg_plan_free(&back);
    free(payload);
    const int norm = four.io.loss_norm;
    four.io.loss_norm = -1;
    CHECK(validate_all(&four, &err) == -1 && strstr(err.msg, "io loss_norm is required"), "no loss_norm: %s",
          err.msg);
    four.io.loss_norm = norm;
    four.train.grad_accumulation = 1;
    CHECK(validate_all(&four, &err) == -1 &&
              strstr(err.msg, "io loss_norm is tensor") && strstr(err.msg, "grad_accumulation is 1"),
          "loss_norm without accumulation: %s", err.msg);
    four.train.grad_accumulation = 4, four.train.n_buckets = 2, four.train.bucket_seq[1] = four.train.seq,
    four.train.bucket_seq[0] = 8;
    CHECK(validate_all(&four, &err) == -1 && strstr(err.msg, "train grad_accumulation 4 with n_buckets 2"),
          "buckets: %s", err.msg);
    four.train.n_buckets = 1, four.train.bucket_seq[0] = four.train.seq, four.train.bucket_seq[1] = 0;
    CHECK(validate_all(&four, &err) == 0, "restored: %s", err.msg);
    tg_plan_free(&one), tg_plan_free(&four);
}

/* Lines of a metrics file holding "step", and the checkpoint folders of dir (step-N). */
static int count_step_lines(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char buf[8192];
    int n = 0;
    while (fgets(buf, sizeof buf, f)) n += strstr(buf, "\"step\":") != NULL && !strstr(buf, "\"summary\"");
    fclose(f);
    return n;
}

/* The CLI: a run of windows of 3 counts and logs optimizer steps, checkpoints every 2 of
 * them, names the micro-batches and the steps per epoch, and evaluates at the end (each eval
 * batch its own mean: the eval's batches are not windows). */
TG_TEST(test_grad_accumulation_cli_run) {
    const char *dir = tg_test_tmpdir();
    char line[1600], metrics[600], ckpt[600];
    snprintf(metrics, sizeof metrics, "%s/accum-m.jsonl", dir);
    snprintf(ckpt, sizeof ckpt, "%s/accum-ckpt", dir);
    snprintf(line, sizeof line,
             "run examples/demo-classify.job --device cpu --set steps=5 --set batch=4 --set seq=16 "
             "--set grad_accumulation=3 --set checkpoint_every=2 --set keep_checkpoints=0 --checkpoint-dir %s "
             "--metrics %s",
             ckpt, metrics);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 0 && r.err && strstr(r.err, ", 3 micro-batches a step") &&
              strstr(r.err, ", 5 steps (167 per epoch, last batch: pad)") && strstr(r.err, "eval on 400 examples: loss "),
          "status %d: %s", r.status, r.err ? r.err : "");
    CHECK(count_step_lines(metrics) == 5, "%d step lines in the metrics", count_step_lines(metrics));
    int folders = 0;
    DIR *d = opendir(ckpt);
    for (struct dirent *e; d && (e = readdir(d));) folders += !strncmp(e->d_name, "step-", 5);
    if (d) closedir(d);
    CHECK(folders == 2, "%d checkpoints (want steps 2 and 4)", folders);
    tg_cli_run_free(&r);
}

/* Data parallelism: 2 replicas of windows of 2 micro-batches of 2 rows train as one replica
 * of batch 8 (classification: every replica's window counts as many rows), the replicas'
 * gradients summed once a window, first in the optimizer phase. */
typedef struct replica {
    const tg_plan *plan;
    void *comm;
    int rank, ok;
    outcome out;
    char msg[512];
} replica;

static void *run_replica(void *arg) {
    replica *r = arg;
    tg_err err = {{0}};
    tg_trainer tr;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1, .rank = r->rank, .comm = r->comm};
    if (tg_trainer_open(&tr, r->plan, &o, &err)) {
        snprintf(r->msg, sizeof r->msg, "rank %d: %s", r->rank, err.msg);
        return NULL;
    }
    int ok = 1;
    for (int s = 0; s < tr.total_steps && ok; s++) {
        tg_step_stats st;
        ok = tg_trainer_step(&tr, &st, &err) == 0;
        if (ok && s < 64) r->out.loss[s] = st.loss;
    }
    r->out.steps = tr.total_steps;
    ok = ok && read_state(&tr, &r->out, &err) == 0;
    if (!ok) snprintf(r->msg, sizeof r->msg, "rank %d: %s", r->rank, err.msg);
    r->ok = ok;
    tg_trainer_close(&tr);
    return NULL;
}

TG_TEST(test_grad_accumulation_data_parallel) {
    const char *extra[] = {"steps=4", "data_parallel=2"}, *one[] = {"steps=4"};
    tg_plan dp, large;
    if (!compile_job(0, 2, 2, extra, 2, &dp) || !compile_job(0, 8, 1, one, 1, &large)) return;
    int sums = 0;
    for (int o = 0; o < dp.n_ops; o++)
        if (dp.ops[o].kind == TG_OP_ALL_REDUCE) {
            sums++;
            CHECK(o == dp.phase_begin[TG_PHASE_OPTIMIZER] && dp.ops[o].in[0] == dp.io.grads_all,
                  "all_reduce at op %d (the optimizer phase begins at %d)", o, dp.phase_begin[TG_PHASE_OPTIMIZER]);
        }
    CHECK(sums == 1, "%d gradient sums", sums);
    tg_cpu_comm_group *group = NULL;
    tg_err err;
    REQUIRE(tg_cpu_comm_group_create(&group, 2, &err) == 0, "%s", err.msg);
    replica r[2];
    pthread_t th[2];
    memset(r, 0, sizeof r);
    for (int k = 0; k < 2; k++) {
        r[k].plan = &dp, r[k].comm = group, r[k].rank = k;
        REQUIRE(pthread_create(&th[k], NULL, run_replica, &r[k]) == 0, "pthread_create");
    }
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    tg_cpu_comm_group_destroy(group);
    outcome b = {0};
    if (CHECK(r[0].ok && r[1].ok, "%s %s", r[0].msg, r[1].msg) && train(&large, 0, &b)) {
        r[0].out.steps = 0; /* replica 0 reports its own window's loss (as without accumulation) */
        check_same(&dp, "2 replicas x 2 micro-batches x 2 rows against batch 8", &r[0].out, &b, 1e-5);
        CHECK(!memcmp(r[0].out.params, r[1].out.params, sizeof(float) * (size_t)b.n_params),
              "the replicas' parameters differ");
    }
    outcome_free(&r[0].out), outcome_free(&r[1].out), outcome_free(&b);
    tg_plan_free(&dp), tg_plan_free(&large);
}

/* CROSS_ENTROPY and its backward with the normaliser (in2, in3): a positive one divides the
 * summed loss (and scales the gradient) in place of the count of rows that count; 0 or an
 * absent one leaves that count. */
TG_TEST(test_grad_accumulation_cross_entropy_normaliser) {
    const float logits[3 * 2] = {0.5f, -1.0f, 2.0f, 0.25f, -0.5f, 1.5f};
    const int32_t labels[3] = {1, TG_IGNORE_INDEX, 0};
    float loss[3], dlogits[3][6];
    const float norms[3] = {0.0f, 8.0f, -1.0f};
    for (int k = 0; k < 3; k++) {
        tg_op op = tg_test_op(TG_OP_CROSS_ENTROPY);
        op.p.cross_entropy.n = 3, op.p.cross_entropy.c = 2;
        float norm = norms[k], one = 1.0f;
        tg_cpu_op_args a = {.op = &op, .in = {(void *)logits, (void *)labels, k == 2 ? NULL : &norm}, .out = {&loss[k]}};
        tg_cpu_op_run(&a);
        tg_op bwd = tg_test_op(TG_OP_CROSS_ENTROPY_BWD);
        bwd.p.cross_entropy = op.p.cross_entropy;
        tg_cpu_op_args b = {.op = &bwd, .in = {&one, (void *)logits, (void *)labels, k == 2 ? NULL : &norm},
                            .out = {dlogits[k]}};
        tg_cpu_op_run(&b);
    }
    /* Two rows count: the mean divides by 2, the normaliser 8 by 8. */
    CHECK(fabsf(loss[1] * 8.0f - loss[0] * 2.0f) <= 1e-6f * loss[0] && loss[2] == loss[0], "losses %.9g %.9g %.9g",
          loss[0], loss[1], loss[2]);
    for (int i = 0; i < 6; i++)
        CHECK(fabsf(dlogits[1][i] * 4.0f - dlogits[0][i]) <= 1e-7f && dlogits[2][i] == dlogits[0][i] &&
                  (i / 2 != 1 || dlogits[1][i] == 0.0f),
              "dlogits[%d]: %.9g %.9g %.9g", i, dlogits[0][i], dlogits[1][i], dlogits[2][i]);
}

/* The eval of a plan with accumulation is that of the same plan without: each eval batch
 * divides by its own count (the normaliser left 0), whatever a training window wrote. */
TG_TEST(test_grad_accumulation_eval_as_without) {
    const char *extra[] = {"steps=2"};
    tg_plan one, four;
    if (!compile_job(0, 8, 1, extra, 1, &one) || !compile_job(0, 8, 4, extra, 1, &four)) return;
    tg_err err;
    tg_eval_stats e[2];
    const tg_plan *plans[2] = {&one, &four};
    for (int k = 0; k < 2; k++) {
        tg_trainer tr;
        REQUIRE(open_trainer(&tr, plans[k], &err) == 0, "%s", err.msg);
        if (k) tg_trainer_next_batch(&tr); /* a window staged: its normaliser written */
        CHECK(tg_trainer_eval(&tr, &e[k], &err) == 0, "%s", err.msg);
        tg_trainer_close(&tr);
    }
    CHECK(e[0].loss == e[1].loss && e[0].accuracy == e[1].accuracy && e[0].counted == 400,
          "eval loss %.9g and %.9g, accuracy %g and %g, %lld counted", e[0].loss, e[1].loss, e[0].accuracy,
          e[1].accuracy, (long long)e[0].counted);
    tg_plan_free(&one), tg_plan_free(&four);
}

/* ---- mlm: the loss over the window's masked positions ----------------------------------- */

/* A masked-LM job on the LM demo's data (tiny BERT from scratch): batch rows a micro-batch,
 * accum micro-batches a step, dropout off. */
static int compile_mlm(int batch, int accum, const char *const *extra, int n_extra, tg_plan *p) {
    char b[32], a[32];
    snprintf(b, sizeof b, "batch=%d", batch);
    snprintf(a, sizeof a, "grad_accumulation=%d", accum);
    const char *sets[10] = {b, a};
    for (int k = 0; k < n_extra && k < 8; k++) sets[2 + k] = extra[k];
    tg_job job;
    tg_err err;
    if (!CHECK(tg_job_load("examples/demo-mlm.job", sets, 2 + n_extra, &job, &err) == 0, "%s", err.msg)) return 0;
    tg_model_config cfg;
    if (!CHECK(tg_model_config_load(job.model, &cfg, &err) == 0, "%s", err.msg)) return 0;
    cfg.hidden_dropout = cfg.attention_dropout = cfg.embedding_dropout = cfg.classifier_dropout = 0;
    return CHECK(tg_compile_with_config(&job, &cfg, p, &err) == 0, "%s", err.msg);
}

/* mlm: N = 2 and N = 4 micro-batches against one batch of N times the rows. Micro-batch k
 * masks its rows with the elements k x B x T on (io.mlm_stream), the masks those rows get
 * in the large batch, and every micro-batch divides by the masked positions of the whole
 * window (io.loss_norm, counted on the host with the masking op's own code), as HF's MLM
 * loss over the large batch's masked positions. */
TG_TEST(test_grad_accumulation_mlm_matches_large_batch) {
    static const int cases[][2] = {{4, 2}, {2, 4}}; /* micro-batch rows, micro-batches */
    const char *extra[] = {"steps=4", "warmup_steps=2"};
    for (int c = 0; c < 2; c++) {
        const int b = cases[c][0], n = cases[c][1];
        tg_plan small, large;
        if (!compile_mlm(b, n, extra, 2, &small) || !compile_mlm(b * n, 1, extra, 2, &large)) return;
        outcome x, y;
        char what[64];
        snprintf(what, sizeof what, "mlm, %d x %d rows against %d", n, b, n * b);
        if (train(&small, 0, &x) && train(&large, 0, &y)) check_same(&small, what, &x, &y, 1e-5);
        outcome_free(&x), outcome_free(&y);
        tg_plan_free(&small), tg_plan_free(&large);
    }
}

/* The masks of a window's micro-batches are the large batch's, row for row, and each
 * micro-batch is told the window's count of masked positions, which differs from micro-batch
 * to micro-batch. */
TG_TEST(test_grad_accumulation_mlm_window_masks) {
    const char *extra[] = {"steps=2"};
    tg_plan small, large;
    if (!compile_mlm(2, 4, extra, 1, &small) || !compile_mlm(8, 1, extra, 1, &large)) return;
    tg_err err;
    tg_trainer ts, tl;
    REQUIRE(open_trainer(&ts, &small, &err) == 0 && open_trainer(&tl, &large, &err) == 0, "%s", err.msg);
    tg_trainer_next_batch(&ts), tg_trainer_next_batch(&tl);
    /* Each micro-batch in turn through the masking op (op 0) in training mode. */
    const tg_op *mask = &small.ops[0];
    REQUIRE(mask->kind == TG_OP_MLM_MASK && large.ops[0].kind == TG_OP_MLM_MASK, "op 0 is not the masking op");
    const int64_t n = mask->p.mlm_mask.n;
    int32_t *want = malloc(sizeof(int32_t) * (size_t)(4 * n)), *got = malloc(sizeof(int32_t) * (size_t)n);
    REQUIRE(want && got, "out of memory");
    REQUIRE(tg_trainer_run(&tl, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 1, &err) == 0 &&
                tg_trainer_read(&tl, large.ops[0].out[1], want, &err) == 0,
            "%s", err.msg);
    const size_t image = small.pool_bytes[TG_POOL_INPUTS];
    float norm[4];
    for (int m = 0; m < 4; m++)
        norm[m] = *(const float *)(ts.staging[ts.cur] + (size_t)m * image + small.tensors[small.io.loss_norm].offset);
    int64_t counts[4] = {0}, total = 0;
    for (int m = 0; m < 4; m++) {
        /* Micro-batch m into the first image, where a run takes its inputs. */
        memcpy(ts.staging[ts.cur], ts.staging[ts.cur] + (size_t)m * image, image);
        if (!CHECK(tg_trainer_run(&ts, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 1, &err) == 0 &&
                       tg_trainer_read(&ts, mask->out[1], got, &err) == 0,
                   "%s", err.msg))
            break;
        CHECK(!memcmp(got, want + m * n, sizeof(int32_t) * (size_t)n), "micro-batch %d: labels differ from rows %d-%d "
              "of the large batch", m, 2 * m, 2 * m + 1);
        for (int64_t i = 0; i < n; i++) counts[m] += got[i] != TG_IGNORE_INDEX;
        total += counts[m];
    }
    for (int m = 0; m < 4; m++)
        CHECK(norm[m] == (float)total, "micro-batch %d: loss_norm %g, the window masks %lld", m, norm[m],
              (long long)total);
    CHECK(total > 0 && (counts[0] != counts[1] || counts[1] != counts[2] || counts[2] != counts[3]),
          "masked positions per micro-batch %lld %lld %lld %lld", (long long)counts[0], (long long)counts[1],
          (long long)counts[2], (long long)counts[3]);
    free(want), free(got);
    tg_trainer_close(&ts), tg_trainer_close(&tl);
    tg_plan_free(&small), tg_plan_free(&large);
}

/* ---- qa: the span loss over the window's rows ------------------------------------------ */

/* The tiny SQuAD v2 fixture (tests/text_fixtures.h) converted at seq 20 with the byte-level
 * stand-in tokenizer into the test folder, once; its training rows in *rows. */
static const char *qa_data(int32_t *rows) {
    static char out[700];
    static int32_t n;
    if (n) return *rows = n, out;
    char squad[700];
    snprintf(squad, sizeof squad, "%s/accum-squad.json", tg_test_tmpdir());
    snprintf(out, sizeof out, "%s/accum-squad", tg_test_tmpdir());
    if (tg_test_write_file(squad, tg_test_squad_v2)) return NULL;
    byte_encoder be;
    tg_text_encoder enc = byte_encoder_make(&be, TG_TOKENIZER_WORDPIECE);
    const char *inputs[] = {squad};
    tg_convert_options o = {.inputs = inputs, .n_inputs = 1, .outdir = out, .format = TG_INPUT_SQUAD, .seq = 20,
                            .doc_stride = 4, .seed = 3, .command = "test"};
    tg_convert_report rep;
    tg_err err = {{0}};
    const int rc = tg_convert(&o, &enc, &rep, &err);
    byte_encoder_free(&be);
    if (!CHECK(rc == 0, "%s", err.msg)) return NULL;
    n = (int32_t)rep.records[TG_SPLIT_TRAIN];
    return *rows = n, out;
}

static const char qa_model[] =
    "{\"architectures\": [\"BertForQuestionAnswering\"], \"model_type\": \"bert\", \"vocab_size\": 261, "
    "\"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 37, "
    "\"max_position_embeddings\": 40, \"type_vocab_size\": 2, \"hidden_act\": \"gelu\", \"layer_norm_eps\": 1e-12, "
    "\"initializer_range\": 0.02, \"hidden_dropout_prob\": 0.0, \"attention_probs_dropout_prob\": 0.0, "
    "\"pad_token_id\": 0}";

/* A qa job on the converted fixture: batch rows a micro-batch, accum micro-batches a step,
 * one epoch. */
static int compile_qa(const char *data, int batch, int accum, tg_plan *p) {
    char dir[600], cfg_path[700], text[2048];
    snprintf(dir, sizeof dir, "%s/accum-qa-model", tg_test_tmpdir());
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    mkdir(dir, 0755);
    if (!CHECK(tg_test_write_file(cfg_path, qa_model) == 0, "cannot write %s", cfg_path)) return 0;
    snprintf(text, sizeof text,
             "model = %s\ntask = qa\nbatch = %d\ngrad_accumulation = %d\nseq = 20\nepochs = 1\nlr = 1e-3\n"
             "warmup_steps = 1\ntrain_data = %s\n",
             dir, batch, accum, data);
    tg_job job;
    tg_err err;
    if (!CHECK(tg_job_parse_text(text, "qa.job", NULL, NULL, 0, &job, &err) == 0, "%s", err.msg)) return 0;
    return CHECK(tg_compile(&job, p, &err) == 0, "%s", err.msg);
}

/* qa: N = 2 and N = 4 micro-batches against one batch of N times the rows, over an epoch
 * whose last window is short (its last micro-batches hold padding rows, whose positions
 * count for nothing, or no rows at all): each side's loss is the mean over the window's
 * counted rows (io.loss_norm, [start, end]). */
TG_TEST(test_grad_accumulation_qa_matches_large_batch) {
    int32_t rows = 0;
    const char *data = qa_data(&rows);
    REQUIRE(data, "no converted SQuAD fixture");
    REQUIRE(rows > 4 && rows % 4 != 0, "%d training rows: want more than 4, not a multiple of 4", rows);
    static const int cases[][2] = {{2, 2}, {1, 4}}; /* micro-batch rows, micro-batches */
    for (int c = 0; c < 2; c++) {
        const int b = cases[c][0], n = cases[c][1];
        tg_plan small, large;
        if (!compile_qa(data, b, n, &small) || !compile_qa(data, b * n, 1, &large)) return;
        CHECK(small.io.loss_norm >= 0 && tg_tensor_numel(&small.tensors[small.io.loss_norm]) == 2,
              "N = %d: loss_norm %d", n, small.io.loss_norm);
        int normalised = 0;
        for (int o = 0; o < small.n_ops; o++) {
            const tg_op *op = &small.ops[o];
            normalised += (op->kind == TG_OP_SPAN_LOSS && op->in[2] == small.io.loss_norm) ||
                          (op->kind == TG_OP_SPAN_LOSS_BWD && op->in[3] == small.io.loss_norm);
        }
        CHECK(normalised == 2, "N = %d: %d span loss ops read the normaliser", n, normalised);
        outcome x, y;
        char what[64];
        snprintf(what, sizeof what, "qa, %d x %d rows against %d", n, b, n * b);
        if (train(&small, 0, &x) && train(&large, 0, &y)) {
            CHECK(x.total_steps == (rows + n * b - 1) / (n * b) && x.total_steps == y.total_steps,
                  "%s: total steps %d and %d", what, x.total_steps, y.total_steps);
            check_same(&small, what, &x, &y, 1e-5);
        }
        outcome_free(&x), outcome_free(&y);
        tg_plan_free(&small), tg_plan_free(&large);
    }
}

/* The window's counts, side by side: an answer start or end at seq or past it counts for
 * nothing (HF's ignore_index), one below 0 counts (clamped to 0), and every micro-batch of
 * the window is told the whole window's counts. */
TG_TEST(test_grad_accumulation_qa_window_counts) {
    int32_t rows = 0;
    const char *data = qa_data(&rows);
    REQUIRE(data, "no converted SQuAD fixture");
    tg_plan p;
    if (!compile_qa(data, 2, 3, &p)) return;
    tg_err err;
    tg_trainer tr;
    REQUIRE(open_trainer(&tr, &p, &err) == 0, "%s", err.msg);
    tg_trainer_next_batch(&tr);
    const size_t image = p.pool_bytes[TG_POOL_INPUTS];
    for (int m = 0; m < 3; m++) {
        const float *norm = (const float *)(tr.staging[tr.cur] + (size_t)m * image + p.tensors[p.io.loss_norm].offset);
        CHECK(norm[0] == 6 && norm[1] == 6, "micro-batch %d of a full window of 3 x 2 rows: counts %g %g", m, norm[0],
              norm[1]);
    }
    tg_trainer_close(&tr);
    /* The ignore rules under the normaliser, on SPAN_LOSS itself (runtime/cpu): a batch of
     * 4 rows split into two micro-batches of 2, each told the whole's counts per side, adds
     * up to the whole's loss, and its gradients are the whole's. */
    const int64_t B = 4, T = 5;
    float logits[4 * 5 * 2];
    for (int i = 0; i < 40; i++) logits[i] = (float)((i * 37) % 11) / 5.0f - 1.0f;
    const int32_t positions[8] = {1, 4, -3, 5, 7, 2, 0, 9}; /* starts 1 -3 7 0: 3 count; ends 4 5 2 9: 2 count */
    float whole = 0, halves[2] = {0, 0}, dwhole[40], dhalf[40];
    const float counts[2] = {3, 2}, one = 1.0f;
    tg_op op = tg_test_op(TG_OP_SPAN_LOSS);
    op.p.span_loss = (tg_span_loss_params){.b = B, .t = T};
    tg_cpu_op_args a = {.op = &op};
    a.in[0] = logits, a.in[1] = (void *)positions, a.out[0] = &whole;
    tg_cpu_op_run(&a);
    for (int h = 0; h < 2; h++) {
        op.p.span_loss.b = 2;
        a.in[0] = logits + h * 2 * T * 2, a.in[1] = (void *)(positions + h * 4), a.in[2] = (void *)counts;
        a.out[0] = &halves[h];
        tg_cpu_op_run(&a);
    }
    CHECK(fabsf(halves[0] + halves[1] - whole) <= 1e-6f * fabsf(whole) && whole > 0,
          "halves %.9g + %.9g, the whole %.9g", halves[0], halves[1], whole);
    tg_op bwd = tg_test_op(TG_OP_SPAN_LOSS_BWD);
    bwd.p.span_loss = (tg_span_loss_params){.b = B, .t = T};
    tg_cpu_op_args g = {.op = &bwd};
    g.in[0] = (void *)&one, g.in[1] = logits, g.in[2] = (void *)positions, g.out[0] = dwhole;
    tg_cpu_op_run(&g);
    bwd.p.span_loss.b = 2;
    for (int h = 0; h < 2; h++) {
        g.in[1] = logits + h * 2 * T * 2, g.in[2] = (void *)(positions + h * 4), g.in[3] = (void *)counts;
        g.out[0] = dhalf + h * 2 * T * 2;
        tg_cpu_op_run(&g);
    }
    double worst = 0;
    for (int i = 0; i < 40; i++) worst = fmax(worst, fabs((double)dhalf[i] - (double)dwhole[i]));
    CHECK(worst <= 1e-7, "dlogits of the halves differ from the whole's by %.3g", worst);
    tg_plan_free(&p);
}
