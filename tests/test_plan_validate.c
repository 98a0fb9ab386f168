/* The checks a loaded plan passes before anything runs it (plan/validate.h), one field at a
 * time: compiled plans (BERT, GPT-2, bf16, data parallel, ZeRO-1, length buckets) are
 * copied, one field of the copy is corrupted, and the check that owns that field must
 * refuse it with the message naming the plan, the tensor, op or setting, and the cause.
 * Also the memory checker on packed groups and its out-of-memory paths, and the activation
 * live peak by hand. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "compiler/compile.h"
#include "compiler/job.h"
#include "plan/op_meta.h"
#include "plan/plan_file.h"
#include "plan/validate.h"
#include "tests/harness.h"

/* ---- the plans ----------------------------------------------------------------------- */

enum { BASE_BERT, BASE_GPT2, BASE_BF16, BASE_DP, BASE_ZERO, BASE_BUCKETS, BASE_UNFUSED, BASE_QA, BASE_ACCUM, BASE_FP16, BASE_MLM, BASE_COUNT };

/* The gradients in a pool of their own (share_grad_memory = false): the edits below move
 * tensors of a whole-step gradient pool; tests/test_grad_share.c checks shared ones. */
static const char *const base_jobs[BASE_COUNT] = {
    [BASE_BERT] = "model = tiny-bert\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\nshare_grad_memory = false\n",
    [BASE_GPT2] = "model = tiny-gpt2\ntask = lm\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\nshare_grad_memory = false\n",
    [BASE_BF16] = "model = tiny-bert\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\nshare_grad_memory = false\nprecision = bf16\n",
    [BASE_DP] = "model = tiny-bert\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\nshare_grad_memory = false\ndata_parallel = 2\n",
    [BASE_ZERO] = "model = tiny-bert\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\nshare_grad_memory = false\ndata_parallel = 2\n"
                  "zero_stage = 1\n",
    [BASE_BUCKETS] = "model = tiny-bert\nbatch = 2\nsteps = 1\ntrain_data = x\nshare_grad_memory = false\nseq_buckets = 4, 8\n",
    [BASE_UNFUSED] = "model = tiny-bert\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\nshare_grad_memory = false\nattention = unfused\n",
    [BASE_QA] = "model = tiny-bert\ntask = qa\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\nshare_grad_memory = false\n",
    [BASE_ACCUM] = "model = tiny-bert\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\nshare_grad_memory = false\ngrad_accumulation = 2\n",
    [BASE_FP16] = "model = tiny-bert\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\nshare_grad_memory = false\nprecision = fp16\n",
    [BASE_MLM] = "model = tiny-bert\ntask = mlm\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\nshare_grad_memory = false\n",
};

static tg_plan bases[BASE_COUNT];
static int base_ready[BASE_COUNT];

/* The compiled plan of base `b` (compiled once), or NULL after a failed CHECK. */
static const tg_plan *base_plan(int b) {
    if (!base_ready[b]) {
        tg_job job;
        tg_err err = {{0}};
        if (!CHECK(tg_job_parse_text(base_jobs[b], "job.txt", "", NULL, 0, &job, &err) == 0 &&
                       tg_compile(&job, &bases[b], &err) == 0,
                   "base %d: %s", b, err.msg))
            return NULL;
        base_ready[b] = 1;
    }
    return &bases[b];
}

/* A deep copy of base `b` through the plan file (which checks it whole). 1 on success. */
static int copy_base(int b, tg_plan *out) {
    const tg_plan *p = base_plan(b);
    if (!p) return 0;
    uint8_t *bytes = NULL;
    size_t len = 0;
    tg_err err = {{0}};
    int ok = tg_plan_encode(p, &bytes, &len, &err) == 0 && tg_plan_decode(bytes, len, "copy", out, &err) == 0;
    free(bytes);
    return CHECK(ok, "copy of base %d: %s", b, err.msg);
}

static int first_op(const tg_plan *p, int kind) {
    for (int o = 0; o < p->n_ops; o++)
        if (p->ops[o].kind == kind) return o;
    return -1;
}

/* The first tensor of `pool` that is not a view, has no class flag and is not packed. */
static int plain_tensor(const tg_plan *p, int pool) {
    for (int t = 0; t < p->n_tensors; t++) {
        const tg_tensor *x = &p->tensors[t];
        if (x->pool == pool && !(x->flags & (TG_TENSOR_VIEW | TG_TENSOR_PARAM | TG_TENSOR_FROZEN | TG_TENSOR_BUFFER)) &&
            x->group < 0 && x->grad < 0 && x->bytes > 0)
            return t;
    }
    return -1;
}

static int first_where(const tg_plan *p, int flags_set, int flags_clear) {
    for (int t = 0; t < p->n_tensors; t++)
        if ((p->tensors[t].flags & flags_set) == flags_set && !(p->tensors[t].flags & flags_clear)) return t;
    return -1;
}

static int first_member(const tg_plan *p) {
    for (int t = 0; t < p->n_tensors; t++)
        if (p->tensors[t].group >= 0) return t;
    return -1;
}

/* A tensor's shape as messages print it: "[2, 8]". */
static const char *shape_of(const tg_tensor *x, char *buf, size_t len) {
    size_t k = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < x->ndim; d++) k += (size_t)snprintf(buf + k, len - k, "%s%lld", d ? ", " : "", (long long)x->shape[d]);
    snprintf(buf + k, len - k, "]");
    return buf;
}

/* A plan with no ops: the io table and the layout are checked alone (the lifetimes stay,
 * which keep the activations that share bytes apart; none is inside the empty schedule,
 * so none is live at its peak). */
static void drop_ops(tg_plan *p) {
    p->n_ops = 0;
    for (int ph = 0; ph <= TG_PHASE_COUNT; ph++) p->phase_begin[ph] = 0;
    p->activation_live_peak = 0;
}

/* ---- the cases ------------------------------------------------------------------------ */

static void b_accepted(tg_plan *p, char *w, size_t n) {}

enum { CHECK_TABLES, CHECK_MEMORY, CHECK_OPS, CHECK_BUCKETS };

typedef void (*edit_fn)(tg_plan *p, char *want, size_t len);

typedef struct edit_case {
    const char *what;
    int base, check;
    edit_fn edit;
} edit_case;

/* Runs each case on a fresh copy of its base plan: the unedited copy passes the check, the
 * edited one is refused with the case's message (the edit writes it; "" for accepted). */
static void run_edits(const edit_case *cases, size_t n) {
    for (size_t k = 0; k < n; k++) {
        tg_plan p;
        if (!copy_base(cases[k].base, &p)) continue;
        tg_plan *saved_buckets = p.buckets; /* an edit may point these elsewhere */
        const int saved_n_tensors = p.n_tensors, saved_n_buckets = p.train.n_buckets;
        char want[512] = "";
        cases[k].edit(&p, want, sizeof want);
        tg_err err = {{0}};
        tg_memory_report report;
        int rc;
        switch (cases[k].check) {
        case CHECK_TABLES: rc = tg_plan_validate_tables(&p, "p", &err); break;
        case CHECK_MEMORY: rc = tg_plan_check_memory(&p, &report, &err); break;
        case CHECK_OPS: rc = tg_plan_validate_ops(&p, "p", &err); break;
        default: rc = tg_plan_validate_buckets(&p, "p", &err); break;
        }
        if (want[0])
            CHECK(rc == -1 && strstr(err.msg, want), "%s: rc %d, '%s', want '%s'", cases[k].what, rc, err.msg, want);
        else
            CHECK(rc == 0, "%s: refused: %s", cases[k].what, err.msg);
        p.buckets = saved_buckets;
        p.n_tensors = saved_n_tensors;
        p.train.n_buckets = saved_n_buckets;
        if (p.buckets) p.buckets[0].buckets = NULL, p.buckets[0].n_tensors = saved_n_tensors;
        tg_plan_free(&p);
    }
}

/* ---- tg_plan_validate_tables: settings ------------------------------------------------- */

static void arch_negative(tg_plan *p, char *w, size_t n) {
    p->model.arch = -1;
    snprintf(w, n, "p: model arch -1 is not a known architecture");
}
static void task_negative(tg_plan *p, char *w, size_t n) {
    p->train.task = -1;
    snprintf(w, n, "p: train task -1 is not a known task");
}
static void lm_num_labels(tg_plan *p, char *w, size_t n) {
    p->train.num_labels = -1;
    snprintf(w, n, "p: train num_labels -1 is not 0 or more");
}
static void lm_num_labels_zero(tg_plan *p, char *w, size_t n) { p->train.num_labels = 0; }
static void position_past_int32(tg_plan *p, char *w, size_t n) {
    p->model.vocab_size = INT32_MAX;
    p->train.pad_id = INT32_MAX - 4;
    snprintf(w, n, "p: train pad_id 2147483643 + seq 8 passes the largest position id (2147483647)");
}
static void position_at_int32(tg_plan *p, char *w, size_t n) {
    p->model.vocab_size = INT32_MAX;
    p->train.pad_id = INT32_MAX - 8; /* the last position id is INT32_MAX itself */
}
static void precision_negative(tg_plan *p, char *w, size_t n) {
    p->train.precision = -1;
    snprintf(w, n, "p: train precision -1 is not a known precision");
}
static void zero_stage_negative(tg_plan *p, char *w, size_t n) {
    p->train.zero_stage = -1;
    snprintf(w, n, "p: train zero_stage -1 is not 0, or 1 with replicas >= 2");
}
static void attention_negative(tg_plan *p, char *w, size_t n) {
    p->train.attention = -1;
    snprintf(w, n, "p: train attention mode -1 is not a known mode");
}
static void no_buckets(tg_plan *p, char *w, size_t n) {
    p->train.n_buckets = 0;
    snprintf(w, n, "p: train n_buckets 0 is not in [1, 8]");
}
static void too_many_buckets(tg_plan *p, char *w, size_t n) {
    p->train.n_buckets = TG_MAX_BUCKETS + 1;
    snprintf(w, n, "p: train n_buckets 9 is not in [1, 8]");
}
static void bucket_past_count(tg_plan *p, char *w, size_t n) {
    p->train.bucket_seq[1] = 4;
    snprintf(w, n, "p: train bucket_seq[1] is 4; the 1 bucket lengths must be positive and strictly ascending "
                   "(the entries past them 0)");
}
static void bucket_repeated(tg_plan *p, char *w, size_t n) {
    p->train.n_buckets = 2, p->train.bucket_seq[1] = 8;
    snprintf(w, n, "p: train bucket_seq[1] is 8; the 2 bucket lengths");
}
static void bucket_descending(tg_plan *p, char *w, size_t n) {
    p->train.n_buckets = 2, p->train.bucket_seq[1] = 7;
    snprintf(w, n, "p: train bucket_seq[1] is 7; the 2 bucket lengths");
}
static void bucket_zero(tg_plan *p, char *w, size_t n) {
    p->train.bucket_seq[0] = 0;
    snprintf(w, n, "p: train bucket_seq[0] is 0; the 1 bucket lengths");
}
static void seq_not_a_bucket(tg_plan *p, char *w, size_t n) {
    p->train.bucket_seq[0] = 16;
    snprintf(w, n, "p: train seq 8 is none of the 1 bucket lengths (bucket_seq)");
}
static void seq_first_of_two(tg_plan *p, char *w, size_t n) {
    p->train.n_buckets = 2, p->train.bucket_seq[1] = 16; /* a bucket plan's seq need not be the last */
}
static void last_batch_negative(tg_plan *p, char *w, size_t n) {
    p->run.last_batch = -1;
    snprintf(w, n, "p: run last_batch -1 is not pad, drop or wrap");
}
static void last_batch_past(tg_plan *p, char *w, size_t n) {
    p->run.last_batch = TG_LAST_BATCH_COUNT;
    snprintf(w, n, "p: run last_batch 3 is not pad, drop or wrap");
}
static void wrap_with_buckets(tg_plan *p, char *w, size_t n) {
    p->train.n_buckets = 2, p->train.bucket_seq[0] = 4, p->train.bucket_seq[1] = 8;
    p->run.last_batch = TG_LAST_BATCH_WRAP;
    snprintf(w, n, "p: run last_batch is wrap, which is not allowed with length buckets (n_buckets 2)");
}
static void wrap_one_bucket(tg_plan *p, char *w, size_t n) { p->run.last_batch = TG_LAST_BATCH_WRAP; }
static void steps_negative(tg_plan *p, char *w, size_t n) {
    p->run.steps = -1;
    snprintf(w, n, "p: run steps -1 and epochs 0: exactly one must be positive");
}
static void epochs_negative(tg_plan *p, char *w, size_t n) {
    p->run.epochs = -1;
    snprintf(w, n, "p: run steps 1 and epochs -1: exactly one must be positive");
}
static void epochs_only(tg_plan *p, char *w, size_t n) { p->run.steps = 0, p->run.epochs = 2; }
static void checkpoint_every_negative(tg_plan *p, char *w, size_t n) {
    p->run.checkpoint_every = -1;
    snprintf(w, n, "p: run checkpoint_every -1 and keep_checkpoints %d: neither may be negative",
             p->run.keep_checkpoints);
}
static void keep_checkpoints_negative(tg_plan *p, char *w, size_t n) {
    p->run.keep_checkpoints = -1;
    snprintf(w, n, "p: run checkpoint_every %d and keep_checkpoints -1: neither may be negative",
             p->run.checkpoint_every);
}

