/* libFuzzer target: plans edited field by field, re-sealed and loaded, then run.
 *
 * An input is a plan file followed by an edit program: records of RECORD_BYTES bytes, each
 * naming a field of the decoded plan (an op parameter or slot, a tensor's dtype, pool,
 * shape, offset or lifetime, an io binding, a train, run, model or pool field) and a value
 * for it (0, -1, 1, the largest, an interesting constant, a small step, a bit flip, twice
 * the value, a neighbouring op's or tensor's value). The edited plan is encoded and sealed
 * with a valid checksum, as a user who edits and re-seals a plan would, so only the
 * decoder's own checks stand between it and the runtime. A plan the decoder accepts must
 * inspect (text and JSON) and re-encode to the same bytes, and must open and take one CPU
 * training step (and an eval pass) on tiny synthetic data, with two threads per replica,
 * without a sanitizer report. A step may fail (a diverged loss) but only with a message.
 *
 * A plan with length buckets (seq_buckets) has its bucket plans edited too: a record of
 * the classes that edit a plan's own tables and totals picks the plan or one of them; the
 * smallest bucket of an accepted plan is run as well.
 *
 * The seeds are compiled plans (the examples, the benchmark jobs as they are and with tiny
 * models, some with length buckets) each with an edit program of no-op records; the custom mutator mutates the edit
 * program and leaves the plan bytes alone, so nearly every input reaches the decoder's
 * checks past the checksum. Plans whose pools exceed RUN_MAX_BYTES are checked and
 * inspected but not run (the benchmark models), as are plans of more than RUN_MAX_REPLICAS
 * replicas: what runs must fit the fuzzer's memory and time limits. */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "plan/inspect.h"
#include "plan/op_meta.h"
#include "plan/plan_file.h"
#include "plan/validate.h"
#include "runtime/comm.h"
#include "runtime/trainer.h"
#include "tests/fuzz/fuzz_input.h"

#define HEADER_BYTES 40
#define RECORD_BYTES 8
#define RUN_MAX_BYTES (48u << 20)
#define RUN_MAX_REPLICAS 4
#define RUN_THREADS 2

static FILE *devnull(void) {
    static FILE *f;
    if (!f && !(f = fopen("/dev/null", "w"))) {
        perror("/dev/null");
        abort();
    }
    return f;
}

/* Where the plan file ends in an input (its header's sizes), or 0 when it is no plan. */
static size_t plan_bytes(const uint8_t *data, size_t size) {
    if (size < HEADER_BYTES || memcmp(data, "TGPLAN\0\0", 8) != 0) return 0;
    uint64_t csize = 0;
    for (int i = 0; i < 8; i++) csize |= (uint64_t)data[24 + i] << (8 * i);
    return csize <= size - HEADER_BYTES ? HEADER_BYTES + (size_t)csize : 0;
}

/* ---- fields and values ----------------------------------------------------------------- */

typedef enum { F_I32, F_I64, F_U64, F_F32 } field_type;

/* One field of the plan: where it is, its type, and the same field of a neighbouring op or
 * tensor (or another field of its class) for the "neighbour's value" edit. */
typedef struct field {
    void *at;
    field_type type;
    const void *neighbour;
} field;

static int64_t get_int(const void *at, field_type type) {
    int32_t i32;
    int64_t i64;
    switch (type) {
    case F_I32: memcpy(&i32, at, 4); return i32;
    case F_I64:
    case F_U64: memcpy(&i64, at, 8); return i64;
    default: return 0;
    }
}

static void set_int(void *at, field_type type, int64_t v) {
    if (type == F_I32) {
        int32_t i32 = (int32_t)(uint32_t)(uint64_t)v;
        memcpy(at, &i32, 4);
    } else {
        memcpy(at, &v, 8);
    }
}

static const int64_t k_interesting[] = {
    2, 3, 4, 7, 8, 15, 16, 31, 32, 33, 63, 64, 127, 128, 255, 256, 512, 768, 1023, 1024, 4095, 4096, 65535, 65536,
    (int64_t)1 << 20, (int64_t)1 << 24, INT32_MAX, (int64_t)INT32_MAX + 1, UINT32_MAX, (int64_t)1 << 40,
    (int64_t)1 << 48, ((int64_t)1 << 48) + 1, 288230376151711745, (int64_t)1 << 62, INT64_MAX / 2, INT64_MIN,
    -2, -100, INT32_MIN, -((int64_t)1 << 40),
};
static const float k_interesting_f[] = {0.5f, 1e-30f, 1e30f, -0.0f, 0.9999999f, 1.0f, 2.0f, 1e-45f, 0.1f, -1e30f};

