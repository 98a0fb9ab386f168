#include "compiler/memory_plan.h"
#include "plan/validate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t align_up(uint64_t x) { return (x + TG_TENSOR_ALIGN - 1) / TG_TENSOR_ALIGN * TG_TENSOR_ALIGN; }

static int view(tg_graph *g, const char *name, int pool, uint64_t bytes) {
    int64_t n = (int64_t)(bytes / 4);
    int t = tg_graph_tensor(g, name, TG_F32, pool, 1, &n);
    if (t >= 0) g->tensors[t].flags |= TG_TENSOR_VIEW;
    return t;
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
    uint64_t *member_bytes = calloc((size_t)n + 1, sizeof *member_bytes);
    char *placed = calloc((size_t)n + 1, 1);
    /* Built once, so the layout is linear in the tensors: the widest view of each tensor
     * (packed views excluded), and each group member's next member in tensor order. */
    uint64_t *widest_view = calloc((size_t)n + 1, sizeof *widest_view);
    int *next_member = malloc(sizeof *next_member * ((size_t)n + 1));
    if (!member_bytes || !placed || !widest_view || !next_member) {
        free(member_bytes), free(placed), free(widest_view), free(next_member);
        return tg_graph_fail(g, "out of memory");
    }
    for (int t = 0; t < n; t++)
        if (g->tensors[t].pool == pool && g->tensors[t].group >= 0) member_bytes[g->tensors[t].group] += g->tensors[t].bytes;
    for (int v = 0; v < n; v++) {
        const tg_tensor *w = &g->tensors[v];
        if ((w->flags & TG_TENSOR_VIEW) && w->pool == pool && w->master >= 0 && w->master < n && !member_bytes[v] &&
            w->bytes > widest_view[w->master])
            widest_view[w->master] = w->bytes;
    }
    int *head = widest_view ? (int *)calloc((size_t)n + 1, sizeof *head) : NULL; /* group -> first member + 1 */
    if (!head) {
        free(member_bytes), free(placed), free(widest_view), free(next_member);
        return tg_graph_fail(g, "out of memory");
    }
    for (int t = n - 1; t >= 0; t--) {
        int grp = g->tensors[t].group;
        if (grp < 0 || grp >= n) continue;
        next_member[t] = head[grp] - 1;
        head[grp] = t + 1;
    }
    free(head);
    for (int t = 0; t < n; t++) {
        tg_tensor *x = &g->tensors[t];
        if (x->pool != pool || (x->flags & TG_TENSOR_VIEW) || placed[t]) continue;
        if (x->group >= 0) {
            /* A packed group: all its members back to back, in tensor order, as one block. */
            for (int m = t; m >= 0; m = next_member[m]) {
                g->tensors[m].offset = end;
                end += g->tensors[m].bytes;
                placed[m] = 1;
            }
        } else {
            /* Room for the widest view of it (a padded LM-head table), zero past its end. */
            uint64_t span = widest_view[t] > x->bytes ? widest_view[t] : x->bytes;
            x->offset = end;
            end += span;
        }
        end = align_param_end(end);
    }
    int bad_group = -1;
    for (int t = 0; t < n; t++)
        if (member_bytes[t] && member_bytes[t] != g->tensors[t].bytes) bad_group = t;
    free(placed), free(member_bytes), free(widest_view), free(next_member);
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
    /* ZeRO-1: each replica keeps the AdamW state of its own slice of the parameters. */
    const int64_t slice = tg_zero_slice(g->job, (int64_t)(end / 4));
    const uint64_t state = slice ? (uint64_t)slice * 4 : end;
    g->io.m_all = view(g, "optim.m", TG_POOL_OPTIM, state);
    g->io.v_all = view(g, "optim.v", TG_POOL_OPTIM, state);
    if (g->io.v_all >= 0) g->tensors[g->io.v_all].offset = state;
    return g->failed ? -1 : 0;
}

int tg_plan_fixed_layout(tg_graph *g) {
    if (g->failed) return -1;
    uint64_t end;
    return place_pool(g, TG_POOL_FROZEN, &end) || place_pool(g, TG_POOL_BUFFERS, &end) ? -1 : 0;
}