/* ---- tg_plan_validate_tables: tensors, phases, ops, io ------------------------------------ */

/* Tensor 0 of the plan, and what messages call it. */
static void say_t0(const tg_plan *p, char *w, size_t n, const char *rest) {
    snprintf(w, n, "p: tensor 0 (%s) %s", p->tensors[0].name, rest);
}
static void dtype_negative(tg_plan *p, char *w, size_t n) {
    p->tensors[0].dtype = -1;
    say_t0(p, w, n, "has dtype -1");
}
static void ndim_negative(tg_plan *p, char *w, size_t n) {
    p->tensors[0].ndim = -1;
    say_t0(p, w, n, "has -1 dims (0..4 allowed)");
}
static void dim_negative(tg_plan *p, char *w, size_t n) {
    tg_tensor *x = &p->tensors[0];
    x->shape[x->ndim - 1] = -2;
    char rest[64];
    snprintf(rest, sizeof rest, "dim %d is -2", x->ndim - 1);
    say_t0(p, w, n, rest);
}
static void pool_negative(tg_plan *p, char *w, size_t n) {
    p->tensors[0].pool = -1;
    say_t0(p, w, n, "is in pool -1 of 9");
}
static void offset_past_pool(tg_plan *p, char *w, size_t n) {
    tg_tensor *x = &p->tensors[0];
    const uint64_t cap = p->pool_bytes[x->pool];
    x->offset = cap + 256;
    char rest[160];
    snprintf(rest, sizeof rest, "at offset %llu + %llu bytes runs past the %s pool (%llu bytes)",
             (unsigned long long)x->offset, (unsigned long long)x->bytes, tg_pool_name(x->pool),
             (unsigned long long)cap);
    say_t0(p, w, n, rest);
}
static void init_negative(tg_plan *p, char *w, size_t n) {
    p->tensors[0].init = -1;
    say_t0(p, w, n, "has init rule -1 of 6");
}
static void grad_below(tg_plan *p, char *w, size_t n) {
    p->tensors[0].grad = -2;
    char rest[96];
    snprintf(rest, sizeof rest, "gradient refers to tensor -2 of %d", p->n_tensors);
    say_t0(p, w, n, rest);
}
static void master_below(tg_plan *p, char *w, size_t n) {
    p->tensors[0].master = -2;
    char rest[96];
    snprintf(rest, sizeof rest, "master copy refers to tensor -2 of %d", p->n_tensors);
    say_t0(p, w, n, rest);
}
static void master_past(tg_plan *p, char *w, size_t n) {
    p->tensors[0].master = p->n_tensors;
    char rest[96];
    snprintf(rest, sizeof rest, "master copy refers to tensor %d of %d", p->n_tensors, p->n_tensors);
    say_t0(p, w, n, rest);
}
static void group_below(tg_plan *p, char *w, size_t n) {
    p->tensors[0].group = -2;
    char rest[96];
    snprintf(rest, sizeof rest, "packed group refers to tensor -2 of %d", p->n_tensors);
    say_t0(p, w, n, rest);
}
static void say_uses(tg_plan *p, char *w, size_t n) {
    char rest[96];
    snprintf(rest, sizeof rest, "uses ops %d..%d of %d", p->tensors[0].first_use, p->tensors[0].last_use, p->n_ops);
    say_t0(p, w, n, rest);
}
static void first_use_below(tg_plan *p, char *w, size_t n) {
    p->tensors[0].first_use = -2;
    say_uses(p, w, n);
}
static void first_use_past(tg_plan *p, char *w, size_t n) {
    p->tensors[0].first_use = p->n_ops;
    say_uses(p, w, n);
}
static void last_use_below(tg_plan *p, char *w, size_t n) {
    p->tensors[0].last_use = -2;
    say_uses(p, w, n);
}
static void last_use_past(tg_plan *p, char *w, size_t n) {
    p->tensors[0].last_use = p->n_ops;
    say_uses(p, w, n);
}
static void half_lifetime(tg_plan *p, char *w, size_t n) {
    p->tensors[0].first_use = -1, p->tensors[0].last_use = 3;
    say_t0(p, w, n, "has lifetime -1..3 (both -1, or first <= last)");
}
static void unused_tensor(tg_plan *p, char *w, size_t n) { p->tensors[0].first_use = p->tensors[0].last_use = -1; }
static void phase_start(tg_plan *p, char *w, size_t n) {
    p->phase_begin[0] = 1;
    snprintf(w, n, "p: phase table runs 1..%d, expected 0..%d (n_ops)", p->n_ops, p->n_ops);
}
static void op_kind_past(tg_plan *p, char *w, size_t n) {
    p->ops[1].kind = TG_OP_COUNT;
    snprintf(w, n, "p: op 1 has kind %d of %d", TG_OP_COUNT, TG_OP_COUNT);
}
static void op_kind_negative(tg_plan *p, char *w, size_t n) {
    p->ops[0].kind = -1;
    snprintf(w, n, "p: op 0 has kind -1 of %d", TG_OP_COUNT);
}
static void op_input_below(tg_plan *p, char *w, size_t n) {
    p->ops[0].in[0] = -2;
    snprintf(w, n, "p: op 0 (%s) input 0 refers to tensor -2 of %d", tg_op_name(p->ops[0].kind), p->n_tensors);
}
static void op_output_past(tg_plan *p, char *w, size_t n) {
    p->ops[0].out[0] = p->n_tensors;
    snprintf(w, n, "p: op 0 (%s) output 0 refers to tensor %d of %d", tg_op_name(p->ops[0].kind), p->n_tensors,
             p->n_tensors);
}
static void activation_negative(tg_plan *p, char *w, size_t n) {
    const int o = first_op(p, TG_OP_MATMUL);
    p->ops[o].p.matmul.activation = -1;
    snprintf(w, n, "p: op %d (matmul) has activation=-1 (0, 1 or 2 allowed)", o);
}
static void gelu_bwd_without_pre(tg_plan *p, char *w, size_t n) {
    const int o = first_op(p, TG_OP_MATMUL);
    p->ops[o].p.matmul.activation = TG_MATMUL_ACT_GELU_BWD, p->ops[o].in[3] = -1;
    snprintf(w, n, "p: op %d (matmul) with activation=2 lacks its pre-activation (in3)", o);
}
static void gelu_bwd_with_pre(tg_plan *p, char *w, size_t n) {
    const int o = first_op(p, TG_OP_MATMUL);
    p->ops[o].p.matmul.activation = TG_MATMUL_ACT_GELU_BWD, p->ops[o].in[3] = 0; /* the tables check no shapes */
}
/* The matmul epilogue's field is read from matmul ops only: in any other op those bytes of
 * the parameter union belong to no field of its own set. */
static void activation_bytes_of_other_ops(tg_plan *p, char *w, size_t n) {
    for (int o = 0; o < p->n_ops; o++)
        if (p->ops[o].kind != TG_OP_MATMUL) p->ops[o].p.matmul.activation = -1;
}
static void io_below(tg_plan *p, char *w, size_t n) {
    p->io.input_ids = -2;
    snprintf(w, n, "p: io input_ids refers to tensor -2 of %d", p->n_tensors);
}

/* The class of an activation: flags and pools that do not go together. */
static void say_plain(tg_plan *p, int t, char *w, size_t n, const char *rest) {
    snprintf(w, n, "p: tensor %d (%s) in the %s pool: %s", t, p->tensors[t].name, tg_pool_name(p->tensors[t].pool),
             rest);
}
static void param_in_activations(tg_plan *p, char *w, size_t n) {
    const int t = plain_tensor(p, TG_POOL_ACTIVATIONS);
    p->tensors[t].flags |= TG_TENSOR_PARAM;
    say_plain(p, t, w, n, "a trainable parameter must be in the params pool");
}
static void buffer_in_activations(tg_plan *p, char *w, size_t n) {
    const int t = plain_tensor(p, TG_POOL_ACTIVATIONS);
    p->tensors[t].flags |= TG_TENSOR_BUFFER;
    say_plain(p, t, w, n, "a buffer must be in the buffers pool");
}
static void move_to(tg_plan *p, int t, int pool) {
    p->tensors[t].pool = pool, p->tensors[t].offset = 0;
    if (p->pool_bytes[pool] < p->tensors[t].bytes) p->pool_bytes[pool] = p->tensors[t].bytes;
}
static void plain_in_frozen(tg_plan *p, char *w, size_t n) {
    const int t = plain_tensor(p, TG_POOL_ACTIVATIONS);
    move_to(p, t, TG_POOL_FROZEN);
    say_plain(p, t, w, n, "the frozen pool holds frozen parameters only");
}
static void plain_in_params(tg_plan *p, char *w, size_t n) {
    const int t = plain_tensor(p, TG_POOL_ACTIVATIONS);
    move_to(p, t, TG_POOL_PARAMS);
    say_plain(p, t, w, n, "the params pool holds trainable parameters (and views of the pool) only");
}
static void persistent_buffer(tg_plan *p, char *w, size_t n) {
    const int t = plain_tensor(p, TG_POOL_ACTIVATIONS);
    move_to(p, t, TG_POOL_BUFFERS);
    p->tensors[t].flags |= TG_TENSOR_BUFFER | TG_TENSOR_PERSISTENT; /* accepted */
}
static void frozen_in_frozen(tg_plan *p, char *w, size_t n) {
    const int t = plain_tensor(p, TG_POOL_ACTIVATIONS);
    move_to(p, t, TG_POOL_FROZEN);
    p->tensors[t].flags |= TG_TENSOR_FROZEN; /* accepted */
}

