/* ATTN_SOFTMAX(_BWD) and HEADS_SPLIT / HEADS_MERGE.
 *
 * Softmax: one warp per row of T keys (rows are <= a few KB, so the three passes over
 * the scores after the first hit L1): max over kept keys of scale*s in float, then
 * expf(scale*s - max) summed in double, as on the CPU, then p = e * (float)(1/sum).
 * Masked keys (mask 0, or k > q when causal) are written as exactly 0; a row with no
 * kept key is all zeros. The backward's dot(dP, P) is a double warp sum. Warp sums use a
 * fixed butterfly, so results are deterministic.
 *
 * Heads split/merge are pure copies (bitwise), one thread per float4 of the
 * [B,H,T,Dh] parts when Dh % 4 == 0, scalars otherwise; blockIdx.y picks the part. */
#include <type_traits>

#include "kernels/cuda_common.cuh"

#define SM_THREADS 256 /* 8 rows per block */
#define HD_THREADS 256

/* ---- softmax ---------------------------------------------------------------------- */

__global__ void __launch_bounds__(SM_THREADS)
attn_softmax_kernel(const float *__restrict__ s, const float *__restrict__ mask, float *__restrict__ P, int64_t rows,
                    int64_t H, int64_t T, int causal, float scale) {
    const int lane = threadIdx.x & 31;
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= rows) return;
    const int64_t q = row % T, bi = row / (T * H);
    const float *sr = s + row * T, *mr = mask ? mask + bi * T : NULL;
    float *pr = P + row * T;
    const int64_t kend = causal ? q + 1 : T;
    float mx = -INFINITY;
    for (int64_t k = lane; k < kend; k += 32)
        if (!mr || mr[k] != 0.0f) mx = fmaxf(mx, fmul(scale, sr[k]));
    mx = warp_max_f(mx);
    if (mx == -INFINITY) { /* no kept key */
        for (int64_t k = lane; k < T; k += 32) pr[k] = 0.0f;
        return;
    }
    double sum = 0;
    for (int64_t k = lane; k < kend; k += 32)
        if (!mr || mr[k] != 0.0f) sum += (double)expf(fsub(fmul(scale, sr[k]), mx));
    const float inv = (float)(1.0 / warp_sum_d(sum));
    for (int64_t k = lane; k < T; k += 32) {
        float v = 0.0f;
        if (k < kend && (!mr || mr[k] != 0.0f)) v = fmul(expf(fsub(fmul(scale, sr[k]), mx)), inv);
        pr[k] = v;
    }
}

__global__ void __launch_bounds__(SM_THREADS)
attn_softmax_bwd_kernel(const float *__restrict__ dP, const float *__restrict__ P, float *__restrict__ ds,
                        int64_t rows, int64_t T, float scale) {
    const int lane = threadIdx.x & 31;
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= rows) return;
    const float *dpr = dP + row * T, *pr = P + row * T;
    float *dsr = ds + row * T;
    double dot = 0;
    for (int64_t k = lane; k < T; k += 32) dot += (double)fmul(dpr[k], pr[k]);
    const float fd = (float)warp_sum_d(dot);
    for (int64_t k = lane; k < T; k += 32) dsr[k] = fmul(fmul(scale, pr[k]), fsub(dpr[k], fd));
}

int tg_launch_attn_softmax(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t B = a->op->i[0], H = a->op->i[1], T = a->op->i[2];
    const int64_t rows = B * H * T;
    if (rows <= 0) return 0;
    const unsigned blocks = (unsigned)((rows * 32 + SM_THREADS - 1) / SM_THREADS);
    attn_softmax_kernel<<<blocks, SM_THREADS, 0, a->ctx->stream>>>((const float *)a->in[0], (const float *)a->in[1],
                                                                    (float *)a->out[0], rows, H, T,
                                                                    a->op->i[3] != 0, a->op->f[0]);
    return 0;
}

int tg_launch_attn_softmax_bwd(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t B = a->op->i[0], H = a->op->i[1], T = a->op->i[2];
    const int64_t rows = B * H * T;
    if (rows <= 0) return 0;
    const unsigned blocks = (unsigned)((rows * 32 + SM_THREADS - 1) / SM_THREADS);
    attn_softmax_bwd_kernel<<<blocks, SM_THREADS, 0, a->ctx->stream>>>(
        (const float *)a->in[0], (const float *)a->in[1], (float *)a->out[0], rows, T, a->op->f[0]);
    return 0;
}

/* ---- heads ------------------------------------------------------------------------ */

struct heads_parts {
    float *p[3];
};

/* Part blockIdx.y: element e (in W-float units) of [B,H,T,Dh] <-> x[(b*T+t), part*H*Dh + h*Dh + d]. */
template <int W, bool TO_HEADS>
__global__ void __launch_bounds__(HD_THREADS)
heads_kernel(float *x, heads_parts parts, int64_t B, int64_t T, int64_t H, int64_t DhW, int64_t P) {
    typedef typename std::conditional<W == 4, float4, float>::type V;
    /* Selected with constant indices: a run-time index into a kernel-parameter array
     * would copy it to local memory. */
    float *part_ptr = blockIdx.y == 0 ? parts.p[0] : blockIdx.y == 1 ? parts.p[1] : parts.p[2];
    V *hp = reinterpret_cast<V *>(part_ptr);
    if (!hp) return;
    V *xv = reinterpret_cast<V *>(x);
    const int64_t part = blockIdx.y, WW = P * H * DhW; /* packed row width */
    const int64_t n = B * H * T * DhW, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int64_t d = e % DhW, r = e / DhW;
        const int64_t t = r % T, bh = r / T, h = bh % H, b = bh / H;
        const int64_t xi = (b * T + t) * WW + part * H * DhW + h * DhW + d;
        if (TO_HEADS)
            hp[e] = xv[xi];
        else
            xv[xi] = hp[e];
    }
}

template <bool TO_HEADS>
static int launch_heads(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t B = a->op->i[0], T = a->op->i[1], H = a->op->i[2], Dh = a->op->i[3];
    const int64_t P = a->op->i[4] < 1 ? 1 : a->op->i[4];
    if (P > 3) return tg_fail(err, "P = %lld (must be 1..3)", (long long)P);
    if (B * T * H * Dh <= 0) return 0;
    float *x = (float *)(TO_HEADS ? a->in[0] : a->out[0]);
    heads_parts parts = {{NULL, NULL, NULL}};
    int vec = Dh % 4 == 0 && tg_aligned16(x);
    for (int p = 0; p < P; p++) {
        parts.p[p] = (float *)(TO_HEADS ? a->out[p] : a->in[p]);
        vec = vec && tg_aligned16(parts.p[p]);
    }
    const int64_t DhW = vec ? Dh / 4 : Dh;
    const dim3 grid(tg_blocks(B * H * T * DhW, HD_THREADS), (unsigned)P);
    if (vec)
        heads_kernel<4, TO_HEADS><<<grid, HD_THREADS, 0, a->ctx->stream>>>(x, parts, B, T, H, DhW, P);
    else
        heads_kernel<1, TO_HEADS><<<grid, HD_THREADS, 0, a->ctx->stream>>>(x, parts, B, T, H, DhW, P);
    return 0;
}

int tg_launch_heads_split(const tg_cuda_op_args *a, tg_err *err) { return launch_heads<true>(a, err); }
int tg_launch_heads_merge(const tg_cuda_op_args *a, tg_err *err) { return launch_heads<false>(a, err); }
