/* `tunegraph inspect`: prints a plan for people (text) or tools (JSON). Reads only the
 * plan, and tolerates out-of-range indices (prints them) so it can show a bad plan. */
#include "plan/inspect.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

#include <jansson.h>

#include "base/alloc.h"
#include "plan/memory_estimate.h"
#include "plan/op_meta.h"

/* What the plan recomputes (compiler/recompute.h): the backward ops writing a copy named
 * "<forward tensor>.recomputed" (and the GELU backwards writing one as their out2). The
 * layers rerun are the layers of those ops that are not a lone GELU (recompute = gelu's copy
 * before its reader); the GELU outputs made again are the GELU backwards' copies and the
 * lone GELU copies outside those layers. */
enum { MAX_SHOWN_LAYERS = 4096 };
typedef struct recompute_summary {
    int ops;            /* ops run again in the backward */
    double flops;       /* their FLOPs a step (times the micro-steps) */
    int outputs;        /* recomputed tensors written */
    int gelu;           /* GELU outputs made again outside the layers rerun */
    int layers;         /* layers rerun */
    char layer[MAX_SHOWN_LAYERS]; /* per layer index: rerun */
} recompute_summary;

static int recomputed_op(const tg_plan *p, const tg_op *op) {
    if (op->kind == TG_OP_GELU_BWD) return 0;
    const int t = op->out[0];
    return t >= 0 && t < p->n_tensors && tg_name_is_recomputed(p->tensors[t].name);
}

static void summarize_recompute(const tg_plan *p, recompute_summary *r) {
    memset(r, 0, sizeof *r);
    int b = p->phase_begin[TG_PHASE_BACKWARD], e = p->phase_begin[TG_PHASE_OPTIMIZER];
    if (b < 0) b = 0;
    if (e > p->n_ops) e = p->n_ops;
    const double times = p->train.grad_accumulation > 1 ? p->train.grad_accumulation : 1;
    for (int o = b; o < e; o++) {
        const tg_op *op = &p->ops[o];
        if (op->kind == TG_OP_GELU_BWD && op->out[2] >= 0) r->outputs++, r->gelu++;
        if (!recomputed_op(p, op)) continue;
        r->ops++;
        r->flops += times * tg_op_flops(op);
        for (int k = 0; k < TG_OP_MAX_OUT; k++) r->outputs += op->out[k] >= 0;
        const int l = tg_op_layer(p->tensors, p->n_tensors, op);
        if (op->kind != TG_OP_GELU && l >= 0 && l < MAX_SHOWN_LAYERS && !r->layer[l]) r->layer[l] = 1, r->layers++;
    }
    for (int o = b; o < e; o++) {
        const tg_op *op = &p->ops[o];
        if (op->kind != TG_OP_GELU || !recomputed_op(p, op)) continue;
        const int l = tg_op_layer(p->tensors, p->n_tensors, op);
        r->gelu += l < 0 || l >= MAX_SHOWN_LAYERS || !r->layer[l];
    }
}

/* The layers rerun as runs: "0-11", "0-3, 5". */
static void layer_runs(const recompute_summary *r, char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = 0;
    for (int l = 0; l < MAX_SHOWN_LAYERS && at < cap; l++) {
        if (!r->layer[l]) continue;
        int end = l;
        while (end + 1 < MAX_SHOWN_LAYERS && r->layer[end + 1]) end++;
        int n = end > l ? snprintf(buf + at, cap - at, "%s%d-%d", at ? ", " : "", l, end)
                        : snprintf(buf + at, cap - at, "%s%d", at ? ", " : "", l);
        at += n > 0 ? (size_t)n : 0;
        l = end;
    }
    if (at >= cap && cap > 4) strcpy(buf + cap - 4, "...");
}

/* The GPU estimate of the plan with its pools as large as without recomputation. */
static uint64_t gpu_estimate_without(const tg_plan *p) {
    tg_memory_estimate est;
    tg_estimate_memory(p, TG_MEM_DEVICE_CUDA, &est);
    return est.total - est.part[TG_MEM_POOLS] + p->peak_bytes_without_recompute;
}

/* Names of the tensor flags, bit by bit (bit 7, a low-precision copy, shows as "copy"). */
static const char *const k_flag_names[] = {"param", "grad",   "no_decay", "input",     "output", "view",
                                           "tied",  "copy",   "frozen",   "buffer",    "persistent"};
_Static_assert(sizeof k_flag_names / sizeof k_flag_names[0] == 11 && TG_TENSOR_FLAGS_ALL == (1 << 11) - 1,
               "a name for every tensor flag");

/* Per class (trainable, frozen, buffer): its tensors (parameters or buffers with values of
 * their own: no views, no low-precision copies) and the bytes of its pool. */
