/* The fused ATTENTION op and its backward on the CPU reference (runtime/cpu/attention.c)
 * against a plain double-precision reference, at lengths just past a multiple of 32 keys
 * (33, 34, 65: a row's keep bits take ceil(T/32) words, the last one mostly empty), with a
 * padding mask, causal and not, with attention dropout: every keep bit (bits past T
 * included), O, LSE, and dQ, dK, dV, delta from the forward's bits. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/philox.h"
#include "runtime/cpu/cpu_kernels.h"
#include "tests/harness.h"

#define SEED 2718u
#define KEY 4
#define STEP 11.0f
#define P_DROP 0.25f

typedef struct attn_case {
    int64_t B, H, T, Dh;
    int causal;
} attn_case;

static float *random_floats(int64_t n, uint64_t seed) {
    float *x = malloc(sizeof *x * (size_t)n);
    if (!x) abort();
    tg_test_fill_uniform(x, n, seed, -1.0f, 1.0f);
    return x;
}

/* Keys of sequence 1 masked out: key 3 and the last five (padding). */
static float key_mask(const attn_case *c, int64_t b, int64_t k) { return b == 1 && (k == 3 || k >= c->T - 5) ? 0.0f : 1.0f; }

static int visible(const attn_case *c, int64_t b, int64_t q, int64_t k) {
    return k < c->T && key_mask(c, b, k) != 0.0f && (!c->causal || k <= q);
}

/* The dropout factor of key k of row (b, h, q): 1/(1-p) kept, 0 dropped. */
static double factor_of(const attn_case *c, int64_t b, int64_t h, int64_t q, int64_t k) {
    const uint64_t e = (uint64_t)(((b * c->H + h) * c->T + q) * c->T + k);
    return tg_dropout_uniform(SEED, (uint64_t)STEP, KEY, e) >= P_DROP ? 1.0 / (1.0 - P_DROP) : 0.0;
}

static double max_rel(const float *got, const double *want, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)got[i] - want[i]));
        den = fmax(den, fabs(want[i]));
    }
    return num / fmax(den, 1e-30);
}

