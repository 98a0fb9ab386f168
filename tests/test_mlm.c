/* task = mlm: MLM_MASK's CPU reference (a known-answer vector from tests/golden/mlm_masks.py,
 * the statistics of the 80/10/10 rule on a large batch, special and padding positions,
 * the determinism of the stream and the fixed eval stream), the job keys, the compiler's
 * refusals, a batch with nothing masked, and the tiny demo job learning. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "compiler/compile.h"
#include "compiler/job.h"
#include "kernels/mlm_mask.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "plan/inspect.h"
#include "plan/op_meta.h"
#include "runtime/cpu/cpu_exec.h"
#include "runtime/hf_export.h"
#include "runtime/trainer.h"
#include "runtime/weights.h"
#include "tests/harness.h"

static tg_mlm_mask_params params(int64_t n, int64_t vocab, float p) {
    tg_mlm_mask_params mp = {.n = n, .vocab = vocab, .key = 5, .mask_id = 103, .p = p};
    mp.special0 = 0, mp.special1 = 100, mp.special2 = 101, mp.special3 = 102, mp.special4 = -1;
    return mp;
}

static void run_mask(const tg_mlm_mask_params *mp, const int32_t *ids, const float *mask, float step, uint64_t seed,
                     int training, int32_t *out, int32_t *labels) {
    tg_op op = tg_test_op(TG_OP_MLM_MASK);
    op.p.mlm_mask = *mp;
    tg_cpu_op_args a = {.op = &op,
                        .in = {(void *)ids, (void *)mask, &step},
                        .out = {out, labels},
                        .seed = seed,
                        .training = training};
    tg_cpu_op_run(&a);
}

/* The CPU reference against masks drawn by tests/golden/mlm_masks.py (the stream's spec in
 * Python): ids[i] = (37 i + 11) % 1000 with [CLS] 101, [SEP] 102, [MASK] 103 and [UNK] 100
 * placed at 0, 5, 9, 12 and 4 padding positions; p 0.5, seed 42, step 3, key 5. */
TG_TEST(test_mlm_mask_known_answer) {
    static const int32_t ids[32] = {101, 48,  85,  122, 159, 102, 233, 270, 307, 103, 381, 418, 100, 492, 529, 566,
                                    603, 640, 677, 714, 751, 788, 825, 862, 899, 936, 973, 10,  0,   0,   0,   0};
    static const int32_t want_ids[32] = {101, 48,  85,  122, 103, 102, 103, 270, 307, 103, 192,
                                         122, 100, 103, 529, 566, 305, 103, 677, 727, 751, 788,
                                         103, 862, 103, 936, 103, 103, 0,   0,   0,   0};
    static const int32_t want_labels[32] = {-100, -100, -100, -100, 159,  -100, 233,  -100, -100, -100, 381,
                                            418,  -100, 492,  -100, -100, 603,  640,  -100, 714,  -100, -100,
                                            825,  -100, 899,  -100, 973,  10,   -100, -100, -100, -100};
    float mask[32];
    for (int i = 0; i < 32; i++) mask[i] = i < 28 ? 1.0f : 0.0f;
    tg_mlm_mask_params mp = params(32, 1000, 0.5f);
    int32_t out[33], labels[33];
    out[32] = labels[32] = 77; /* guards past the outputs */
    run_mask(&mp, ids, mask, 3.0f, 42, 1, out, labels);
    int bad = 0;
    for (int i = 0; i < 32; i++) bad += out[i] != want_ids[i] || labels[i] != want_labels[i];
    CHECK(bad == 0 && out[32] == 77 && labels[32] == 77, "%d of 32 positions differ from mlm_masks.py", bad);
}

/* n positions of ids in [0, V), 10% padding, with the special ids among them. */
static void random_batch(int32_t *ids, float *mask, int64_t n, int64_t vocab, uint64_t *rng) {
    for (int64_t i = 0; i < n; i++) {
        ids[i] = (int32_t)(tg_test_rand(rng) % (uint32_t)vocab);
        mask[i] = tg_test_rand(rng) % 10 == 0 ? 0.0f : 1.0f;
    }
}

/* |x - n q| within 4 standard deviations of a binomial(n, q). */
static int within_4_sigma(double x, double n, double q) { return fabs(x - n * q) <= 4.0 * sqrt(n * q * (1 - q)) + 1; }