typedef struct class_counts {
    int count[TG_CLASS_COUNT];
    uint64_t bytes[TG_CLASS_COUNT];
} class_counts;

static class_counts count_classes(const tg_plan *p) {
    class_counts c;
    memset(&c, 0, sizeof c);
    for (int t = 0; t < p->n_tensors; t++)
        if (tg_tensor_is_value(&p->tensors[t])) c.count[tg_tensor_class_of(&p->tensors[t])]++;
    c.bytes[TG_CLASS_TRAINABLE] = p->pool_bytes[TG_POOL_PARAMS];
    c.bytes[TG_CLASS_FROZEN] = p->pool_bytes[TG_POOL_FROZEN];
    c.bytes[TG_CLASS_BUFFER] = p->pool_bytes[TG_POOL_BUFFERS];
    return c;
}

static const tg_tensor *tensor_at(const tg_plan *p, int32_t t) {
    return t >= 0 && t < p->n_tensors ? &p->tensors[t] : NULL;
}

/* Walks the op's parameters (those of its kind's set, in plan/ops.def order, with their
 * display names) with the visitor's functions. */
static void each_param(const tg_op *op, const tg_param_visitor *v) {
    tg_op_params params = op->p;
    tg_op_params_visit(op->kind, &params, v);
}

/* ---- text -------------------------------------------------------------------- */

typedef struct text_ctx {
    FILE *out;
    int n;
} text_ctx;

static void text_i64(void *ctx, const char *name, int64_t *value) {
    text_ctx *c = ctx;
    if (!c->n++) fputs(" |", c->out);
    fprintf(c->out, " %s=%" PRId64, name, *value);
}
static void text_f32(void *ctx, const char *name, float *value) {
    text_ctx *c = ctx;
    if (!c->n++) fputs(" |", c->out);
    fprintf(c->out, " %s=%g", name, (double)*value);
}

static void print_shape(FILE *out, const tg_tensor *t) {
    fputc('[', out);
    int nd = t->ndim < 0 ? 0 : t->ndim > TG_MAX_DIMS ? TG_MAX_DIMS : t->ndim;
    for (int d = 0; d < nd; d++) fprintf(out, "%s%" PRId64, d ? "," : "", t->shape[d]);
    fputc(']', out);
}

static void print_tensor_ref(FILE *out, const tg_plan *p, int32_t t, int with_shape) {
    const tg_tensor *x = tensor_at(p, t);
    if (!x) {
        fprintf(out, "#%d?", t);
        return;
    }
    fputs(x->name, out);
    if (with_shape) print_shape(out, x);
}

/* The attention the plan runs, from its ops: the job asks for fused attention, but a model
 * whose heads are too wide for the fused op gets the unfused one. */
static int plan_attention_mode(const tg_plan *p) {
    for (int o = 0; o < p->n_ops; o++)
        if (p->ops[o].kind == TG_OP_ATTENTION) return TG_ATTENTION_FUSED;
    return TG_ATTENTION_UNFUSED;
}

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

/* The bytes of `pool` a plan's own layout reaches (its pool_bytes may be larger: a bucket
 * plan's pools are the largest bucket's). */
static uint64_t pool_need(const tg_plan *p, int pool) {
    uint64_t need = 0;
    for (int t = 0; t < p->n_tensors; t++) {
        const tg_tensor *x = &p->tensors[t];
        if (x->pool == pool && x->offset + x->bytes > need) need = x->offset + x->bytes;
    }
    return need;
}

/* The bucket count the plan's tables hold (1 when it has no bucket plans). */
static int bucket_count(const tg_plan *p) {
    return p->buckets && p->train.n_buckets > 1 && p->train.n_buckets <= TG_MAX_BUCKETS ? p->train.n_buckets : 1;
}

/* The bucket whose activations set the pool's size (the first that needs the most). */
static int sizing_bucket(const tg_plan *p) {
    int best = 0;
    for (int k = 1; k < bucket_count(p); k++)
        if (pool_need(tg_plan_bucket(p, k), TG_POOL_ACTIVATIONS) >
            pool_need(tg_plan_bucket(p, best), TG_POOL_ACTIVATIONS))
            best = k;
    return best;
}

