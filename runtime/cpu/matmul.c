/* CPU reference: MATMUL (with its bias-gradient and GELU epilogues), BIAS_GRAD and the
 * deterministic column sums they share. */
#include <stdlib.h>
#include "base/alloc.h"
#include <string.h>

#include "runtime/cpu/cpu_kernels.h"

/* ---- matmul -------------------------------------------------------------------------
 * A small packed GEMM: op(B) of each batch is packed into panels of NR columns laid out
 * [K][NR] and op(A) into panels of MR rows laid out [K][MR], so the MR x NR micro-kernel
 * streams both contiguously and keeps the tile in registers. Work items are (batch, block
 * of MC rows); each output element is one k-ordered sum, identical for any thread count. */

typedef float v4f __attribute__((vector_size(16)));

#define MR 4
#define NR 8
#define MC 64

typedef struct mm_ctx {
    const tg_cpu_op_args *a;
    int64_t M, N, K, batch;
    int ta, tb, acc;
    int act;            /* TG_MATMUL_ACT_* */
    float alpha;
    int64_t n_panels;   /* ceil(N / NR) */
    int64_t row_blocks; /* ceil(M / MC) */
    float *bp;          /* packed op(B): batch x n_panels x [K][NR] */
} mm_ctx;

static void mm_pack_b(void *p, int64_t b, int64_t e) {
    mm_ctx *c = p;
    const float *B = CF32(c->a->in[1]);
    int64_t N = c->N, K = c->K;
    for (int64_t it = b; it < e; it++) {
        int64_t bt = it / c->n_panels, jp = it % c->n_panels;
        const float *Bb = B + bt * K * N;
        float *dst = c->bp + it * K * NR;
        int64_t j0 = jp * NR, nj = min64(NR, N - j0);
        for (int64_t k = 0; k < K; k++) {
            for (int64_t j = 0; j < nj; j++)
                dst[k * NR + j] = c->tb ? Bb[(j0 + j) * K + k] : Bb[k * N + j0 + j];
            for (int64_t j = nj; j < NR; j++) dst[k * NR + j] = 0.0f;
        }
    }
}

static void mm_kernel(const float *ap, const float *bp, int64_t K, v4f acc[MR][NR / 4]) {
    for (int r = 0; r < MR; r++)
        for (int q = 0; q < NR / 4; q++) acc[r][q] = (v4f){0, 0, 0, 0};
    for (int64_t k = 0; k < K; k++) {
        const v4f *bk = (const v4f *)(bp + k * NR);
        const float *ak = ap + k * MR;
        for (int r = 0; r < MR; r++)
            for (int q = 0; q < NR / 4; q++) acc[r][q] += ak[r] * bk[q];
    }
}

static void mm_rows(void *p, int64_t b, int64_t e) {
    mm_ctx *c = p;
    const float *A = CF32(c->a->in[0]), *bias = CF32(c->a->in[2]);
    const float *pre_in = CF32(c->a->in[3]);
    float *C = F32(c->a->out[0]), *pre_out = F32(c->a->out[2]);
    int64_t M = c->M, N = c->N, K = c->K;
    float *ap = tg_aligned_alloc(64, (size_t)MC * (size_t)(K > 0 ? K : 1) * 4);
    if (!ap) return tg_cpu_op_out_of_memory(c->a);
    for (int64_t it = b; it < e; it++) {
        int64_t bt = it / c->row_blocks, i0 = (it % c->row_blocks) * MC;
        int64_t mi = min64(MC, M - i0);
        const float *Ab = A + bt * M * K;
        float *Cb = C + bt * M * N;
        /* Pack rows [i0, i0+mi) of op(A), zero-padding the last panel. */
        int64_t panels = (mi + MR - 1) / MR;
        for (int64_t ip = 0; ip < panels; ip++) {
            float *dst = ap + ip * K * MR;
            for (int64_t k = 0; k < K; k++)
                for (int r = 0; r < MR; r++) {
                    int64_t i = i0 + ip * MR + r;
                    dst[k * MR + r] = i >= i0 + mi ? 0.0f : c->ta ? Ab[k * M + i] : Ab[i * K + k];
                }
        }
        const float *bpb = c->bp + bt * c->n_panels * K * NR;
        for (int64_t jp = 0; jp < c->n_panels; jp++) {
            int64_t j0 = jp * NR, nj = min64(NR, N - j0);
            for (int64_t ip = 0; ip < panels; ip++) {
                v4f acc[MR][NR / 4];
                mm_kernel(ap + ip * K * MR, bpb + jp * K * NR, K, acc);
                for (int r = 0; r < MR; r++) {
                    int64_t i = i0 + ip * MR + r;
                    if (i >= i0 + mi) break;
                    float *crow = Cb + i * N + j0;
                    float t[NR];
                    memcpy(t, acc[r], sizeof t);
                    for (int64_t j = 0; j < nj; j++) {
                        float v = c->alpha * t[j];
                        if (bias) v += bias[j0 + j];
                        /* The epilogues (batch 1, no accumulate): GELU, keeping the
                         * pre-activation, or the GELU backward at the saved one. */
                        int64_t at = bt * M * N + i * N + j0 + j;
                        if (c->act == TG_MATMUL_ACT_GELU) pre_out[at] = v, v = gelu_tanh(v);
                        else if (c->act == TG_MATMUL_ACT_GELU_BWD) v = v * gelu_tanh_grad(pre_in[at]);
                        crow[j] = c->acc ? crow[j] + v : v;
                    }
                }
            }
        }
    }
    free(ap);
}