TG_TEST(test_mlm_mask_statistics) {
    enum { N = 400000, V = 1000 };
    int32_t *ids = malloc(sizeof(int32_t) * N), *out = malloc(sizeof(int32_t) * N), *labels = malloc(sizeof(int32_t) * N);
    float *mask = malloc(sizeof(float) * N);
    REQUIRE(ids && out && labels && mask, "out of memory");
    uint64_t rng = 0x1234;
    random_batch(ids, mask, N, V, &rng);
    tg_mlm_mask_params mp = params(N, V, 0.15f);
    run_mask(&mp, ids, mask, 7.0f, 42, 1, out, labels);
    int64_t eligible = 0, selected = 0, masked = 0, random = 0, same = 0, wrong = 0, out_of_range = 0;
    int64_t bins[10] = {0};
    for (int64_t i = 0; i < N; i++) {
        const int special = mask[i] == 0.0f || tg_mlm_is_special(&mp, ids[i]);
        eligible += !special;
        out_of_range += out[i] < 0 || out[i] >= V;
        if (labels[i] == TG_IGNORE_INDEX) { /* not selected: unchanged */
            wrong += out[i] != ids[i];
            continue;
        }
        wrong += special || labels[i] != ids[i]; /* special and padding positions are never selected */
        selected++;
        if (out[i] == mp.mask_id) masked++;
        else if (out[i] == ids[i]) same++;
        else random++, bins[out[i] * 10 / V]++;
    }
    CHECK(wrong == 0 && out_of_range == 0, "%lld positions break the rule, %lld ids outside the vocabulary",
          (long long)wrong, (long long)out_of_range);
    CHECK(within_4_sigma((double)selected, (double)eligible, 0.15), "selected %lld of %lld eligible, p 0.15",
          (long long)selected, (long long)eligible);
    /* A random id equals the original or [MASK] with probability 1/V each. */
    CHECK(within_4_sigma((double)masked, (double)selected, 0.8 + 0.1 / V), "[MASK] %lld of %lld", (long long)masked,
          (long long)selected);
    CHECK(within_4_sigma((double)random, (double)selected, 0.1 * (1 - 2.0 / V)), "random %lld of %lld",
          (long long)random, (long long)selected);
    CHECK(within_4_sigma((double)same, (double)selected, 0.1 + 0.1 / V), "unchanged %lld of %lld", (long long)same,
          (long long)selected);
    for (int b = 0; b < 10; b++)
        CHECK(within_4_sigma((double)bins[b], (double)random, 0.1), "random ids in [%d, %d): %lld of %lld", b * V / 10,
              (b + 1) * V / 10, (long long)bins[b], (long long)random);
    free(ids), free(out), free(labels), free(mask);
}

static int64_t count_differences(const int32_t *a, const int32_t *b, int64_t n) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += a[i] != b[i];
    return d;
}

/* Same seed and step: the same masks (whatever else ran between); another step, seed or key:
 * other masks; eval mode: the fixed eval stream, whatever the run's seed and step. */
TG_TEST(test_mlm_mask_determinism) {
    enum { N = 4096, V = 500 };
    static int32_t ids[N], a[N], la[N], b[N], lb[N];
    static float mask[N];
    uint64_t rng = 99;
    random_batch(ids, mask, N, V, &rng);
    tg_mlm_mask_params mp = params(N, V, 0.15f);
    run_mask(&mp, ids, mask, 2.0f, 42, 1, a, la);
    run_mask(&mp, ids, mask, 9.0f, 42, 1, b, lb); /* something else in between */
    run_mask(&mp, ids, mask, 2.0f, 42, 1, b, lb);
    CHECK(count_differences(a, b, N) == 0 && count_differences(la, lb, N) == 0, "same seed and step differ");
    run_mask(&mp, ids, mask, 3.0f, 42, 1, b, lb);
    CHECK(count_differences(la, lb, N) > 100, "step 3 selects the positions of step 2");
    run_mask(&mp, ids, mask, 2.0f, 43, 1, b, lb);
    CHECK(count_differences(la, lb, N) > 100, "seed 43 selects the positions of seed 42");
    mp.key = 6;
    run_mask(&mp, ids, mask, 2.0f, 42, 1, b, lb);
    CHECK(count_differences(la, lb, N) > 100, "key 6 selects the positions of key 5");
    mp.key = 5;
    /* Eval: TG_MLM_EVAL_SEED at step 0, the run's seed and step counter unused. */
    run_mask(&mp, ids, mask, 2.0f, 42, 0, a, la);
    run_mask(&mp, ids, mask, 11.0f, 7, 0, b, lb);
    CHECK(count_differences(a, b, N) == 0 && count_differences(la, lb, N) == 0, "eval masks follow the run");
    run_mask(&mp, ids, mask, 0.0f, TG_MLM_EVAL_SEED, 1, b, lb);
    CHECK(count_differences(a, b, N) == 0 && count_differences(la, lb, N) == 0,
          "eval masks are not the stream of TG_MLM_EVAL_SEED at step 0");
    int64_t selected = 0;
    for (int i = 0; i < N; i++) selected += la[i] != TG_IGNORE_INDEX;
    CHECK(selected > 0, "eval masks nothing");
}