static void skip_nonfinite_two(tg_plan *p, char *w, size_t n) {
    p->run.skip_nonfinite = 2;
    snprintf(w, n, "p: run skip_nonfinite 2 is not 0 or 1");
}
static void skip_nonfinite_negative(tg_plan *p, char *w, size_t n) {
    p->run.skip_nonfinite = -1;
    snprintf(w, n, "p: run skip_nonfinite -1 is not 0 or 1");
}
static void skip_nonfinite_one(tg_plan *p, char *w, size_t n) { p->run.skip_nonfinite = 1; }
static void max_skipped_negative(tg_plan *p, char *w, size_t n) {
    p->run.max_skipped_steps = -1;
    snprintf(w, n, "p: run max_skipped_steps -1 is negative");
}
static void gpu_hour_price_negative(tg_plan *p, char *w, size_t n) {
    p->run.gpu_hour_price = -1;
    snprintf(w, n, "p: run gpu_hour_price -1 is not in [0, 1e+06]");
}
static void gpu_hour_price_nan(tg_plan *p, char *w, size_t n) {
    p->run.gpu_hour_price = NAN;
    snprintf(w, n, "p: run gpu_hour_price nan is not in [0, 1e+06]");
}
static void gpu_hour_price_above(tg_plan *p, char *w, size_t n) {
    p->run.gpu_hour_price = 2e6f;
    snprintf(w, n, "p: run gpu_hour_price 2e+06 is not in [0, 1e+06]");
}
/* -1 is a dim too: the smallest negative one is refused by its own message. */
static void dim_minus_one(tg_plan *p, char *w, size_t n) {
    tg_tensor *x = &p->tensors[0];
    x->shape[0] = -1;
    say_t0(p, w, n, "dim 0 is -1");
}
static void say_past(tg_plan *p, char *w, size_t n, const char *what, int t) {
    char rest[96];
    snprintf(rest, sizeof rest, "%s refers to tensor %d of %d", what, t, p->n_tensors);
    say_t0(p, w, n, rest);
}
static void grad_past(tg_plan *p, char *w, size_t n) {
    p->tensors[0].grad = p->n_tensors;
    say_past(p, w, n, "gradient", p->n_tensors);
}
static void master_far_past(tg_plan *p, char *w, size_t n) {
    p->tensors[0].master = p->n_tensors + 1;
    say_past(p, w, n, "master copy", p->n_tensors + 1);
}
static void group_far_past(tg_plan *p, char *w, size_t n) {
    p->tensors[0].group = p->n_tensors + 1;
    say_past(p, w, n, "packed group", p->n_tensors + 1);
}
static void phase_start_negative(tg_plan *p, char *w, size_t n) {
    p->phase_begin[0] = -1;
    snprintf(w, n, "p: phase table runs -1..%d, expected 0..%d (n_ops)", p->n_ops, p->n_ops);
}
static void phases_descending(tg_plan *p, char *w, size_t n) {
    const int b = p->phase_begin[1];
    p->phase_begin[2] = b - 1;
    snprintf(w, n, "p: phase backward begins at op %d but ends at op %d", b, b - 1);
}
static void batch_one(tg_plan *p, char *w, size_t n) { p->train.batch = 1; }
static void batch_zero(tg_plan *p, char *w, size_t n) {
    p->train.batch = 0;
    snprintf(w, n, "p: train batch 0 is not a positive row count");
}
static void phase_end_short(tg_plan *p, char *w, size_t n) {
    p->phase_begin[TG_PHASE_COUNT] = p->n_ops - 1;
    snprintf(w, n, "p: phase table runs 0..%d, expected 0..%d (n_ops)", p->n_ops - 1, p->n_ops);
}

TG_TEST(test_plan_validate_tables_fields) {
    static const edit_case cases[] = {
        {"arch -1", BASE_BERT, CHECK_TABLES, arch_negative},
        {"task -1", BASE_BERT, CHECK_TABLES, task_negative},
        {"LM num_labels -1", BASE_GPT2, CHECK_TABLES, lm_num_labels},
        {"LM num_labels 0", BASE_GPT2, CHECK_TABLES, lm_num_labels_zero},
        {"positions past int32", BASE_BERT, CHECK_TABLES, position_past_int32},
        {"positions up to int32", BASE_BERT, CHECK_TABLES, position_at_int32},
        {"precision -1", BASE_BERT, CHECK_TABLES, precision_negative},
        {"zero_stage -1", BASE_BERT, CHECK_TABLES, zero_stage_negative},
        {"attention -1", BASE_BERT, CHECK_TABLES, attention_negative},
        {"n_buckets 0", BASE_BERT, CHECK_TABLES, no_buckets},
        {"n_buckets 9", BASE_BERT, CHECK_TABLES, too_many_buckets},
        {"a bucket past the count", BASE_BERT, CHECK_TABLES, bucket_past_count},
        {"a bucket repeated", BASE_BERT, CHECK_TABLES, bucket_repeated},
        {"buckets descending", BASE_BERT, CHECK_TABLES, bucket_descending},
        {"a bucket of 0", BASE_BERT, CHECK_TABLES, bucket_zero},
        {"seq not a bucket", BASE_BERT, CHECK_TABLES, seq_not_a_bucket},
        {"seq the first of two buckets", BASE_BERT, CHECK_TABLES, seq_first_of_two},
        {"last_batch -1", BASE_BERT, CHECK_TABLES, last_batch_negative},
        {"last_batch 3", BASE_BERT, CHECK_TABLES, last_batch_past},
        {"wrap with buckets", BASE_BERT, CHECK_TABLES, wrap_with_buckets},
        {"wrap with one bucket", BASE_BERT, CHECK_TABLES, wrap_one_bucket},
        {"steps -1", BASE_BERT, CHECK_TABLES, steps_negative},
        {"epochs -1", BASE_BERT, CHECK_TABLES, epochs_negative},
        {"epochs instead of steps", BASE_BERT, CHECK_TABLES, epochs_only},
        {"checkpoint_every -1", BASE_BERT, CHECK_TABLES, checkpoint_every_negative},
        {"keep_checkpoints -1", BASE_BERT, CHECK_TABLES, keep_checkpoints_negative},
        {"dtype -1", BASE_BERT, CHECK_TABLES, dtype_negative},
        {"ndim -1", BASE_BERT, CHECK_TABLES, ndim_negative},
        {"a negative dim", BASE_BERT, CHECK_TABLES, dim_negative},
        {"pool -1", BASE_BERT, CHECK_TABLES, pool_negative},
        {"offset past the pool", BASE_BERT, CHECK_TABLES, offset_past_pool},
        {"init -1", BASE_BERT, CHECK_TABLES, init_negative},
        {"grad -2", BASE_BERT, CHECK_TABLES, grad_below},
        {"master -2", BASE_BERT, CHECK_TABLES, master_below},
        {"master past the table", BASE_BERT, CHECK_TABLES, master_past},
        {"group -2", BASE_BERT, CHECK_TABLES, group_below},
        {"first_use -2", BASE_BERT, CHECK_TABLES, first_use_below},
        {"first_use n_ops", BASE_BERT, CHECK_TABLES, first_use_past},
        {"last_use -2", BASE_BERT, CHECK_TABLES, last_use_below},
        {"last_use n_ops", BASE_BERT, CHECK_TABLES, last_use_past},
        {"half a lifetime", BASE_BERT, CHECK_TABLES, half_lifetime},
        {"no lifetime", BASE_BERT, CHECK_TABLES, unused_tensor},
        {"phase table start", BASE_BERT, CHECK_TABLES, phase_start},
        {"phase table start -1", BASE_BERT, CHECK_TABLES, phase_start_negative},
        {"phase table end short", BASE_BERT, CHECK_TABLES, phase_end_short},
        {"phases descending", BASE_BERT, CHECK_TABLES, phases_descending},
        {"batch 1", BASE_BERT, CHECK_TABLES, batch_one},
        {"batch 0", BASE_BERT, CHECK_TABLES, batch_zero},
        {"skip_nonfinite 2", BASE_BERT, CHECK_TABLES, skip_nonfinite_two},
        {"skip_nonfinite -1", BASE_BERT, CHECK_TABLES, skip_nonfinite_negative},
        {"skip_nonfinite 1", BASE_BERT, CHECK_TABLES, skip_nonfinite_one},
        {"max_skipped_steps -1", BASE_BERT, CHECK_TABLES, max_skipped_negative},
        {"gpu_hour_price -1", BASE_BERT, CHECK_TABLES, gpu_hour_price_negative},
        {"gpu_hour_price nan", BASE_BERT, CHECK_TABLES, gpu_hour_price_nan},
        {"gpu_hour_price 2e6", BASE_BERT, CHECK_TABLES, gpu_hour_price_above},
        {"dim -1", BASE_BERT, CHECK_TABLES, dim_minus_one},
        {"grad past the table", BASE_BERT, CHECK_TABLES, grad_past},
        {"master two past the table", BASE_BERT, CHECK_TABLES, master_far_past},
        {"group two past the table", BASE_BERT, CHECK_TABLES, group_far_past},
        {"qa as compiled", BASE_QA, CHECK_TABLES, b_accepted},
        {"op kind -1", BASE_BERT, CHECK_TABLES, op_kind_negative},
        {"op kind past the enum", BASE_BERT, CHECK_TABLES, op_kind_past},
        {"op input -2", BASE_BERT, CHECK_TABLES, op_input_below},
        {"op output past the table", BASE_BERT, CHECK_TABLES, op_output_past},
        {"matmul activation -1", BASE_BERT, CHECK_TABLES, activation_negative},
        {"GELU backward without its input", BASE_BERT, CHECK_TABLES, gelu_bwd_without_pre},
        {"GELU backward with its input", BASE_BERT, CHECK_TABLES, gelu_bwd_with_pre},
        {"activation bytes of ops other than matmul", BASE_BERT, CHECK_TABLES, activation_bytes_of_other_ops},
        {"activation bytes of ops other than matmul, GPT-2", BASE_GPT2, CHECK_TABLES, activation_bytes_of_other_ops},
        {"io -2", BASE_BERT, CHECK_TABLES, io_below},
        {"a parameter among activations", BASE_BERT, CHECK_TABLES, param_in_activations},
        {"a buffer among activations", BASE_BERT, CHECK_TABLES, buffer_in_activations},
        {"an activation in the frozen pool", BASE_BERT, CHECK_TABLES, plain_in_frozen},
        {"an activation in the params pool", BASE_BERT, CHECK_TABLES, plain_in_params},
        {"a persistent buffer", BASE_BERT, CHECK_TABLES, persistent_buffer},
        {"a frozen parameter", BASE_BERT, CHECK_TABLES, frozen_in_frozen},
    };
    run_edits(cases, sizeof cases / sizeof cases[0]);
}

/* ---- tg_plan_validate_tables: the loss scale, half dtypes, the io of mlm and fp16 ----- */

static void scale_nan(tg_plan *p, char *w, size_t n) {
    p->train.loss_scale_init = NAN;
    snprintf(w, n, "p: train loss_scale_init nan is not a positive power of two (fp16 plans)");
}
static void scale_inf(tg_plan *p, char *w, size_t n) {
    p->train.loss_scale_init = INFINITY;
    snprintf(w, n, "p: train loss_scale_init inf is not a positive power of two (fp16 plans)");
}
static void scale_zero(tg_plan *p, char *w, size_t n) {
    p->train.loss_scale_init = 0.0f;
    snprintf(w, n, "p: train loss_scale_init 0 is not a positive power of two (fp16 plans)");
}
static void scale_minus_half(tg_plan *p, char *w, size_t n) {
    p->train.loss_scale_init = -0.5f; /* frexpf gives -0.5: the sign alone is refused here */
    snprintf(w, n, "p: train loss_scale_init -0.5 is not a positive power of two (fp16 plans)");
}
static void scale_three(tg_plan *p, char *w, size_t n) {
    p->train.loss_scale_init = 3.0f;
    snprintf(w, n, "p: train loss_scale_init 3 is not a positive power of two (fp16 plans)");
}
static void scale_half(tg_plan *p, char *w, size_t n) { p->train.loss_scale_init = 0.5f; }
static void scale_in_fp32(tg_plan *p, char *w, size_t n) {
    p->train.loss_scale_init = 1.0f;
    snprintf(w, n, "p: train loss_scale_init 1 is not 0 (only fp16 plans scale the loss)");
}
/* The first tensor of `dtype` retyped as `to` (same element size): the refusal names it. */
static void retype(tg_plan *p, char *w, size_t n, int dtype, int to) {
    for (int t = 0; t < p->n_tensors; t++)
        if (p->tensors[t].dtype == dtype) {
            p->tensors[t].dtype = to;
            snprintf(w, n, "p: tensor %d (%s) is %s in a plan of precision %s", t, p->tensors[t].name,
                     tg_dtype_name(to), tg_precision_name(p->train.precision));
            return;
        }
    snprintf(w, n, "(no tensor of dtype %s)", tg_dtype_name(dtype));
}
static void f16_in_bf16(tg_plan *p, char *w, size_t n) { retype(p, w, n, TG_BF16, TG_F16); }
static void bf16_in_fp16(tg_plan *p, char *w, size_t n) { retype(p, w, n, TG_F16, TG_BF16); }
static void bf16_in_fp32(tg_plan *p, char *w, size_t n) {
    p->train.precision = TG_PREC_FP32;
    retype(p, w, n, TG_BF16, TG_BF16);
}
static void f16_in_fp32(tg_plan *p, char *w, size_t n) {
    p->train.precision = TG_PREC_FP32;
    p->train.loss_scale_init = 0.0f;
    retype(p, w, n, TG_F16, TG_F16);
}
/* A tensor of f32 [1] in the optimizer pool (the step counter): a valid loss scale's
 * place, by pool, dtype and shape. */
