#include "compiler/memory_plan.h"
#include "compiler/compiler_alloc.h"
#include "compiler/limits.h"
#include "compiler/size_check.h"
#include "compiler/span_set.h"
#include "base/checked.h"
#include "plan/grad_hold.h"
#include "plan/validate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Callers keep x at most TG_MAX_POOL_BYTES plus a tensor (at most as much again), far from
 * overflowing. */
static uint64_t align_up(uint64_t x) { return (x + TG_TENSOR_ALIGN - 1) / TG_TENSOR_ALIGN * TG_TENSOR_ALIGN; }

/* A pool that would pass TG_MAX_POOL_BYTES (at least `bytes`): a job error naming the
 * fields that size it. */
static int pool_too_large(tg_graph *g, int pool, uint64_t bytes) {
    char what[600], need[32], limit[32];
    tg_describe_pool_size(g->job, g->cfg, pool, what, sizeof what);
    tg_format_bytes(bytes, need, sizeof need);
    tg_format_bytes(TG_MAX_POOL_BYTES, limit, sizeof limit);
    return tg_graph_size_fail(g, tg_pool_size_key(pool), "%s: the %s pool needs at least %s, more than the %s one pool may hold",
                              what, tg_pool_name(pool), need, limit);
}

static int view_of(tg_graph *g, const char *name, int pool, int dtype, int64_t n) {
    int t = tg_graph_tensor(g, name, dtype, pool, 1, &n);
    if (t >= 0) g->tensors[t].flags |= TG_TENSOR_VIEW;
    return t;
}

static int view(tg_graph *g, const char *name, int pool, uint64_t bytes) {
    return view_of(g, name, pool, TG_F32, (int64_t)(bytes / 4));
}

/* Rounds the layout's end up to twice the tensor alignment, so that half-width copies at
 * half the offsets stay aligned. */
static uint64_t align_param_end(uint64_t end) {
    end = align_up(end);
    return (end + 2 * TG_TENSOR_ALIGN - 1) / (2 * TG_TENSOR_ALIGN) * (2 * TG_TENSOR_ALIGN);
}

/* Places the tensors of one whole-step pool (parameters, frozen parameters, buffers) in
 * tensor order, each aligned: a packed group's members back to back as one block where the
 * first member is reached, any other tensor with room for its widest view (a padded LM-head
 * table, zero past its end); then every view at its master's offset. *end is the layout's
 * end. */