/* Applies value mode `mode` (with operand bytes) to field f. */
static void edit_field(const field *f, int mode, uint32_t operand) {
    if (f->type == F_F32) {
        float v, n = 0.0f;
        memcpy(&v, f->at, 4);
        if (f->neighbour) memcpy(&n, f->neighbour, 4);
        uint32_t bits;
        switch (mode) {
        case 0: v = 0.0f; break;
        case 1: v = -1.0f; break;
        case 2: v = 1.0f; break;
        case 3: v = operand & 1 ? INFINITY : FLT_MAX; break;
        case 4: v = operand & 1 ? NAN : k_interesting_f[operand / 2 % (sizeof k_interesting_f / sizeof k_interesting_f[0])]; break;
        case 5: v += (float)(int8_t)operand * 0.125f; break;
        case 6:
            memcpy(&bits, &v, 4);
            bits ^= 1u << (operand % 32);
            memcpy(&v, &bits, 4);
            break;
        case 7: v *= 2.0f; break;
        case 8: v = n; break;
        default: v = (float)operand; break;
        }
        memcpy(f->at, &v, 4);
        return;
    }
    const int64_t v = get_int(f->at, f->type);
    const int64_t max = f->type == F_I32 ? INT32_MAX : f->type == F_U64 ? -1 : INT64_MAX;
    int64_t w;
    switch (mode) {
    case 0: w = 0; break;
    case 1: w = -1; break;
    case 2: w = 1; break;
    case 3: w = max; break;
    case 4: w = k_interesting[operand % (sizeof k_interesting / sizeof k_interesting[0])]; break;
    case 5: w = (int64_t)((uint64_t)v + (uint64_t)(int64_t)((int8_t)operand ? (int8_t)operand : 1)); break;
    case 6: w = (int64_t)((uint64_t)v ^ ((uint64_t)1 << (operand % (f->type == F_I32 ? 32 : 64)))); break;
    case 7: w = (int64_t)((uint64_t)v * 2); break;
    case 8: w = f->neighbour ? get_int(f->neighbour, f->type) : v; break;
    default: w = operand; break;
    }
    set_int(f->at, f->type, w);
}

/* ---- the edit program -------------------------------------------------------------------- */

/* The integer and float parameters of an op, in ops.def order. */
typedef struct param_list {
    int n;
    field f[16];
} param_list;
static void list_i64(void *ctx, const char *display, int64_t *value) {
    param_list *l = ctx;
    if (l->n < 16) l->f[l->n++] = (field){value, F_I64, NULL};
}
static void list_f32(void *ctx, const char *display, float *value) {
    param_list *l = ctx;
    if (l->n < 16) l->f[l->n++] = (field){value, F_F32, NULL};
}

/* The same byte of a neighbouring element of an array of `count` elements of `size` bytes. */
static const void *neighbour_of(const void *base, size_t size, int count, int index, const void *at, int up) {
    if (count < 2) return NULL;
    const int j = (index + (up ? 1 : count - 1)) % count;
    return (const uint8_t *)base + (size_t)j * size + ((const uint8_t *)at - ((const uint8_t *)base + (size_t)index * size));
}

/* Element count and byte size from a tensor's shape, saturating, so that a shape edit can
 * keep the byte size consistent and reach the checks past it. */
static void resize_bytes(tg_tensor *x) {
    uint64_t n = 1;
    int over = 0;
    for (int d = 0; d < x->ndim && d < TG_MAX_DIMS; d++)
        over |= x->shape[d] < 0 || __builtin_mul_overflow(n, (uint64_t)x->shape[d], &n);
    const int size = tg_dtype_size(x->dtype);
    if (!over && size && !__builtin_mul_overflow(n, (uint64_t)size, &n)) x->bytes = n;
}

/* Each op's first and last user of each tensor, as the compiler records them. */
static void recompute_lifetimes(tg_plan *p) {
    for (int t = 0; t < p->n_tensors; t++) p->tensors[t].first_use = p->tensors[t].last_use = -1;
    for (int o = 0; o < p->n_ops; o++)
        for (int s = 0; s < TG_OP_MAX_IN + TG_OP_MAX_OUT; s++) {
            const int t = s < TG_OP_MAX_IN ? p->ops[o].in[s] : p->ops[o].out[s - TG_OP_MAX_IN];
            if (t < 0 || t >= p->n_tensors) continue;
            if (p->tensors[t].first_use < 0) p->tensors[t].first_use = o;
            p->tensors[t].last_use = o;
        }
}