static int optim_scalar(const tg_plan *p) {
    for (int t = 0; t < p->n_tensors; t++) {
        const tg_tensor *x = &p->tensors[t];
        if (x->pool == TG_POOL_OPTIM && x->dtype == TG_F32 && tg_tensor_numel(x) == 1)
            return t;
    }
    return -1;
}
static void scale_io_in_fp32(tg_plan *p, char *w, size_t n) {
    p->io.loss_scale = optim_scalar(p);
    snprintf(w, n, "p: io loss_scale is tensor %d and loss_scale_growth tensor -1, but the plan's precision is fp32 "
                   "(only fp16 plans scale the loss)", p->io.loss_scale);
}
static void growth_io_in_fp32(tg_plan *p, char *w, size_t n) {
    p->io.loss_scale_growth = optim_scalar(p);
    snprintf(w, n, "p: io loss_scale is tensor -1 and loss_scale_growth tensor %d, but the plan's precision is fp32 "
                   "(only fp16 plans scale the loss)", p->io.loss_scale_growth);
}
static void mlm_stream_in_lm(tg_plan *p, char *w, size_t n) {
    p->train.task = TG_TASK_LM;
    snprintf(w, n, "p: io mlm_stream is tensor %d (%s), but the task is lm (it is for mlm alone)", p->io.mlm_stream,
             p->tensors[p->io.mlm_stream].name);
}
/* A tensor of no bytes in the step counter's pool reaches none of its bytes. */
static void empty_at_step(tg_plan *p, char *w, size_t n) {
    tg_tensor *grown = realloc(p->tensors, (size_t)(p->n_tensors + 1) * sizeof *grown);
    if (!grown) {
        snprintf(w, n, "(out of memory)");
        return;
    }
    p->tensors = grown;
    tg_tensor *x = &p->tensors[p->n_tensors];
    *x = p->tensors[p->io.step];
    snprintf(x->name, sizeof x->name, "empty");
    /* Aligned past the pool's last tensor, the pool (and the peak) grown to reach it. */
    const uint64_t end = (p->pool_bytes[x->pool] + 255) / 256 * 256;
    p->peak_bytes += end - p->pool_bytes[x->pool];
    p->pool_bytes[x->pool] = x->offset = end;
    x->ndim = 1;
    x->shape[0] = 0;
    x->bytes = 0;
    x->first_use = x->last_use = -1;
    p->n_tensors++;
}
/* Every parameter lies inside params_all: with params_all and the gradients one element
 * short of the parameters' end (no ops, which would count them), the last parameter
 * reaches past it. */
static void param_past_params_all(tg_plan *p, char *w, size_t n) {
    drop_ops(p);
    uint64_t end = 0;
    for (int t = 0; t < p->n_tensors; t++)
        if ((p->tensors[t].flags & TG_TENSOR_PARAM) && p->tensors[t].offset + p->tensors[t].bytes > end)
            end = p->tensors[t].offset + p->tensors[t].bytes;
    for (int k = 0; k < 2; k++) {
        tg_tensor *x = &p->tensors[k ? p->io.grads_all : p->io.params_all];
        x->ndim = 1;
        x->shape[0] = (int64_t)(end / 4) - 1;
        x->bytes = end - 4;
    }
    int last = -1;
    for (int t = 0; t < p->n_tensors; t++)
        if ((p->tensors[t].flags & TG_TENSOR_PARAM) &&
            p->tensors[t].offset + p->tensors[t].bytes > p->tensors[p->io.params_all].bytes) {
            last = t;
            break;
        }
    if (last < 0) {
        snprintf(w, n, "(no parameter reaches the end of params_all)");
        return;
    }
    const tg_tensor *x = &p->tensors[last];
    snprintf(w, n, "p: tensor %d (%s) at offset %llu + %llu bytes lies outside io params_all (%lld elements)", last,
             x->name, (unsigned long long)x->offset, (unsigned long long)x->bytes,
             (long long)tg_tensor_numel(&p->tensors[p->io.params_all]));
}

/* SCHEDULE's gradient norm is optional: without it the schedule binds the rest alone. */
static void schedule_without_norm(tg_plan *p, char *w, size_t n) {
    const int o = first_op(p, TG_OP_SCHEDULE);
    if (o < 0) {
        snprintf(w, n, "(no SCHEDULE op)");
        return;
    }
    p->ops[o].in[2] = -1;
}
/* A parameter copy whose view-ness differs from its master's. */
static void copy_view_mismatch(tg_plan *p, char *w, size_t n) {
    for (int t = 0; t < p->n_tensors; t++) {
        tg_tensor *x = &p->tensors[t];
        if (!(x->flags & TG_TENSOR_PARAM_COPY) || x->master < 0 || (x->flags & TG_TENSOR_VIEW)) continue;
        x->flags |= TG_TENSOR_VIEW;
        snprintf(w, n, "p: tensor %d (%s) is a parameter copy of tensor %d %s, which is not a parameter or buffer of its "
                       "elements", t, x->name, x->master, p->tensors[x->master].name);
        return;
    }
    snprintf(w, n, "(no parameter copy that is not a view)");
}

TG_TEST(test_plan_validate_tables_precision_io) {
    static const edit_case cases[] = {
        {"fp16 as compiled", BASE_FP16, CHECK_TABLES, b_accepted},
        {"mlm as compiled", BASE_MLM, CHECK_TABLES, b_accepted},
        {"loss scale nan", BASE_FP16, CHECK_TABLES, scale_nan},
        {"loss scale inf", BASE_FP16, CHECK_TABLES, scale_inf},
        {"loss scale 0", BASE_FP16, CHECK_TABLES, scale_zero},
        {"loss scale -0.5", BASE_FP16, CHECK_TABLES, scale_minus_half},
        {"loss scale 3", BASE_FP16, CHECK_TABLES, scale_three},
        {"loss scale 0.5", BASE_FP16, CHECK_TABLES, scale_half},
        {"a loss scale in fp32", BASE_BERT, CHECK_TABLES, scale_in_fp32},
        {"f16 in a bf16 plan", BASE_BF16, CHECK_TABLES, f16_in_bf16},
        {"bf16 in an fp16 plan", BASE_FP16, CHECK_TABLES, bf16_in_fp16},
        {"bf16 in an fp32 plan", BASE_BF16, CHECK_TABLES, bf16_in_fp32},
        {"f16 in an fp32 plan", BASE_FP16, CHECK_TABLES, f16_in_fp32},
        {"io loss_scale in fp32", BASE_BERT, CHECK_OPS, scale_io_in_fp32},
        {"io loss_scale_growth in fp32", BASE_BERT, CHECK_OPS, growth_io_in_fp32},
        {"io mlm_stream in lm", BASE_MLM, CHECK_OPS, mlm_stream_in_lm},
        {"an empty tensor at the step counter", BASE_BERT, CHECK_OPS, empty_at_step},
        {"a parameter past params_all", BASE_BERT, CHECK_OPS, param_past_params_all},
        {"SCHEDULE without a gradient norm", BASE_BERT, CHECK_OPS, schedule_without_norm},
        {"a parameter copy a view of a tensor that is not", BASE_BF16, CHECK_OPS, copy_view_mismatch},
    };
    run_edits(cases, sizeof cases / sizeof cases[0]);
}

/* ---- tg_plan_check_memory --------------------------------------------------------------- */

static void used_after_last_use(tg_plan *p, char *w, size_t n) {
    for (int t = 0; t < p->n_tensors; t++) {
        tg_tensor *x = &p->tensors[t];
        if (x->first_use >= 0 && x->last_use > x->first_use) {
            const int last = x->last_use;
            x->last_use = x->first_use;
            /* The first op past the shortened lifetime that touches it is named. */
            for (int o = x->first_use + 1; o <= last; o++)
                for (int s = 0; s < TG_OP_MAX_IN + TG_OP_MAX_OUT; s++)
                    if ((s < TG_OP_MAX_IN ? p->ops[o].in[s] : p->ops[o].out[s - TG_OP_MAX_IN]) == t) {
                        snprintf(w, n, "op %d (%s) uses tensor %s outside its lifetime [%d, %d]", o,
                                 tg_op_name(p->ops[o].kind), x->name, x->first_use, x->last_use);
                        return;
                    }
        }
    }
}
static void used_before_first_use(tg_plan *p, char *w, size_t n) {
    const int t = p->ops[0].in[0];
    tg_tensor *x = &p->tensors[t];
    x->first_use = 1;
    if (x->last_use < 1) x->last_use = 1;
    snprintf(w, n, "op 0 (%s) uses tensor %s outside its lifetime [1, %d]", tg_op_name(p->ops[0].kind), x->name,
             x->last_use);
}
static void unaligned(tg_plan *p, char *w, size_t n) {
    const int t = plain_tensor(p, TG_POOL_ACTIVATIONS);
    p->tensors[t].offset += 4;
    snprintf(w, n, "tensor %s offset %llu is not 256-byte aligned", p->tensors[t].name,
             (unsigned long long)p->tensors[t].offset);
}
static void say_member(tg_plan *p, int t, char *w, size_t n, const char *why) {
    snprintf(w, n, "tensor %s at offset %llu, packed in %s: %s", p->tensors[t].name,
             (unsigned long long)p->tensors[t].offset, p->tensors[p->tensors[t].group].name, why);
}
#define NOT_A_GROUP "its group is not a view of its pool and dtype, or it is not a whole-step tensor"
static void group_not_view(tg_plan *p, char *w, size_t n) {
    const int t = first_member(p);
    p->tensors[p->tensors[t].group].flags &= ~TG_TENSOR_VIEW;
    say_member(p, t, w, n, NOT_A_GROUP);
}
static void group_other_pool(tg_plan *p, char *w, size_t n) {
    const int t = first_member(p);
    p->tensors[p->tensors[t].group].pool = TG_POOL_GRADS;
    say_member(p, t, w, n, NOT_A_GROUP);
}
static void group_other_dtype(tg_plan *p, char *w, size_t n) {
    const int t = first_member(p);
    p->tensors[p->tensors[t].group].dtype = TG_BF16;
    say_member(p, t, w, n, NOT_A_GROUP);
}
static void member_a_view(tg_plan *p, char *w, size_t n) {
    const int t = first_member(p);
    p->tensors[t].flags |= TG_TENSOR_VIEW;
    say_member(p, t, w, n, NOT_A_GROUP);
}
static void group_in_activations(tg_plan *p, char *w, size_t n) {
    const int t = first_member(p);
    p->tensors[t].pool = p->tensors[p->tensors[t].group].pool = TG_POOL_ACTIVATIONS;
    say_member(p, t, w, n, NOT_A_GROUP);
}
static void member_before_view(tg_plan *p, char *w, size_t n) {
    const int first = first_member(p);
    p->tensors[p->tensors[first].group].offset += 256;
    /* The first member (in table order) now before its view is named. */
    for (int t = 0; t < p->n_tensors; t++)
        if (p->tensors[t].group >= 0 && p->tensors[t].offset < p->tensors[p->tensors[t].group].offset) {
            say_member(p, t, w, n, "it lies outside its group's view");
            return;
        }
}
static void member_past_view(tg_plan *p, char *w, size_t n) {
    const int t = first_member(p);
    const tg_tensor *v = &p->tensors[p->tensors[t].group];
    p->tensors[t].offset = v->offset + v->bytes - 4;
    say_member(p, t, w, n, "it lies outside its group's view");
}
static void member_misaligned(tg_plan *p, char *w, size_t n) {
    const int t = first_member(p);
    p->tensors[t].offset += 2;
    say_member(p, t, w, n, "its offset is not a multiple of its element size");
}
static void member_short(tg_plan *p, char *w, size_t n) {
    const int t = first_member(p);
    const tg_tensor *v = &p->tensors[p->tensors[t].group];
    p->tensors[t].bytes -= 4;
    snprintf(w, n, "packed view %s holds %llu bytes but its members %llu", v->name, (unsigned long long)v->bytes,
             (unsigned long long)(v->bytes - 4));
}
static void pool_short(tg_plan *p, char *w, size_t n) {
    uint64_t reach = 0;
    for (int t = 0; t < p->n_tensors; t++)
        if (p->tensors[t].pool == TG_POOL_OPTIM && p->tensors[t].offset + p->tensors[t].bytes > reach)
            reach = p->tensors[t].offset + p->tensors[t].bytes;
    p->pool_bytes[TG_POOL_OPTIM] = reach - 1;
    snprintf(w, n, "pool optim: tensors reach %llu bytes but the pool has %llu", (unsigned long long)reach,
             (unsigned long long)(reach - 1));
}

