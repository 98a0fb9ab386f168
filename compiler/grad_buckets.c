#include "compiler/grad_buckets.h"
#include "compiler/compiler_alloc.h"
#include "compiler/grad_state.h"
#include "compiler/memory_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Highest gradient element (exclusive) that op writes, 0 if none. */
static int64_t grad_write_end(const tg_graph *g, const tg_op *op) {
    int64_t end = 0;
    for (int s = 0; s < TG_OP_MAX_OUT; s++) {
        const int t = op->out[s];
        if (t < 0 || t == g->io.grads_all || g->tensors[t].pool != TG_POOL_GRADS) continue;
        const int64_t e = (int64_t)((g->tensors[t].offset + g->tensors[t].bytes + 3) / 4);
        if (e > end) end = e;
    }
    return end;
}

/* The sum of n gradients from element `first` over the replicas, in the view t: an
 * ALL_REDUCE, or with ZeRO-1 a REDUCE_SCATTER that brings each replica the sums of its own
 * slice only (what its update reads). */
static int sum_op(tg_graph *g, int t, int64_t first, int64_t n) {
    const int64_t slice = tg_zero_slice(g->job, tg_tensor_numel(&g->tensors[g->io.grads_all]));
    tg_op_spec s = tg_spec(slice ? TG_OP_REDUCE_SCATTER : TG_OP_ALL_REDUCE);
    s.in[0] = s.out[0] = t;
    if (slice) s.p.reduce_scatter = (tg_reduce_scatter_params){.n = n, .first = first, .slice = slice};
    else s.p.count.n = n;
    return tg_graph_op(g, &s);
}

/* grad_accumulation: the window's gradients are final only after its last micro-step, so
 * one sum of the whole buffer opens the optimizer phase (before the norm). */
static int sum_before_update(tg_graph *g) {
    int at = g->n_ops;
    for (int o = 0; o < g->n_ops && at == g->n_ops; o++)
        if (g->ops[o].phase == TG_PHASE_OPTIMIZER) at = o;
    const int phase = g->phase;
    g->phase = TG_PHASE_OPTIMIZER;
    const int added = sum_op(g, g->io.grads_all, 0, tg_tensor_numel(&g->tensors[g->io.grads_all]));
    g->phase = phase;
    if (added < 0) return -1;
    const tg_op sum = g->ops[g->n_ops - 1];
    memmove(g->ops + at + 1, g->ops + at, sizeof *g->ops * (size_t)(g->n_ops - 1 - at));
    g->ops[at] = sum;
    return 0;
}

