/* CPU reference: the optimizer's ops (SCHEDULE, GRAD_NORM, GRAD_SQUARES, NORM_OF_SQUARES, ADAMW, ADAN,
 * LOSS_SCALE_UPDATE). */
#include <stdlib.h>
#include <string.h>
#include "base/alloc.h"

#include "kernels/adan_update.h"
#include "kernels/loss_scale.h"
#include "kernels/lr_schedule.h"
#include "kernels/state_rounding.h"
#include "runtime/comm.h"
#include "runtime/cpu/cpu_kernels.h"

void tg_cpu_kernel_schedule(const tg_cpu_op_args *a) {
    const tg_schedule_params *sp = &a->op->p.schedule;
    double s = CF32(a->in[0])[0], total = CF32(a->in[1])[0]; /* read before out1 aliases in0 */
    const int skipped = a->in[2] && !isfinite(CF32(a->in[2])[0]);
    F32(a->out[0])[0] = (float)(sp->lr * tg_lr_multiplier((int)sp->form, s, total, (double)sp->warmup));
    if (a->out[1]) F32(a->out[1])[0] = (float)(skipped ? s : s + 1.0);
}

/* Element count of an op's whole-pool view, from the plan's tensor table. */
static int64_t view_numel(const tg_cpu_op_args *a, int slot) {
    int t = a->op->in[slot];
    if (!a->plan || t < 0 || t >= a->plan->n_tensors) return 0;
    return tg_tensor_numel(&a->plan->tensors[t]);
}

typedef struct norm_ctx {
    const float *g;
    int64_t n;
    float *squares; /* one per block of TG_NORM_BLOCK elements */
} norm_ctx;

static void norm_blocks(void *p, int64_t b, int64_t e) {
    norm_ctx *c = p;
    for (int64_t blk = b; blk < e; blk++) {
        int64_t i0 = blk * TG_NORM_BLOCK, i1 = min64(c->n, i0 + TG_NORM_BLOCK);
        double s = 0;
        for (int64_t i = i0; i < i1; i++) s += (double)c->g[i] * c->g[i];
        c->squares[blk] = (float)s;
    }
}

/* Blocks [b0, b1) of the n gradients g into squares[b0, b1) (plan/ops.def GRAD_SQUARES). */
static void block_squares(const tg_cpu_op_args *a, const float *g, int64_t n, float *squares, int64_t b0, int64_t b1) {
    if (b1 <= b0) return;
    norm_ctx c = {.g = g + b0 * TG_NORM_BLOCK, .n = min64(n, b1 * TG_NORM_BLOCK) - b0 * TG_NORM_BLOCK, .squares = squares + b0};
    tg_parallel_for(a->threads, b1 - b0, norm_blocks, &c);
}

/* sqrt(the f64 sum of squares[0..k) in index order) / scale: NORM_OF_SQUARES. */
static float norm_of(const float *squares, int64_t k, const float *scale) {
    double s = 0;
    for (int64_t i = 0; i < k; i++) s += squares[i];
    /* Dividing by the loss scale (a power of two) after the square root is exact. */
    return (float)sqrt(s) / (scale ? scale[0] : 1.0f);
}

void tg_cpu_kernel_grad_norm(const tg_cpu_op_args *a) {
    const int64_t n = view_numel(a, 0), blocks = (n + TG_NORM_BLOCK - 1) / TG_NORM_BLOCK;
    float *squares = tg_calloc((size_t)(blocks > 0 ? blocks : 1), sizeof *squares);
    if (!squares) return tg_cpu_op_out_of_memory(a);
    block_squares(a, CF32(a->in[0]), n, squares, 0, blocks);
    F32(a->out[0])[0] = norm_of(squares, blocks, a->in[1] ? CF32(a->in[1]) : NULL);
    free(squares);
}

void tg_cpu_kernel_grad_squares(const tg_cpu_op_args *a) {
    const tg_squares_params *p = &a->op->p.squares;
    const int64_t blocks = (p->n + TG_NORM_BLOCK - 1) / TG_NORM_BLOCK;
    int64_t b0 = 0, b1 = blocks;
    /* A replica alone (no communicator, or one of one rank) holds every slice, as ALL_GATHER's. */
    if (p->slice > 0 && tg_cpu_comm_group_ranks(a->comm) > 1) {
        const int64_t per = p->slice / TG_NORM_BLOCK;
        b0 = min64(blocks, per * a->rank), b1 = min64(blocks, b0 + per);
    }
    float *out = F32(a->out[0]);
    memset(out, 0, (size_t)blocks * sizeof *out);
    block_squares(a, CF32(a->in[0]), p->n, out, b0, b1);
}