static void print_buckets(const tg_plan *p, FILE *out) {
    const int n = bucket_count(p);
    if (n < 2) return;
    const int sizing = sizing_bucket(p);
    fprintf(out, "buckets: %d lengths, one set of pools: activations %" PRIu64 " bytes (%.2f MiB), sized by bucket %d "
                 "(seq %d), serve them all\n",
            n, p->pool_bytes[TG_POOL_ACTIVATIONS], mib(p->pool_bytes[TG_POOL_ACTIVATIONS]), sizing,
            tg_plan_bucket(p, sizing)->train.seq);
    for (int k = 0; k < n; k++) {
        const tg_plan *b = tg_plan_bucket(p, k);
        const uint64_t act = pool_need(b, TG_POOL_ACTIVATIONS);
        fprintf(out, "  bucket %d: seq %-6d activations %12" PRIu64 " bytes (%.2f MiB)  ops %d  %.3f GFLOP/step\n", k,
                b->train.seq, act, mib(act), b->n_ops, b->flops_per_step / 1e9);
    }
}

/* ZeRO-1: the bytes of AdamW's m and v this replica holds (its slice) and those a replica
 * of the same plan without sharding would (every parameter's). 0 for other plans. */
static int zero_state_bytes(const tg_plan *p, uint64_t *own, uint64_t *whole) {
    const tg_plan_io *io = &p->io;
    if (p->train.zero_stage < 1 || p->train.replicas < 2 || io->m_all < 0 || io->v_all < 0 || io->params_all < 0)
        return 0;
    const tg_tensor *m = &p->tensors[io->m_all], *v = &p->tensors[io->v_all], *w = &p->tensors[io->params_all];
    const uint64_t n = w->bytes / (uint64_t)tg_dtype_size(w->dtype);
    *own = m->bytes + v->bytes;
    *whole = n * (uint64_t)(tg_dtype_size(m->dtype) + tg_dtype_size(v->dtype));
    return *whole >= *own;
}

