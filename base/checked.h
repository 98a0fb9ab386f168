/* Overflow-checked integer arithmetic for sizes derived from user input (element counts,
 * byte counts, offsets, step counts). The checked forms return 0 and store the result, or
 * -1 when it does not fit (*out is then unspecified); the saturating forms give the
 * type's maximum instead, for sizes that are compared with a limit afterwards. */
#ifndef TUNEGRAPH_CHECKED_H
#define TUNEGRAPH_CHECKED_H

#include <stdint.h>

static inline int tg_mul_u64(uint64_t a, uint64_t b, uint64_t *out) { return __builtin_mul_overflow(a, b, out) ? -1 : 0; }
static inline int tg_add_u64(uint64_t a, uint64_t b, uint64_t *out) { return __builtin_add_overflow(a, b, out) ? -1 : 0; }
static inline int tg_mul_i64(int64_t a, int64_t b, int64_t *out) { return __builtin_mul_overflow(a, b, out) ? -1 : 0; }
static inline int tg_add_i64(int64_t a, int64_t b, int64_t *out) { return __builtin_add_overflow(a, b, out) ? -1 : 0; }

static inline uint64_t tg_mul_sat_u64(uint64_t a, uint64_t b) {
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}
static inline uint64_t tg_add_sat_u64(uint64_t a, uint64_t b) {
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

#endif