TG_TEST(test_plan_validate_memory) {
    static const edit_case cases[] = {
        {"used after its last use", BASE_BERT, CHECK_MEMORY, used_after_last_use},
        {"unaligned", BASE_BERT, CHECK_MEMORY, unaligned},
        {"used before its first use", BASE_BERT, CHECK_MEMORY, used_before_first_use},
        {"group not a view", BASE_BERT, CHECK_MEMORY, group_not_view},
        {"group in another pool", BASE_BERT, CHECK_MEMORY, group_other_pool},
        {"group of another dtype", BASE_BERT, CHECK_MEMORY, group_other_dtype},
        {"a member that is a view", BASE_BERT, CHECK_MEMORY, member_a_view},
        {"a group of activations", BASE_BERT, CHECK_MEMORY, group_in_activations},
        {"a member before its view", BASE_BERT, CHECK_MEMORY, member_before_view},
        {"a member past its view", BASE_BERT, CHECK_MEMORY, member_past_view},
        {"a member off its element size", BASE_BERT, CHECK_MEMORY, member_misaligned},
        {"members short of the view", BASE_BERT, CHECK_MEMORY, member_short},
        {"a pool too small", BASE_BERT, CHECK_MEMORY, pool_short},
    };
    run_edits(cases, sizeof cases / sizeof cases[0]);

    /* The report of the compiled plan: the pools' extents add up to its peak. */
    const tg_plan *p = base_plan(BASE_BERT);
    REQUIRE(p, "no base plan");
    tg_memory_report r;
    tg_err err = {{0}};
    REQUIRE(tg_plan_check_memory(p, &r, &err) == 0, "%s", err.msg);
    CHECK(r.peak_bytes == p->peak_bytes && r.activation_live_peak == p->activation_live_peak &&
              r.pool_extent[TG_POOL_ACTIVATIONS] <= p->pool_bytes[TG_POOL_ACTIVATIONS],
          "report: peak %llu (plan %llu), live %llu (plan %llu)", (unsigned long long)r.peak_bytes,
          (unsigned long long)p->peak_bytes, (unsigned long long)r.activation_live_peak,
          (unsigned long long)p->activation_live_peak);

    /* A plan without tensors or ops: nothing placed, nothing reached. */
    tg_plan empty;
    memset(&empty, 0, sizeof empty);
    memset(&r, 0xff, sizeof r);
    CHECK(tg_plan_check_memory(&empty, &r, &err) == 0 && r.peak_bytes == 0 && r.activation_live_peak == 0 &&
              r.pool_extent[TG_POOL_PARAMS] == 0,
          "empty plan: %s, peak %llu", err.msg, (unsigned long long)r.peak_bytes);

    /* Out of memory: the layout's two tables, then the live peak's. */
    static const char *const oom[] = {"out of memory checking the memory layout of", "out of memory checking the memory layout of",
                                      "out of memory computing the activation live peak over"};
    for (int k = 0; k < 3; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = tg_plan_check_memory(p, &r, &err);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && strstr(err.msg, oom[k]), "allocation %d failed: rc %d, '%s'", k, rc, err.msg);
    }
    tg_alloc_fail_after(3);
    CHECK(tg_plan_check_memory(p, &r, &err) == 0, "three allocations do not suffice: %s", err.msg);
    tg_alloc_fail_after(-1);
}

/* The overlap check on a hand-made layout (no ops): tensors sorted by pool, then offset, then
 * index, each checked against those after it in its pool, and the first overlap in that
 * order reported. Whole-step pools overlap whatever the lifetimes; activations only while
 * both are live. */
typedef struct placed_spec {
    const char *name;
    int pool;
    uint64_t offset, bytes;
    int first, last;
} placed_spec;

static int check_layout(const placed_spec *spec, int n, tg_err *err, tg_memory_report *r) {
    tg_tensor t[8];
    tg_plan p;
    memset(&p, 0, sizeof p);
    memset(t, 0, sizeof t);
    for (int k = 0; k < n; k++) {
        snprintf(t[k].name, sizeof t[k].name, "%s", spec[k].name);
        t[k].dtype = TG_F32, t[k].pool = spec[k].pool, t[k].ndim = 1, t[k].shape[0] = (int64_t)spec[k].bytes / 4;
        t[k].offset = spec[k].offset, t[k].bytes = spec[k].bytes;
        t[k].first_use = spec[k].first, t[k].last_use = spec[k].last;
        t[k].grad = t[k].master = t[k].group = -1;
    }
    tg_op ops[5]; /* five ops touching nothing: lifetimes within the schedule count in the live peak */
    for (int o = 0; o < 5; o++) ops[o] = tg_test_op(TG_OP_ADD);
    p.tensors = t, p.n_tensors = n, p.ops = ops, p.n_ops = 5;
    for (int q = 0; q < TG_POOL_COUNT; q++) p.pool_bytes[q] = 4096;
    memset(err, 0, sizeof *err);
    return tg_plan_check_memory(&p, r, err);
}