int64_t tg_zero_slice(const tg_job *job, int64_t elements) {
    if (!job || job->zero_stage < 1 || job->data_parallel < 2) return 0;
    const int64_t n = job->data_parallel, align = TG_TENSOR_ALIGN / 2; /* elements: aligned for fp32 and bf16 */
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

typedef struct placed {
    uint64_t offset, end;
    int first, last;
} placed;

static const tg_tensor *g_sort_tensors;

static int by_size_desc(const void *a, const void *b) {
    const tg_tensor *x = &g_sort_tensors[*(const int *)a], *y = &g_sort_tensors[*(const int *)b];
    if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
    if (x->first_use != y->first_use) return x->first_use < y->first_use ? -1 : 1;
    return *(const int *)a - *(const int *)b;
}

/* The placed activations in offset order, in blocks of at most PLACED_BLOCK, each block
 * with the earliest first use and latest last use of its members: a placement scans the
 * blocks in offset order and skips those whose members' lifetimes cannot overlap its own,
 * instead of collecting and sorting the overlapping ones again for every tensor. */
enum { PLACED_BLOCK = 64 };

typedef struct placed_block {
    int n, min_first, max_last;
    placed item[PLACED_BLOCK];
} placed_block;

typedef struct placed_set {
    placed_block **block;
    int n_blocks, cap;
} placed_set;

static void block_bounds(placed_block *b) {
    b->min_first = b->item[0].first, b->max_last = b->item[0].last;
    for (int i = 1; i < b->n; i++) {
        if (b->item[i].first < b->min_first) b->min_first = b->item[i].first;
        if (b->item[i].last > b->max_last) b->max_last = b->item[i].last;
    }
}

/* Adds p after every member with an offset at or below its own. -1 when out of memory. */
static int placed_insert(placed_set *s, placed p) {
    int bi = 0;
    while (bi < s->n_blocks - 1 && s->block[bi]->item[s->block[bi]->n - 1].offset <= p.offset) bi++;
    if (s->n_blocks == 0 || s->block[bi]->n == PLACED_BLOCK) {
        if (s->n_blocks == s->cap) {
            int cap = s->cap ? 2 * s->cap : 16;
            placed_block **grown = realloc(s->block, sizeof *grown * (size_t)cap);
            if (!grown) return -1;
            s->block = grown, s->cap = cap;
        }
        placed_block *fresh = malloc(sizeof *fresh);
        if (!fresh) return -1;
        fresh->n = 0;
        if (s->n_blocks == 0) {
            s->block[s->n_blocks++] = fresh;
        } else { /* split the full block: its upper half moves to the fresh one after it */
            placed_block *full = s->block[bi];
            fresh->n = PLACED_BLOCK / 2;
            memcpy(fresh->item, full->item + PLACED_BLOCK / 2, sizeof *fresh->item * (size_t)fresh->n);
            full->n = PLACED_BLOCK / 2;
            block_bounds(full), block_bounds(fresh);
            memmove(s->block + bi + 2, s->block + bi + 1, sizeof *s->block * (size_t)(s->n_blocks - bi - 1));
            s->block[bi + 1] = fresh;
            s->n_blocks++;
            if (fresh->item[0].offset <= p.offset) bi++;
        }
    }
    placed_block *b = s->block[bi];
    int at = b->n;
    while (at > 0 && b->item[at - 1].offset > p.offset) at--;
    memmove(b->item + at + 1, b->item + at, sizeof *b->item * (size_t)(b->n - at));
    b->item[at] = p;
    if (b->n++ == 0 || p.first < b->min_first) b->min_first = p.first;
    if (b->n == 1 || p.last > b->max_last) b->max_last = p.last;
    return 0;
}

static void placed_free(placed_set *s) {
    for (int i = 0; i < s->n_blocks; i++) free(s->block[i]);
    free(s->block);
}

static int place_activations(tg_graph *g, uint64_t *extent) {
    int n = 0;
    int *order = malloc(sizeof *order * (size_t)g->n_tensors);
    placed_set done = {0};
    if (!order) return tg_graph_fail(g, "out of memory");
    for (int t = 0; t < g->n_tensors; t++) {
        const tg_tensor *x = &g->tensors[t];
        if (x->pool != TG_POOL_ACTIVATIONS) continue;
        if (x->first_use < 0) {
            free(order);
            return tg_graph_fail(g, "activation %s is never used", x->name);
        }
        order[n++] = t;
    }
    g_sort_tensors = g->tensors;
    qsort(order, (size_t)n, sizeof *order, by_size_desc);
    uint64_t top = 0;
    for (int i = 0; i < n; i++) {
        tg_tensor *x = &g->tensors[order[i]];
        /* Best fit: the smallest gap that holds x between the placed tensors whose lifetimes
         * overlap x's, taken in offset order (the lowest of equal ones), else above them all.
         * Members at equal offsets give the same gaps in any order. */
        uint64_t best = UINT64_MAX, best_gap = UINT64_MAX, cursor = 0;
        for (int bi = 0; bi < done.n_blocks; bi++) {
            const placed_block *b = done.block[bi];
            if (b->max_last < x->first_use || b->min_first > x->last_use) continue;
            for (int j = 0; j < b->n; j++) {
                const placed *p = &b->item[j];
                if (p->last < x->first_use || p->first > x->last_use) continue;
                if (p->offset > cursor) {
                    uint64_t gap = p->offset - cursor;
                    if (gap >= x->bytes && gap < best_gap) best = cursor, best_gap = gap;
                }
                uint64_t e = align_up(p->end);
                if (e > cursor) cursor = e;
            }
        }
        x->offset = best != UINT64_MAX ? best : cursor;
        if (placed_insert(&done, (placed){x->offset, x->offset + x->bytes, x->first_use, x->last_use})) {
            free(order), placed_free(&done);
            return tg_graph_fail(g, "out of memory");
        }
        if (x->offset + x->bytes > top) top = x->offset + x->bytes;
    }
    free(order), placed_free(&done);
    *extent = top;
    return 0;
}

int tg_plan_memory(tg_graph *g, const int *phase_begin, uint64_t pool_bytes[TG_POOL_COUNT],
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
            x->offset = cursor[x->pool];
            cursor[x->pool] = align_up(cursor[x->pool] + x->bytes);
            if (x->offset + x->bytes > pool_bytes[x->pool]) pool_bytes[x->pool] = x->offset + x->bytes;
        }
    }
    if (place_activations(g, &pool_bytes[TG_POOL_ACTIVATIONS])) return -1;
    *live_peak = tg_plan_live_activation_peak(g->tensors, g->n_tensors, g->n_ops);
    return 0;
}
