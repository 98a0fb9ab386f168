/* Counter-based Philox4x32-10 (Salmon et al., SC'11; Random123), header-only so the CPU
 * reference and the CUDA kernels draw bit-identical dropout masks: a value depends only on
 * (seed, step, key, element), never on thread layout or call order, which is what lets a
 * backward pass regenerate its forward mask.
 *
 * Stream layout used by tg_philox_uniform:
 *   Philox key     = { lo32(seed), hi32(seed) ^ hi32(step) }
 *   Philox counter = { lo32(element / 4), hi32(element / 4), lo32(step), stream key }
 *   value          = word (element % 4) of the 4-word output block, top 24 bits * 2^-24
 * so one Philox call yields four consecutive elements (tg_philox_uniform4 hands out the
 * whole block). Steps beyond 2^32 are folded into the key rather than dropped. */
#ifndef TUNEGRAPH_PHILOX_H
#define TUNEGRAPH_PHILOX_H

#include <stdint.h>

#if defined(__CUDACC__)
#define TG_HOST_DEVICE __host__ __device__
#else
#define TG_HOST_DEVICE
#endif

#define TG_PHILOX_M0 0xD2511F53u
#define TG_PHILOX_M1 0xCD9E8D57u
#define TG_PHILOX_W0 0x9E3779B9u /* golden ratio */
#define TG_PHILOX_W1 0xBB67AE85u /* sqrt(3) - 1 */

/* The raw Philox4x32-10 bijection: out = philox(ctr, key). Matches Random123's
 * known-answer vectors. */
TG_HOST_DEVICE static inline void tg_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
                                                   uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)TG_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)TG_PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += TG_PHILOX_W0;
        k1 += TG_PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* Word j (0..3) of a block by selects: a run-time index would put a kernel's words in
 * local memory. */
TG_HOST_DEVICE static inline uint32_t tg_philox_word(const uint32_t w[4], unsigned j) {
    return j == 0 ? w[0] : j == 1 ? w[1] : j == 2 ? w[2] : w[3];
}

/* The 4 raw words of block `block` (elements 4*block .. 4*block+3) of stream (seed, step, key). */
TG_HOST_DEVICE static inline void tg_philox_block(uint64_t seed, uint64_t step, uint32_t key, uint64_t block,
                                                  uint32_t r[4]) {
    const uint32_t k[2] = {(uint32_t)seed, (uint32_t)(seed >> 32) ^ (uint32_t)(step >> 32)};
    const uint32_t c[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)step, key};
    tg_philox4x32_10(c, k, r);
}

/* Uniform floats in [0,1) for elements 4*block .. 4*block+3 of stream (seed, step, key). */
TG_HOST_DEVICE static inline void tg_philox_uniform4(uint64_t seed, uint64_t step, uint32_t key,
                                                     uint64_t block, float u[4]) {
    uint32_t r[4];
    tg_philox_block(seed, step, key, block, r);
    for (int j = 0; j < 4; j++) u[j] = (float)(r[j] >> 8) * (1.0f / 16777216.0f);
}

/* Uniform float in [0,1) (24 random bits, so exactly representable) for one element. */
TG_HOST_DEVICE static inline float tg_philox_uniform(uint64_t seed, uint64_t step, uint32_t key,
                                                     uint64_t element) {
    float u[4];
    tg_philox_uniform4(seed, step, key, element >> 2, u);
    return u[element & 3];
}

/* ---- dropout's draws: 16 bits an element, 8 elements a Philox call --------------------
 * Dropout needs only the test uniform >= p, so each element takes 16 bits: element e is
 * half (e & 1) (low first) of word (e >> 1) & 3 of block e >> 3 of stream (seed, step,
 * key), the uniform k * 2^-16 of that half's k. One Philox call serves 8 consecutive
 * elements, half the calls of 24-bit uniforms; keep = uniform >= p exactly when
 * k >= tg_dropout_keep_threshold(p) = ceil(p * 2^16), so the kept fraction is
 * 1 - ceil(p 2^16) 2^-16 (within 2^-16 of 1 - p: 0.89999 for p = 0.1). */

/* The 16 bits of element e from its block's 4 words. */
TG_HOST_DEVICE static inline uint32_t tg_dropout_bits16(const uint32_t w[4], uint64_t e) {
    return (tg_philox_word(w, (unsigned)(e >> 1) & 3u) >> (16 * (unsigned)(e & 1))) & 0xffffu;
}

/* Element e's dropout uniform in [0, 1), a multiple of 2^-16. */
TG_HOST_DEVICE static inline float tg_dropout_uniform(uint64_t seed, uint64_t step, uint32_t key, uint64_t e) {
    uint32_t w[4];
    tg_philox_block(seed, step, key, e >> 3, w);
    return (float)tg_dropout_bits16(w, e) * (1.0f / 65536.0f);
}

/* The uniforms of elements 4g .. 4g+3 (half of block g >> 1). */
TG_HOST_DEVICE static inline void tg_dropout_uniform4(uint64_t seed, uint64_t step, uint32_t key, uint64_t g,
                                                      float u[4]) {
    uint32_t w[4];
    tg_philox_block(seed, step, key, g >> 1, w);
    const uint32_t lo = g & 1 ? w[2] : w[0], hi = g & 1 ? w[3] : w[1];
    u[0] = (float)(lo & 0xffffu) * (1.0f / 65536.0f), u[1] = (float)(lo >> 16) * (1.0f / 65536.0f);
    u[2] = (float)(hi & 0xffffu) * (1.0f / 65536.0f), u[3] = (float)(hi >> 16) * (1.0f / 65536.0f);
}

/* The integer form of uniform >= p for dropout's 16-bit uniforms: ceil(p * 2^16) (exact
 * in double); kernels compare an element's 16 bits against it. */
static inline uint32_t tg_dropout_keep_threshold(float p) {
    const double t = (double)p * 65536.0;
    const uint32_t n = (uint32_t)t;
    return (double)n < t ? n + 1 : n;
}

#endif