/* A record edits the plan or, for the classes of a plan's own tables and totals (ops,
 * tensors, pools, the fix-ups), one of its bucket plans: r[0] / 12 picks which (0: the
 * plan, k: bucket plan k - 1, of the n_bucket_plans it was decoded with). */
static void apply_record(tg_plan *top, int n_bucket_plans, const uint8_t *r) {
    const int cls = r[0] % 12, mode = r[4] % 10;
    const int which = r[0] / 12 % (n_bucket_plans + 1);
    const int own_tables = cls <= 5 || cls == 9 || cls == 11;
    tg_plan *p = own_tables && which > 0 ? &top->buckets[which - 1] : top;
    const uint32_t sel = (uint32_t)r[1] | (uint32_t)r[2] << 8, pick = r[3];
    const uint32_t operand = (uint32_t)r[5] | (uint32_t)r[6] << 8 | (uint32_t)r[7] << 16;
    field f = {0};
    if ((cls >= 1 && cls <= 3 && p->n_ops == 0) || ((cls == 4 || cls == 5) && p->n_tensors == 0)) return;
    switch (cls) {
    case 0: return; /* no-op: the seeds' padding */
    case 1: {       /* an op parameter */
        const int o = (int)(sel % (uint32_t)p->n_ops);
        tg_op *op = &p->ops[o];
        param_list l = {0};
        tg_op_params_visit(op->kind, &op->p, &(tg_param_visitor){&l, list_i64, list_f32});
        if (!l.n) return;
        f = l.f[pick % (uint32_t)l.n];
        f.neighbour = neighbour_of(p->ops, sizeof *op, p->n_ops, o, f.at, operand & 1);
        break;
    }
    case 2: { /* an op slot: a tensor index, -1, or a neighbour's */
        const int o = (int)(sel % (uint32_t)p->n_ops);
        const int s = (int)(pick % (TG_OP_MAX_IN + TG_OP_MAX_OUT));
        int32_t *slot = s < TG_OP_MAX_IN ? &p->ops[o].in[s] : &p->ops[o].out[s - TG_OP_MAX_IN];
        if (mode == 9) {
            *slot = (int32_t)(operand % (uint32_t)(p->n_tensors + 1)) - 1;
            return;
        }
        f = (field){slot, F_I32, neighbour_of(p->ops, sizeof p->ops[0], p->n_ops, o, slot, operand & 1)};
        break;
    }
    case 3: { /* an op's kind or phase */
        const int o = (int)(sel % (uint32_t)p->n_ops);
        int32_t *at = pick & 1 ? &p->ops[o].phase : &p->ops[o].kind;
        if (mode == 9 && at == &p->ops[o].kind) {
            *at = (int32_t)(operand % TG_OP_COUNT); /* another kind, its parameters as they lie */
            return;
        }
        f = (field){at, F_I32, neighbour_of(p->ops, sizeof p->ops[0], p->n_ops, o, at, operand & 1)};
        break;
    }
    case 4:
    case 5: { /* a tensor field; class 5 keeps the byte size consistent with a shape or dtype edit */
        const int t = (int)(sel % (uint32_t)p->n_tensors);
        tg_tensor *x = &p->tensors[t];
        void *const at[] = {&x->dtype, &x->pool, &x->ndim, &x->flags, &x->shape[0], &x->shape[1],
                            &x->shape[2], &x->shape[3], &x->offset, &x->bytes, &x->first_use, &x->last_use,
                            &x->grad, &x->init, &x->master, &x->group, &x->init_std};
        static const field_type types[] = {F_I32, F_I32, F_I32, F_I32, F_I64, F_I64, F_I64, F_I64, F_U64,
                                           F_U64, F_I32, F_I32, F_I32, F_I32, F_I32, F_I32, F_F32};
        /* Class 5 edits a dimension, the rank or the dtype: the fields the byte size follows. */
        static const int sized[] = {4, 5, 6, 7, 2, 0};
        const int k = cls == 5 ? sized[pick % 6] : (int)(pick % (sizeof types / sizeof types[0]));
        f = (field){at[k], types[k], NULL};
        if (mode == 9 && k >= 10 && k <= 15 && k != 13) { /* an index: of an op (lifetimes) or a tensor */
            const int32_t count = k <= 11 ? p->n_ops : p->n_tensors;
            *(int32_t *)at[k] = (int32_t)(operand % (uint32_t)(count + 1)) - 1;
            return;
        }
        f.neighbour = neighbour_of(p->tensors, sizeof *x, p->n_tensors, t, f.at, operand & 1);
        edit_field(&f, mode, operand >> 1);
        if (cls == 5) resize_bytes(x);
        return;
    }
    case 6: { /* an io binding */
        int32_t *io = (int32_t *)&p->io;
        const int k = (int)(pick % (sizeof p->io / sizeof(int32_t)));
        if (mode == 9) {
            io[k] = (int32_t)(operand % (uint32_t)(p->n_tensors + 1)) - 1;
            return;
        }
        f = (field){&io[k], F_I32, &io[(k + 1) % (sizeof p->io / sizeof(int32_t))]};
        break;
    }
    case 7: { /* a train setting */
        int32_t *train = (int32_t *)&p->train;
        const int k = (int)(pick % (sizeof p->train / sizeof(int32_t)));
        f = (field){&train[k], F_I32, &train[(k + 1) % (sizeof p->train / sizeof(int32_t))]};
        break;
    }
    case 8: { /* a run setting */
        void *const at[] = {&p->run.steps, &p->run.epochs, &p->run.log_every, &p->run.seed, &p->run.last_batch};
        const int k = (int)(pick % 5);
        f = (field){at[k], k == 3 ? F_U64 : F_I32, k < 2 ? at[1 - k] : NULL};
        break;
    }
    case 9: { /* pool sizes, the totals, the gradients' sharing, the recompute summary, the phase table */
        const int k = (int)(pick % (TG_POOL_COUNT + 4 + TG_PHASE_COUNT + 1));
        if (k < TG_POOL_COUNT) f = (field){&p->pool_bytes[k], F_U64, &p->pool_bytes[(k + 1) % TG_POOL_COUNT]};
        else if (k == TG_POOL_COUNT) f = (field){&p->peak_bytes, F_U64, NULL};
        else if (k == TG_POOL_COUNT + 1) f = (field){&p->activation_live_peak, F_U64, NULL};
        else if (k == TG_POOL_COUNT + 2) f = (field){&p->grads_share_activations, F_I32, NULL};
        else if (k == TG_POOL_COUNT + 3) f = (field){&p->peak_bytes_without_recompute, F_U64, &p->peak_bytes};
        else f = (field){&p->phase_begin[k - TG_POOL_COUNT - 4], F_I32, NULL};
        break;
    }
    case 10: { /* a model setting */
        int32_t *at[] = {&p->model.arch, &p->model.vocab_size, &p->model.hidden, &p->model.layers,
                         &p->model.heads, &p->model.intermediate, &p->model.max_positions,
                         &p->model.type_vocab_size, &p->model.pad_token_id, &p->model.gelu};
        const int k = (int)(pick % 10);
        f = (field){at[k], F_I32, at[(k + 1) % 10]};
        break;
    }
    default: /* fix-ups that let an edit reach the checks past the totals and lifetimes */
        if (pick % 3 == 0) {
            p->peak_bytes = tg_plan_pools_bytes(p);
        } else if (pick % 3 == 1) {
            recompute_lifetimes(p);
        } else if (p->n_tensors > 1) { /* a tensor moved onto another's offset and pool */
            tg_tensor *x = &p->tensors[sel % (uint32_t)p->n_tensors];
            const tg_tensor *y = &p->tensors[operand % (uint32_t)p->n_tensors];
            x->offset = y->offset, x->pool = y->pool;
        }
        /* The live peak sums byte counts: only over tables that bound them. */
        tg_err ignored;
        if (pick % 3 != 0 && tg_plan_validate_tables(p, "", &ignored) == 0) {
            tg_grad_hold *holds = NULL;
            int n_holds = 0;
            if (!p->grads_share_activations || !tg_grad_holds(p->tensors, p->n_tensors, p->ops, p->n_ops, p->phase_begin,
                                                              p->pool_bytes[TG_POOL_GRADS], &holds, &n_holds))
                (void)tg_plan_live_activation_peak(p->tensors, p->n_tensors, p->n_ops, holds, n_holds,
                                                   &p->activation_live_peak);
            free(holds);
        }
        return;
    }
    edit_field(&f, mode, operand >> 1);
}