static void print_text(const tg_plan *p, FILE *out) {
    fprintf(out, "model: %s (%s)\n", p->model.source, tg_arch_name(p->model.arch));
    int attention = plan_attention_mode(p);
    const tg_plan_train *t = &p->train;
    if (p->model.arch == TG_ARCH_MOBILENET_V2) { /* images: no tokens, no attention */
        fprintf(out, "task: %s  batch: %d images of %d x %d x %d  width_mult: %g  precision: %s", tg_task_name(t->task),
                t->batch, p->model.image_channels, p->model.image_size, p->model.image_size,
                (double)p->model.width_mult, tg_precision_name(t->precision));
        /* The normalisation the trainer applies to each channel's bytes. */
        for (int c = 0; c < p->model.image_channels && c < 3; c++)
            fprintf(out, "%s%g", c ? "," : "  image_mean/std: ", (double)p->model.image_mean[c]);
        for (int c = 0; c < p->model.image_channels && c < 3; c++)
            fprintf(out, "%s%g", c ? "," : " / ", (double)p->model.image_std[c]);
    } else {
        fprintf(out, "task: %s  batch x seq: %d x %d  precision: %s  attention: %s", tg_task_name(t->task), t->batch,
                t->seq, tg_precision_name(t->precision), tg_attention_mode_name(attention));
        if (attention != t->attention) fprintf(out, " (job asks %s)", tg_attention_mode_name(t->attention));
    }
    if (t->replicas > 1) fprintf(out, "  data parallel: %d replicas", t->replicas);
    if (t->zero_stage > 0) fprintf(out, " (ZeRO-%d: optimizer state sharded)", t->zero_stage);
    if (t->grad_accumulation > 1)
        fprintf(out, "  grad_accumulation: %d micro-batches a step (%d rows)", t->grad_accumulation,
                t->grad_accumulation * t->batch);
    fputc('\n', out);
    print_buckets(p, out);
    const tg_plan_run *r = &p->run;
    fprintf(out, "run: steps %d  epochs %d  seed %" PRIu64 "  last_batch: %s  skip_nonfinite: ", r->steps, r->epochs,
            r->seed, tg_last_batch_name(r->last_batch));
    if (r->skip_nonfinite) fprintf(out, "true (at most %d in a row)\n", r->max_skipped_steps);
    else fputs("false\n", out);
    if (p->train.task == TG_TASK_QA)
        fprintf(out, "qa eval: n_best %d  max_answer_length %d  null_threshold %g\n", r->qa_n_best,
                r->qa_max_answer_length, (double)r->qa_null_threshold);
    recompute_summary *rs = tg_calloc(1, sizeof *rs);
    if (rs) summarize_recompute(p, rs);
    if (rs && rs->layers) {
        char runs[256];
        layer_runs(rs, runs, sizeof runs);
        const double base = p->flops_per_step - rs->flops;
        fprintf(out, "recompute: layers %s (%d of %d) run again in the backward: %d ops, %.6g FLOPs (%.3f GFLOP) a step",
                runs, rs->layers, p->model.layers, rs->ops, rs->flops, rs->flops / 1e9);
        if (base > 0) fprintf(out, " (+%.1f%%)", 100.0 * rs->flops / base);
        fputs(" (job key recompute)\n", out);
    }
    if (rs && rs->gelu)
        fprintf(out, "recompute: %d GELU outputs made again in the backward%s\n", rs->gelu,
                rs->layers ? "" : " (job key recompute)");
    if (rs && (rs->layers || rs->gelu) && p->peak_bytes_without_recompute)
        fprintf(out, "recompute: planned peak %" PRIu64 " bytes (%.2f MiB), %" PRIu64 " bytes (%.2f MiB) without recomputing\n",
                p->peak_bytes, mib(p->peak_bytes), p->peak_bytes_without_recompute, mib(p->peak_bytes_without_recompute));
    free(rs);
    fprintf(out, "fingerprint: %016" PRIx64 "\n", p->fingerprint);
    fprintf(out, "ops: %d  tensors: %d\n", p->n_ops, p->n_tensors);
    const class_counts cc = count_classes(p);
    fprintf(out, "parameters: trainable %d (%" PRIu64 " bytes), frozen %d (%" PRIu64 " bytes), buffers %d (%" PRIu64
                 " bytes)\n",
            cc.count[TG_CLASS_TRAINABLE], cc.bytes[TG_CLASS_TRAINABLE], cc.count[TG_CLASS_FROZEN],
            cc.bytes[TG_CLASS_FROZEN], cc.count[TG_CLASS_BUFFER], cc.bytes[TG_CLASS_BUFFER]);
    if (cc.count[TG_CLASS_FROZEN] || p->freeze_pruned_ops)
        fprintf(out, "freeze pruned: %d backward ops, %.6g FLOPs (%.3f GFLOP) per step, beside no gradient and no "
                     "optimizer state for the %d frozen parameters\n",
                p->freeze_pruned_ops, p->freeze_pruned_flops, p->freeze_pruned_flops / 1e9, cc.count[TG_CLASS_FROZEN]);

    for (int ph = 0; ph < TG_PHASE_COUNT; ph++) {
        int b = p->phase_begin[ph], e = p->phase_begin[ph + 1];
        if (b < 0) b = 0;
        if (e > p->n_ops) e = p->n_ops;
        fprintf(out, "\n== %s (%d ops) ==\n", tg_phase_name(ph), e > b ? e - b : 0);
        for (int o = b; o < e; o++) {
            const tg_op *op = &p->ops[o];
            fprintf(out, "%5d %-18s ", o, tg_op_name(op->kind));
            int n = 0;
            for (int k = 0; k < TG_OP_MAX_OUT; k++) {
                if (op->out[k] == -1) continue;
                fputs(n++ ? ", " : "", out);
                print_tensor_ref(out, p, op->out[k], 1);
            }
            fputs(" <- ", out);
            n = 0;
            for (int k = 0; k < TG_OP_MAX_IN; k++) {
                if (op->in[k] == -1) continue;
                fputs(n++ ? ", " : "", out);
                print_tensor_ref(out, p, op->in[k], 0);
            }
            if (!n) fputs("-", out);
            text_ctx tc = {out, 0};
            each_param(op, &(const tg_param_visitor){&tc, text_i64, text_f32});
            fputc('\n', out);
        }
    }

    fprintf(out, "\n== tensors (%d) ==\n", p->n_tensors);
    fprintf(out, "%5s %-40s %-5s %-18s %-11s %12s %12s %5s %5s  %s\n", "idx", "name", "dtype",
            "shape", "pool", "offset", "bytes", "first", "last", "flags");
    for (int t = 0; t < p->n_tensors; t++) {
        const tg_tensor *x = &p->tensors[t];
        char shape[96];
        int len = snprintf(shape, sizeof shape, "[");
        int nd = x->ndim < 0 ? 0 : x->ndim > TG_MAX_DIMS ? TG_MAX_DIMS : x->ndim;
        /* GCOVR_EXCL_BR_START: nd <= TG_MAX_DIMS, and four int64 dims fit the 96-byte buffer */
        for (int d = 0; d < nd && len < (int)sizeof shape; d++)
            len += snprintf(shape + len, sizeof shape - (size_t)len, "%s%" PRId64, d ? "," : "",
                            x->shape[d]);
        if (len < (int)sizeof shape) snprintf(shape + len, sizeof shape - (size_t)len, "]");
        /* GCOVR_EXCL_BR_STOP */
        fprintf(out, "%5d %-40s %-5s %-18s %-11s %12" PRIu64 " %12" PRIu64 " %5d %5d  ", t,
                x->name, tg_dtype_name(x->dtype), shape, tg_pool_name(x->pool), x->offset,
                x->bytes, x->first_use, x->last_use);
        int n = 0;
        for (size_t f = 0; f < sizeof k_flag_names / sizeof k_flag_names[0]; f++)
            if (x->flags & (1 << f)) fprintf(out, "%s%s", n++ ? "," : "", k_flag_names[f]);
        if (!n) fputc('-', out);
        if (x->group != -1) {
            fputs("  packed in ", out);
            print_tensor_ref(out, p, x->group, 0);
        }
        fputc('\n', out);
    }

    fputs("\n== pools ==\n", out);
    for (int q = 0; q < TG_POOL_COUNT; q++)
        fprintf(out, "%-12s %14" PRIu64 " bytes %12.2f MiB%s\n", tg_pool_name(q), p->pool_bytes[q],
                mib(p->pool_bytes[q]), tg_pool_allocated(p, q) ? "" : "  (inside activations, held by liveness)");
    fprintf(out, "peak: %" PRIu64 " bytes (%.2f MiB)%s\n", p->peak_bytes, mib(p->peak_bytes),
            p->train.replicas > 1 ? " on each replica (rank)" : "");
    uint64_t own, whole;
    if (zero_state_bytes(p, &own, &whole))
        fprintf(out, "ZeRO-1: AdamW state %.2f MiB a replica, of %.2f MiB without sharding: %.2f MiB saved on each of "
                     "%d replicas\n",
                mib(own), mib(whole), mib(whole - own), p->train.replicas);
    /* What a run needs on each device beside the pools (plan/memory_estimate.h). */
    for (int d = TG_MEM_DEVICE_CUDA; d >= TG_MEM_DEVICE_CPU; d--) {
        tg_memory_estimate est;
        char total[32], parts[512];
        tg_estimate_memory(p, d, &est);
        fprintf(out, "memory estimate, %s: %s (%s)\n", d == TG_MEM_DEVICE_CUDA ? "GPU" : "CPU",
                tg_mem_format_bytes(est.total, total, sizeof total),
                tg_memory_estimate_parts(&est, -1, parts, sizeof parts));
    }
    if (p->peak_bytes_without_recompute) {
        char total[32];
        fprintf(out, "memory estimate, GPU without recomputing: %s\n",
                tg_mem_format_bytes(gpu_estimate_without(p), total, sizeof total));
    }
    fprintf(out, "activation live peak: %" PRIu64 " bytes (%.2f MiB)\n", p->activation_live_peak,
            mib(p->activation_live_peak));
    fprintf(out, "flops per step: %.6g (%.3f GFLOP)\n", p->flops_per_step,
            p->flops_per_step / 1e9);
    fprintf(out, "bytes per step: %.6g (%.2f MiB)\n", p->bytes_per_step,
            p->bytes_per_step / (1024.0 * 1024.0));
}

