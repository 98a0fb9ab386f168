/* ATTN_SOFTMAX(_BWD) and HEADS_SPLIT / HEADS_MERGE.
 *
 * Softmax: one warp per row of T keys (rows are <= a few KB, so the three passes over
 * the scores after the first hit L1): max over kept keys of scale*s in float, then
 * expf(scale*s - max) summed in double, as on the CPU, then p = e * (float)(1/sum).
 * Masked keys (mask 0, or k > q when causal) are written as exactly 0; a row with no
 * kept key is all zeros. The backward's dot(dP, P) is a double warp sum. Warp sums use a
 * fixed butterfly, so results are deterministic.
 *
 * Storage: scores float (or bf16), probs float or bf16 (bf16 plans keep the scores
 * fp32); the backward's dprobs, probs and dscores share one type. bf16 values are
 * widened on load and rounded on store; all arithmetic is the fp32 kernel's.
 *
 * Heads split/merge are pure copies of raw bits (bitwise for any dtype), one thread per
 * 16 bytes of the [B,H,T,Dh] parts when the head rows allow it (8 bytes, then one
 * element, otherwise); blockIdx.y picks the part. */
#include "kernels/cuda_common.cuh"

#define SM_THREADS 256 /* 8 rows per block */
#define HD_THREADS 256

/* ---- softmax ---------------------------------------------------------------------- */

/* Scores TS, probs TP (float/float, or float/bf16 and bf16/bf16 in bf16 plans). */
template <class TS, class TP>
__global__ void __launch_bounds__(SM_THREADS)
attn_softmax_kernel(const TS *__restrict__ s, const float *__restrict__ mask, TP *__restrict__ P, int64_t rows,
                    int64_t H, int64_t T, int causal, float scale) {
    const int lane = threadIdx.x & 31;
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= rows) return;
    const int64_t q = row % T, bi = row / (T * H);
    const TS *sr = s + row * T;
    const float *mr = mask ? mask + bi * T : NULL;
    TP *pr = P + row * T;
    const int64_t kend = causal ? q + 1 : T;
    float mx = -INFINITY;
    for (int64_t k = lane; k < kend; k += 32)
        if (!mr || mr[k] != 0.0f) mx = fmaxf(mx, fmul(scale, tg_ld(sr, k)));
    mx = warp_max_f(mx);
    if (mx == -INFINITY) { /* no kept key */
        for (int64_t k = lane; k < T; k += 32) tg_st(pr, k, 0.0f);
        return;
    }
    double sum = 0;
    for (int64_t k = lane; k < kend; k += 32)
        if (!mr || mr[k] != 0.0f) sum += (double)expf(fsub(fmul(scale, tg_ld(sr, k)), mx));
    const float inv = (float)(1.0 / warp_sum_d(sum));
    for (int64_t k = lane; k < T; k += 32) {
        float v = 0.0f;
        if (k < kend && (!mr || mr[k] != 0.0f)) v = fmul(expf(fsub(fmul(scale, tg_ld(sr, k)), mx)), inv);
        tg_st(pr, k, v);
    }
}

template <class T_>
__global__ void __launch_bounds__(SM_THREADS)
attn_softmax_bwd_kernel(const T_ *__restrict__ dP, const T_ *__restrict__ P, T_ *__restrict__ ds, int64_t rows,
                        int64_t T, float scale) {
    const int lane = threadIdx.x & 31;
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= rows) return;
    const T_ *dpr = dP + row * T, *pr = P + row * T;
    T_ *dsr = ds + row * T;
    double dot = 0;
    for (int64_t k = lane; k < T; k += 32) dot += (double)fmul(tg_ld(dpr, k), tg_ld(pr, k));
    const float fd = (float)warp_sum_d(dot);
    for (int64_t k = lane; k < T; k += 32) tg_st(dsr, k, fmul(fmul(scale, tg_ld(pr, k)), fsub(tg_ld(dpr, k), fd)));
}

template <class TS, class TP>
static void launch_softmax(const tg_cuda_op_args *a, int64_t rows, int64_t H, int64_t T) {
    const unsigned blocks = (unsigned)((rows * 32 + SM_THREADS - 1) / SM_THREADS);
    attn_softmax_kernel<TS, TP><<<blocks, SM_THREADS, 0, a->ctx->stream>>>(
        (const TS *)a->in[0], (const float *)a->in[1], (TP *)a->out[0], rows, H, T, a->op->i[3] != 0, a->op->f[0]);
}