static int place_pool(tg_graph *g, int pool, uint64_t *end_out) {
    uint64_t end = 0;
    int n = g->n_tensors;
    /* Per tensor: the bytes of the packed group members it covers (views of a group), and
     * whether it is placed yet. */
    uint64_t *member_bytes = tg_compiler_calloc((size_t)n + 1, sizeof *member_bytes);
    char *placed = tg_compiler_calloc((size_t)n + 1, 1);
    /* Built once, so the layout is linear in the tensors: the widest view of each tensor
     * (packed views excluded), and each group member's next member in tensor order. */
    uint64_t *widest_view = tg_compiler_calloc((size_t)n + 1, sizeof *widest_view);
    int *next_member = tg_compiler_malloc(sizeof *next_member * ((size_t)n + 1));
    int *head = tg_compiler_calloc((size_t)n + 1, sizeof *head); /* group -> first member + 1 */
    if (!member_bytes || !placed || !widest_view || !next_member || !head) {
        free(member_bytes), free(placed), free(widest_view), free(next_member), free(head);
        return tg_graph_out_of_memory(g);
    }
    for (int t = 0; t < n; t++)
        if (g->tensors[t].pool == pool && g->tensors[t].group >= 0)
            member_bytes[g->tensors[t].group] = tg_add_sat_u64(member_bytes[g->tensors[t].group], g->tensors[t].bytes);
    for (int v = 0; v < n; v++) {
        const tg_tensor *w = &g->tensors[v];
        if ((w->flags & TG_TENSOR_VIEW) && w->pool == pool && w->master >= 0 && w->master < n && !member_bytes[v] && /* GCOVR_EXCL_BR_LINE: master is -1 or set to a tensor of the graph (graph.c, model_build.c, precision.c), so below n */
            w->bytes > widest_view[w->master])
            widest_view[w->master] = w->bytes;
    }
    for (int t = n - 1; t >= 0; t--) {
        int grp = g->tensors[t].group;
        if (grp < 0 || grp >= n) continue; /* GCOVR_EXCL_BR_LINE: a group is the view tg_param_pack made, a tensor of the graph */
        next_member[t] = head[grp] - 1;
        head[grp] = t + 1;
    }
    free(head);
    /* Every tensor is at most TG_MAX_POOL_BYTES (tg_graph_tensor) and end stays at most
     * that, so each sum below is checked before it could overflow. */
    int too_large = 0;
    for (int t = 0; t < n && !too_large; t++) {
        tg_tensor *x = &g->tensors[t];
        if (x->pool != pool || (x->flags & TG_TENSOR_VIEW) || placed[t]) continue;
        if (x->group >= 0) {
            /* A packed group: all its members back to back, in tensor order, as one block. */
            for (int m = t; m >= 0 && !too_large; m = next_member[m]) {
                g->tensors[m].offset = end;
                end += g->tensors[m].bytes;
                too_large = end > TG_MAX_POOL_BYTES;
                placed[m] = 1;
            }
        } else {
            /* Room for the widest view of it (a padded LM-head table), zero past its end. */
            uint64_t span = widest_view[t] > x->bytes ? widest_view[t] : x->bytes;
            x->offset = end;
            end += span;
        }
        end = align_param_end(end);
        too_large |= end > TG_MAX_POOL_BYTES;
    }
    int bad_group = -1;
    for (int t = 0; t < n; t++)
        if (member_bytes[t] && member_bytes[t] != g->tensors[t].bytes) bad_group = t;
    free(placed), free(member_bytes), free(widest_view), free(next_member);
    if (too_large) return pool_too_large(g, pool, end);
    if (bad_group >= 0) return tg_graph_fail(g, "packed view %s does not cover its members", g->tensors[bad_group].name);
    for (int t = 0; t < n; t++) {
        tg_tensor *x = &g->tensors[t];
        if (x->pool == pool && (x->flags & TG_TENSOR_VIEW) && x->master >= 0) x->offset = g->tensors[x->master].offset;
    }
    *end_out = end;
    return 0;
}

int tg_plan_param_layout(tg_graph *g) {
    uint64_t end = 0;
    const int n = g->n_tensors;
    if (place_pool(g, TG_POOL_PARAMS, &end)) return -1;
    if (end == 0) return tg_graph_fail(g, "model has no trainable parameters");
    for (int t = 0; t < n; t++) {
        if (!(g->tensors[t].flags & TG_TENSOR_PARAM)) continue;
        char name[TG_NAME_MAX];
        snprintf(name, sizeof name, "grad.%s", g->tensors[t].name);
        int d = tg_graph_tensor(g, name, TG_F32, TG_POOL_GRADS, g->tensors[t].ndim, g->tensors[t].shape);
        if (d < 0) return -1;
        g->tensors[d].flags |= TG_TENSOR_GRAD | (g->tensors[t].flags & TG_TENSOR_VIEW);
        g->tensors[d].offset = g->tensors[t].offset; /* same layout as the parameters */
        g->tensors[t].grad = d;
    }
    /* A packed group's gradients form the same group under the gradient of its view. */
    for (int t = 0; t < n; t++)
        if ((g->tensors[t].flags & TG_TENSOR_PARAM) && g->tensors[t].group >= 0)
            g->tensors[g->tensors[t].grad].group = g->tensors[g->tensors[t].group].grad;
    g->io.params_all = view(g, "params.all", TG_POOL_PARAMS, end);
    g->io.grads_all = view(g, "grads.all", TG_POOL_GRADS, end);
    /* ZeRO-1: each replica keeps the optimizer state of its own slice of the parameters;
     * Adan keeps two vectors in each of m and v (plan/ops.def), in f32 or bf16. */
    const int64_t slice = tg_zero_slice(g->job, (int64_t)(end / 4));
    const int64_t state = (slice ? slice : (int64_t)(end / 4)) * (g->job && g->job->optimizer == TG_OPTIMIZER_ADAN ? 2 : 1);
    const int dtype = g->job && g->job->optimizer_state == TG_OPTIMIZER_STATE_BF16 ? TG_BF16 : TG_F32;
    g->io.m_all = view_of(g, "optim.m", TG_POOL_OPTIM, dtype, state);
    g->io.v_all = view_of(g, "optim.v", TG_POOL_OPTIM, dtype, state);
    if (g->io.m_all >= 0 && g->io.v_all >= 0) g->tensors[g->io.v_all].offset = align_up(g->tensors[g->io.m_all].bytes);
    return g->failed ? -1 : 0;
}

