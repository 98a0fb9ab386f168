#include "compiler/graph.h"

#include <fnmatch.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/checked.h"
#include "compiler/compiler_alloc.h"
#include "compiler/limits.h"
#include "compiler/size_check.h"
#include "plan/op_meta.h"

void tg_graph_init(tg_graph *g, const tg_model_config *cfg, const tg_job *job, tg_err *err) {
    memset(g, 0, sizeof *g);
    g->cfg = cfg;
    g->job = job;
    g->err = err;
    memset(&g->io, 0xff, sizeof g->io); /* every role -1 */
    if (job) g->n_freeze = tg_job_freeze_patterns(job, g->freeze, TG_JOB_FREEZE_MAX);
}

void tg_graph_free(tg_graph *g) {
    free(g->tensors);
    free(g->ops);
    free(g->grad);
    free(g->needs_grad);
    free(g->grad_holders), free(g->forward_reads), free(g->gelu_producer), free(g->writes), free(g->last_write);
    memset(g, 0, sizeof *g);
}

int tg_graph_fail(tg_graph *g, const char *fmt, ...) {
    if (!g->failed) {
        char msg[900];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        tg_fail(g->err, "internal compiler error: %s", msg);
        g->failed = 1;
    }
    return -1;
}

/* A parameter name for messages: the first parameter built. */
static const char *first_param_name(const tg_graph *g) {
    for (int t = 0; t < g->n_tensors; t++)
        if ((g->tensors[t].flags & (TG_TENSOR_PARAM | TG_TENSOR_FROZEN)) && !(g->tensors[t].flags & TG_TENSOR_VIEW))
            return g->tensors[t].name;
    return "?";
}

int tg_graph_job_fail(tg_graph *g, int key, const char *fmt, ...) {
    if (!g->failed) {
        char msg[700], where[TG_PATH_MAX + 32];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        tg_fail(g->err, "%s: key '%s': %s", tg_job_where(g->job, key, where, sizeof where), tg_job_key_name(key),
                msg);
        g->failed = 1;
    }
    return -1;
}

int tg_graph_out_of_memory(tg_graph *g) {
    if (!g->failed) {
        tg_fail(g->err, "out of memory compiling model '%s' (at %d tensors and %d ops)", g->cfg ? g->cfg->source : "?",
                g->n_tensors, g->n_ops);
        g->failed = 1;
    }
    return -1;
}

int tg_graph_size_fail(tg_graph *g, int key, const char *fmt, ...) {
    if (!g->failed) {
        char msg[900];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        if (g->job) {
            char where[TG_PATH_MAX + 32];
            tg_fail(g->err, "%s: key '%s': %s", tg_job_where(g->job, key, where, sizeof where), tg_job_key_name(key), msg);
        } else {
            tg_fail(g->err, "%s", msg);
        }
        g->failed = 1;
    }
    return -1;
}

int tg_graph_check_freeze(tg_graph *g) {
    if (g->failed) return -1;
    char unmatched[600] = "";
    int n = 0;
    for (int i = 0; i < g->n_freeze; i++)
        if (!g->freeze_hits[i]) {
            size_t len = strlen(unmatched);
            snprintf(unmatched + len, sizeof unmatched - len, "%s'%s'", n++ ? ", " : "", g->freeze[i]);
        }
    if (!n) return 0;
    return tg_graph_job_fail(g, TG_JOB_FREEZE, "%s %s %s no parameter of model '%s' (patterns match Hugging Face "
                             "parameter names such as '%s')", n > 1 ? "patterns" : "pattern", unmatched,
                             n > 1 ? "match" : "matches", g->cfg->source, first_param_name(g));
}

/* Grows an array to hold `need` entries, one more than it holds (the callers append one at
 * a time, so one doubling always suffices); need is at most TG_MAX_GRAPH_TENSORS or
 * TG_MAX_GRAPH_OPS (2^24), so the doubling stays far from overflowing int. */
static int grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int n = *cap ? *cap * 2 : 256;
    void *q = tg_compiler_realloc(*p, (size_t)n * elem);
    if (!q) return -1;
    *p = q;
    *cap = n;
    return 0;
}