TG_TEST(test_mlm_mask_shape_rule) {
    tg_tensor t[3];
    memset(t, 0, sizeof t);
    for (int i = 0; i < 3; i++) t[i].ndim = 1, t[i].grad = t[i].master = t[i].group = -1;
    t[0].dtype = TG_I32, t[0].shape[0] = 8;  /* ids, labels */
    t[1].dtype = TG_F32, t[1].shape[0] = 8;  /* mask */
    t[2].dtype = TG_F32, t[2].shape[0] = 1;  /* step */
    tg_op_check_ctx c = {.tensors = t, .n_tensors = 3, .replicas = 1};
    tg_op op = tg_test_op(TG_OP_MLM_MASK);
    op.in[0] = 0, op.in[1] = 1, op.in[2] = 2, op.out[0] = 0, op.out[1] = 0;
    op.p.mlm_mask = params(8, 200, 0.15f);
    char why[256];
    CHECK(tg_op_check(&c, &op, why, sizeof why) == 0, "a consistent MLM_MASK refused: %s", why);
    CHECK(tg_op_flops(&op) == 0, "MLM_MASK counts %g FLOPs", tg_op_flops(&op));
    static const struct {
        const char *what;
        float p;
        int64_t mask_id, vocab, n;
        const char *needle;
    } bad[] = {
        {"p 0", 0.0f, 103, 200, 8, "p outside (0, 1)"},
        {"p 1", 1.0f, 103, 200, 8, "p outside (0, 1)"},
        {"mask id past V", 0.15f, 200, 200, 8, "mask_id outside [0, V)"},
        {"negative mask id", 0.15f, -1, 200, 8, "mask_id outside [0, V)"},
        {"no vocabulary", 0.15f, 0, 0, 8, "V outside"},
        {"n != ids", 0.15f, 103, 200, 7, "in[0]: ids != n"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        op.p.mlm_mask = params(bad[k].n, bad[k].vocab, bad[k].p);
        op.p.mlm_mask.mask_id = bad[k].mask_id;
        int rc = tg_op_check(&c, &op, why, sizeof why);
        CHECK(rc != 0 && strstr(why, bad[k].needle), "%s: rc %d, '%s'", bad[k].what, rc, why);
    }
    op.p.mlm_mask = params(8, 200, 0.15f);
    op.in[2] = 0; /* an int32 step counter */
    CHECK(tg_op_check(&c, &op, why, sizeof why) != 0 && strstr(why, "in[2]"), "an int32 step counter: '%s'", why);
}

/* ---- the job and the compiler ---------------------------------------------------------- */

static int compile_text(const char *text, tg_plan *plan, tg_err *err) {
    char path[512];
    snprintf(path, sizeof path, "%s/mlm.job", tg_test_tmpdir());
    if (tg_test_write_file(path, text)) return tg_fail(err, "cannot write %s", path);
    tg_job job;
    if (tg_job_load(path, NULL, 0, &job, err)) return -1;
    return tg_compile(&job, plan, err);
}

static const tg_op *find_op(const tg_plan *p, int kind) {
    for (int o = 0; o < p->n_ops; o++)
        if (p->ops[o].kind == kind) return &p->ops[o];
    return NULL;
}

static int find_tensor(const tg_plan *p, const char *name) {
    for (int t = 0; t < p->n_tensors; t++)
        if (!strcmp(p->tensors[t].name, name)) return t;
    return -1;
}

TG_TEST(test_mlm_job_keys) {
    static const struct {
        const char *text, *needle;
    } bad[] = {
        {"task = mlm\nmlm_probability = 0\n", "mlm_probability': 0 is out of range"},
        {"task = mlm\nmlm_probability = 1\n", "mlm_probability': 1 is out of range"},
        {"task = classify\nmlm_probability = 0.2\n", "only meaningful for task = mlm"},
        {"task = lm\nmask_token_id = 4\n", "key 'mask_token_id': only meaningful for task = mlm"},
        {"task = mlm\nspecial_token_ids = 1,,2\n", "'' is not a token id"},
        {"task = mlm\nspecial_token_ids = 1,2,3,4,5,6\n", "more than 5 ids"},
        {"task = mlm\nspecial_token_ids = -1\n", "'-1' is not a token id"},
        {"task = mlm\nmask_token_id = x\n", "'x' is not an integer"},
        {"task = masked\n", "'masked' is not one of classify, lm, mlm"},
    };
    char path[512];
    snprintf(path, sizeof path, "%s/keys.job", tg_test_tmpdir());
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char text[512];
        snprintf(text, sizeof text, "model = tiny-bert\n%ssteps = 1\ntrain_data = x\n", bad[k].text);
        REQUIRE(tg_test_write_file(path, text) == 0, "cannot write %s", path);
        tg_job job;
        tg_err err = {{0}};
        int rc = tg_job_load(path, NULL, 0, &job, &err);
        CHECK(rc != 0 && strstr(err.msg, bad[k].needle), "'%s': rc %d, '%s'", bad[k].text, rc, err.msg);
    }
    REQUIRE(tg_test_write_file(path, "model = tiny-bert\ntask = mlm\nmlm_probability = 0.25\nmask_token_id = 7\n"
                                     "special_token_ids = 1, 2 ,3\nsteps = 1\ntrain_data = x\n") == 0,
            "cannot write %s", path);
    tg_job job;
    tg_err err;
    REQUIRE(tg_job_load(path, NULL, 0, &job, &err) == 0, "%s", err.msg);
    CHECK(job.task == TG_TASK_MLM && job.mlm_probability == 0.25f && job.mask_token_id == 7 && job.n_special_ids == 3 &&
              job.special_ids[0] == 1 && job.special_ids[1] == 2 && job.special_ids[2] == 3 && job.special_ids[3] == -1,
          "parsed task %d p %g mask %d, %d special ids", job.task, job.mlm_probability, job.mask_token_id,
          job.n_special_ids);
    const char *sets[] = {"special_token_ids=none"};
    REQUIRE(tg_job_load(path, sets, 1, &job, &err) == 0, "%s", err.msg);
    CHECK(job.n_special_ids == 0 && job.special_ids[0] == -1, "none: %d special ids", job.n_special_ids);
}