int tg_plan_fixed_layout(tg_graph *g) {
    if (g->failed) return -1;
    uint64_t end;
    return place_pool(g, TG_POOL_FROZEN, &end) || place_pool(g, TG_POOL_BUFFERS, &end) ? -1 : 0;
}

int64_t tg_zero_slice(const tg_job *job, int64_t elements) {
    if (!job || job->zero_stage < 1 || job->data_parallel < 2) return 0;
    /* Whole norm blocks (GRAD_SQUARES' shards), which also keeps fp32 and bf16 slices aligned. */
    const int64_t n = job->data_parallel, align = TG_NORM_BLOCK;
    return ((elements + n - 1) / n + align - 1) / align * align;
}

/* ---- liveness ---------------------------------------------------------------------- */

static void compute_liveness(tg_graph *g, const int *phase_begin) {
    for (int t = 0; t < g->n_tensors; t++) g->tensors[t].first_use = g->tensors[t].last_use = -1;
    for (int o = 0; o < g->n_ops; o++) {
        const tg_op *op = &g->ops[o];
        int ts[TG_OP_MAX_IN + TG_OP_MAX_OUT];
        memcpy(ts, op->in, sizeof op->in);
        memcpy(ts + TG_OP_MAX_IN, op->out, sizeof op->out);
        for (int s = 0; s < TG_OP_MAX_IN + TG_OP_MAX_OUT; s++) {
            if (ts[s] < 0) continue;
            tg_tensor *t = &g->tensors[ts[s]];
            if (t->first_use < 0) t->first_use = o;
            t->last_use = o;
        }
    }
    int end_of_forward = phase_begin[TG_PHASE_BACKWARD] - 1;
    for (int t = 0; t < g->n_tensors; t++) {
        tg_tensor *x = &g->tensors[t];
        /* Outputs are read by the runtime after the forward phase (eval) ... */
        if ((x->flags & TG_TENSOR_OUTPUT) && x->last_use < end_of_forward) x->last_use = end_of_forward;
        /* ... and the loss after the whole step. */
        if (t == g->io.loss) x->last_use = g->n_ops - 1;
    }
}

/* ---- activation offsets: greedy by size, best fit among overlapping lifetimes -------- */

static const tg_tensor *g_sort_tensors;

static int by_size_desc(const void *a, const void *b) {
    const tg_tensor *x = &g_sort_tensors[*(const int *)a], *y = &g_sort_tensors[*(const int *)b];
    if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
    if (x->first_use != y->first_use) return x->first_use < y->first_use ? -1 : 1;
    return *(const int *)a - *(const int *)b;
}

/* The placed activations by lifetime: a segment tree over the ops, where each placed
 * tensor's op range [first, last] is split into O(log ops) nodes that it covers whole. Each
 * node keeps the byte ranges [offset, aligned end) of the tensors split into it (own) and of
 * those split into it or any node below it (sub), as merged span sets. The tensors whose
 * lifetimes meet [first, last] are then those in `sub` of the nodes that [first, last]
 * covers whole and in `own` of the nodes above them: their union is read from O(log ops)
 * sets, whose sizes are the number of separate runs of occupied bytes, instead of from every
 * overlapping tensor (all the saved activations of a deep model overlap each other). */
typedef struct life_tree {
    int leaves; /* a power of two >= the ops */
    tg_span_set *own, *sub; /* per node: 1 the root, 2k and 2k+1 the halves of k */
} life_tree;

static int life_tree_init(life_tree *t, int n_ops) {
    t->leaves = 1;
    while (t->leaves < n_ops) t->leaves *= 2;
    t->own = tg_compiler_calloc(2 * (size_t)t->leaves, sizeof *t->own);
    t->sub = tg_compiler_calloc(2 * (size_t)t->leaves, sizeof *t->sub);
    return t->own && t->sub ? 0 : -1;
}