int tg_graph_tensor(tg_graph *g, const char *name, int dtype, int pool, int ndim, const int64_t *shape) {
    if (g->failed) return -1;
    if (ndim < 0 || ndim > TG_MAX_DIMS) return tg_graph_fail(g, "tensor %s has %d dims", name, ndim);
    if (strlen(name) >= TG_NAME_MAX) return tg_graph_fail(g, "tensor name too long: %s", name);
    /* shape may point into the table that grow() is about to move. */
    int64_t dims[TG_MAX_DIMS] = {0};
    for (int d = 0; d < ndim; d++) dims[d] = shape[d];
    shape = dims;
    /* The size, checked before the tensor is added: any tensor must fit one pool. */
    uint64_t numel = 1, bytes = 0;
    int overflow = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] <= 0) return tg_graph_fail(g, "tensor %s dim %d is %lld", name, d, (long long)shape[d]);
        overflow |= tg_mul_u64(numel, (uint64_t)shape[d], &numel) != 0;
    }
    overflow |= tg_mul_u64(numel, (uint64_t)tg_dtype_size(dtype), &bytes) != 0;
    if (overflow || bytes > TG_MAX_POOL_BYTES) {
        char what[600], dims_text[200] = "", size[32], limit[32];
        tg_describe_pool_size(g->job, g->cfg, pool, what, sizeof what);
        for (int d = 0; d < ndim; d++) {
            size_t at = strlen(dims_text);
            snprintf(dims_text + at, sizeof dims_text - at, "%s%lld", d ? ", " : "", (long long)shape[d]);
        }
        if (overflow) snprintf(size, sizeof size, "more than 2^64 bytes");
        else tg_format_bytes(bytes, size, sizeof size);
        tg_format_bytes(TG_MAX_POOL_BYTES, limit, sizeof limit);
        return tg_graph_size_fail(g, tg_pool_size_key(pool),
                                  "%s: tensor %s [%s] is %s, more than the %s one memory pool may hold", what, name,
                                  dims_text, size, limit);
    }
    if (g->n_tensors >= TG_MAX_GRAPH_TENSORS)
        return tg_graph_size_fail(g, TG_JOB_MODEL, "the graph needs more than %d tensors", TG_MAX_GRAPH_TENSORS);
    if (grow((void **)&g->tensors, &g->cap_tensors, g->n_tensors + 1, sizeof *g->tensors))
        return tg_graph_out_of_memory(g);
    tg_tensor *t = &g->tensors[g->n_tensors];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->pool = pool;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
    t->bytes = bytes;
    t->first_use = t->last_use = -1;
    t->grad = -1;
    t->master = -1;
    t->group = -1;
    return g->n_tensors++;
}

int tg_act(tg_graph *g, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    int64_t shape[4] = {d0, d1, d2, d3};
    return tg_graph_tensor(g, name, TG_F32, TG_POOL_ACTIVATIONS, ndim, shape);
}

/* Whether a parameter named `name` is frozen: some freeze pattern matches it (each
 * matching pattern counts the hit). */
static int frozen_by_job(tg_graph *g, const char *name) {
    int frozen = 0;
    for (int i = 0; i < g->n_freeze; i++)
        if (fnmatch(g->freeze[i], name, 0) == 0) frozen = 1, g->freeze_hits[i]++;
    return frozen;
}

/* Whether name t[0, len) is the module path p[0, n) or its tail after a dot. */
static int names_path(const char *t, size_t len, const char *p, size_t n) {
    return n >= len && !strncmp(p + n - len, t, len) && (n == len || p[n - len - 1] == '.');
}

int tg_graph_saves_module(tg_graph *g, const char *path) {
    if (!g->job || g->job->lora_r <= 0 || !g->job->lora_modules_to_save[0]) return 0;
    int hit = 0;
    const char *s = g->job->lora_modules_to_save;
    for (int k = 0;; k++) {
        while (*s == ' ' || *s == '\t' || *s == ',') s++;
        const char *t = s;
        while (*s && *s != ',' && *s != ' ' && *s != '\t') s++;
        const size_t len = (size_t)(s - t);
        if (!len) break;
        /* The path itself, then each module above it (a.b.c, a.b, a). */
        int named = 0;
        for (size_t n = strlen(path); n > 0 && !named; n--)
            if (n == strlen(path) || path[n] == '.') named = names_path(t, len, path, n);
        if (named && k < 64) g->save_hits[k]++;
        hit |= named;
    }
    return hit;
}

int tg_param(tg_graph *g, const char *name, int ndim, int64_t d0, int64_t d1, int init, int no_decay) {
    const int64_t shape[2] = {d0, d1};
    return tg_param_shaped(g, name, ndim, shape, init, no_decay);
}