/* ---- JSON -------------------------------------------------------------------- */

/* json_string refuses invalid UTF-8; a damaged name should not sink the whole dump. Out of
 * memory it fails too: then NULL, which refuses the dump, rather than a "?" in place of a
 * valid name. */
static json_t *jstr(const char *s) {
    const long failures_before = tg_alloc_failures();
    json_t *v = json_string(s);
    return v || tg_alloc_failures() != failures_before ? v : json_string("?");
}
/* json_real refuses NaN and infinities. */
static json_t *jreal(double d) { return isfinite(d) ? json_real(d) : json_null(); }
static json_t *jint(int64_t v) { return json_integer((json_int_t)v); }
/* Byte counts are uint64 in the plan but always far below 2^63. */
static json_t *jbytes(uint64_t v) { return json_integer((json_int_t)v); }

typedef struct jctx {
    json_t *obj;
    int bad;
} jctx;

static void jset(jctx *c, json_t *obj, const char *key, json_t *v) {
    if (!v || json_object_set_new(obj, key, v)) c->bad = 1;
}
static void jpush(jctx *c, json_t *arr, json_t *v) {
    if (!v || json_array_append_new(arr, v)) c->bad = 1;
}

static void json_i64(void *ctx, const char *name, int64_t *value) {
    jctx *c = ctx;
    jset(c, c->obj, name, jint(*value));
}
static void json_f32(void *ctx, const char *name, float *value) {
    jctx *c = ctx;
    jset(c, c->obj, name, jreal((double)*value));
}

static json_t *tensor_name_json(const tg_plan *p, int32_t t) {
    const tg_tensor *x = tensor_at(p, t);
    if (x) return jstr(x->name);
    char buf[32];
    snprintf(buf, sizeof buf, "#%d?", t);
    return json_string(buf);
}