/* ---- running an accepted plan ------------------------------------------------------------ */

/* A few rows of synthetic data the plan's settings accept: ids inside its vocabulary,
 * labels inside its classes, lengths around seq (some truncated). */
static const char *synthetic_data(const tg_plan *p) {
    static char text[4096];
    size_t n = 0;
    const int64_t vocab = p->model.vocab_size > 0 ? p->model.vocab_size : 1;
    for (int row = 0; row < 5; row++) {
        const int len = 1 + (row * 7) % (p->train.seq + 3 < 40 ? p->train.seq + 3 : 40);
        n += (size_t)snprintf(text + n, sizeof text - n, "{\"input_ids\":[");
        for (int i = 0; i < len; i++)
            n += (size_t)snprintf(text + n, sizeof text - n, "%s%lld", i ? "," : "", (long long)((row * 31 + i * 17 + 1) % vocab));
        if (p->train.task == TG_TASK_CLASSIFY)
            n += (size_t)snprintf(text + n, sizeof text - n, "],\"label\":%d}\n", p->train.num_labels > 0 ? row % p->train.num_labels : 0);
        else
            n += (size_t)snprintf(text + n, sizeof text - n, "]}\n");
    }
    return fuzz_input_file((const uint8_t *)text, n);
}

typedef struct replica {
    const tg_plan *plan;
    int rank, eval;
    void *comm;
    pthread_barrier_t *opened;
    int *failed_open;
    pthread_t thread;
} replica;

