/* Optimizer state stored in bf16 (job key optimizer_state = bf16): the update runs in f32
 * and each new moment is rounded to bf16 stochastically, up with probability equal to the
 * distance from the value below, so the rounding is unbiased. Round to nearest would stall
 * the second moment: with beta2 = 0.999 the decay v -> 0.999 v moves v by less than half a
 * bf16 step (2^-9 relative), so v could only grow.
 *
 * The draws are Philox words (kernels/philox.h) of stream (seed, step, key), the word of
 * parameter element i being word i % 4 of block i / 4: the same bits on the CPU reference
 * and on the GPU, whatever the thread layout, chunking or ZeRO-1 slice. AdamW's m takes the
 * word's low 16 bits and v its high 16 (key TG_STATE_ROUND_KEY); Adan's m and d take those
 * of that stream, its v and g_prev those of key TG_STATE_ROUND_KEY2. The keys sit at the
 * top of the 32-bit key space, far from the compiler's dropout keys (counted from 0). */
#ifndef TUNEGRAPH_STATE_ROUNDING_H
#define TUNEGRAPH_STATE_ROUNDING_H

#include <stdint.h>
#include <string.h>

#include "kernels/philox.h"

#define TG_STATE_ROUND_KEY 0xFFFFFFFFu
#define TG_STATE_ROUND_KEY2 0xFFFFFFFEu

/* x rounded to a bf16 value (returned as the f32 holding it): the 16 bits below bf16's
 * mantissa plus r16 (0..65535) carry into it or not, then are cut. Infinities stay; a NaN
 * stays a quiet NaN (cutting could otherwise turn one into an infinity). */
TG_HOST_DEVICE static inline float tg_bf16_round_stochastic(float x, uint32_t r16) {
    uint32_t u;
#if defined(__CUDA_ARCH__)
    u = __float_as_uint(x);
#else
    memcpy(&u, &x, 4);
#endif
    if ((u & 0x7fffffffu) > 0x7f800000u) u |= 0x00400000u;
    else if ((u & 0x7fffffffu) < 0x7f800000u) u += r16 & 0xffffu;
    u &= 0xffff0000u;
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

/* The draws of parameter elements 4*block .. 4*block+3 at `step`, one word each. */
TG_HOST_DEVICE static inline void tg_state_round_words(uint64_t seed, uint64_t step, uint32_t key, uint64_t block,
                                                       uint32_t w[4]) {
    tg_philox_block(seed, step, key, block, w);
}

#endif
