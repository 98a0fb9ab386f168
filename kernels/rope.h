/* The rotary embedding's inverse frequencies (ROPE, ROPE_BWD), written once for the CPU
 * reference and the CUDA kernels. The float32 operations follow transformers' order
 * (_compute_default_rope_parameters, then _compute_llama3_parameters for rope type
 * llama3), so the angles pos x inv_freq[i] round as HF's do. */
#ifndef TUNEGRAPH_ROPE_H
#define TUNEGRAPH_ROPE_H

#include <math.h>

#include "kernels/philox.h" /* TG_HOST_DEVICE */
#include "plan/plan.h"

/* inv_freq[i], i in [0, Dh/2): 1 / theta^(2i / Dh), then for llama3 the long wavelengths
 * (beyond original_max / low_freq) divided by factor, the short ones (below original_max /
 * high_freq) kept, and those between blended smoothly. */
TG_HOST_DEVICE static inline float tg_rope_inv_freq(const tg_rope_params *p, int64_t i) {
    const float exponent = (float)(2 * i) / (float)p->head_dim;
    const float inv = 1.0f / powf(p->theta, exponent);
    if (p->type != TG_ROPE_LLAMA3) return inv;
    const float old_len = (float)p->original_max;
    const float low_wavelen = (float)((double)p->original_max / (double)p->low_freq);
    const float high_wavelen = (float)((double)p->original_max / (double)p->high_freq);
    const float wavelen = (float)(2.0 * 3.14159265358979323846) / inv;
    const float scaled = wavelen > low_wavelen ? inv / p->factor : inv;
    if (wavelen < high_wavelen || wavelen > low_wavelen) return scaled;
    const float smooth = (old_len / wavelen - p->low_freq) / (float)((double)p->high_freq - (double)p->low_freq);
    return (1.0f - smooth) * scaled / p->factor + smooth * scaled;
}

/* Rotates the pair (a, b) = (x[i], x[i + Dh/2]) by angle (cos c, sin s): HF's
 * x * cos + rotate_half(x) * sin, each product rounded before the sum. inverse: the
 * transpose (the backward). */
TG_HOST_DEVICE static inline void tg_rope_rotate(float a, float b, float c, float s, int inverse, float *ra,
                                                 float *rb) {
    const float ac = a * c, bs = b * s, bc = b * c, as = a * s;
    *ra = inverse ? ac + bs : ac - bs;
    *rb = inverse ? bc - as : bc + as;
}

#endif