/* Opens a trainer, waits for every replica to have opened (a replica that failed to open
 * would leave the others waiting in a collective), takes one step, evaluates. */
static void *run_replica(void *arg) {
    replica *r = arg;
    tg_trainer tr;
    tg_err err = {{0}};
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = RUN_THREADS, .load_data = 1, .max_in_flight = 1,
                            .rank = r->rank, .comm = r->comm};
    const int rc = tg_trainer_open(&tr, r->plan, &o, &err);
    if (rc) {
        FUZZ_ASSERT(err.msg[0], "open failed without a message");
        __atomic_store_n(r->failed_open, 1, __ATOMIC_SEQ_CST);
    }
    if (r->opened) pthread_barrier_wait(r->opened);
    if (rc) return NULL;
    if (!__atomic_load_n(r->failed_open, __ATOMIC_SEQ_CST)) {
        tg_step_stats s;
        memset(&err, 0, sizeof err);
        if (tg_trainer_step(&tr, &s, &err)) FUZZ_ASSERT(err.msg[0], "step failed without a message");
        tg_eval_stats e;
        memset(&err, 0, sizeof err);
        if (r->eval && tg_trainer_eval(&tr, &e, &err)) FUZZ_ASSERT(err.msg[0], "eval failed without a message");
    }
    tg_trainer_close(&tr);
    return NULL;
}

static void run_plan(tg_plan *p) {
    uint64_t pools = 0;
    for (int q = 0; q < TG_POOL_COUNT; q++) pools += p->pool_bytes[q]; /* each at most 2^48 */
    if (pools > RUN_MAX_BYTES || p->train.replicas > RUN_MAX_REPLICAS) return;
    /* Nothing outside the fuzzer's memory: no weights file, the data in a memfd. */
    p->model.weights[0] = 0;
    snprintf(p->run.train_data, sizeof p->run.train_data, "%s", synthetic_data(p));
    snprintf(p->run.eval_data, sizeof p->run.eval_data, "%s", p->run.train_data);
    const int n = p->train.replicas;
    int failed_open = 0;
    if (n == 1) {
        replica r = {.plan = p, .rank = 0, .eval = 1, .failed_open = &failed_open};
        run_replica(&r);
        return;
    }
    tg_cpu_comm_group *group = NULL;
    tg_err err;
    FUZZ_ASSERT(tg_cpu_comm_group_create(&group, n, &err) == 0, "comm group: %s", err.msg);
    pthread_barrier_t opened;
    FUZZ_ASSERT(pthread_barrier_init(&opened, NULL, (unsigned)n) == 0, "barrier");
    replica r[RUN_MAX_REPLICAS];
    for (int k = 0; k < n; k++) {
        r[k] = (replica){.plan = p, .rank = k, .eval = 0, .comm = group, .opened = &opened, .failed_open = &failed_open};
        if (k) FUZZ_ASSERT(pthread_create(&r[k].thread, NULL, run_replica, &r[k]) == 0, "pthread_create");
    }
    run_replica(&r[0]);
    for (int k = 1; k < n; k++) pthread_join(r[k].thread, NULL);
    pthread_barrier_destroy(&opened);
    tg_cpu_comm_group_destroy(group);
}