int tg_param_shaped(tg_graph *g, const char *name, int ndim, const int64_t *shape, int init, int no_decay) {
    /* With LoRA, a parameter of a module in lora_modules_to_save trains whole, as the head
     * does (its module: the name less its last part, "transformer.ln_f" of ".weight"). */
    int saved = 0;
    if (g->base_frozen) {
        char module[TG_NAME_MAX];
        const char *dot = strrchr(name, '.');
        snprintf(module, sizeof module, "%.*s", dot ? (int)(dot - name) : (int)strlen(name), name);
        saved = tg_graph_saves_module(g, module);
    }
    const int frozen = frozen_by_job(g, name) || (g->base_frozen && !g->adapter && !saved);
    int t = tg_graph_tensor(g, name, TG_F32, frozen ? TG_POOL_FROZEN : TG_POOL_PARAMS, ndim, shape);
    if (t < 0) return t;
    /* Weight decay is AdamW's: a frozen parameter has none to skip. */
    g->tensors[t].flags |= frozen ? TG_TENSOR_FROZEN : TG_TENSOR_PARAM | (no_decay ? TG_TENSOR_NO_DECAY : 0);
    g->tensors[t].init = init;
    g->tensors[t].init_std = init == TG_INIT_NORMAL ? g->cfg->initializer_range : 0.0f;
    return t;
}

int tg_buffer(tg_graph *g, const char *name, int dtype, int ndim, int64_t d0, int64_t d1, int init, int persistent) {
    int64_t shape[2] = {d0, d1};
    if (init == TG_INIT_NORMAL) return tg_graph_fail(g, "buffer %s cannot have a random init", name);
    int t = tg_graph_tensor(g, name, dtype, TG_POOL_BUFFERS, ndim, shape);
    if (t < 0) return t;
    g->tensors[t].flags |= TG_TENSOR_BUFFER | (persistent ? TG_TENSOR_PERSISTENT : 0);
    g->tensors[t].init = init;
    return t;
}

int tg_param_pack(tg_graph *g, const char *name, const int *members, int n, int ndim, int64_t d0, int64_t d1) {
    if (g->failed) return -1;
    int64_t shape[2] = {d0, d1}, covered = 0;
    const tg_tensor *first = &g->tensors[members[0]];
    const int cls = tg_tensor_class_of(first);
    for (int i = 0; i < n; i++) {
        const tg_tensor *m = &g->tensors[members[i]];
        if ((cls != TG_CLASS_TRAINABLE && cls != TG_CLASS_FROZEN) || (m->flags & TG_TENSOR_VIEW) || m->group >= 0 ||
            m->dtype != first->dtype || (i && members[i] <= members[i - 1]))
            return tg_graph_fail(g, "%s cannot pack %s", name, m->name);
        if (tg_tensor_class_of(m) != cls) {
            const tg_tensor *fz = cls == TG_CLASS_FROZEN ? first : m, *tr = cls == TG_CLASS_FROZEN ? m : first;
            return tg_graph_job_fail(g, TG_JOB_FREEZE,
                                     "freezes %s but not %s, which the plan reads as one packed parameter %s "
                                     "(fuse_qkv): freeze all of them, or set fuse_qkv = false",
                                     fz->name, tr->name, name);
        }
        covered += tg_tensor_numel(m);
    }
    int v = tg_graph_tensor(g, name, first->dtype, first->pool, ndim, shape);
    if (v < 0) return -1;
    tg_tensor *x = &g->tensors[v];
    if (covered != tg_tensor_numel(x)) return tg_graph_fail(g, "%s does not cover its members", name);
    x->flags |= TG_TENSOR_VIEW | (g->tensors[members[0]].flags & (TG_TENSOR_PARAM | TG_TENSOR_FROZEN | TG_TENSOR_NO_DECAY));
    x->master = members[0];
    for (int i = 0; i < n; i++) g->tensors[members[i]].group = v;
    return v;
}

int tg_graph_op(tg_graph *g, const tg_op_spec *spec) {
    if (g->failed) return -1;
    if (g->n_ops >= TG_MAX_GRAPH_OPS)
        return tg_graph_size_fail(g, TG_JOB_MODEL, "the graph needs more than %d ops", TG_MAX_GRAPH_OPS);
    if (grow((void **)&g->ops, &g->cap_ops, g->n_ops + 1, sizeof *g->ops))
        return tg_graph_out_of_memory(g);
    tg_op *op = &g->ops[g->n_ops];
    memset(op, 0, sizeof *op);
    op->kind = spec->kind;
    op->phase = g->phase;
    for (int s = 0; s < TG_OP_MAX_IN; s++) op->in[s] = spec->in[s];
    for (int s = 0; s < TG_OP_MAX_OUT; s++) op->out[s] = spec->out[s];
    op->p = spec->p;
    /* A graph without a job (hand-built) is one replica. */
    const tg_op_check_ctx ctx = {g->tensors, g->n_tensors, g->job ? g->job->data_parallel : 1};
    char why[256];
    if (tg_op_check(&ctx, op, why, sizeof why))
        return tg_graph_fail(g, "op %d (%s): %s", g->n_ops, tg_op_name(op->kind), why);
    return g->n_ops++;
}
