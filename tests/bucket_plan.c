/* Length-bucket plans assembled from single-length compiles, and what the executor tests
 * feed them (tests/bucket_plan.h). */
#include "tests/bucket_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "compiler/compile.h"
#include "compiler/job.h"
#include "runtime/weights.h"
#include "tests/harness.h"

int tg_test_compile_job_text(const char *preset, int task, int precision, int seq, int steps, tg_plan *p) {
    char text[512];
    snprintf(text, sizeof text,
             "model = %s\ntask = %s\n%sbatch = 2\nseq = %d\nprecision = %s\n"
             "lr = 1e-3\nwarmup_steps = 2\nsteps = %d\nseed = 5\ntrain_data = unread.jsonl\n",
             preset, tg_task_name(task), task == TG_TASK_CLASSIFY ? "num_labels = 3\n" : "", seq,
             tg_precision_name(precision), steps);
    tg_job job;
    tg_err err;
    if (!CHECK(tg_job_parse_text(text, "bucket-test.job", NULL, NULL, 0, &job, &err) == 0, "%s", err.msg)) return 0;
    memset(p, 0, sizeof *p);
    return CHECK(tg_compile(&job, p, &err) == 0, "%s seq %d: %s", preset, seq, err.msg);
}

static int outside_seq_pools(int pool) { return pool != TG_POOL_ACTIVATIONS && pool != TG_POOL_INPUTS; }

/* plan.h's rules for bucket plan b of the plan `main`. */
static int check_bucket_rules(const tg_plan *main, const tg_plan *b) {
    const int seq = b->train.seq;
    if (!CHECK(b->n_tensors == main->n_tensors && b->n_ops == main->n_ops,
               "seq %d: %d tensors and %d ops, seq %d: %d and %d", seq, b->n_tensors, b->n_ops, main->train.seq,
               main->n_tensors, main->n_ops))
        return 0;
    int ok = 1;
    for (int t = 0; t < b->n_tensors && ok; t++) {
        const tg_tensor *x = &b->tensors[t], *y = &main->tensors[t];
        ok = CHECK(!strcmp(x->name, y->name) && x->dtype == y->dtype && x->pool == y->pool && x->flags == y->flags,
                   "seq %d: tensor %d is %s (%s, %s pool, flags %#x), the plan's %s (%s, %s pool, flags %#x)", seq, t,
                   x->name, tg_dtype_name(x->dtype), tg_pool_name(x->pool), x->flags, y->name,
                   tg_dtype_name(y->dtype), tg_pool_name(y->pool), y->flags);
        if (ok && outside_seq_pools(x->pool))
            ok = CHECK(x->offset == y->offset && x->bytes == y->bytes && x->ndim == y->ndim &&
                           !memcmp(x->shape, y->shape, sizeof x->shape),
                       "seq %d: tensor %s (%s pool) lies at %llu (%llu bytes), the plan's at %llu (%llu bytes)", seq,
                       x->name, tg_pool_name(x->pool), (unsigned long long)x->offset, (unsigned long long)x->bytes,
                       (unsigned long long)y->offset, (unsigned long long)y->bytes);
    }
    for (int o = 0; o < b->n_ops && ok; o++)
        ok = CHECK(b->ops[o].kind == main->ops[o].kind && b->ops[o].phase == main->ops[o].phase,
                   "seq %d: op %d is %s, the plan's %s", seq, o, tg_op_name(b->ops[o].kind),
                   tg_op_name(main->ops[o].kind));
    ok = ok && CHECK(!memcmp(b->phase_begin, main->phase_begin, sizeof b->phase_begin), "seq %d: phases differ", seq);
    ok = ok && CHECK(!memcmp(&b->io, &main->io, sizeof b->io), "seq %d: io tensors differ", seq);
    for (int p = 0; p < TG_POOL_COUNT && ok; p++)
        if (outside_seq_pools(p))
            ok = CHECK(b->pool_bytes[p] == main->pool_bytes[p], "seq %d: the %s pool is %llu bytes, the plan's %llu",
                       seq, tg_pool_name(p), (unsigned long long)b->pool_bytes[p],
                       (unsigned long long)main->pool_bytes[p]);
    return ok;
}

int tg_test_bucket_plan(const char *preset, int task, int precision, const int *seqs, int n, int steps,
                        tg_plan *out) {
    memset(out, 0, sizeof *out);
    if (!CHECK(n >= 2 && n <= TG_MAX_BUCKETS, "%d buckets", n)) return 0;
    for (int k = 1; k < n; k++)
        if (!CHECK(seqs[k - 1] < seqs[k], "bucket lengths must ascend: %d then %d", seqs[k - 1], seqs[k])) return 0;
    tg_plan *smaller = calloc((size_t)(n - 1), sizeof *smaller);
    if (!CHECK(smaller != NULL, "out of memory")) return 0;
    int built = 0, ok = tg_test_compile_job_text(preset, task, precision, seqs[n - 1], steps, out);
    for (; ok && built < n - 1; built++)
        ok = tg_test_compile_job_text(preset, task, precision, seqs[built], steps, &smaller[built]);
    for (int k = 0; ok && k < n - 1; k++) ok = check_bucket_rules(out, &smaller[k]);
    if (!ok) {
        for (int k = 0; k < built; k++) tg_plan_free(&smaller[k]);
        free(smaller);
        tg_plan_free(out);
        return 0;
    }
    /* One set of pools for all: each pool as large as the largest bucket needs. */
    for (int p = 0; p < TG_POOL_COUNT; p++)
        for (int k = 0; k < n - 1; k++)
            if (smaller[k].pool_bytes[p] > out->pool_bytes[p]) out->pool_bytes[p] = smaller[k].pool_bytes[p];
    out->train.n_buckets = n;
    for (int k = 0; k < n; k++) out->train.bucket_seq[k] = seqs[k];
    for (int k = 0; k < n - 1; k++) {
        tg_plan *b = &smaller[k];
        memcpy(b->pool_bytes, out->pool_bytes, sizeof b->pool_bytes);
        b->train.n_buckets = n;
        memcpy(b->train.bucket_seq, out->train.bucket_seq, sizeof b->train.bucket_seq);
        b->buckets = NULL;
    }
    out->buckets = smaller;
    return 1;
}