/* ---- the target ----------------------------------------------------------------------- */

/* An edited plan: its bucket plans are all TG_MAX_BUCKETS - 1 of the array, whatever its
 * (maybe edited) count says. */
static void free_edited(tg_plan *p) {
    if (p->buckets) p->train.n_buckets = TG_MAX_BUCKETS;
    tg_plan_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const size_t file = plan_bytes(data, size);
    if (!file) return 0;
    tg_plan plan;
    tg_err err;
    /* The seed must load: a plan damaged by byte mutations is fuzz_plan's input, not this one's. */
    if (tg_plan_decode(data, file, "seed", &plan, &err) != 0) return 0;
    /* The bucket plans in an array of the most a plan may have (the extra ones empty), so
     * that an edited bucket count reads no further than the array: the encoder writes as
     * many as the count says, and the decoder must refuse what does not match. */
    const int n_bucket_plans = plan.buckets ? plan.train.n_buckets - 1 : 0;
    if (plan.buckets) {
        tg_plan *all = calloc(TG_MAX_BUCKETS - 1, sizeof *all);
        FUZZ_ASSERT(all, "out of memory");
        memcpy(all, plan.buckets, sizeof *all * (size_t)n_bucket_plans);
        free(plan.buckets);
        plan.buckets = all;
    }
    for (size_t at = file; at + RECORD_BYTES <= size; at += RECORD_BYTES)
        apply_record(&plan, n_bucket_plans, data + at);

    uint8_t *sealed = NULL, *again = NULL;
    size_t n_sealed = 0, n_again = 0;
    if (tg_plan_encode(&plan, &sealed, &n_sealed, &err) != 0) { /* an op kind outside the enum, say */
        FUZZ_ASSERT(err.msg[0], "encode failed without a message");
        free_edited(&plan);
        return 0;
    }
    free_edited(&plan);
    if (tg_plan_decode(sealed, n_sealed, "edited.tgp", &plan, &err) != 0) {
        FUZZ_ASSERT(err.msg[0], "refused without a message");
        free(sealed);
        return 0;
    }
    FUZZ_ASSERT(tg_plan_inspect(&plan, devnull(), 0, &err) == 0, "inspect: %s", err.msg);
    FUZZ_ASSERT(tg_plan_inspect(&plan, devnull(), 1, &err) == 0, "inspect --json: %s", err.msg);
    FUZZ_ASSERT(tg_plan_encode(&plan, &again, &n_again, &err) == 0, "re-encode: %s", err.msg);
    FUZZ_ASSERT(n_again == n_sealed && memcmp(again, sealed, n_sealed) == 0, "re-encoding differs");
    free(sealed);
    free(again);
    run_plan(&plan);
    /* The smallest bucket, run as the plan of its length that it is. */
    if (plan.buckets) run_plan(&plan.buckets[0]);
    tg_plan_free(&plan);
    return 0;
}

/* ---- the mutator: the edit program only --------------------------------------------- */

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    const size_t file = plan_bytes(data, size);
    if (!file || file > max_size) return LLVMFuzzerMutate(data, size, max_size);
    uint8_t *prog = data + file;
    size_t len = size - file, room = max_size - file;
    /* Whole records keep the program aligned: one written afresh, else bytes mutated. */
    len -= len % RECORD_BYTES;
    uint32_t s = seed * 2654435761u + 1;
    if (seed % 3 == 0 || len < RECORD_BYTES) {
        size_t at = len >= RECORD_BYTES ? (seed / 3) % (len / RECORD_BYTES) * RECORD_BYTES : 0;
        if (seed % 2 && len + RECORD_BYTES <= room) at = len; /* appended */
        if (at + RECORD_BYTES > room) return LLVMFuzzerMutate(prog, len, room) + file;
        for (int i = 0; i < RECORD_BYTES; i++) {
            s = s * 1103515245u + 12345u;
            prog[at + i] = (uint8_t)(s >> 16);
        }
        if (prog[at] % 12 == 0) prog[at]++; /* not a no-op */
        if (at == len) len += RECORD_BYTES;
        return file + len;
    }
    return file + LLVMFuzzerMutate(prog, len, room);
}