int tg_launch_attn_softmax(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t B = a->op->i[0], H = a->op->i[1], T = a->op->i[2];
    const int64_t rows = B * H * T;
    if (rows <= 0) return 0;
    const int s_bf16 = a->in_dtype[0] == TG_BF16, p_bf16 = a->out_dtype[0] == TG_BF16;
    if (!p_bf16 && s_bf16) /* tg_check_dtypes refuses it; never read bf16 as float */
        return tg_fail(err, "unsupported dtypes scores=bf16 probs=%s", tg_dtype_name(a->out_dtype[0]));
    if (s_bf16)
        launch_softmax<tg_bf16, tg_bf16>(a, rows, H, T);
    else if (p_bf16)
        launch_softmax<float, tg_bf16>(a, rows, H, T);
    else
        launch_softmax<float, float>(a, rows, H, T);
    return 0;
}

int tg_launch_attn_softmax_bwd(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t B = a->op->i[0], H = a->op->i[1], T = a->op->i[2];
    const int64_t rows = B * H * T;
    if (rows <= 0) return 0;
    const unsigned blocks = (unsigned)((rows * 32 + SM_THREADS - 1) / SM_THREADS);
    if (a->out_dtype[0] == TG_BF16)
        attn_softmax_bwd_kernel<tg_bf16><<<blocks, SM_THREADS, 0, a->ctx->stream>>>(
            (const tg_bf16 *)a->in[0], (const tg_bf16 *)a->in[1], (tg_bf16 *)a->out[0], rows, T, a->op->f[0]);
    else
        attn_softmax_bwd_kernel<float><<<blocks, SM_THREADS, 0, a->ctx->stream>>>(
            (const float *)a->in[0], (const float *)a->in[1], (float *)a->out[0], rows, T, a->op->f[0]);
    return 0;
}

/* ---- heads ------------------------------------------------------------------------ */

struct heads_parts {
    void *p[3];
};

/* Part blockIdx.y: unit e (V = one access of W elements) of [B,H,T,Dh] <->
 * x[(b*T+t), part*H*Dh + h*Dh + d]. Copies raw bits, so any element type works. */
template <class V, bool TO_HEADS>
__global__ void __launch_bounds__(HD_THREADS)
heads_kernel(void *x, heads_parts parts, int64_t B, int64_t T, int64_t H, int64_t DhW, int64_t P) {
    /* Selected with constant indices: a run-time index into a kernel-parameter array
     * would copy it to local memory. */
    void *part_ptr = blockIdx.y == 0 ? parts.p[0] : blockIdx.y == 1 ? parts.p[1] : parts.p[2];
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

/* Access of `vb` bytes: 16 (float4 / 8 bf16), 8 (4 bf16), or one element (4 or 2). */
template <bool TO_HEADS>
static int launch_heads(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t B = a->op->i[0], T = a->op->i[1], H = a->op->i[2], Dh = a->op->i[3];
    const int64_t P = a->op->i[4] < 1 ? 1 : a->op->i[4];
    if (P > 3) return tg_fail(err, "P = %lld (must be 1..3)", (long long)P);
    if (B * T * H * Dh <= 0) return 0;
    const unsigned es = (TO_HEADS ? a->in_dtype[0] : a->out_dtype[0]) == TG_BF16 ? 2 : 4;
    void *x = TO_HEADS ? a->in[0] : a->out[0];
    heads_parts parts = {{NULL, NULL, NULL}};
    unsigned vb = 16;
    for (int p = 0; p < P; p++) parts.p[p] = TO_HEADS ? a->out[p] : a->in[p];
    for (; vb > es; vb /= 2) {
        int ok = (Dh * es) % vb == 0 && tg_aligned(x, vb);
        for (int p = 0; p < P; p++) ok = ok && tg_aligned(parts.p[p], vb);
        if (ok) break;
    }
    const int64_t DhW = Dh * es / vb;
    const dim3 grid(tg_blocks(B * H * T * DhW, HD_THREADS), (unsigned)P);
    cudaStream_t st = a->ctx->stream;
    switch (vb) {
    case 16: heads_kernel<uint4, TO_HEADS><<<grid, HD_THREADS, 0, st>>>(x, parts, B, T, H, DhW, P); break;
    case 8: heads_kernel<uint2, TO_HEADS><<<grid, HD_THREADS, 0, st>>>(x, parts, B, T, H, DhW, P); break;
    case 4: heads_kernel<uint32_t, TO_HEADS><<<grid, HD_THREADS, 0, st>>>(x, parts, B, T, H, DhW, P); break;
    default: heads_kernel<uint16_t, TO_HEADS><<<grid, HD_THREADS, 0, st>>>(x, parts, B, T, H, DhW, P); break;
    }
    return 0;
}

int tg_launch_heads_split(const tg_cuda_op_args *a, tg_err *err) { return launch_heads<true>(a, err); }
int tg_launch_heads_merge(const tg_cuda_op_args *a, tg_err *err) { return launch_heads<false>(a, err); }