int tg_gradient_buckets(tg_graph *g) {
    if (g->failed) return -1;
    if (!g->job || g->job->data_parallel <= 1) return 0;
    if (g->job->grad_accumulation > 1) return sum_before_update(g);
    const int64_t n = tg_tensor_numel(&g->tensors[g->io.grads_all]);
    int b0 = -1, b1 = -1; /* the backward's ops [b0, b1) */
    for (int o = 0; o < g->n_ops; o++)
        if (g->ops[o].phase == TG_PHASE_BACKWARD) {
            if (b0 < 0) b0 = o;
            b1 = o + 1;
        }
    if (b0 < 0 || n <= 0) return tg_graph_fail(g, "data parallelism: no backward to sum gradients after"); /* GCOVR_EXCL_BR_LINE: n > 0: grads_all is a graph tensor, whose dims tg_graph_tensor makes positive */
    /* The job's size where it names one; by default 25 MiB, or an eighth of a smaller
     * model's gradients, so that it too has several buckets to overlap. */
    const int64_t mb = g->job->grad_bucket_mb > 0 ? g->job->grad_bucket_mb : TG_GRAD_BUCKET_MB_DEFAULT;
    int64_t bucket = mb * (1 << 20) / 4, small = n / 8 > 1024 ? n / 8 : 1024;
    if (!g->job->key_line[TG_JOB_GRAD_BUCKET_MB] && bucket > small) bucket = small;
    /* final_from[k]: every gradient element at or above it is final once backward op b0 + k
     * has run (nothing after it writes there). */
    const int nb = b1 - b0;
    int64_t *final_from = tg_compiler_malloc(sizeof *final_from * (size_t)nb);
    int64_t *cut = tg_compiler_malloc(sizeof *cut * (size_t)(nb + 1)); /* bucket start after op b0 + k, or -1 */
    if (!final_from || !cut) {
        free(final_from), free(cut);
        return tg_graph_out_of_memory(g);
    }
    int64_t later = 0;
    for (int k = nb - 1; k >= 0; k--) {
        final_from[k] = later;
        const int64_t e = grad_write_end(g, &g->ops[b0 + k]);
        if (e > later) later = e;
    }
    int64_t upper = n;
    const int64_t floor = g->grads_summed_from; /* below it: gathered, not summed */
    for (int k = 0; k < nb; k++) {
        cut[k] = -1;
        int64_t lo = (final_from[k] + 63) / 64 * 64; /* 256-byte aligned starts */
        if (lo < floor) lo = floor;
        if (k == nb - 1) lo = floor;                /* the rest, once the backward ends */
        if (lo < upper && (upper - lo >= bucket || k == nb - 1)) cut[k] = lo, upper = lo;
    }
    /* The new ops, appended in the backward phase, then moved after their ops. */
    const int first_new = g->n_ops, phase = g->phase;
    g->phase = TG_PHASE_BACKWARD;
    int64_t top = n;
    for (int k = 0; k < nb && !g->failed; k++) {
        if (cut[k] < 0) continue;
        char name[TG_NAME_MAX];
        snprintf(name, sizeof name, "grads.bucket.%lld", (long long)(cut[k] / 64));
        const int64_t len = top - cut[k];
        const int t = tg_graph_tensor(g, name, TG_F32, TG_POOL_GRADS, 1, &len);
        if (t < 0) break;
        g->tensors[t].flags |= TG_TENSOR_VIEW;
        g->tensors[t].offset = (uint64_t)cut[k] * 4;
        sum_op(g, t, cut[k], len);
        top = cut[k];
    }
    g->phase = phase;
    if (g->failed) {
        free(final_from), free(cut);
        return -1;
    }
    /* Rebuild the schedule: each bucket's op right after the backward op that completes it. */
    const int total = g->n_ops;
    tg_op *ops = tg_compiler_malloc(sizeof *ops * (size_t)total);
    if (!ops) {
        free(final_from), free(cut);
        return tg_graph_out_of_memory(g);
    }
    int w = 0, next_new = first_new;
    for (int o = 0; o < first_new; o++) {
        ops[w++] = g->ops[o];
        if (o >= b0 && o < b1 && cut[o - b0] >= 0) ops[w++] = g->ops[next_new++];
    }
    memcpy(g->ops, ops, sizeof *ops * (size_t)total);
    free(ops), free(final_from), free(cut);
    return 0;
}

int tg_zero_gather(tg_graph *g, int all, const char *name) {
    if (g->failed) return -1;
    const int64_t slice = tg_zero_slice(g->job, tg_tensor_numel(&g->tensors[all]));
    const tg_tensor *x = &g->tensors[all];
    int64_t n = slice * g->job->data_parallel;
    int t = tg_graph_tensor(g, name, x->dtype, x->pool, 1, &n);
    if (t < 0) return -1;
    g->tensors[t].flags |= TG_TENSOR_VIEW; /* at offset 0, over the pool's padded end */
    tg_op_spec s = tg_spec(TG_OP_ALL_GATHER);
    s.in[0] = s.out[0] = t;
    s.p.all_gather.slice = slice;
    g->phase = TG_PHASE_OPTIMIZER;
    return tg_graph_op(g, &s) < 0 ? -1 : 0;
}

/* Whether any backward op but `except` (and the ZERO that clears the buffer) writes
 * gradient elements [0, end). */
static int others_write(const tg_graph *g, int except, int64_t end) {
    for (int o = 0; o < g->n_ops; o++) {
        const tg_op *op = &g->ops[o];
        if (o == except || op->kind == TG_OP_ZERO || op->phase != TG_PHASE_BACKWARD) continue;
        for (int s = 0; s < TG_OP_MAX_OUT; s++) {
            const int t = op->out[s];
            if (t < 0 || t == g->io.grads_all || g->tensors[t].pool != TG_POOL_GRADS) continue;
            if ((int64_t)(g->tensors[t].offset / 4) < end) return 1;
        }
    }
    return 0;
}