TG_TEST(test_plan_validate_overlap_order) {
    enum { A = TG_POOL_ACTIVATIONS, G = TG_POOL_GRADS, P = TG_POOL_PARAMS };
    static const struct {
        const char *what;
        placed_spec t[6];
        int n;
        const char *want; /* NULL: accepted */
    } cases[] = {
        {"overlaps in two pools: the lower pool's first",
         {{"g1", G, 0, 512, 0, 0}, {"g2", G, 256, 256, 0, 0}, {"p2", P, 256, 256, 1, 1}, {"p1", P, 0, 512, 2, 2}},
         4,
         "tensors p1 [0, 512) and p2 [256, 512) of pool params overlap while both live (ops 2..2 and 1..1)"},
        {"the lower offset first, whatever the index",
         {{"late", P, 512, 256, 0, 0}, {"early", P, 256, 512, 0, 0}},
         2,
         "tensors early [256, 768) and late [512, 768) of pool params overlap while both live (ops 0..0 and 0..0)"},
        {"the same offset: the lower index first",
         {{"x", A, 0, 256, 0, 5}, {"b", A, 0, 512, 3, 4}, {"a", A, 0, 256, 1, 3}},
         3,
         "tensors x [0, 256) and b [0, 512) of pool activations overlap while both live (ops 0..5 and 3..4)"},
        {"activations apart in time, then one live with both",
         {{"a", A, 0, 768, 0, 1}, {"b", A, 256, 256, 2, 3}, {"c", A, 512, 256, 1, 2}},
         3,
         "tensors a [0, 768) and c [512, 768) of pool activations overlap while both live (ops 0..1 and 1..2)"},
        {"whole-step tensors of one pool overlap whatever their lifetimes",
         {{"a", G, 0, 512, 0, 0}, {"b", G, 256, 256, 5, 5}},
         2,
         "tensors a [0, 512) and b [256, 512) of pool grads overlap while both live (ops 0..0 and 5..5)"},
        {"adjacent tensors, equal offsets in different pools, activations apart in time",
         {{"a", P, 0, 256, 0, 0}, {"b", P, 256, 256, 0, 0}, {"c", G, 0, 512, 0, 0}, {"d", A, 0, 512, 0, 1},
          {"e", A, 256, 256, 2, 3}, {"f", A, 0, 256, 4, 4}},
         6,
         NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tg_err err;
        tg_memory_report r;
        const int rc = check_layout(cases[i].t, cases[i].n, &err, &r);
        if (cases[i].want)
            CHECK(rc == -1 && !strcmp(err.msg, cases[i].want), "%s: rc %d '%s', want '%s'", cases[i].what, rc, err.msg,
                  cases[i].want);
        else
            CHECK(rc == 0 && r.pool_extent[P] == 512 && r.pool_extent[G] == 512 && r.pool_extent[A] == 512 &&
                      r.peak_bytes == 1536 && r.activation_live_peak == 512,
                  "%s: rc %d '%s', extents %llu %llu %llu, peak %llu, live %llu", cases[i].what, rc, err.msg,
                  (unsigned long long)r.pool_extent[P], (unsigned long long)r.pool_extent[G],
                  (unsigned long long)r.pool_extent[A], (unsigned long long)r.peak_bytes,
                  (unsigned long long)r.activation_live_peak);
    }
}

/* The live activation bytes, op by op, from lifetimes alone; tensors outside the
 * activations pool, unused or with lifetimes outside the schedule count nothing. */
TG_TEST(test_plan_validate_live_peak) {
    tg_tensor t[7];
    memset(t, 0, sizeof t);
    const struct {
        int pool, first, last;
        uint64_t bytes;
    } spec[7] = {
        {TG_POOL_ACTIVATIONS, 0, 1, 100}, /* ops 0, 1 */
        {TG_POOL_ACTIVATIONS, 1, 2, 50},  /* ops 1, 2 */
        {TG_POOL_ACTIVATIONS, 2, 2, 120}, /* op 2 */
        {TG_POOL_PARAMS, 0, 2, 1000},     /* not an activation */
        {TG_POOL_ACTIVATIONS, -1, -1, 1000},
        {TG_POOL_ACTIVATIONS, 2, 1, 1000}, /* backwards */
        {TG_POOL_ACTIVATIONS, 1, 3, 1000}, /* past the schedule */
    };
    for (int k = 0; k < 7; k++)
        t[k].pool = spec[k].pool, t[k].first_use = spec[k].first, t[k].last_use = spec[k].last, t[k].bytes = spec[k].bytes;
    uint64_t peak = 0;
    REQUIRE(tg_plan_live_activation_peak(t, 7, 3, NULL, 0, &peak) == 0, "live peak failed");
    CHECK(peak == 170, "live peak %llu, want 170 (op 2: 50 + 120)", (unsigned long long)peak);
    REQUIRE(tg_plan_live_activation_peak(t, 2, 3, NULL, 0, &peak) == 0, "live peak failed");
    CHECK(peak == 150, "live peak of two %llu, want 150 (op 1)", (unsigned long long)peak);
    REQUIRE(tg_plan_live_activation_peak(t, 0, 0, NULL, 0, &peak) == 0, "live peak failed");
    CHECK(peak == 0, "live peak of nothing %llu", (unsigned long long)peak);
    tg_alloc_fail_after(0);
    const int rc = tg_plan_live_activation_peak(t, 7, 3, NULL, 0, &peak);
    tg_alloc_fail_after(-1);
    CHECK(rc == -1, "live peak without memory: rc %d", rc);
}

/* ---- tg_plan_validate_ops ---------------------------------------------------------------- */

static void live_peak_off(tg_plan *p, char *w, size_t n) {
    p->activation_live_peak += 1;
    snprintf(w, n, "p: the plan says peak %llu bytes (live activations %llu), its pools and layout make %llu (%llu)",
             (unsigned long long)p->peak_bytes, (unsigned long long)p->activation_live_peak,
             (unsigned long long)p->peak_bytes, (unsigned long long)(p->activation_live_peak - 1));
}
static void no_input_ids(tg_plan *p, char *w, size_t n) {
    p->io.input_ids = -1;
    snprintf(w, n, "p: io input_ids is required (the batch's token ids, train batch x seq)");
}
static void logits_i32(tg_plan *p, char *w, size_t n) {
    p->io.logits = p->io.input_ids;
    snprintf(w, n,
             "p: io logits is tensor %d (%s) of dtype i32; it must be f32, bf16 or f16 (a row of num_labels scores per row "
             "of the batch)",
             p->io.input_ids, p->tensors[p->io.input_ids].name);
}
static void labels_2d(tg_plan *p, char *w, size_t n) {
    p->io.labels = p->io.input_ids;
    snprintf(w, n, "p: io labels is tensor %d (%s) of shape [2, 8]; it must be [2] (the batch's labels, one per row)",
             p->io.input_ids, p->tensors[p->io.input_ids].name);
}
static void loss_not_scalar(tg_plan *p, char *w, size_t n) {
    p->io.loss = p->io.logits;
    char have[64];
    snprintf(w, n, "p: io loss is tensor %d (%s) of shape %s; it must be one element (the step's loss, read after "
                   "each step)",
             p->io.logits, p->tensors[p->io.logits].name, shape_of(&p->tensors[p->io.logits], have, sizeof have));
}
static void lm_logits_rows(tg_plan *p, char *w, size_t n) {
    const int t = first_where(p, TG_TENSOR_PARAM, TG_TENSOR_VIEW); /* the token embedding [V, D] */
    p->io.logits = t;
    char have[64];
    snprintf(w, n, "p: io logits is tensor %d (%s) of shape %s; it must be [16, any] (a row of scores per token)", t,
             p->tensors[t].name, shape_of(&p->tensors[t], have, sizeof have));
}
static void step_a_view(tg_plan *p, char *w, size_t n) {
    p->tensors[p->io.step].flags |= TG_TENSOR_VIEW;
    snprintf(w, n, "p: io step is tensor %d (%s), a view; it must be a tensor of its own", p->io.step,
             p->tensors[p->io.step].name);
}
static void total_steps_a_view(tg_plan *p, char *w, size_t n) {
    p->tensors[p->io.total_steps].flags |= TG_TENSOR_VIEW;
    snprintf(w, n, "p: io total_steps is tensor %d (%s), a view; it must be a tensor of its own", p->io.total_steps,
             p->tensors[p->io.total_steps].name);
}
static void fill_total_steps(tg_plan *p, char *w, size_t n) {
    const int o = first_op(p, TG_OP_FILL);
    p->ops[o].out[0] = p->io.total_steps;
    p->tensors[p->io.total_steps].first_use = 0;
    snprintf(w, n, "p: op %d (fill): out[0] writes the total steps, which only the runtime sets", o);
}
/* Without ops, the io table alone: the parameter views against the pools. */
static void grow_pool(tg_plan *p, int pool, uint64_t by) {
    p->pool_bytes[pool] += by;
    p->peak_bytes += by;
}
static void params_all_moved(tg_plan *p, char *w, size_t n) {
    drop_ops(p);
    p->tensors[p->io.params_all].offset += 256;
    grow_pool(p, TG_POOL_PARAMS, 256);
    snprintf(w, n, "p: io params_all is tensor %d (%s) at offset 256; it must start the params pool", p->io.params_all,
             p->tensors[p->io.params_all].name);
}
static void grads_all_moved(tg_plan *p, char *w, size_t n) {
    drop_ops(p);
    p->tensors[p->io.grads_all].offset += 256;
    grow_pool(p, TG_POOL_GRADS, 256);
    snprintf(w, n, "p: io grads_all is tensor %d (%s) at offset 256; it must start the grads pool", p->io.grads_all,
             p->tensors[p->io.grads_all].name);
}
static void shrink(tg_tensor *x, int64_t elements) {
    x->shape[0] -= elements;
    x->bytes -= (uint64_t)elements * (uint64_t)tg_dtype_size(x->dtype);
}
static void grads_all_short(tg_plan *p, char *w, size_t n) {
    drop_ops(p);
    tg_tensor *g = &p->tensors[p->io.grads_all];
    shrink(g, 64);
    snprintf(w, n, "p: io grads_all is tensor %d (%s) of %lld elements; the parameters have %lld", p->io.grads_all,
             g->name, (long long)tg_tensor_numel(g), (long long)tg_tensor_numel(g) + 64);
}
static void bf16_copies_short(tg_plan *p, char *w, size_t n) {
    drop_ops(p);
    tg_tensor *c = &p->tensors[p->io.params_bf16_all];
    shrink(c, 128);
    snprintf(w, n, "p: io params_bf16_all is tensor %d (%s) of %lld elements; the parameters have %lld",
             p->io.params_bf16_all, c->name, (long long)tg_tensor_numel(c), (long long)tg_tensor_numel(c) + 128);
}
static void param_outside_params_all(tg_plan *p, char *w, size_t n) {
    drop_ops(p);
    shrink(&p->tensors[p->io.params_all], 64);
    shrink(&p->tensors[p->io.grads_all], 64);
    const uint64_t end = p->tensors[p->io.params_all].bytes;
    for (int t = 0; t < p->n_tensors; t++) {
        const tg_tensor *x = &p->tensors[t];
        if ((x->flags & TG_TENSOR_PARAM) && x->offset + x->bytes > end) {
            snprintf(w, n, "p: tensor %d (%s) at offset %llu + %llu bytes lies outside io params_all (%lld elements)", t,
                     x->name, (unsigned long long)x->offset, (unsigned long long)x->bytes,
                     (long long)tg_tensor_numel(&p->tensors[p->io.params_all]));
            return;
        }
    }
}
static void bf16_pool_large(tg_plan *p, char *w, size_t n) {
    drop_ops(p);
    const uint64_t half = p->pool_bytes[TG_POOL_PARAMS] / 2;
    grow_pool(p, TG_POOL_PARAMS_BF16, half + 256 - p->pool_bytes[TG_POOL_PARAMS_BF16]);
    snprintf(w, n, "p: pool params_bf16 holds %llu bytes, more than half the params pool (%llu)",
             (unsigned long long)(half + 256), (unsigned long long)p->pool_bytes[TG_POOL_PARAMS]);
}
static void bf16_pool_half(tg_plan *p, char *w, size_t n) {
    drop_ops(p);
    const uint64_t half = p->pool_bytes[TG_POOL_PARAMS] / 2;
    grow_pool(p, TG_POOL_PARAMS_BF16, half - p->pool_bytes[TG_POOL_PARAMS_BF16]); /* accepted: exactly half */
}
static void no_ops_accepted(tg_plan *p, char *w, size_t n) { drop_ops(p); }
static void schedule_writes_step_as_lr(tg_plan *p, char *w, size_t n) {
    const int o = first_op(p, TG_OP_SCHEDULE);
    p->ops[o].out[0] = p->io.step;
    snprintf(w, n, "p: op %d (schedule): out[0] writes the step counter, which only the runtime and SCHEDULE sets", o);
}
static void softmax_without_dropout(tg_plan *p, char *w, size_t n) {
    /* No dropout, no counter: nothing to bind (accepted). */
    for (int o = 0; o < p->n_ops; o++)
        if (p->ops[o].kind == TG_OP_ATTN_SOFTMAX) p->ops[o].p.softmax.p = 0.0f, p->ops[o].in[2] = -1;
}
static void zero_bytes_at_step(tg_plan *p, char *w, size_t n) {
    /* A tensor of no bytes at the counter's offset shares none of them (accepted). */
    drop_ops(p);
    for (int t = 0; t < p->io.step; t++) {
        tg_tensor *x = &p->tensors[t];
        if (x->pool == TG_POOL_ACTIVATIONS && !(x->flags & TG_TENSOR_VIEW) && x->group < 0) {
            x->pool = TG_POOL_OPTIM, x->offset = p->tensors[p->io.step].offset;
            x->ndim = 1, x->shape[0] = 0, x->bytes = 0;
            return;
        }
    }
}
/* The embedding's gathers (tg_gather_embedding_grads) as the single replica's copies:
 * slices of the whole gathered tensor, so the edits below reach the check they aim at. */
static void gathers_as_one(tg_plan *p) {
    for (int o = 0; o < p->n_ops; o++)
        if (p->ops[o].kind == TG_OP_ALL_GATHER && p->ops[o].in[1] >= 0)
            p->ops[o].p.all_gather.slice = tg_tensor_numel(&p->tensors[p->ops[o].in[0]]), p->ops[o].in[1] = -1;
}
static void dp_replicas_one(tg_plan *p, char *w, size_t n) {
    int sums = 0;
    for (int o = 0; o < p->n_ops; o++) sums += p->ops[o].kind == TG_OP_ALL_REDUCE;
    p->train.replicas = 1;
    gathers_as_one(p);
    snprintf(w, n, "p: train replicas 1, but the plan sums its gradients over replicas (%d all_reduce)", sums);
}
static void zero_without_gathers(tg_plan *p, char *w, size_t n) {
    for (int o = 0; o < p->n_ops; o++)
        if (p->ops[o].kind == TG_OP_ALL_GATHER && p->ops[o].in[1] < 0) {
            tg_op *op = &p->ops[o];
            op->kind = TG_OP_ALL_REDUCE; /* a sum in place of the gather: every op check still holds */
            op->p.count.n = tg_tensor_numel(&p->tensors[op->in[0]]);
        }
    snprintf(w, n, "p: train zero_stage 1, but the plan has 0 all_gather");
}
static int first_copy(const tg_plan *p) { return first_where(p, TG_TENSOR_PARAM_COPY, TG_TENSOR_VIEW); }
static void copy_without_master(tg_plan *p, char *w, size_t n) {
    const int t = first_copy(p);
    p->tensors[t].master = -1;
    snprintf(w, n, "p: tensor %d (%s) is a parameter copy of tensor -1, which is not a parameter or buffer of its "
                   "elements",
             t, p->tensors[t].name);
}
static void copy_of_copy(tg_plan *p, char *w, size_t n) {
    const int t = first_copy(p);
    int other = -1;
    for (int u = 0; u < p->n_tensors && other < 0; u++)
        if (u != t && (p->tensors[u].flags & TG_TENSOR_PARAM_COPY) && !(p->tensors[u].flags & TG_TENSOR_VIEW) &&
            tg_tensor_numel(&p->tensors[u]) == tg_tensor_numel(&p->tensors[t]))
            other = u;
    if (other < 0) other = t; /* itself: a copy too */
    p->tensors[t].master = other;
    snprintf(w, n, "p: tensor %d (%s) is a parameter copy of tensor %d %s, which is not a parameter", t,
             p->tensors[t].name, other, p->tensors[other].name);
}
static void copy_of_activation(tg_plan *p, char *w, size_t n) {
    const int t = first_copy(p);
    const int a = plain_tensor(p, TG_POOL_ACTIVATIONS);
    p->tensors[t].master = a;
    snprintf(w, n, "p: tensor %d (%s) is a parameter copy of tensor %d %s, which is not a parameter", t,
             p->tensors[t].name, a, p->tensors[a].name);
}
/* qa: labels are a start and an end per row, logits a start and an end score per token. */
static void qa_labels_per_token(tg_plan *p, char *w, size_t n) {
    p->io.labels = p->io.input_ids;
    snprintf(w, n,
             "p: io labels is tensor %d (%s) of shape [2, 8]; it must be [2, 2] (the batch's answer start and end, "
             "train batch x 2)",
             p->io.input_ids, p->tensors[p->io.input_ids].name);
}
static void qa_logits_rows(tg_plan *p, char *w, size_t n) {
    const int t = first_where(p, TG_TENSOR_PARAM, TG_TENSOR_VIEW); /* the token embedding [V, D] */
    p->io.logits = t;
    char have[64];
    snprintf(w, n, "p: io logits is tensor %d (%s) of shape %s; it must be [16, 2] (a start and an end score per token)",
             t, p->tensors[t].name, shape_of(&p->tensors[t], have, sizeof have));
}
static void qa_logits_i32(tg_plan *p, char *w, size_t n) {
    p->io.logits = p->io.labels;
    snprintf(w, n,
             "p: io logits is tensor %d (%s) of dtype i32; it must be f32, bf16 or f16 (a start and an end score per token)",
             p->io.labels, p->tensors[p->io.labels].name);
}

/* The optimizer's bindings, each broken alone: the op, the slot and its io role, the
 * tensor the role names and the one the slot holds. */
static void say_binding(tg_plan *p, char *w, size_t n, int kind, const char *slot, int want, int got) {
    snprintf(w, n, "p: op %d (%s): %s must be tensor %d, is tensor %d", first_op(p, kind), tg_op_name(kind), slot,
             want, got);
}
static void io_lr_moved(tg_plan *p, char *w, size_t n) {
    const int lr = p->io.lr;
    p->io.lr = p->io.loss;
    say_binding(p, w, n, TG_OP_SCHEDULE, "out[0] (io lr)", p->io.loss, lr);
}
static void io_grad_norm_moved(tg_plan *p, char *w, size_t n) {
    const int g = p->io.grad_norm;
    p->io.grad_norm = p->io.loss;
    say_binding(p, w, n, TG_OP_GRAD_NORM, "out[0] (io grad_norm)", p->io.loss, g);
}
static void io_moments_swapped(tg_plan *p, char *w, size_t n) {
    const int m = p->io.m_all;
    p->io.m_all = p->io.v_all, p->io.v_all = m;
    say_binding(p, w, n, TG_OP_ADAMW, "out[1] (io m_all)", p->io.m_all, m);
}
static void adamw_lr_slot(tg_plan *p, char *w, size_t n) {
    p->ops[first_op(p, TG_OP_ADAMW)].in[1] = p->io.grad_norm;
    say_binding(p, w, n, TG_OP_ADAMW, "in[1] (io lr)", p->io.lr, p->io.grad_norm);
}
static void adamw_grad_norm_slot(tg_plan *p, char *w, size_t n) {
    p->ops[first_op(p, TG_OP_ADAMW)].in[3] = p->io.lr;
    say_binding(p, w, n, TG_OP_ADAMW, "in[3] (io grad_norm)", p->io.grad_norm, p->io.lr);
}
static void schedule_total_steps_slot(tg_plan *p, char *w, size_t n) {
    p->ops[first_op(p, TG_OP_SCHEDULE)].in[1] = p->io.step;
    say_binding(p, w, n, TG_OP_SCHEDULE, "in[1] (io total_steps)", p->io.total_steps, p->io.step);
}
static void zero_stage_without_slices(tg_plan *p, char *w, size_t n) {
    p->train.zero_stage = 1;
    snprintf(w, n, "p: op %d (adamw): zero_slice 0, but train zero_stage is 1 (a slice exactly with ZeRO-1)",
             first_op(p, TG_OP_ADAMW));
}

/* The window's label count is for grad_accumulation > 1 alone. */
static void loss_norm_without_accumulation(tg_plan *p, char *w, size_t n) {
    p->train.grad_accumulation = 1;
    snprintf(w, n,
             "p: io loss_norm is tensor %d (%s), but train grad_accumulation is 1 (it is for grad_accumulation > 1 "
             "alone)",
             p->io.loss_norm, p->tensors[p->io.loss_norm].name);
}

TG_TEST(test_plan_validate_ops_bindings) {
    static const edit_case cases[] = {
        {"live peak", BASE_BERT, CHECK_OPS, live_peak_off},
        {"no input_ids", BASE_BERT, CHECK_OPS, no_input_ids},
        {"i32 logits", BASE_BERT, CHECK_OPS, logits_i32},
        {"2-D labels", BASE_BERT, CHECK_OPS, labels_2d},
        {"loss not a scalar", BASE_BERT, CHECK_OPS, loss_not_scalar},
        {"LM logits rows", BASE_GPT2, CHECK_OPS, lm_logits_rows},
        {"qa as compiled", BASE_QA, CHECK_OPS, b_accepted},
        {"io lr moved", BASE_BERT, CHECK_OPS, io_lr_moved},
        {"grad_accumulation as compiled", BASE_ACCUM, CHECK_OPS, b_accepted},
        {"loss_norm without accumulation", BASE_ACCUM, CHECK_OPS, loss_norm_without_accumulation},
        {"io grad_norm moved", BASE_BERT, CHECK_OPS, io_grad_norm_moved},
        {"io moments swapped", BASE_BERT, CHECK_OPS, io_moments_swapped},
        {"adamw lr slot", BASE_BERT, CHECK_OPS, adamw_lr_slot},
        {"adamw grad norm slot", BASE_BERT, CHECK_OPS, adamw_grad_norm_slot},
        {"schedule total steps slot", BASE_BERT, CHECK_OPS, schedule_total_steps_slot},
        {"zero_stage 1 without slices", BASE_BERT, CHECK_OPS, zero_stage_without_slices},
        {"qa labels per token", BASE_QA, CHECK_OPS, qa_labels_per_token},
        {"qa logits rows", BASE_QA, CHECK_OPS, qa_logits_rows},
        {"qa i32 logits", BASE_QA, CHECK_OPS, qa_logits_i32},
        {"step counter a view", BASE_BERT, CHECK_OPS, step_a_view},
        {"total steps a view", BASE_BERT, CHECK_OPS, total_steps_a_view},
        {"fill writing the total steps", BASE_BERT, CHECK_OPS, fill_total_steps},
        {"schedule writing the counter as lr", BASE_BERT, CHECK_OPS, schedule_writes_step_as_lr},
        {"unfused attention as compiled", BASE_UNFUSED, CHECK_OPS, b_accepted},
        {"softmax without dropout or counter", BASE_UNFUSED, CHECK_OPS, softmax_without_dropout},
        {"no bytes at the counter", BASE_BERT, CHECK_OPS, zero_bytes_at_step},
        {"no ops", BASE_BF16, CHECK_OPS, no_ops_accepted},
        {"params_all moved", BASE_BERT, CHECK_OPS, params_all_moved},
        {"grads_all moved", BASE_BERT, CHECK_OPS, grads_all_moved},
        {"grads_all short", BASE_BERT, CHECK_OPS, grads_all_short},
        {"bf16 copies short", BASE_BF16, CHECK_OPS, bf16_copies_short},
        {"a parameter outside params_all", BASE_BERT, CHECK_OPS, param_outside_params_all},
        {"bf16 pool past half", BASE_BF16, CHECK_OPS, bf16_pool_large},
        {"bf16 pool at half", BASE_BF16, CHECK_OPS, bf16_pool_half},
        {"data parallel as one replica", BASE_DP, CHECK_OPS, dp_replicas_one},
        {"ZeRO-1 without gathers", BASE_ZERO, CHECK_OPS, zero_without_gathers},
        {"a copy without master", BASE_BF16, CHECK_OPS, copy_without_master},
        {"a copy of a copy", BASE_BF16, CHECK_OPS, copy_of_copy},
        {"a copy of an activation", BASE_BF16, CHECK_OPS, copy_of_activation},
    };
    run_edits(cases, sizeof cases / sizeof cases[0]);
}

/* ---- tg_plan_validate_buckets ---------------------------------------------------------- */

#define BUCKET0 "p: bucket 0 (seq 4): "
static void say_bucket(char *w, size_t n, const char *what) {
    snprintf(w, n, BUCKET0 "its %s differ from the plan's (a bucket plan has the plan's, but for train seq)", what);
}
static void b_none(tg_plan *p, char *w, size_t n) {
    p->train.n_buckets = 0;
    snprintf(w, n, "p: train n_buckets 0 is not in [1, 8]");
}
static void b_too_many(tg_plan *p, char *w, size_t n) {
    p->train.n_buckets = TG_MAX_BUCKETS + 1;
    snprintf(w, n, "p: train n_buckets 9 is not in [1, 8]");
}
static void b_last_not_seq(tg_plan *p, char *w, size_t n) {
    p->train.bucket_seq[1] = 16;
    snprintf(w, n, "p: train seq 8 is not the last bucket length (bucket_seq[1] = 16)");
}
static void b_missing(tg_plan *p, char *w, size_t n) {
    p->buckets = NULL;
    snprintf(w, n, "p: train n_buckets 2, but the plan lacks its bucket plans");
}
static void b_unexpected(tg_plan *p, char *w, size_t n) {
    static tg_plan stray;
    p->buckets = &stray;
    snprintf(w, n, "p: train n_buckets 1, but the plan has bucket plans");
}
static void b_train(tg_plan *p, char *w, size_t n) {
    p->buckets[0].train.batch = 3;
    say_bucket(w, n, "train settings");
}
#define RUN_EDIT(NAME, STMT)                                  \
    static void b_run_##NAME(tg_plan *p, char *w, size_t n) { \
        tg_plan_run *r = &p->buckets[0].run;                  \
        STMT;                                                 \
        say_bucket(w, n, "run settings");                     \
    }