static void life_tree_free(life_tree *t) {
    for (int k = 0; t->own && t->sub && k < 2 * t->leaves; k++) tg_span_set_free(&t->own[k]), tg_span_set_free(&t->sub[k]);
    free(t->own), free(t->sub);
}

/* Records bytes [a, b) as taken during ops [first, last], under node k (ops [lo, hi]). */
static int life_tree_add(life_tree *t, int k, int lo, int hi, int first, int last, uint64_t a, uint64_t b) {
    if (last < lo || first > hi) return 0;
    if (first <= lo && hi <= last) return tg_span_set_add(&t->own[k], a, b) || tg_span_set_add(&t->sub[k], a, b) ? -1 : 0;
    const int mid = lo + (hi - lo) / 2;
    if (life_tree_add(t, 2 * k, lo, mid, first, last, a, b) || life_tree_add(t, 2 * k + 1, mid + 1, hi, first, last, a, b))
        return -1;
    return tg_span_set_add(&t->sub[k], a, b);
}

/* Adds to *taken the bytes taken at any op of [first, last], under node k (ops [lo, hi]). */
static int life_tree_taken(const life_tree *t, int k, int lo, int hi, int first, int last, tg_span_set *taken) {
    if (last < lo || first > hi) return 0;
    const int whole = first <= lo && hi <= last;
    const tg_span_set *s = whole ? &t->sub[k] : &t->own[k];
    for (int i = 0; i < s->n; i++)
        if (tg_span_set_add(taken, s->v[i].a, s->v[i].b)) return -1;
    if (whole) return 0;
    const int mid = lo + (hi - lo) / 2;
    return life_tree_taken(t, 2 * k, lo, mid, first, last, taken) ||
                   life_tree_taken(t, 2 * k + 1, mid + 1, hi, first, last, taken)
               ? -1
               : 0;
}

/* Shared gradients (grad_pool_bytes > 0): the gradient pool's bytes at the start of the
 * activation pool, taken while each gradient is held (plan/grad_hold.h). */
static int take_grad_holds(const tg_grad_hold *h, int n, life_tree *tree) {
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        rc = life_tree_add(tree, 1, 0, tree->leaves - 1, h[i].from, h[i].to, h[i].a, align_up(h[i].b));
        if (!rc && h[i].wrap_to >= 0) rc = life_tree_add(tree, 1, 0, tree->leaves - 1, 0, h[i].wrap_to, h[i].a, align_up(h[i].b));
    }
    return rc;
}

static int place_activations(tg_graph *g, const tg_grad_hold *holds, int n_holds, uint64_t grad_pool_bytes,
                             uint64_t *extent) {
    int n = 0;
    int *order = tg_compiler_malloc(sizeof *order * ((size_t)g->n_tensors + 1));
    life_tree tree = {0};
    tg_span_set taken = {0};
    if (!order || life_tree_init(&tree, g->n_ops) || take_grad_holds(holds, n_holds, &tree)) {
        free(order), life_tree_free(&tree);
        return tg_graph_out_of_memory(g);
    }
    for (int t = 0; t < g->n_tensors; t++) {
        const tg_tensor *x = &g->tensors[t];
        if (x->pool != TG_POOL_ACTIVATIONS) continue;
        if (x->first_use < 0) {
            free(order), life_tree_free(&tree);
            return tg_graph_fail(g, "activation %s is never used", x->name);
        }
        order[n++] = t;
    }
    g_sort_tensors = g->tensors;
    qsort(order, (size_t)n, sizeof *order, by_size_desc);
    uint64_t top = grad_pool_bytes;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        tg_tensor *x = &g->tensors[order[i]];
        /* Best fit: the smallest gap that holds x between the bytes taken (up to their
         * aligned ends) by the placed tensors whose lifetimes overlap x's, the lowest of
         * equal ones, else above them all. */
        taken.n = 0;
        if (life_tree_taken(&tree, 1, 0, tree.leaves - 1, x->first_use, x->last_use, &taken)) {
            rc = tg_graph_out_of_memory(g);
            break;
        }
        uint64_t best = UINT64_MAX, best_gap = UINT64_MAX, cursor = 0;
        for (int j = 0; j < taken.n; j++) {
            if (taken.v[j].a > cursor) {
                const uint64_t gap = taken.v[j].a - cursor;
                if (gap >= x->bytes && gap < best_gap) best = cursor, best_gap = gap;
            }
            cursor = taken.v[j].b;
        }
        x->offset = best != UINT64_MAX ? best : cursor;
        if (x->offset + x->bytes > TG_MAX_POOL_BYTES) {
            rc = pool_too_large(g, TG_POOL_ACTIVATIONS, x->offset + x->bytes);
            break;
        }
        if (life_tree_add(&tree, 1, 0, tree.leaves - 1, x->first_use, x->last_use, x->offset,
                          align_up(x->offset + x->bytes)))
            rc = tg_graph_out_of_memory(g);
        if (x->offset + x->bytes > top) top = x->offset + x->bytes;
    }
    free(order), life_tree_free(&tree), tg_span_set_free(&taken);
    *extent = top;
    return rc;
}

