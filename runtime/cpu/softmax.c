/* CPU reference: ATTN_SOFTMAX (the attention softmax with its dropout fused in) and its
 * backward. */
#include <stdlib.h>
#include "base/alloc.h"
#include <string.h>

#include "runtime/cpu/cpu_kernels.h"

/* The fused attention dropout of either kind (its p and key, the step counter in2): DROPOUT's
 * mask and value on the flat [b,h,t,t] element index (tg_cpu_dropout_elements). */
typedef struct softmax_dropout {
    float p;
    uint32_t key;
    uint64_t step;
    int on;         /* the op applies it */
} softmax_dropout;

static softmax_dropout softmax_dropout_of(const tg_cpu_op_args *a, float p, int64_t key) {
    softmax_dropout d = {.p = p, .key = (uint32_t)key};
    d.on = a->training && p > 0.0f && a->in[2] != NULL;
    d.step = d.on ? step_counter(CF32(a->in[2])) : 0;
    return d;
}

static void attn_softmax_rows(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    const tg_softmax_params *sp = &a->op->p.softmax;
    int64_t H = sp->h, T = sp->t;
    int causal = sp->causal != 0;
    float scale = sp->scale;
    const float *s = CF32(a->in[0]), *mask = CF32(a->in[1]);
    float *P = F32(a->out[0]), *D = F32(a->out[1]);
    softmax_dropout drop = softmax_dropout_of(a, sp->p, sp->key);
    drop.on = D && drop.on;
    for (int64_t row = b; row < e; row++) {
        int64_t q = row % T, bi = row / (T * H);
        const float *sr = s + row * T, *mr = mask ? mask + bi * T : NULL;
        float *pr = P + row * T;
        int64_t kend = causal ? q + 1 : T;
        float mx = -INFINITY;
        for (int64_t k = 0; k < kend; k++)
            if (!mr || mr[k] != 0.0f) mx = fmaxf(mx, scale * sr[k]);
        if (mx == -INFINITY) { /* no kept key */
            memset(pr, 0, (size_t)T * 4);
        } else {
            double sum = 0;
            for (int64_t k = 0; k < T; k++) {
                float v = 0.0f;
                if (k < kend && (!mr || mr[k] != 0.0f)) v = expf(scale * sr[k] - mx);
                pr[k] = v;
                sum += v;
            }
            float inv = (float)(1.0 / sum);
            for (int64_t k = 0; k < T; k++) pr[k] *= inv;
        }
        if (!D) continue;
        if (drop.on)
            tg_cpu_dropout_elements(a->seed, drop.step, drop.key, drop.p, row * T, T, pr, D + row * T);
        else if (D + row * T != pr)
            memmove(D + row * T, pr, (size_t)T * 4);
    }
}
void tg_cpu_kernel_attn_softmax(const tg_cpu_op_args *a) {
    const tg_softmax_params *sp = &a->op->p.softmax;
    tg_parallel_for(a->threads, sp->b * sp->h * sp->t, attn_softmax_rows, (void *)a);
}

/* With dropout, dP = dD * keep / (1 - p) is formed in the output row first (an output
 * aliasing dD is fine: each element is read before it is written), then turned into dS. */
static void attn_softmax_bwd_rows(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    const tg_softmax_bwd_params *sp = &a->op->p.softmax_bwd;
    int64_t T = sp->t;
    float scale = sp->scale;
    const float *dD = CF32(a->in[0]), *P = CF32(a->in[1]);
    float *ds = F32(a->out[0]);
    const softmax_dropout drop = softmax_dropout_of(a, sp->p, sp->key);
    for (int64_t row = b; row < e; row++) {
        const float *dpr = dD + row * T, *pr = P + row * T;
        float *dsr = ds + row * T;
        if (drop.on && dsr != pr) {
            tg_cpu_dropout_elements(a->seed, drop.step, drop.key, drop.p, row * T, T, dpr, dsr);
            dpr = dsr;
        }
        float *tmp = NULL;
        if (drop.on && dsr == pr) { /* output aliases P: keep dP apart */
            tmp = tg_malloc((size_t)T * 4);
            if (!tmp) return tg_cpu_op_out_of_memory(a);
            tg_cpu_dropout_elements(a->seed, drop.step, drop.key, drop.p, row * T, T, dpr, tmp);
            dpr = tmp;
        }
        double dot = 0;
        for (int64_t k = 0; k < T; k++) dot += dpr[k] * pr[k];
        float fd = (float)dot;
        for (int64_t k = 0; k < T; k++) dsr[k] = scale * pr[k] * (dpr[k] - fd);
        free(tmp);
    }
}
void tg_cpu_kernel_attn_softmax_bwd(const tg_cpu_op_args *a) {
    const tg_softmax_bwd_params *sp = &a->op->p.softmax_bwd;
    tg_parallel_for(a->threads, sp->b * sp->h * sp->t, attn_softmax_bwd_rows, (void *)a);
}