RUN_EDIT(train_data, r->train_data[0] ^= 1)
RUN_EDIT(eval_data, r->eval_data[0] = 'e')
RUN_EDIT(steps, r->steps += 1)
RUN_EDIT(epochs, r->epochs += 1)
RUN_EDIT(log_every, r->log_every += 1)
RUN_EDIT(seed, r->seed += 1)
RUN_EDIT(checkpoint_every, r->checkpoint_every += 1)
RUN_EDIT(keep_checkpoints, r->keep_checkpoints += 1)
RUN_EDIT(checkpoint_dir, r->checkpoint_dir[0] = 'c')
RUN_EDIT(last_batch, r->last_batch = (r->last_batch + 1) % TG_LAST_BATCH_COUNT)
RUN_EDIT(skip_nonfinite, r->skip_nonfinite = !r->skip_nonfinite)
RUN_EDIT(max_skipped_steps, r->max_skipped_steps += 1)
RUN_EDIT(qa_n_best, r->qa_n_best += 1)
RUN_EDIT(qa_max_answer_length, r->qa_max_answer_length += 1)
RUN_EDIT(qa_null_threshold, r->qa_null_threshold += 0.5f)
RUN_EDIT(gpu_hour_price, r->gpu_hour_price += 0.5f)
static void b_model_source(tg_plan *p, char *w, size_t n) {
    p->buckets[0].model.source[0] ^= 1;
    say_bucket(w, n, "model config");
}
static void b_model_weights(tg_plan *p, char *w, size_t n) {
    p->buckets[0].model.weights[0] = 'w';
    say_bucket(w, n, "model config");
}
static void b_model_hidden(tg_plan *p, char *w, size_t n) {
    p->buckets[0].model.hidden += 1;
    say_bucket(w, n, "model config");
}
static void b_model_eps(tg_plan *p, char *w, size_t n) {
    p->buckets[0].model.classifier_dropout += 0.5f; /* the last number */
    say_bucket(w, n, "model config");
}
static void b_model_past_nul(tg_plan *p, char *w, size_t n) {
    /* Bytes past a string's NUL are not the model's. */
    tg_model_config *m = &p->buckets[0].model;
    m->source[strlen(m->source) + 1] ^= 1;
}
static void b_io(tg_plan *p, char *w, size_t n) {
    p->buckets[0].io.lr = p->buckets[0].io.grad_norm;
    say_bucket(w, n, "io table");
}
static void b_job_path(tg_plan *p, char *w, size_t n) {
    p->buckets[0].job_path[0] ^= 1;
    say_bucket(w, n, "job path");
}
static void b_fingerprint(tg_plan *p, char *w, size_t n) {
    p->buckets[0].fingerprint ^= 1;
    say_bucket(w, n, "fingerprint");
}
static void b_nested(tg_plan *p, char *w, size_t n) {
    p->buckets[0].buckets = p->buckets;
    say_bucket(w, n, "bucket plans");
}
static void b_tensor_count(tg_plan *p, char *w, size_t n) {
    p->buckets[0].n_tensors -= 1;
    snprintf(w, n, BUCKET0 "%d tensors and %d ops, the plan %d and %d (a bucket plan has the plan's, index for index)",
             p->n_tensors - 1, p->buckets[0].n_ops, p->n_tensors, p->n_ops);
}
static void b_op_count(tg_plan *p, char *w, size_t n) {
    p->buckets[0].n_ops -= 1;
    snprintf(w, n, BUCKET0 "%d tensors and %d ops, the plan %d and %d", p->n_tensors, p->n_ops - 1, p->n_tensors,
             p->n_ops);
}
/* The first trainable parameter of the bucket plan: every field must be the plan's. */
static void say_param(tg_plan *p, int t, char *w, size_t n, const char *field) {
    const tg_tensor *x = &p->buckets[0].tensors[t];
    snprintf(w, n, BUCKET0 "tensor %d (%s, %s pool) differs from the plan's tensor %d (%s) in its %s (only activations "
                          "and inputs follow seq)",
             t, x->name, tg_pool_name(x->pool), t, p->tensors[t].name, field);
}
#define TENSOR_EDIT(NAME, STMT, FIELD)                                  \
    static void b_tensor_##NAME(tg_plan *p, char *w, size_t n) {        \
        const int t = first_where(p, TG_TENSOR_PARAM, TG_TENSOR_VIEW);  \
        tg_tensor *x = &p->buckets[0].tensors[t];                       \
        STMT;                                                           \
        say_param(p, t, w, n, FIELD);                                   \
    }