static void run_case(const attn_case *c) {
    const int64_t B = c->B, H = c->H, T = c->T, Dh = c->Dh, D = H * Dh, rows = B * T, W = (T + 31) / 32;
    float *x[3], *mask = malloc(sizeof *mask * (size_t)(B * T)), step = STEP;
    for (int s = 0; s < 3; s++) x[s] = random_floats(rows * D, 40 + (uint64_t)s + (uint64_t)T);
    float *O = malloc(sizeof *O * (size_t)(rows * D)), *LSE = malloc(sizeof *LSE * (size_t)(B * H * T));
    int32_t *bits = malloc(sizeof *bits * (size_t)(B * H * T * W));
    float *dO = random_floats(rows * D, 90 + (uint64_t)T), *dx[3], *delta = malloc(sizeof *delta * (size_t)(B * H * T));
    for (int s = 0; s < 3; s++) dx[s] = malloc(sizeof *dx[s] * (size_t)(rows * D));
    double *wO = calloc((size_t)(rows * D), sizeof *wO), *wLSE = calloc((size_t)(B * H * T), sizeof *wLSE);
    double *wdx[3], *wdelta = calloc((size_t)(B * H * T), sizeof *wdelta), *P = malloc(sizeof *P * (size_t)T);
    for (int s = 0; s < 3; s++) wdx[s] = calloc((size_t)(rows * D), sizeof *wdx[s]);
    if (!mask || !O || !LSE || !bits || !delta || !dx[0] || !dx[1] || !dx[2] || !wO || !wLSE || !wdx[0] || !wdx[1] ||
        !wdx[2] || !wdelta || !P)
        abort();
    for (int64_t b = 0; b < B; b++)
        for (int64_t k = 0; k < T; k++) mask[b * T + k] = key_mask(c, b, k);
    memset(bits, 0xA5, sizeof *bits * (size_t)(B * H * T * W)); /* every word must be written */

    tg_op op = tg_test_op(TG_OP_ATTENTION);
    op.p.attention = (tg_attention_params){.b = B, .h = H, .t = T, .causal = c->causal, .key = KEY, .head_dim = Dh,
                                           .scale = 1.0f / sqrtf((float)Dh), .p = P_DROP};
    tg_cpu_op_args fa = {.op = &op, .in = {x[0], x[1], x[2], mask, &step}, .out = {O, LSE, bits}, .seed = SEED,
                         .training = 1};
    tg_cpu_op_run(&fa);

    /* The reference: scores in double, softmax over the visible keys, dropout factors. */
    const double scale = op.p.attention.scale;
    int64_t bad_bits = 0, set_bits = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t q = 0; q < T; q++) {
                const int64_t r = b * T + q, bh = b * H + h;
                const float *qv = x[0] + r * D + h * Dh, *dov = dO + r * D + h * Dh;
                for (int64_t k = 0; k < 32 * W; k++) {
                    const int want = visible(c, b, q, k) && factor_of(c, b, h, q, k) != 0.0;
                    const uint32_t word = (uint32_t)bits[(bh * T + q) * W + k / 32];
                    const int got = (int)((word >> (k % 32)) & 1u);
                    if (got != want && bad_bits++ < 3)
                        CHECK(0, "T %lld causal %d: bit (b %lld h %lld q %lld k %lld) is %d, expected %d", (long long)T,
                              c->causal, (long long)b, (long long)h, (long long)q, (long long)k, got, want);
                    set_bits += got;
                }
                double mx = -INFINITY, sum = 0;
                for (int64_t k = 0; k < T; k++) {
                    P[k] = 0;
                    if (!visible(c, b, q, k)) continue;
                    double s = 0;
                    for (int64_t d = 0; d < Dh; d++) s += (double)qv[d] * x[1][(b * T + k) * D + h * Dh + d];
                    P[k] = s * scale;
                    mx = fmax(mx, P[k]);
                }
                for (int64_t k = 0; k < T; k++)
                    if (visible(c, b, q, k)) sum += exp(P[k] - mx);
                wLSE[bh * T + q] = mx + log(sum);
                for (int64_t k = 0; k < T; k++) P[k] = visible(c, b, q, k) ? exp(P[k] - wLSE[bh * T + q]) : 0.0;
                for (int64_t k = 0; k < T; k++) {
                    const double dropped = P[k] * factor_of(c, b, h, q, k);
                    for (int64_t d = 0; d < Dh; d++) wO[r * D + h * Dh + d] += dropped * x[2][(b * T + k) * D + h * Dh + d];
                }
                /* The backward: delta = dO . O, dS = scale P (dO . V_k factor - delta). */
                double dl = 0;
                for (int64_t d = 0; d < Dh; d++) dl += (double)dov[d] * wO[r * D + h * Dh + d];
                wdelta[bh * T + q] = dl;
                for (int64_t k = 0; k < T; k++) {
                    if (!visible(c, b, q, k)) continue;
                    const int64_t kr = (b * T + k) * D + h * Dh;
                    const double f = factor_of(c, b, h, q, k);
                    double dov_v = 0;
                    for (int64_t d = 0; d < Dh; d++) dov_v += (double)dov[d] * x[2][kr + d];
                    const double dS = scale * P[k] * (dov_v * f - dl);
                    for (int64_t d = 0; d < Dh; d++) {
                        wdx[0][r * D + h * Dh + d] += dS * x[1][kr + d];
                        wdx[1][kr + d] += dS * qv[d];
                        wdx[2][kr + d] += P[k] * f * dov[d];
                    }
                }
            }
    CHECK(bad_bits == 0 && set_bits > 0, "T %lld causal %d: %lld keep bits wrong, %lld set", (long long)T, c->causal,
          (long long)bad_bits, (long long)set_bits);
    double e = max_rel(O, wO, rows * D);
    CHECK(e < 1e-5, "T %lld causal %d: O off by %g", (long long)T, c->causal, e);
    double le = 0;
    for (int64_t i = 0; i < B * H * T; i++) le = fmax(le, fabs(LSE[i] - wLSE[i]));
    CHECK(le < 1e-5, "T %lld causal %d: LSE off by %g", (long long)T, c->causal, le);

    tg_op bop = op;
    bop.kind = TG_OP_ATTENTION_BWD;
    tg_cpu_op_args ba = {.op = &bop, .in = {dO, O, LSE, mask, bits, x[0], x[1], x[2]},
                         .out = {dx[0], dx[1], dx[2], delta}, .seed = SEED, .training = 1};
    tg_cpu_op_run(&ba);
    const char *names[3] = {"dQ", "dK", "dV"};
    for (int s = 0; s < 3; s++) {
        e = max_rel(dx[s], wdx[s], rows * D);
        CHECK(e < 1e-4, "T %lld causal %d: %s off by %g", (long long)T, c->causal, names[s], e);
    }
    e = max_rel(delta, wdelta, B * H * T);
    CHECK(e < 1e-5, "T %lld causal %d: delta off by %g", (long long)T, c->causal, e);

    for (int s = 0; s < 3; s++) free(x[s]), free(dx[s]), free(wdx[s]);
    free(mask), free(O), free(LSE), free(bits), free(dO), free(delta), free(wO), free(wLSE), free(wdelta), free(P);
}

TG_TEST(test_cpu_attention_keep_bits_past_32_keys) {
    const int64_t lengths[] = {33, 34, 65};
    for (size_t i = 0; i < sizeof lengths / sizeof *lengths; i++)
        for (int causal = 0; causal < 2; causal++) {
            const attn_case c = {2, 2, lengths[i], 4, causal};
            run_case(&c);
        }
}

/* An odd head size (3, 5) and an odd number of keys: the two-lane sums and row updates end
 * with one lane alone, and no row's update reaches into the next row (dK, dV) or past the
 * scratch (ASan). */
TG_TEST(test_cpu_attention_odd_head_size) {
    const int64_t sizes[] = {3, 5};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        for (int causal = 0; causal < 2; causal++) {
            const attn_case c = {2, 3, 7, sizes[i], causal};
            run_case(&c);
        }
}