TG_TEST(test_mlm_compile_refusals) {
    static const struct {
        const char *text, *needle;
    } bad[] = {
        {"model = tiny-gpt2\ntask = mlm\n", "task mlm needs an encoder (bert or roberta family)"},
        {"model = tiny-bert\ntask = mlm\nmask_token_id = 128\n", "mask token id 128 is outside the vocabulary"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char text[512];
        snprintf(text, sizeof text, "%sbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\n", bad[k].text);
        tg_plan p;
        tg_err err = {{0}};
        int rc = compile_text(text, &p, &err);
        CHECK(rc != 0 && strstr(err.msg, bad[k].needle), "'%s': rc %d, '%s'", bad[k].text, rc, err.msg);
        if (rc == 0) tg_plan_free(&p);
    }
}

/* The plans' masking op and heads: HF's names, the defaults of each architecture, the
 * decoder reading the word embeddings (tied), no pooler, logits for every position. */
TG_TEST(test_mlm_plans) {
    static const struct {
        const char *model, *extra, *bias, *no;
        int32_t mask_id, special[5];
    } cases[] = {
        {"tiny-bert", "", "cls.predictions.bias", "bert.pooler.dense.weight", 103, {0, 100, 101, 102, -1}},
        {"tiny-roberta", "", "lm_head.bias", "classifier.dense.weight", 127, {0, 1, 2, 3, -1}},
        {"tiny-bert", "mlm_probability = 0.3\nmask_token_id = 4\nspecial_token_ids = 9\n", "cls.predictions.bias",
         "bert.pooler.dense.weight", 4, {9, -1, -1, -1, -1}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char text[512];
        snprintf(text, sizeof text, "model = %s\ntask = mlm\n%sbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\n",
                 cases[k].model, cases[k].extra);
        tg_plan p;
        tg_err err;
        if (!CHECK(compile_text(text, &p, &err) == 0, "%s: %s", cases[k].model, err.msg)) continue;
        const tg_op *mask = find_op(&p, TG_OP_MLM_MASK);
        if (CHECK(mask && mask->phase == TG_PHASE_FORWARD && mask == &p.ops[0], "%s: MLM_MASK is not the first op",
                  cases[k].model)) {
            const tg_mlm_mask_params *mp = &mask->p.mlm_mask;
            const int32_t got[5] = {(int32_t)mp->special0, (int32_t)mp->special1, (int32_t)mp->special2,
                                    (int32_t)mp->special3, (int32_t)mp->special4};
            CHECK(mp->mask_id == cases[k].mask_id && !memcmp(got, cases[k].special, sizeof got) &&
                      mp->n == 16 && mp->vocab == 128 && mask->in[0] == p.io.input_ids,
                  "%s: mask id %lld, specials %d %d %d %d %d", cases[k].model, (long long)mp->mask_id, got[0], got[1],
                  got[2], got[3], got[4]);
            CHECK(mp->p == (k == 2 ? 0.3f : 0.15f), "%s: p %g", cases[k].model, mp->p);
            /* The word embedding reads the masked ids, the loss the op's labels. */
            const tg_op *ce = find_op(&p, TG_OP_CROSS_ENTROPY), *emb = find_op(&p, TG_OP_EMBEDDING);
            CHECK(ce && emb && ce->in[1] == mask->out[1] && emb->in[0] == mask->out[0],
                  "%s: the embedding or the loss does not read the masking op", cases[k].model);
        }
        int bias = find_tensor(&p, cases[k].bias);
        const char *table_name = !strcmp(cases[k].model, "tiny-bert") ? "bert.embeddings.word_embeddings.weight"
                                                                      : "roberta.embeddings.word_embeddings.weight";
        int table = find_tensor(&p, table_name);
        CHECK(bias >= 0 && table >= 0 && (p.tensors[table].flags & TG_TENSOR_TIED) && find_tensor(&p, cases[k].no) < 0,
              "%s: head bias %d, tied table %d, %s present", cases[k].model, bias, table, cases[k].no);
        const tg_tensor *logits = &p.tensors[p.io.logits];
        CHECK(logits->ndim == 2 && logits->shape[0] == 16 && logits->shape[1] == 128, "%s: logits [%lld, %lld]",
              cases[k].model, (long long)logits->shape[0], (long long)logits->shape[1]);
        tg_plan_free(&p);
    }
}

/* inspect of a tiny BERT mlm plan: the forward phase line for line against
 * tests/data/inspect_tiny_bert_mlm_forward.txt (the masking op, the encoder reading its
 * ids, HF's head and the loss on its labels). */
TG_TEST(test_mlm_inspect_forward) {
    tg_plan p;
    tg_err err;
    REQUIRE(compile_text("model = tiny-bert\ntask = mlm\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\n", &p, &err) == 0,
            "%s", err.msg);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    REQUIRE(f, "open_memstream");
    int rc = tg_plan_inspect(&p, f, 0, &err);
    fclose(f);
    tg_plan_free(&p);
    REQUIRE(rc == 0 && text, "inspect: %s", err.msg);
    char *from = strstr(text, "== forward"), *to = from ? strstr(from, "== backward") : NULL;
    long want_len = 0;
    char *want = tg_test_read_file("tests/data/inspect_tiny_bert_mlm_forward.txt", &want_len);
    if (CHECK(from && to && want, "no forward section, or the expected text is unreadable")) {
        *to = 0;
        size_t at = 0;
        while (from[at] && from[at] == want[at]) at++;
        CHECK(from[at] == want[at], "differs at byte %zu: got '%.80s', want '%.80s'", at, from + at, want + at);
    }
    free(text), free(want);
}

/* A batch where nothing can be masked (every token special or padding): loss 0 and every
 * gradient 0, finite (HF's mean over no position is NaN). */
TG_TEST(test_mlm_nothing_masked) {
    tg_plan p;
    tg_err err;
    REQUIRE(compile_text("model = tiny-bert\ntask = mlm\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\n", &p, &err) == 0,
            "%s", err.msg);
    tg_trainer tr;
    tg_trainer_options o = {.device = tg_test_device(), .threads = 2, .load_data = 0};
    REQUIRE(tg_trainer_open(&tr, &p, &o, &err) == 0, "%s", err.msg);
    uint64_t rng = 5;
    tg_test_fill_random_inputs(&tr, &p, &rng);
    int32_t *ids = tg_trainer_input(&tr, p.io.input_ids);
    for (int i = 0; i < 16; i++) ids[i] = i % 8 < 5 ? 101 + i % 3 : 0; /* [CLS] [SEP] [MASK], [PAD] */
    float loss = NAN;
    REQUIRE(tg_trainer_run(&tr, TG_PHASE_FORWARD, TG_PHASE_BACKWARD, 1, &err) == 0 &&
                tg_trainer_read(&tr, p.io.loss, &loss, &err) == 0,
            "%s", err.msg);
    CHECK(loss == 0.0f, "loss %g over no masked position", loss);
    float *grads = malloc(p.pool_bytes[TG_POOL_GRADS]);
    REQUIRE(grads && tg_trainer_read(&tr, p.io.grads_all, grads, &err) == 0, "%s", err.msg);
    int64_t nonzero = 0;
    for (uint64_t i = 0; i < p.pool_bytes[TG_POOL_GRADS] / 4; i++) nonzero += grads[i] != 0.0f;
    CHECK(nonzero == 0, "%lld gradient elements are not 0", (long long)nonzero);
    free(grads);
    tg_trainer_close(&tr);
    tg_plan_free(&p);
}

/* Training lowers the eval loss: rows of one repeated token ([CLS] c c ... c [SEP]), so a
 * masked position is its neighbours' token, which a tiny BERT learns in a few dozen steps.
 * The eval masks are fixed: two evals at the same weights agree bit for bit, and every
 * eval masks the same positions; perplexity is exp(loss). */
TG_TEST(test_mlm_training_lowers_eval_loss) {
    char train_path[512], eval_path[512], job_path[512];
    snprintf(train_path, sizeof train_path, "%s/mlm-train.jsonl", tg_test_tmpdir());
    snprintf(eval_path, sizeof eval_path, "%s/mlm-eval.jsonl", tg_test_tmpdir());
    snprintf(job_path, sizeof job_path, "%s/mlm-learn.job", tg_test_tmpdir());
    uint64_t rng = 17;
    for (int f = 0; f < 2; f++) {
        FILE *out = fopen(f ? eval_path : train_path, "w");
        REQUIRE(out, "cannot write the data");
        for (int r = 0; r < (f ? 64 : 512); r++) {
            const int c = 3 + (int)(tg_test_rand(&rng) % 97), len = 12 + (int)(tg_test_rand(&rng) % 20);
            fprintf(out, "{\"input_ids\":[101");
            for (int t = 0; t < len; t++) fprintf(out, ",%d", c);
            fprintf(out, ",102]}\n");
        }
        fclose(out);
    }
    char text[2048];
    snprintf(text, sizeof text,
             "model = tiny-bert\ntask = mlm\nbatch = 16\nseq = 32\nlr = 1e-2\nwarmup_steps = 10\nsteps = 80\n"
             "train_data = %s\neval_data = %s\n",
             train_path, eval_path);
    REQUIRE(tg_test_write_file(job_path, text) == 0, "cannot write %s", job_path);
    tg_job job;
    tg_plan p;
    tg_err err;
    REQUIRE(tg_job_load(job_path, NULL, 0, &job, &err) == 0, "%s", err.msg);
    REQUIRE(tg_compile(&job, &p, &err) == 0, "%s", err.msg);
    tg_trainer tr;
    tg_trainer_options o = {.device = tg_test_device(), .threads = 0, .load_data = 1};
    REQUIRE(tg_trainer_open(&tr, &p, &o, &err) == 0, "%s", err.msg);
    tg_eval_stats before, again, after;
    REQUIRE(tr.has_eval && tg_trainer_eval(&tr, &before, &err) == 0 && tg_trainer_eval(&tr, &again, &err) == 0, "%s",
            err.msg);
    CHECK(before.loss == again.loss && before.counted == again.counted && before.counted > 0,
          "two evals at the same weights: loss %.9g and %.9g, %lld and %lld positions", before.loss, again.loss,
          (long long)before.counted, (long long)again.counted);
    int ok = 1;
    for (int s = 0; ok && s < tr.total_steps; s++) {
        tg_step_stats st;
        ok = CHECK(tg_trainer_step(&tr, &st, &err) == 0 && isfinite(st.loss), "step %d: %s", s, err.msg);
    }
    REQUIRE(ok && tg_trainer_eval(&tr, &after, &err) == 0, "%s", err.msg);
    printf("    mlm: eval loss %.4f -> %.4f over %lld masked positions, perplexity %.2f\n", before.loss, after.loss,
           (long long)after.counted, after.perplexity);
    CHECK(fabs(before.loss - log(128.0)) < 0.5, "initial eval loss %.4f should be near ln 128", before.loss);
    CHECK(after.loss < before.loss - 1.0, "eval loss did not fall: %.4f -> %.4f", before.loss, after.loss);
    CHECK(after.counted == before.counted, "the eval masked %lld positions, then %lld", (long long)before.counted,
          (long long)after.counted);
    CHECK(fabs(after.perplexity - exp(after.loss)) <= 1e-9 * after.perplexity && after.accuracy == -1.0,
          "perplexity %g, accuracy %g", after.perplexity, after.accuracy);
    tg_trainer_close(&tr);
    tg_plan_free(&p);
}

/* ---- checkpoints ------------------------------------------------------------------------ */

/* Every value of a tiny BERT mlm image as checkpoint items, under the names `rename` gives
 * (NULL: left out), plus `extra` items. */
typedef const char *(*rename_fn)(const char *name);

static int mlm_items(const tg_weights_image *img, rename_fn rename, tg_st_item *items) {
    const tg_plan *p = img->plan;
    int n = 0;
    for (int t = 0; t < p->n_tensors; t++) {
        const tg_tensor *x = &p->tensors[t];
        if (!tg_tensor_is_value(x) || tg_tensor_class_of(x) == TG_CLASS_BUFFER) continue;
        const char *name = rename ? rename(x->name) : x->name;
        if (name) items[n++] = (tg_st_item){name, TG_ST_F32, x->ndim, x->shape, tg_weights_value(img, t)};
    }
    return n;
}

/* BertModel's names (all-MiniLM-L6-v2): no "bert." prefix and no MLM head. */
static const char *bare_bert_name(const char *name) { return !strncmp(name, "bert.", 5) ? name + 5 : NULL; }
/* A checkpoint holding the head's bias only as the decoder's (tied) bias. */
static const char *decoder_bias_name(const char *name) {
    return !strcmp(name, "cls.predictions.bias") ? "cls.predictions.decoder.bias" : name;
}

static int same_value(const tg_weights_image *a, const tg_weights_image *b, const char *name) {
    const int t = find_tensor(a->plan, name);
    return t >= 0 && !memcmp(tg_weights_value(a, t), tg_weights_value(b, t), (size_t)tg_tensor_numel(&a->plan->tensors[t]) * 4);
}

/* bert-base-uncased's layout (BertForPreTraining: the tied decoder stored too, a pooler and
 * the next-sentence head) loads whole, the decoder's copies used, the pooler and NSP head
 * unused; the decoder bias alone loads as the head's bias; a bare BertModel gets the head
 * newly initialised and the report says so. */
TG_TEST(test_mlm_checkpoints) {
    tg_plan p;
    if (!tg_test_compile_preset("tiny-bert", TG_TASK_MLM, TG_PREC_FP32, 1, &p)) return;
    tg_weights_image src, got;
    tg_err err = {{0}};
    REQUIRE(tg_weights_image_alloc(&p, &src, &err) == 0 && tg_weights_image_alloc(&p, &got, &err) == 0, "%s", err.msg);
    tg_weights_init(&src, 7);
    static tg_st_item items[256];
    static const float extra[4] = {1, 2, 3, 4};
    static const int64_t four[] = {4};
    char path[700];
    snprintf(path, sizeof path, "%s/mlm-ckpt.safetensors", tg_test_tmpdir());
    int n = mlm_items(&src, NULL, items);
    const int table = find_tensor(&p, "bert.embeddings.word_embeddings.weight"), bias = find_tensor(&p, "cls.predictions.bias");
    REQUIRE(table >= 0 && bias >= 0 && n < 240, "no table or bias");
    items[n++] = (tg_st_item){"cls.predictions.decoder.weight", TG_ST_F32, 2, p.tensors[table].shape,
                              tg_weights_value(&src, table)};
    items[n++] = (tg_st_item){"cls.predictions.decoder.bias", TG_ST_F32, 1, p.tensors[bias].shape,
                              tg_weights_value(&src, bias)};
    items[n++] = (tg_st_item){"cls.seq_relationship.bias", TG_ST_F32, 1, four, extra};
    items[n++] = (tg_st_item){"bert.pooler.dense.bias", TG_ST_F32, 1, four, extra};
    REQUIRE(tg_st_write(path, items, n, &err) == 0, "%s", err.msg);
    tg_weights_report r;
    REQUIRE(tg_weights_load(&got, path, &r, &err) == 0, "%s", err.msg);
    CHECK(r.missing == 0 && r.unexpected == 2 && !strcmp(r.unexpected_names[0], "bert.pooler.dense.bias") &&
              !strcmp(r.unexpected_names[1], "cls.seq_relationship.bias"),
          "pretraining checkpoint: %d missing (first %s), %d unexpected", r.missing, r.first_missing, r.unexpected);
    CHECK(same_value(&src, &got, "cls.predictions.bias") && same_value(&src, &got, "cls.predictions.transform.dense.weight"),
          "the head's values differ");
    tg_weights_report_free(&r);

    n = mlm_items(&src, decoder_bias_name, items);
    REQUIRE(tg_st_write(path, items, n, &err) == 0, "%s", err.msg);
    memset(tg_weights_value(&got, bias), 0, (size_t)tg_tensor_numel(&p.tensors[bias]) * 4);
    REQUIRE(tg_weights_load(&got, path, &r, &err) == 0, "%s", err.msg);
    CHECK(r.missing == 0 && r.unexpected == 0 && same_value(&src, &got, "cls.predictions.bias"),
          "decoder bias only: %d missing (first %s), %d unexpected", r.missing, r.first_missing, r.unexpected);
    tg_weights_report_free(&r);

    n = mlm_items(&src, bare_bert_name, items);
    REQUIRE(tg_st_write(path, items, n, &err) == 0, "%s", err.msg);
    REQUIRE(tg_weights_load(&got, path, &r, &err) == 0, "%s", err.msg);
    char *text = tg_weights_report_text(&r, tg_hf_model_class(&p), "minilm");
    CHECK(text && !strcmp(text, "Some weights of BertForMaskedLM were not initialized from the model checkpoint at "
                                "minilm and are newly initialized: ['cls.predictions.bias', "
                                "'cls.predictions.transform.LayerNorm.bias', 'cls.predictions.transform.LayerNorm.weight', "
                                "'cls.predictions.transform.dense.bias', 'cls.predictions.transform.dense.weight']\n"),
          "bare BertModel: %s", text ? text : "(null)");
    free(text);
    tg_weights_report_free(&r);
    tg_weights_image_free(&src);
    tg_weights_image_free(&got);
    tg_plan_free(&p);
}

static int count_rows(void *ctx, const float *logits, int32_t first, int32_t rows, tg_err *err) {
    tg_trainer *t = ctx;
    /* The masked ids and labels of the batch are there while the callback runs. */
    if (!t->eval_masked_ids || !t->eval_masked_labels) return tg_fail(err, "no masked ids in the callback");
    return 0;
}

/* An mlm eval (and one handing each batch's logits and masked ids over) with each of its
 * allocations failing in turn: -1 and "out of memory", then the same loss as without. */
TG_TEST(test_mlm_eval_alloc_faults) {
    char data[512], job_path[512];
    snprintf(data, sizeof data, "%s/mlm-rows.jsonl", tg_test_tmpdir());
    snprintf(job_path, sizeof job_path, "%s/mlm-rows.job", tg_test_tmpdir());
    REQUIRE(tg_test_write_file(data, "{\"input_ids\": [101, 5, 6, 7, 8, 9, 10, 102]}\n{\"input_ids\": [101, 8, 9, 11, 102]}\n"
                                     "{\"input_ids\": [101, 10, 11, 12, 13, 14, 15, 16, 17, 102]}\n") == 0,
            "write %s", data);
    char text[1400];
    snprintf(text, sizeof text,
             "model = tiny-bert\ntask = mlm\nmlm_probability = 0.5\nbatch = 2\nseq = 12\nsteps = 1\ntrain_data = %s\n"
             "eval_data = %s\n",
             data, data);
    REQUIRE(tg_test_write_file(job_path, text) == 0, "write %s", job_path);
    tg_job job;
    tg_plan p;
    tg_err err;
    REQUIRE(tg_job_load(job_path, NULL, 0, &job, &err) == 0 && tg_compile(&job, &p, &err) == 0, "%s", err.msg);
    tg_trainer tr;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1, .no_loader_thread = 1};
    REQUIRE(tg_trainer_open(&tr, &p, &o, &err) == 0, "%s", err.msg);
    tg_eval_stats want, got;
    REQUIRE(tg_trainer_eval(&tr, &want, &err) == 0 && want.counted > 0, "%s", err.msg);
    for (int with_logits = 0; with_logits < 2; with_logits++) {
        int failures = 0;
        for (long k = 0; k < 100; k++) {
            memset(&err, 0, sizeof err);
            tg_alloc_fail_after(k);
            const int rc = with_logits ? tg_trainer_eval_logits(&tr, &got, count_rows, &tr, &err)
                                       : tg_trainer_eval(&tr, &got, &err);
            tg_alloc_fail_after(-1);
            if (rc == 0) break;
            failures++;
            if (!CHECK(strstr(err.msg, "out of memory"), "allocation %ld failing: '%s'", k, err.msg)) break;
        }
        CHECK(failures > 0 && got.loss == want.loss && got.counted == want.counted && !tr.eval_masked_ids,
              "%s: %d failures, then loss %.9g over %lld (want %.9g over %lld)", with_logits ? "eval_logits" : "eval",
              failures, got.loss, (long long)got.counted, want.loss, (long long)want.counted);
    }
    tg_trainer_close(&tr);
    tg_plan_free(&p);
}

/* The labels each eval batch got, batch after batch (rows x seq each). */
typedef struct eval_masks {
    tg_trainer *t;
    int32_t *labels;
    int64_t per_batch;
    int batches;
} eval_masks;

static int keep_masks(void *ctx, const float *logits, int32_t first, int32_t rows, tg_err *err) {
    eval_masks *m = ctx;
    if (m->batches >= 4) return tg_fail(err, "more eval batches than kept");
    memcpy(m->labels + m->batches * m->per_batch, m->t->eval_masked_labels, sizeof(int32_t) * (size_t)m->per_batch);
    m->batches++;
    return 0;
}

/* The eval masks are a fixed stream of the batch's index in the eval set: four batches of
 * the same rows get four different masks (not the first batch's pattern over again), and a
 * second eval of the same run masks every batch as the first did, so its loss and
 * perplexity are the same, bit for bit; a training step between them does not move them. */
TG_TEST(test_mlm_eval_masks_follow_the_batch) {
    char data[512], job_path[512];
    snprintf(data, sizeof data, "%s/mlm-same-rows.jsonl", tg_test_tmpdir());
    snprintf(job_path, sizeof job_path, "%s/mlm-same-rows.job", tg_test_tmpdir());
    FILE *f = fopen(data, "w");
    REQUIRE(f, "cannot write %s", data);
    for (int r = 0; r < 8; r++) fprintf(f, "{\"input_ids\": [101, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 102]}\n");
    fclose(f);
    char text[1400];
    snprintf(text, sizeof text,
             "model = tiny-bert\ntask = mlm\nmlm_probability = 0.3\nbatch = 2\nseq = 12\nsteps = 2\ntrain_data = %s\n"
             "eval_data = %s\n",
             data, data);
    REQUIRE(tg_test_write_file(job_path, text) == 0, "write %s", job_path);
    tg_job job;
    tg_plan p;
    tg_err err;
    REQUIRE(tg_job_load(job_path, NULL, 0, &job, &err) == 0 && tg_compile(&job, &p, &err) == 0, "%s", err.msg);
    tg_trainer tr;
    tg_trainer_options o = {.device = tg_test_device(), .threads = 1, .load_data = 1};
    REQUIRE(tg_trainer_open(&tr, &p, &o, &err) == 0, "%s", err.msg);
    eval_masks m[2] = {{.t = &tr, .per_batch = 2 * 12}, {.t = &tr, .per_batch = 2 * 12}};
    m[0].labels = malloc(sizeof(int32_t) * 4 * 24), m[1].labels = malloc(sizeof(int32_t) * 4 * 24);
    REQUIRE(m[0].labels && m[1].labels, "out of memory");
    tg_eval_stats e[2];
    tg_step_stats st;
    REQUIRE(tg_trainer_eval_logits(&tr, &e[0], keep_masks, &m[0], &err) == 0 &&
                tg_trainer_step(&tr, &st, &err) == 0 && tg_trainer_eval_logits(&tr, &e[1], keep_masks, &m[1], &err) == 0,
            "%s", err.msg);
    REQUIRE(m[0].batches == 4 && m[1].batches == 4, "%d and %d eval batches", m[0].batches, m[1].batches);
    for (int a = 0; a < 4; a++)
        for (int b = a + 1; b < 4; b++)
            CHECK(memcmp(m[0].labels + a * 24, m[0].labels + b * 24, sizeof(int32_t) * 24) != 0,
                  "eval batches %d and %d (the same rows) got the same masks", a, b);
    CHECK(!memcmp(m[0].labels, m[1].labels, sizeof(int32_t) * 4 * 24), "the second eval masked other positions");
    CHECK(e[0].counted == e[1].counted && e[0].counted > 0, "masked positions %lld, then %lld", (long long)e[0].counted,
          (long long)e[1].counted);
    tg_trainer_close(&tr);
    /* The same run again: the same eval, bit for bit. */
    REQUIRE(tg_trainer_open(&tr, &p, &o, &err) == 0, "%s", err.msg);
    tg_eval_stats again[2];
    REQUIRE(tg_trainer_eval(&tr, &again[0], &err) == 0 && tg_trainer_step(&tr, &st, &err) == 0 &&
                tg_trainer_eval(&tr, &again[1], &err) == 0,
            "%s", err.msg);
    for (int k = 0; k < 2; k++)
        CHECK(again[k].loss == e[k].loss && again[k].perplexity == e[k].perplexity && again[k].counted == e[k].counted,
              "eval %d: loss %.9g perplexity %.9g, the first run's %.9g %.9g", k, again[k].loss, again[k].perplexity,
              e[k].loss, e[k].perplexity);
    free(m[0].labels), free(m[1].labels);
    tg_trainer_close(&tr);
    tg_plan_free(&p);
}