void tg_cpu_kernel_norm_of_squares(const tg_cpu_op_args *a) {
    const int t = a->op->in[0];
    const int64_t k = a->plan && t >= 0 && t < a->plan->n_tensors ? tg_tensor_numel(&a->plan->tensors[t]) : 0;
    F32(a->out[0])[0] = norm_of(CF32(a->in[0]), k, a->in[1] ? CF32(a->in[1]) : NULL);
}

/* A contiguous run of one parameter tensor's elements that this update covers. */
typedef struct adamw_seg {
    int64_t first; /* element index into the pools */
    int64_t start; /* prefix sum of the segment sizes before this one */
    int64_t n;
    int decay;
} adamw_seg;

typedef struct adamw_ctx {
    const adamw_seg *seg;
    int n_seg;
    const tg_adan_step *adan; /* ADAN's per-update constants, NULL for ADAMW */
    float *d, *g_prev;        /* ADAN: the second halves of out1 and out2 */
    const float *g;
    float *p, *m, *v;
    float *copy; /* out3: the low-precision parameter copies (widened by the caller), or NULL */
    int64_t state_first; /* the parameter element m[0] and v[0] belong to (ZeRO-1's slice) */
    float clip, lr, b1, b2, eps, wd, step_size, sqrt_bc2;
    /* bf16 state: the draws' stream (kernels/state_rounding.h); the executor widened m and
     * v and narrows them back after the kernel, which keeps the values rounded here. */
    int round_state;
    uint64_t seed, step;
} adamw_ctx;

/* The draw word of parameter element i (kernels/state_rounding.h). */
static uint32_t round_word(const adamw_ctx *c, uint32_t key, int64_t i) {
    uint32_t w[4];
    tg_state_round_words(c->seed, c->step, key, (uint64_t)i >> 2, w);
    return tg_philox_word(w, (unsigned)(i & 3));
}

/* One element's new state rounded to bf16 (parts: 2 for AdamW's m, v; 4 for Adan's m, d,
 * v, g_prev), in place. */
static void round_state(const adamw_ctx *c, int64_t i, float *const *state, int parts) {
    for (int k = 0; k < parts; k += 2) {
        const uint32_t w = round_word(c, k ? TG_STATE_ROUND_KEY2 : TG_STATE_ROUND_KEY, i);
        *state[k] = tg_bf16_round_stochastic(*state[k], w);
        *state[k + 1] = tg_bf16_round_stochastic(*state[k + 1], w >> 16);
    }
}

static void adamw_range(void *pv, int64_t b, int64_t e) {
    const adamw_ctx *c = pv;
    int lo = 0, hi = c->n_seg - 1; /* last segment with start <= b */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (c->seg[mid].start <= b) lo = mid; else hi = mid - 1;
    }
    for (int s = lo; s < c->n_seg && c->seg[s].start < e; s++) {
        const adamw_seg *sg = &c->seg[s];
        int64_t j0 = b > sg->start ? b - sg->start : 0, j1 = min64(sg->n, e - sg->start);
        float decay = sg->decay ? c->lr * c->wd : 0.0f;
        if (c->adan) {
            for (int64_t j = j0; j < j1; j++) {
                const int64_t i = sg->first + j, k = i - c->state_first;
                tg_adan_element(c->adan, decay, c->g[i], &c->p[i], &c->m[k], &c->d[k], &c->v[k], &c->g_prev[k]);
                if (c->round_state) round_state(c, i, (float *const[]){&c->m[k], &c->d[k], &c->v[k], &c->g_prev[k]}, 4);
                if (c->copy) c->copy[i] = c->p[i];
            }
            continue;
        }
        for (int64_t j = j0; j < j1; j++) {
            int64_t i = sg->first + j, k = i - c->state_first;
            float g = c->g[i] * c->clip;
            float p = c->p[i] - decay * c->p[i];
            float m = c->b1 * c->m[k] + (1.0f - c->b1) * g;
            float v = c->b2 * c->v[k] + (1.0f - c->b2) * g * g;
            c->p[i] = p - c->step_size * m / (sqrtf(v) / c->sqrt_bc2 + c->eps);
            c->m[k] = m;
            c->v[k] = v;
            if (c->round_state) round_state(c, i, (float *const[]){&c->m[k], &c->v[k]}, 2);
            if (c->copy) c->copy[i] = c->p[i];
        }
    }
}

/* 1 / the loss scale of fp16 plans (in4), else 1: the gradients' factor before clipping,
 * GradScaler's unscale_. The scale is a power of two, so the product with the clipping
 * factor is what unscaling and clipping one after the other give. */
