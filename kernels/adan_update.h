/* One Adan update of one parameter element (ADAN, plan/ops.def), written once for the CPU
 * reference and the CUDA kernel. On the device every operation is rounded on its own
 * (__fmul_rn and friends, never fused into an FMA), in the order below, so both compute
 * the same floats; the order follows the reference implementation (sail-sg/Adan). */
#ifndef TUNEGRAPH_ADAN_UPDATE_H
#define TUNEGRAPH_ADAN_UPDATE_H

#include <math.h>

#include "kernels/philox.h" /* TG_HOST_DEVICE */

#if defined(__CUDA_ARCH__)
#define TG_ADAN_MUL(a, b) __fmul_rn(a, b)
#define TG_ADAN_ADD(a, b) __fadd_rn(a, b)
#define TG_ADAN_SUB(a, b) __fsub_rn(a, b)
#define TG_ADAN_DIV(a, b) __fdiv_rn(a, b)
#define TG_ADAN_SQRT(a) __fsqrt_rn(a)
#else
#define TG_ADAN_MUL(a, b) ((a) * (b))
#define TG_ADAN_ADD(a, b) ((a) + (b))
#define TG_ADAN_SUB(a, b) ((a) - (b))
#define TG_ADAN_DIV(a, b) ((a) / (b))
#define TG_ADAN_SQRT(a) sqrtf(a)
#endif

/* Per-update constants, from the step counter t (already counting this update) and lr. */
typedef struct tg_adan_step {
    float clip;           /* the gradient's factor: min(1, max_grad_norm / (norm + 1e-6)), or 1 */
    float b1, b2, b3, eps;
    float step_size;      /* lr / (1 - beta1^t) */
    float step_size_diff; /* lr beta2 / (1 - beta2^t) */
    float sqrt_bc3;       /* sqrt(1 - beta3^t) */
    float lr_wd;          /* lr x weight_decay (0 for parameters without decay, set per element) */
    int no_prox, first;   /* first: t == 1, where g_prev is taken as g */
} tg_adan_step;

TG_HOST_DEVICE static inline tg_adan_step tg_adan_step_of(float lr, double t, float norm, float max_grad_norm,
                                                           float b1, float b2, float b3, float eps, int no_prox) {
    tg_adan_step s;
    s.clip = max_grad_norm > 0.0f ? (float)fmin(1.0, (double)max_grad_norm / ((double)norm + 1e-6)) : 1.0f;
    s.b1 = b1, s.b2 = b2, s.b3 = b3, s.eps = eps;
    s.step_size = (float)((double)lr / (1.0 - pow((double)b1, t)));
    s.step_size_diff = (float)((double)lr * (double)b2 / (1.0 - pow((double)b2, t)));
    s.sqrt_bc3 = (float)sqrt(1.0 - pow((double)b3, t));
    s.lr_wd = 0.0f;
    s.no_prox = no_prox;
    s.first = t <= 1.0;
    return s;
}

/* p, m, d, v, g_prev updated in place from the raw gradient g; lr_wd this element's decay. */
TG_HOST_DEVICE static inline void tg_adan_element(const tg_adan_step *s, float lr_wd, float g, float *p, float *m,
                                                  float *d, float *v, float *g_prev) {
    g = TG_ADAN_MUL(g, s->clip);
    const float diff = s->first ? 0.0f : TG_ADAN_SUB(g, *g_prev);
    *m = TG_ADAN_ADD(TG_ADAN_MUL(*m, s->b1), TG_ADAN_MUL(g, TG_ADAN_SUB(1.0f, s->b1)));
    *d = TG_ADAN_ADD(TG_ADAN_MUL(*d, s->b2), TG_ADAN_MUL(diff, TG_ADAN_SUB(1.0f, s->b2)));
    const float u = TG_ADAN_ADD(TG_ADAN_MUL(diff, s->b2), g);
    *v = TG_ADAN_ADD(TG_ADAN_MUL(*v, s->b3), TG_ADAN_MUL(TG_ADAN_MUL(u, u), TG_ADAN_SUB(1.0f, s->b3)));
    const float den = TG_ADAN_ADD(TG_ADAN_DIV(TG_ADAN_SQRT(*v), s->sqrt_bc3), s->eps);
    float x = *p;
    if (s->no_prox) x = TG_ADAN_MUL(x, TG_ADAN_SUB(1.0f, lr_wd));
    x = TG_ADAN_SUB(x, TG_ADAN_MUL(s->step_size, TG_ADAN_DIV(*m, den)));
    x = TG_ADAN_SUB(x, TG_ADAN_MUL(s->step_size_diff, TG_ADAN_DIV(*d, den)));
    if (!s->no_prox) x = TG_ADAN_DIV(x, TG_ADAN_ADD(1.0f, lr_wd));
    *p = x;
    *g_prev = g;
}

#endif