/* Appends an ALL_GATHER of `src` (slice elements) into a new activation tensor `name` of
 * replicas x slice elements; its index, or -1. */
static int gather_into(tg_graph *g, const char *name, int src, int ndim, const int64_t *shape) {
    const int t = tg_graph_tensor(g, name, g->tensors[src].dtype, TG_POOL_ACTIVATIONS, ndim, shape);
    if (t < 0) return -1;
    tg_op_spec s = tg_spec(TG_OP_ALL_GATHER);
    s.in[0] = s.out[0] = t;
    s.in[1] = src;
    s.p.all_gather.slice = tg_tensor_numel(&g->tensors[src]);
    return tg_graph_op(g, &s) < 0 ? -1 : t;
}

int tg_gather_embedding_grads(tg_graph *g) {
    if (g->failed) return -1;
    const tg_job *j = g->job;
    if (!j || j->data_parallel <= 1 || j->grad_accumulation > 1) return 0;
    const int64_t replicas = j->data_parallel;
    int chosen = -1;
    for (int o = 0; o < g->n_ops && chosen < 0; o++) {
        const tg_op *op = &g->ops[o];
        if (op->kind != TG_OP_EMBEDDING_BWD || op->phase != TG_PHASE_BACKWARD) continue;
        const tg_tensor *table = &g->tensors[op->out[0]];
        const tg_embedding_params *e = &op->p.embedding;
        /* Judged at the longest length bucket's rows, so that every bucket plan of a job
         * makes the same choice (they share their ops and tensors, plan.h). */
        const int64_t seq_max = j->n_buckets > 1 ? j->bucket_seq[j->n_buckets - 1] : j->seq;
        const int64_t table_n = e->vocab * e->dim, rows = j->seq > 0 ? e->n / j->seq * seq_max : e->n;
        const int64_t row_bytes = e->dim * tg_dtype_size(g->tensors[op->in[1]].dtype) + 4;
        if (table->pool != TG_POOL_GRADS || table->offset != 0 || others_write(g, o, table_n)) continue;
        if ((double)replicas * (double)rows * (double)row_bytes >= 2.0 * (double)table_n * 4.0) continue;
        chosen = o;
    }
    if (chosen < 0) return 0;
    const tg_op e = g->ops[chosen];
    const int phase = g->phase, first_new = g->n_ops;
    g->phase = TG_PHASE_BACKWARD;
    const int64_t ids_shape[1] = {replicas * e.p.embedding.n},
                  rows_shape[2] = {replicas * e.p.embedding.n, e.p.embedding.dim};
    char ids_name[TG_NAME_MAX], rows_name[TG_NAME_MAX];
    snprintf(ids_name, sizeof ids_name, "%.200s.gathered", g->tensors[e.in[0]].name);
    snprintf(rows_name, sizeof rows_name, "%.200s.gathered", g->tensors[e.in[1]].name);
    const int ids = gather_into(g, ids_name, e.in[0], 1, ids_shape);
    const int dout = ids < 0 ? -1 : gather_into(g, rows_name, e.in[1], 2, rows_shape);
    g->phase = phase;
    if (dout < 0) return -1;
    /* The two gathers, appended last, go just before the scatter, which reads them. */
    const tg_op gathers[2] = {g->ops[first_new], g->ops[first_new + 1]};
    memmove(g->ops + chosen + 2, g->ops + chosen, sizeof *g->ops * (size_t)(first_new - chosen));
    g->ops[chosen] = gathers[0], g->ops[chosen + 1] = gathers[1];
    tg_op *scatter = &g->ops[chosen + 2];
    scatter->in[0] = ids, scatter->in[1] = dout;
    scatter->p.embedding.n = replicas * e.p.embedding.n;
    g->grads_summed_from = e.p.embedding.vocab * e.p.embedding.dim;
    return 0;
}