static json_t *build_json(const tg_plan *p, int *bad) {
    jctx c = {0};
    json_t *root = json_object();
    if (!root) {
        *bad = 1;
        return NULL;
    }
    char hex[17];
    snprintf(hex, sizeof hex, "%016" PRIx64, p->fingerprint);

    json_t *model = json_object();
    jset(&c, root, "model", model);
    if (model) {
        jset(&c, model, "source", jstr(p->model.source));
        jset(&c, model, "weights", jstr(p->model.weights));
        jset(&c, model, "arch", jstr(tg_arch_name(p->model.arch)));
        jset(&c, model, "vocab_size", jint(p->model.vocab_size));
        jset(&c, model, "hidden", jint(p->model.hidden));
        jset(&c, model, "layers", jint(p->model.layers));
        jset(&c, model, "heads", jint(p->model.heads));
        jset(&c, model, "intermediate", jint(p->model.intermediate));
        jset(&c, model, "max_positions", jint(p->model.max_positions));
    }
    const tg_plan_train *t = &p->train;
    json_t *train = json_object();
    jset(&c, root, "train", train);
    if (train) {
        jset(&c, train, "task", jstr(tg_task_name(t->task)));
        jset(&c, train, "batch", jint(t->batch));
        jset(&c, train, "seq", jint(t->seq));
        jset(&c, train, "num_labels", jint(t->num_labels));
        jset(&c, train, "pad_id", jint(t->pad_id));
        jset(&c, train, "precision", jstr(tg_precision_name(t->precision)));
        jset(&c, train, "allow_tf32", json_boolean(t->allow_tf32));
        jset(&c, train, "replicas", jint(t->replicas));
        jset(&c, train, "zero_stage", jint(t->zero_stage));
        jset(&c, train, "grad_accumulation", jint(t->grad_accumulation));
        jset(&c, train, "attention", jstr(tg_attention_mode_name(t->attention))); /* as the job asked */
        json_t *lengths = json_array();
        jset(&c, train, "bucket_seq", lengths);
        for (int k = 0; lengths && k < t->n_buckets && k < TG_MAX_BUCKETS; k++) jpush(&c, lengths, jint(t->bucket_seq[k]));
    }
    const tg_plan_run *r = &p->run;
    json_t *run = json_object();
    jset(&c, root, "run", run);
    if (run) {
        jset(&c, run, "train_data", jstr(r->train_data));
        jset(&c, run, "eval_data", jstr(r->eval_data));
        jset(&c, run, "steps", jint(r->steps));
        jset(&c, run, "epochs", jint(r->epochs));
        jset(&c, run, "log_every", jint(r->log_every));
        jset(&c, run, "checkpoint_every", jint(r->checkpoint_every));
        jset(&c, run, "keep_checkpoints", jint(r->keep_checkpoints));
        jset(&c, run, "checkpoint_dir", jstr(r->checkpoint_dir));
        jset(&c, run, "last_batch", jstr(tg_last_batch_name(r->last_batch)));
        jset(&c, run, "skip_nonfinite", json_boolean(r->skip_nonfinite));
        jset(&c, run, "max_skipped_steps", jint(r->max_skipped_steps));
        jset(&c, run, "qa_n_best", jint(r->qa_n_best));
        jset(&c, run, "qa_max_answer_length", jint(r->qa_max_answer_length));
        jset(&c, run, "qa_null_threshold", json_real(r->qa_null_threshold));
        jset(&c, run, "gpu_hour_price", json_real(r->gpu_hour_price));
        /* A JSON integer where it fits jansson's signed 64 bits, else its decimal text. */
        char seed[24];
        snprintf(seed, sizeof seed, "%" PRIu64, r->seed);
        jset(&c, run, "seed", r->seed <= (uint64_t)INT64_MAX ? jint((int64_t)r->seed) : json_string(seed));
    }
    jset(&c, root, "job_path", jstr(p->job_path));
    jset(&c, root, "task", jstr(tg_task_name(t->task)));
    jset(&c, root, "batch", jint(t->batch));
    jset(&c, root, "seq", jint(t->seq));
    jset(&c, root, "precision", jstr(tg_precision_name(t->precision)));
    jset(&c, root, "attention", jstr(tg_attention_mode_name(plan_attention_mode(p))));
    jset(&c, root, "data_parallel", jint(t->replicas));
    jset(&c, root, "zero_stage", jint(t->zero_stage));
    jset(&c, root, "fingerprint", json_string(hex));
    jset(&c, root, "n_ops", jint(p->n_ops));
    jset(&c, root, "n_tensors", jint(p->n_tensors));

    /* Per class: its parameters (or buffers) and its pool's bytes. */
    const class_counts cc = count_classes(p);
    json_t *classes = json_object();
    jset(&c, root, "classes", classes);
    static const char *const class_keys[TG_CLASS_COUNT] = {NULL, "trainable", "frozen", "buffers"};
    for (int k = TG_CLASS_TRAINABLE; classes && k < TG_CLASS_COUNT; k++) {
        json_t *jc = json_object();
        jset(&c, classes, class_keys[k], jc);
        if (!jc) continue;
        jset(&c, jc, "count", jint(cc.count[k]));
        jset(&c, jc, "bytes", jbytes(cc.bytes[k]));
    }

    json_t *per_phase = json_object();
    jset(&c, root, "ops_per_phase", per_phase);
    for (int ph = 0; per_phase && ph < TG_PHASE_COUNT; ph++) {
        int n = p->phase_begin[ph + 1] - p->phase_begin[ph];
        jset(&c, per_phase, tg_phase_name(ph), jint(n > 0 ? n : 0));
    }

    json_t *ops = json_array();
    jset(&c, root, "ops", ops);
    for (int o = 0; ops && o < p->n_ops; o++) {
        const tg_op *op = &p->ops[o];
        json_t *jo = json_object(), *ins = json_array(), *outs = json_array(),
               *params = json_object();
        jpush(&c, ops, jo);
        if (!jo) {
            json_decref(ins);
            json_decref(outs);
            json_decref(params);
            continue;
        }
        jset(&c, jo, "index", jint(o));
        jset(&c, jo, "op", jstr(tg_op_name(op->kind)));
        jset(&c, jo, "phase", jstr(tg_phase_name(op->phase)));
        jset(&c, jo, "inputs", ins);
        jset(&c, jo, "outputs", outs);
        jset(&c, jo, "params", params);
        for (int k = 0; ins && k < TG_OP_MAX_IN; k++)
            if (op->in[k] != -1) jpush(&c, ins, tensor_name_json(p, op->in[k]));
        for (int k = 0; outs && k < TG_OP_MAX_OUT; k++)
            if (op->out[k] != -1) jpush(&c, outs, tensor_name_json(p, op->out[k]));
        if (params) {
            jctx pc = {params, 0};
            each_param(op, &(const tg_param_visitor){&pc, json_i64, json_f32});
            c.bad |= pc.bad;
        }
    }

    json_t *tensors = json_array();
    jset(&c, root, "tensors", tensors);
    for (int t = 0; tensors && t < p->n_tensors; t++) {
        const tg_tensor *x = &p->tensors[t];
        json_t *jt = json_object(), *shape = json_array(), *flags = json_array();
        jpush(&c, tensors, jt);
        if (!jt) {
            json_decref(shape);
            json_decref(flags);
            continue;
        }
        jset(&c, jt, "name", jstr(x->name));
        jset(&c, jt, "dtype", jstr(tg_dtype_name(x->dtype)));
        jset(&c, jt, "shape", shape);
        int nd = x->ndim < 0 ? 0 : x->ndim > TG_MAX_DIMS ? TG_MAX_DIMS : x->ndim;
        for (int d = 0; shape && d < nd; d++) jpush(&c, shape, jint(x->shape[d]));
        jset(&c, jt, "pool", jstr(tg_pool_name(x->pool)));
        jset(&c, jt, "offset", jbytes(x->offset));
        jset(&c, jt, "bytes", jbytes(x->bytes));
        jset(&c, jt, "first_use", jint(x->first_use));
        jset(&c, jt, "last_use", jint(x->last_use));
        jset(&c, jt, "flags", flags);
        for (size_t f = 0; flags && f < sizeof k_flag_names / sizeof k_flag_names[0]; f++)
            if (x->flags & (1 << f)) jpush(&c, flags, json_string(k_flag_names[f]));
        /* A packed group member: the view that reads it with the rest of its group. */
        if (x->group != -1) jset(&c, jt, "packed_in", tensor_name_json(p, x->group));
    }

    json_t *pools = json_object();
    jset(&c, root, "pools", pools);
    for (int q = 0; pools && q < TG_POOL_COUNT; q++)
        jset(&c, pools, tg_pool_name(q), jbytes(p->pool_bytes[q]));
    jset(&c, root, "grads_share_activations", json_boolean(p->grads_share_activations));
    jset(&c, root, "peak_bytes", jbytes(p->peak_bytes));
    uint64_t zero_own, zero_whole;
    if (zero_state_bytes(p, &zero_own, &zero_whole)) {
        json_t *z = json_object();
        jset(&c, z, "optimizer_state_bytes", jbytes(zero_own));
        jset(&c, z, "optimizer_state_bytes_unsharded", jbytes(zero_whole));
        jset(&c, root, "zero", z);
    }
    /* {"cuda": {"total_bytes": N, "parts": {"pools": N, ...}}, "cpu": {...}}: every part,
     * 0 where it does not apply to the device. */
    json_t *memory = json_object();
    jset(&c, root, "memory_estimate", memory);
    for (int d = TG_MEM_DEVICE_CUDA; memory && d >= TG_MEM_DEVICE_CPU; d--) {
        tg_memory_estimate est;
        tg_estimate_memory(p, d, &est);
        json_t *dev = json_object(), *parts = json_object();
        jset(&c, memory, d == TG_MEM_DEVICE_CUDA ? "cuda" : "cpu", dev);
        if (!dev) {
            json_decref(parts);
            continue;
        }
        jset(&c, dev, "total_bytes", jbytes(est.total));
        jset(&c, dev, "parts", parts);
        for (int k = 0; parts && k < TG_MEM_PART_COUNT; k++) jset(&c, parts, tg_mem_part_key(k), jbytes(est.part[k]));
    }
    /* Every bucket (the plan itself the last, or the only one): its length, the activation
     * bytes it needs itself, its ops and work; the pools serve the largest need. */
    json_t *buckets = json_array();
    jset(&c, root, "buckets", buckets);
    for (int k = 0; buckets && k < bucket_count(p); k++) {
        const tg_plan *b = tg_plan_bucket(p, k);
        json_t *jb = json_object();
        jpush(&c, buckets, jb);
        if (!jb) continue;
        jset(&c, jb, "seq", jint(b->train.seq));
        jset(&c, jb, "activation_bytes", jbytes(pool_need(b, TG_POOL_ACTIVATIONS)));
        jset(&c, jb, "activation_live_peak", jbytes(b->activation_live_peak));
        jset(&c, jb, "n_ops", jint(b->n_ops));
        jset(&c, jb, "flops_per_step", jreal(b->flops_per_step));
    }
    jset(&c, root, "pools_sized_by_bucket", jint(sizing_bucket(p)));
    jset(&c, root, "activation_live_peak", jbytes(p->activation_live_peak));
    jset(&c, root, "flops_per_step", jreal(p->flops_per_step));
    jset(&c, root, "bytes_per_step", jreal(p->bytes_per_step));
    jset(&c, root, "freeze_pruned_ops", jint(p->freeze_pruned_ops));
    jset(&c, root, "freeze_pruned_flops", jreal(p->freeze_pruned_flops));
    /* {"layers": [0, 1, ...], "ops": N, "flops_per_step": X, "gelu_outputs": N,
     * "peak_bytes_without": N, "gpu_estimate_without_bytes": N}: what the backward runs
     * again (compiler/recompute.h); the sizes without recomputing are 0 where the plan
     * recomputes nothing. */
    recompute_summary *rs = tg_calloc(1, sizeof *rs);
    if (!rs) c.bad = 1;
    else summarize_recompute(p, rs);
    jset(&c, root, "recomputed_outputs", jint(rs ? rs->outputs : 0));
    json_t *jr = json_object(), *layers = json_array();
    jset(&c, root, "recompute", jr);
    if (jr) {
        jset(&c, jr, "layers", layers);
        layers = NULL;
        for (int l = 0; rs && l < MAX_SHOWN_LAYERS; l++)
            if (rs->layer[l]) jpush(&c, json_object_get(jr, "layers"), jint(l));
        jset(&c, jr, "ops", jint(rs ? rs->ops : 0));
        jset(&c, jr, "flops_per_step", jreal(rs ? rs->flops : 0));
        jset(&c, jr, "gelu_outputs", jint(rs ? rs->gelu : 0));
        jset(&c, jr, "peak_bytes_without", jbytes(p->peak_bytes_without_recompute));
        jset(&c, jr, "gpu_estimate_without_bytes", jbytes(p->peak_bytes_without_recompute ? gpu_estimate_without(p) : 0));
    }
    json_decref(layers);
    free(rs);
    *bad = c.bad;
    return root;
}

int tg_plan_inspect(const tg_plan *plan, FILE *out, int json, tg_err *err) {
    if (json) {
        int bad = 0;
        json_t *root = build_json(plan, &bad);
        if (!root || bad) {
            json_decref(root);
            return tg_fail(err, "inspect: cannot build the JSON (out of memory)");
        }
        /* Sorted-by-insertion keys: the order above is the stable output order. jansson
         * reports an allocation that failed while dumping as a failed dump. */
        const long failures_before = tg_alloc_failures();
        int rc = json_dumpf(root, out, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
        json_decref(root);
        if (rc && tg_alloc_failures() != failures_before)
            return tg_fail(err, "inspect: out of memory writing the JSON");
        if (rc || fputc('\n', out) == EOF)
            return tg_fail(err, "inspect: cannot write the JSON output");
    } else {
        print_text(plan, out);
    }
    if (fflush(out) || ferror(out)) return tg_fail(err, "inspect: cannot write the output");
    return 0;
}