/* Column sums (cpu_kernels.h): each chunk of columns sums its rows in order. */
typedef struct colsum_ctx {
    const float *x;
    float *out;
    int64_t rows, cols;
    int acc;
    const tg_cpu_op_args *a;
} colsum_ctx;

static void colsum_range(void *p, int64_t b, int64_t e) {
    const colsum_ctx *c = p;
    double *s = tg_calloc((size_t)(e - b), sizeof *s);
    if (!s) return tg_cpu_op_out_of_memory(c->a);
    for (int64_t r = 0; r < c->rows; r++)
        for (int64_t j = b; j < e; j++) s[j - b] += c->x[r * c->cols + j];
    for (int64_t j = b; j < e; j++) c->out[j] = c->acc ? c->out[j] + (float)s[j - b] : (float)s[j - b];
    free(s);
}

void tg_cpu_colsum(const tg_cpu_op_args *a, const float *x, float *out, int64_t rows, int64_t cols, int acc) {
    colsum_ctx c = {x, out, rows, cols, acc, a};
    tg_parallel_for(a->threads, cols, colsum_range, &c);
}

void tg_cpu_kernel_matmul(const tg_cpu_op_args *a) {
    const tg_matmul_params *mm = &a->op->p.matmul;
    mm_ctx c = {.a = a, .M = mm->m, .N = mm->n, .K = mm->k, .ta = mm->trans_a != 0,
                .tb = mm->trans_b != 0, .batch = mm->batch > 0 ? mm->batch : 1, .acc = mm->accumulate != 0,
                .act = (int)mm->activation, .alpha = mm->alpha};
    /* An epilogue without its pre-activation buffer (a plan the reader let through) would
     * write or read through NULL. */
    if ((c.act == TG_MATMUL_ACT_GELU && !a->out[2]) || (c.act == TG_MATMUL_ACT_GELU_BWD && !a->in[3])) abort();
    if (c.M <= 0 || c.N <= 0) return;
    c.n_panels = (c.N + NR - 1) / NR;
    c.row_blocks = (c.M + MC - 1) / MC;
    size_t bp_floats = (size_t)(c.batch * c.n_panels * NR) * (size_t)(c.K > 0 ? c.K : 1);
    c.bp = tg_aligned_alloc(64, (bp_floats * 4 + 63) / 64 * 64);
    if (!c.bp) return tg_cpu_op_out_of_memory(a);
    tg_parallel_for(a->threads, c.batch * c.n_panels, mm_pack_b, &c);
    tg_parallel_for(a->threads, c.batch * c.row_blocks, mm_rows, &c);
    free(c.bp);
    /* The fused bias gradient: column sums of the stored A [K,M] or B [K,N] (batch 1). */
    if (mm->bias_grad == 1 && a->out[1]) tg_cpu_colsum(a, CF32(a->in[0]), F32(a->out[1]), c.K, c.M, 0);
    if (mm->bias_grad == 2 && a->out[1]) tg_cpu_colsum(a, CF32(a->in[1]), F32(a->out[1]), c.K, c.N, 0);
}

void tg_cpu_kernel_bias_grad(const tg_cpu_op_args *a) {
    const tg_bias_grad_params *bg = &a->op->p.bias_grad;
    tg_cpu_colsum(a, CF32(a->in[0]), F32(a->out[0]), bg->m, bg->n, !bg->overwrite);
}