/* Writes a float scalar tensor (the step counters are fp32). */
static int write_scalar(tg_executor *ex, int tensor, float v) {
    tg_err err;
    return tensor < 0 || CHECK(tg_executor_write(ex, tensor, &v, &err) == 0, "%s", err.msg);
}

/* An fp32 image as the bf16 tensor t, written narrowed. */
static int write_narrowed(tg_executor *ex, const tg_plan *p, int t, const float *src) {
    tg_err err;
    const int64_t n = tg_tensor_numel(&p->tensors[t]);
    uint16_t *low = malloc((size_t)n * sizeof *low);
    if (!CHECK(low != NULL, "out of memory")) return 0;
    tg_bf16_narrow(low, src, n);
    int ok = CHECK(tg_executor_write(ex, t, low, &err) == 0, "%s", err.msg);
    free(low);
    return ok;
}

int tg_test_upload_values(tg_executor *ex, const tg_plan *p, uint64_t seed, int total_steps) {
    tg_err err;
    tg_weights_image img;
    if (!CHECK(tg_weights_image_alloc(p, &img, &err) == 0, "%s", err.msg)) return 0;
    tg_weights_init(&img, seed);
    int ok = CHECK(tg_executor_write(ex, p->io.params_all, img.params, &err) == 0, "%s", err.msg);
    if (ok && p->io.params_bf16_all >= 0) ok = write_narrowed(ex, p, p->io.params_bf16_all, img.params);
    for (int t = 0; t < p->n_tensors && ok; t++) {
        const tg_tensor *x = &p->tensors[t];
        const int cls = tg_tensor_class_of(x);
        if ((cls != TG_CLASS_FROZEN && cls != TG_CLASS_BUFFER) || (x->flags & TG_TENSOR_VIEW)) continue;
        const void *src = tg_weights_value(&img, x->flags & TG_TENSOR_PARAM_COPY ? x->master : t);
        if (!src) continue;
        ok = x->dtype == TG_BF16 ? write_narrowed(ex, p, t, src)
                                 : CHECK(tg_executor_write(ex, t, src, &err) == 0, "%s", err.msg);
    }
    tg_weights_image_free(&img);
    return ok && write_scalar(ex, p->io.total_steps, (float)total_steps) && write_scalar(ex, p->io.step, 0.0f);
}

static void *input_at(const tg_plan *p, void *image, int tensor) {
    return tensor >= 0 ? (uint8_t *)image + p->tensors[tensor].offset : NULL;
}

void tg_test_fill_batch_image(const tg_plan *p, int step, void *image) {
    memset(image, 0, p->pool_bytes[TG_POOL_INPUTS]);
    const tg_plan_io *io = &p->io;
    const int B = p->train.batch, T = p->train.seq, V = p->model.vocab_size, pad = p->train.pad_id;
    int32_t *ids = input_at(p, image, io->input_ids), *pos = input_at(p, image, io->position_ids);
    int32_t *labels = input_at(p, image, io->labels), *types = input_at(p, image, io->token_type_ids);
    float *mask = input_at(p, image, io->attention_mask);
    uint64_t s = 0x1234567ull + (uint64_t)step * 7919;
    for (int b = 0; b < B; b++) {
        const int len = T - 5 * b > 1 ? T - 5 * b : 2;
        for (int t = 0; t < T; t++) {
            const int i = b * T + t;
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            const int real = t < len;
            ids[i] = real ? (int32_t)(1 + (s >> 33) % (uint64_t)(V - 2)) : pad;
            if (ids[i] == pad && real) ids[i] = pad + 1 < V ? pad + 1 : pad - 1;
            mask[i] = (float)real;
            if (pos)
                pos[i] = p->model.arch == TG_ARCH_ROBERTA ? (real ? pad + 1 + t : pad) : t;
            if (types) types[i] = 0;
            if (p->train.task == TG_TASK_LM)
                labels[i] = t + 1 < len ? (int32_t)((s >> 40) % (uint64_t)V) : TG_IGNORE_INDEX;
        }
        if (p->train.task == TG_TASK_CLASSIFY) labels[b] = (b + step) % 3;
    }
}

int tg_test_copy_state(tg_executor *from, tg_executor *to, const tg_plan *p) {
    tg_err err;
    int ok = 1;
    for (int t = 0; t < p->n_tensors && ok; t++) {
        const tg_tensor *x = &p->tensors[t];
        if (!outside_seq_pools(x->pool) || !x->bytes) continue;
        void *buf = malloc((size_t)x->bytes);
        ok = CHECK(buf != NULL, "out of memory") &&
             CHECK(tg_executor_read(from, t, buf, &err) == 0 && tg_executor_write(to, t, buf, &err) == 0,
                   "copying %s: %s", x->name, err.msg);
        free(buf);
    }
    return ok;
}