TENSOR_EDIT(name, x->name[0] ^= 1, "name")
TENSOR_EDIT(dtype, x->dtype = TG_BF16, "dtype")
TENSOR_EDIT(pool, x->pool = TG_POOL_FROZEN, "pool")
TENSOR_EDIT(flags, x->flags ^= TG_TENSOR_NO_DECAY, "flags")
TENSOR_EDIT(grad, x->grad = -1, "gradient")
TENSOR_EDIT(master, x->master = 1, "master")
TENSOR_EDIT(group, x->group = 1, "packed group")
TENSOR_EDIT(init, x->init = TG_INIT_ONES, "initialisation")
TENSOR_EDIT(init_std, x->init_std += 0.5f, "initialisation")
TENSOR_EDIT(ndim, x->ndim += 1, "shape")
TENSOR_EDIT(shape, x->shape[0] += 1, "shape")
TENSOR_EDIT(bytes, x->bytes += 4, "shape")
TENSOR_EDIT(offset, x->offset += 256, "offset")
static void b_activation_shape(tg_plan *p, char *w, size_t n) {
    const int t = plain_tensor(&p->buckets[0], TG_POOL_ACTIVATIONS);
    p->buckets[0].tensors[t].offset += 256; /* activations and inputs follow seq: accepted */
    p->buckets[0].tensors[t].shape[0] += 1;
}
static void say_op0(tg_plan *p, char *w, size_t n) {
    snprintf(w, n, BUCKET0 "op 0 (%s) differs from the plan's op 0 (%s) in its kind, phase or tensors",
             tg_op_name(p->buckets[0].ops[0].kind), tg_op_name(p->ops[0].kind));
}
static void b_op_kind(tg_plan *p, char *w, size_t n) {
    p->buckets[0].ops[0].kind = TG_OP_ZERO;
    say_op0(p, w, n);
}
static void b_op_phase(tg_plan *p, char *w, size_t n) {
    p->buckets[0].ops[0].phase = TG_PHASE_BACKWARD;
    say_op0(p, w, n);
}
static void b_op_in(tg_plan *p, char *w, size_t n) {
    p->buckets[0].ops[0].in[TG_OP_MAX_IN - 1] = 0;
    say_op0(p, w, n);
}
static void b_op_out(tg_plan *p, char *w, size_t n) {
    p->buckets[0].ops[0].out[TG_OP_MAX_OUT - 1] = 0;
    say_op0(p, w, n);
}
static void b_op_params(tg_plan *p, char *w, size_t n) {
    p->buckets[0].ops[0].p.embedding.n += 1; /* parameters follow seq: accepted */
}
static void b_pool(tg_plan *p, char *w, size_t n) {
    p->buckets[0].pool_bytes[TG_POOL_WORKSPACE] += 256;
    snprintf(w, n, BUCKET0 "pool workspace holds %llu bytes, the plan's %llu (one set of pools serves every bucket)",
             (unsigned long long)p->buckets[0].pool_bytes[TG_POOL_WORKSPACE],
             (unsigned long long)p->pool_bytes[TG_POOL_WORKSPACE]);
}
TG_TEST(test_plan_validate_buckets) {
    static const edit_case cases[] = {
        {"as compiled", BASE_BUCKETS, CHECK_BUCKETS, b_accepted},
        {"one bucket", BASE_BERT, CHECK_BUCKETS, b_accepted},
        {"n_buckets 0", BASE_BUCKETS, CHECK_BUCKETS, b_none},
        {"n_buckets 9", BASE_BUCKETS, CHECK_BUCKETS, b_too_many},
        {"last bucket not seq", BASE_BUCKETS, CHECK_BUCKETS, b_last_not_seq},
        {"bucket plans missing", BASE_BUCKETS, CHECK_BUCKETS, b_missing},
        {"bucket plans unexpected", BASE_BERT, CHECK_BUCKETS, b_unexpected},
        {"train", BASE_BUCKETS, CHECK_BUCKETS, b_train},
        {"run train_data", BASE_BUCKETS, CHECK_BUCKETS, b_run_train_data},
        {"run eval_data", BASE_BUCKETS, CHECK_BUCKETS, b_run_eval_data},
        {"run steps", BASE_BUCKETS, CHECK_BUCKETS, b_run_steps},
        {"run epochs", BASE_BUCKETS, CHECK_BUCKETS, b_run_epochs},
        {"run log_every", BASE_BUCKETS, CHECK_BUCKETS, b_run_log_every},
        {"run seed", BASE_BUCKETS, CHECK_BUCKETS, b_run_seed},
        {"run checkpoint_every", BASE_BUCKETS, CHECK_BUCKETS, b_run_checkpoint_every},
        {"run keep_checkpoints", BASE_BUCKETS, CHECK_BUCKETS, b_run_keep_checkpoints},
        {"run checkpoint_dir", BASE_BUCKETS, CHECK_BUCKETS, b_run_checkpoint_dir},
        {"run last_batch", BASE_BUCKETS, CHECK_BUCKETS, b_run_last_batch},
        {"run skip_nonfinite", BASE_BUCKETS, CHECK_BUCKETS, b_run_skip_nonfinite},
        {"run max_skipped_steps", BASE_BUCKETS, CHECK_BUCKETS, b_run_max_skipped_steps},
        {"run qa_n_best", BASE_BUCKETS, CHECK_BUCKETS, b_run_qa_n_best},
        {"run qa_max_answer_length", BASE_BUCKETS, CHECK_BUCKETS, b_run_qa_max_answer_length},
        {"run qa_null_threshold", BASE_BUCKETS, CHECK_BUCKETS, b_run_qa_null_threshold},
        {"run gpu_hour_price", BASE_BUCKETS, CHECK_BUCKETS, b_run_gpu_hour_price},
        {"model source", BASE_BUCKETS, CHECK_BUCKETS, b_model_source},
        {"model weights", BASE_BUCKETS, CHECK_BUCKETS, b_model_weights},
        {"model hidden", BASE_BUCKETS, CHECK_BUCKETS, b_model_hidden},
        {"model classifier_dropout", BASE_BUCKETS, CHECK_BUCKETS, b_model_eps},
        {"model bytes past a NUL", BASE_BUCKETS, CHECK_BUCKETS, b_model_past_nul},
        {"io", BASE_BUCKETS, CHECK_BUCKETS, b_io},
        {"job path", BASE_BUCKETS, CHECK_BUCKETS, b_job_path},
        {"fingerprint", BASE_BUCKETS, CHECK_BUCKETS, b_fingerprint},
        {"nested buckets", BASE_BUCKETS, CHECK_BUCKETS, b_nested},
        {"tensor count", BASE_BUCKETS, CHECK_BUCKETS, b_tensor_count},
        {"op count", BASE_BUCKETS, CHECK_BUCKETS, b_op_count},
        {"tensor name", BASE_BUCKETS, CHECK_BUCKETS, b_tensor_name},
        {"tensor dtype", BASE_BUCKETS, CHECK_BUCKETS, b_tensor_dtype},
        {"tensor pool", BASE_BUCKETS, CHECK_BUCKETS, b_tensor_pool},
        {"tensor flags", BASE_BUCKETS, CHECK_BUCKETS, b_tensor_flags},
        {"tensor grad", BASE_BUCKETS, CHECK_BUCKETS, b_tensor_grad},
        {"tensor master", BASE_BUCKETS, CHECK_BUCKETS, b_tensor_master},
        {"tensor group", BASE_BUCKETS, CHECK_BUCKETS, b_tensor_group},
        {"tensor init", BASE_BUCKETS, CHECK_BUCKETS, b_tensor_init},
        {"tensor init_std", BASE_BUCKETS, CHECK_BUCKETS, b_tensor_init_std},
        {"tensor ndim", BASE_BUCKETS, CHECK_BUCKETS, b_tensor_ndim},
        {"tensor shape", BASE_BUCKETS, CHECK_BUCKETS, b_tensor_shape},
        {"tensor bytes", BASE_BUCKETS, CHECK_BUCKETS, b_tensor_bytes},
        {"tensor offset", BASE_BUCKETS, CHECK_BUCKETS, b_tensor_offset},
        {"an activation's shape and offset", BASE_BUCKETS, CHECK_BUCKETS, b_activation_shape},
        {"op kind", BASE_BUCKETS, CHECK_BUCKETS, b_op_kind},
        {"op phase", BASE_BUCKETS, CHECK_BUCKETS, b_op_phase},
        {"op input", BASE_BUCKETS, CHECK_BUCKETS, b_op_in},
        {"op output", BASE_BUCKETS, CHECK_BUCKETS, b_op_out},
        {"op parameters", BASE_BUCKETS, CHECK_BUCKETS, b_op_params},
        {"pool", BASE_BUCKETS, CHECK_BUCKETS, b_pool},
    };
    run_edits(cases, sizeof cases / sizeof cases[0]);
    for (int b = 0; b < BASE_COUNT; b++)
        if (base_ready[b]) tg_plan_free(&bases[b]), base_ready[b] = 0;
}