/* Gradient pools cut by more stretches of padding than this keep a pool of their own. */
enum { MAX_SHARED_PADDING = 64 };

int tg_plan_memory(tg_graph *g, const int *phase_begin, int *share_grads, uint64_t pool_bytes[TG_POOL_COUNT],
                   uint64_t *live_peak) {
    compute_liveness(g, phase_begin);
    memset(pool_bytes, 0, sizeof(uint64_t) * TG_POOL_COUNT);
    pool_bytes[TG_POOL_GRADS] = g->tensors[g->io.grads_all].bytes;
    /* The parameter pools end at their widest view (ZeRO-1's replica slices pad them); the
     * frozen and buffers pools at their last tensor. */
    for (int t = 0; t < g->n_tensors; t++) {
        const tg_tensor *x = &g->tensors[t];
        if ((x->pool == TG_POOL_PARAMS || x->pool == TG_POOL_PARAMS_BF16 || x->pool == TG_POOL_FROZEN ||
             x->pool == TG_POOL_BUFFERS) &&
            x->offset + x->bytes > pool_bytes[x->pool])
            pool_bytes[x->pool] = x->offset + x->bytes;
    }
    /* Optimizer pool: m, v, then the scalars. Inputs and workspace: in creation order. */
    uint64_t cursor[TG_POOL_COUNT] = {0};
    cursor[TG_POOL_OPTIM] = g->tensors[g->io.v_all].offset + g->tensors[g->io.v_all].bytes;
    for (int t = 0; t < g->n_tensors; t++) {
        tg_tensor *x = &g->tensors[t];
        if (x->flags & TG_TENSOR_VIEW) continue;
        if (x->pool == TG_POOL_OPTIM || x->pool == TG_POOL_INPUTS || x->pool == TG_POOL_WORKSPACE) {
            /* cursor and x->bytes are each at most TG_MAX_POOL_BYTES: the sum cannot overflow. */
            if (cursor[x->pool] + x->bytes > TG_MAX_POOL_BYTES) return pool_too_large(g, x->pool, cursor[x->pool] + x->bytes);
            x->offset = cursor[x->pool];
            cursor[x->pool] = align_up(cursor[x->pool] + x->bytes);
            pool_bytes[x->pool] = x->offset + x->bytes; /* x lies past every tensor placed before it */
        }
    }
    /* The holds of shared gradients; their padding, which must stay zero, is held all the
     * time, and where it cuts the pool into many small stretches (a tiny model's tensors,
     * not multiples of the 512-byte alignment) the pool stays apart. */
    tg_grad_hold *holds = NULL;
    int n_holds = 0;
    if (*share_grads && tg_grad_holds(g->tensors, g->n_tensors, g->ops, g->n_ops, phase_begin,
                                      pool_bytes[TG_POOL_GRADS], &holds, &n_holds))
        return tg_graph_out_of_memory(g);
    int padding = 0;
    for (int i = 0; i < n_holds; i++) padding += holds[i].tensor < 0;
    if (padding > MAX_SHARED_PADDING) {
        free(holds);
        holds = NULL, n_holds = 0, *share_grads = 0;
    }
    int rc = place_activations(g, holds, n_holds, *share_grads ? pool_bytes[TG_POOL_GRADS] : 0,
                               &pool_bytes[TG_POOL_ACTIVATIONS]);
    if (!rc && tg_plan_live_activation_peak(g->tensors, g->n_tensors, g->n_ops, holds, n_holds, live_peak))
        rc = tg_graph_out_of_memory(g);
    free(holds);
    return rc;
}