static float unscale(const tg_cpu_op_args *a) { return a->in[4] ? 1.0f / CF32(a->in[4])[0] : 1.0f; }

/* ADAMW, or ADAN when adan is its per-update constants (its parameters begin with ADAMW's). */
static void update_run(const tg_cpu_op_args *a, const tg_adan_step *adan) {
    const tg_plan *plan = a->plan;
    if (!plan) return; /* the executor always passes the plan */
    const tg_adamw_params *ap = &a->op->p.adamw;
    if (a->in[3] && !isfinite(CF32(a->in[3])[0])) return; /* a non-finite gradient: the step is skipped */
    adamw_ctx c = {.g = CF32(a->in[0]), .p = F32(a->out[0]), .m = F32(a->out[1]),
                   .v = F32(a->out[2]), .copy = a->out[3] ? F32(a->out[3]) : NULL,
                   .lr = CF32(a->in[1])[0], .b1 = ap->beta1, .b2 = ap->beta2,
                   .eps = ap->eps, .wd = ap->weight_decay, .clip = 1.0f};
    if (ap->max_grad_norm > 0.0f && a->in[3]) {
        double norm = CF32(a->in[3])[0];
        c.clip = (float)fmin(1.0, (double)ap->max_grad_norm / (norm + 1e-6));
    }
    c.clip *= unscale(a);
    c.round_state = a->out_dtype[1] == TG_BF16;
    c.seed = a->seed, c.step = step_counter(CF32(a->in[2]));
    double t = CF32(a->in[2])[0];
    double bc1 = 1.0 - pow(ap->beta1, t), bc2 = 1.0 - pow(ap->beta2, t);
    c.step_size = (float)(c.lr / bc1);
    c.sqrt_bc2 = (float)sqrt(bc2);

    adamw_seg *seg = tg_malloc((size_t)(plan->n_tensors > 0 ? plan->n_tensors : 1) * sizeof *seg);
    if (!seg) return tg_cpu_op_out_of_memory(a);
    /* ZeRO-1: only this replica's slice of the elements, whose state starts at m[0]. */
    const int64_t slice = ap->zero_slice;
    const int64_t lo = slice > 0 ? (int64_t)a->rank * slice : 0, hi = slice > 0 ? lo + slice : INT64_MAX;
    c.state_first = lo;
    int64_t total = 0;
    for (int i = 0; i < plan->n_tensors; i++) {
        const tg_tensor *tt = &plan->tensors[i];
        /* Whole-pool views would update every parameter a second time. */
        if (!(tt->flags & TG_TENSOR_PARAM) || (tt->flags & TG_TENSOR_VIEW)) continue;
        int64_t first = (int64_t)(tt->offset / 4), end = first + tg_tensor_numel(tt);
        if (first < lo) first = lo;
        if (end > hi) end = hi;
        if (end <= first) continue;
        seg[c.n_seg++] = (adamw_seg){first, total, end - first, !(tt->flags & TG_TENSOR_NO_DECAY)};
        total += end - first;
    }
    c.seg = seg;
    if (adan) { /* out1 = [m | d], out2 = [v | g_prev], each part the state's length */
        const int64_t state = slice > 0 ? slice : ap->n;
        c.adan = adan, c.d = c.m + state, c.g_prev = c.v + state;
    }
    if (c.n_seg) tg_parallel_for(a->threads, total, adamw_range, &c);
    free(seg);
}

void tg_cpu_kernel_adamw(const tg_cpu_op_args *a) { update_run(a, NULL); }

void tg_cpu_kernel_adan(const tg_cpu_op_args *a) {
    const tg_adan_params *ap = &a->op->p.adan;
    const float norm = a->in[3] ? CF32(a->in[3])[0] : 0.0f;
    tg_adan_step s = tg_adan_step_of(CF32(a->in[1])[0], CF32(a->in[2])[0], norm, a->in[3] ? ap->max_grad_norm : 0.0f,
                                           ap->beta1, ap->beta2, ap->beta3, ap->eps, (int)ap->no_prox);
    s.clip *= unscale(a);
    update_run(a, &s);
}

void tg_cpu_kernel_loss_scale_update(const tg_cpu_op_args *a) {
    const tg_loss_scale_params *p = &a->op->p.loss_scale;
    float scale = CF32(a->in[1])[0], tracker = CF32(a->in[2])[0];
    tg_loss_scale_step(CF32(a->in[0])[0], p->growth_factor, p->backoff_factor, p->growth_interval, &scale, &tracker);
    F32(a->out[0])[0] = scale;
    F32(a->out[1])[0] = tracker;
}
