/* ATTN_SOFTMAX(_BWD) and HEADS_SPLIT / HEADS_MERGE.
 *
 * Softmax: one warp per row of T keys (rows are <= a few KB, so the three passes over
 * the scores after the first hit L1): max over kept keys of scale*s in float, then
 * expf(scale*s - max) summed in double, as on the CPU, then p = e * (float)(1/sum).
 * Masked keys (mask 0, or k > q when causal) are written as exactly 0; a row with no
 * kept key is all zeros. The backward's dot(dP, P) is a double warp sum. Warp sums use a
 * fixed butterfly, so results are deterministic.
 *
 * Attention dropout is fused in (plan/ops.h): the forward's last pass writes
 * P and the dropped D = P * keep / (1 - p) together, and the backward applies the same
 * mask to dD as it reads it, so the [B,H,T,T] tensor makes no extra round trip. With
 * dropout on, those passes hand each lane 4 consecutive elements of the flat index (half
 * of one of dropout's Philox blocks, kernels/philox.h); the mask is bit for bit the
 * DROPOUT kernel's, as on the CPU.
 *
 * Storage: scores float (or bf16), probs float or bf16 (bf16 plans keep the scores
 * fp32); the backward's dprobs, probs and dscores share one type. bf16 values are
 * widened on load and rounded on store; all arithmetic is the fp32 kernel's.
 *
 * Heads split/merge are pure copies of raw bits (bitwise for any dtype), one thread per
 * 16 bytes of the [B,H,T,Dh] parts when the head rows allow it (8 bytes, then one
 * element, otherwise); blockIdx.y picks the part. */
#include "kernels/cuda_common.cuh"
#include "kernels/philox.h"

#define SM_THREADS 256 /* 8 rows per block */
#define HD_THREADS 256

/* ---- softmax ---------------------------------------------------------------------- */

/* The fused attention dropout: keep = tg_dropout_uniform(seed, step, key, element) >= p
 * with element the flat index row*T + k, kept value fmul(x, scale), as the DROPOUT kernel. */
struct sm_drop {
    uint64_t seed;
    uint32_t key;
    float p, scale;
    int on;  /* 0: no mask (D = P, dP = dD) */
    int vec; /* T % 4 == 0 and every [B,H,T,T] slot aligned to 4 elements: one access per block */
};

/* Scores TS, probs TP (float/float, or float/T and T/T in bf16 and fp16 plans, T the 16-bit type); the
 * dropped probs D (optional) have P's type. */
template <class TS, class TP>
__global__ void __launch_bounds__(SM_THREADS)
attn_softmax_kernel(const TS *__restrict__ s, const float *__restrict__ mask, const float *__restrict__ step_ptr,
                    TP *__restrict__ P, TP *__restrict__ D, int64_t rows, int64_t H, int64_t T, int causal, float scale,
                    sm_drop drop) {
    const int lane = threadIdx.x & 31;
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= rows) return;
    const int64_t q = row % T, bi = row / (T * H);
    const TS *sr = s + row * T;
    const float *mr = mask ? mask + bi * T : NULL;
    TP *pr = P + row * T;
    TP *dr = D ? D + row * T : NULL;
    const int64_t kend = causal ? q + 1 : T;
    float mx = -INFINITY;
    for (int64_t k = lane; k < kend; k += 32)
        if (!mr || mr[k] != 0.0f) mx = fmaxf(mx, fmul(scale, tg_ld(sr, k)));
    mx = warp_max_f(mx);
    if (mx == -INFINITY) { /* no kept key: P = D = 0 */
        for (int64_t k = lane; k < T; k += 32) {
            tg_st(pr, k, 0.0f);
            if (dr) tg_st(dr, k, 0.0f);
        }
        return;
    }
    double sum = 0;
    for (int64_t k = lane; k < kend; k += 32)
        if (!mr || mr[k] != 0.0f) sum += (double)expf(fsub(fmul(scale, tg_ld(sr, k)), mx));
    const float inv = (float)(1.0 / warp_sum_d(sum));
    if (!drop.on) {
        for (int64_t k = lane; k < T; k += 32) {
            float v = 0.0f;
            if (k < kend && (!mr || mr[k] != 0.0f)) v = fmul(expf(fsub(fmul(scale, tg_ld(sr, k)), mx)), inv);
            tg_st(pr, k, v);
            if (dr) tg_st(dr, k, v); /* eval mode or p == 0: D = P */
        }
        return;
    }
    /* Dropout: each lane takes groups of 4 consecutive elements of the flat [B,H,T,T]
     * index (tg_dropout_uniform4); D comes from the float P. With T % 4 == 0 the groups
     * are row-aligned and move as one access each (drop.vec). */
    const uint64_t step = tg_dropout_step(step_ptr);
    const int64_t e0 = row * T, b0 = e0 >> 2, b1 = (e0 + T - 1) >> 2;
    for (int64_t blk = b0 + lane; blk <= b1; blk += 32) {
        float u[4];
        tg_dropout_uniform4(drop.seed, step, drop.key, (uint64_t)blk, u);
        const int64_t kb = blk * 4 - e0; /* row index of the block's element 0 (may be < 0) */
        if (drop.vec) {
            float sv[4], pv[4], dv[4];
            tg_vec<TS, 4>::load(sr, kb >> 2, sv);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int64_t k = kb + j;
                float v = 0.0f;
                if (k < kend && (!mr || mr[k] != 0.0f)) v = fmul(expf(fsub(fmul(scale, sv[j]), mx)), inv);
                pv[j] = v;
                dv[j] = u[j] >= drop.p ? fmul(v, drop.scale) : 0.0f;
            }
            tg_vec<TP, 4>::store(pr, kb >> 2, pv);
            tg_vec<TP, 4>::store(dr, kb >> 2, dv);
            continue;
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t k = kb + j;
            if (k < 0 || k >= T) continue;
            float v = 0.0f;
            if (k < kend && (!mr || mr[k] != 0.0f)) v = fmul(expf(fsub(fmul(scale, tg_ld(sr, k)), mx)), inv);
            tg_st(pr, k, v);
            tg_st(dr, k, u[j] >= drop.p ? fmul(v, drop.scale) : 0.0f);
        }
    }
}

/* dP = dD * keep / (1 - p) (or dD), formed on the fly in both passes. */
template <class T_>
__global__ void __launch_bounds__(SM_THREADS)
attn_softmax_bwd_kernel(const T_ *__restrict__ dD, const T_ *__restrict__ P, const float *__restrict__ step_ptr,
                        T_ *__restrict__ ds, int64_t rows, int64_t T, float scale, sm_drop drop) {
    const int lane = threadIdx.x & 31;
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= rows) return;
    const T_ *dpr = dD + row * T, *pr = P + row * T;
    T_ *dsr = ds + row * T;
    if (!drop.on) {
        double dot = 0;
        for (int64_t k = lane; k < T; k += 32) dot += (double)fmul(tg_ld(dpr, k), tg_ld(pr, k));
        const float fd = (float)warp_sum_d(dot);
        for (int64_t k = lane; k < T; k += 32)
            tg_st(dsr, k, fmul(fmul(scale, tg_ld(pr, k)), fsub(tg_ld(dpr, k), fd)));
        return;
    }
    /* Whole Philox blocks per lane as in the forward (the mask is drawn in both passes);
     * one access per block when T % 4 == 0 (drop.vec). */
    const uint64_t step = tg_dropout_step(step_ptr);
    const int64_t e0 = row * T, b0 = e0 >> 2, b1 = (e0 + T - 1) >> 2;
    double dot = 0;
    for (int64_t blk = b0 + lane; blk <= b1; blk += 32) {
        float u[4];
        tg_dropout_uniform4(drop.seed, step, drop.key, (uint64_t)blk, u);
        const int64_t kb = blk * 4 - e0;
        if (drop.vec) {
            float dv[4], pv[4];
            tg_vec<T_, 4>::load(dpr, kb >> 2, dv);
            tg_vec<T_, 4>::load(pr, kb >> 2, pv);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float dp = u[j] >= drop.p ? fmul(dv[j], drop.scale) : 0.0f;
                dot += (double)fmul(dp, pv[j]);
            }
            continue;
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t k = kb + j;
            if (k < 0 || k >= T) continue;
            const float dp = u[j] >= drop.p ? fmul(tg_ld(dpr, k), drop.scale) : 0.0f;
            dot += (double)fmul(dp, tg_ld(pr, k));
        }
    }
    const float fd = (float)warp_sum_d(dot);
    for (int64_t blk = b0 + lane; blk <= b1; blk += 32) {
        float u[4];
        tg_dropout_uniform4(drop.seed, step, drop.key, (uint64_t)blk, u);
        const int64_t kb = blk * 4 - e0;
        if (drop.vec) {
            float dv[4], pv[4], out[4];
            tg_vec<T_, 4>::load(dpr, kb >> 2, dv);
            tg_vec<T_, 4>::load(pr, kb >> 2, pv);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float dp = u[j] >= drop.p ? fmul(dv[j], drop.scale) : 0.0f;
                out[j] = fmul(fmul(scale, pv[j]), fsub(dp, fd));
            }
            tg_vec<T_, 4>::store(dsr, kb >> 2, out);
            continue;
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t k = kb + j;
            if (k < 0 || k >= T) continue;
            const float dp = u[j] >= drop.p ? fmul(tg_ld(dpr, k), drop.scale) : 0.0f;
            tg_st(dsr, k, fmul(fmul(scale, tg_ld(pr, k)), fsub(dp, fd)));
        }
    }
}

/* The op's dropout parameters (key and p, from the caller: the forward's and the
 * backward's parameter sets both hold them); off in eval mode, for p == 0, or without the
 * step counter / the output it applies to. */
static sm_drop softmax_drop(const tg_cuda_op_args *a, int64_t key, float p, int applies) {
    sm_drop d;
    d.seed = a->ctx->seed;
    d.key = (uint32_t)key;
    d.p = p;
    d.scale = d.p < 1.0f ? 1.0f / (1.0f - d.p) : 0.0f; /* the CPU's expression */
    d.on = applies && a->training && d.p > 0.0f && a->in[2] != NULL;
    d.vec = 0;
    return d;
}

/* Rows start on a 4-element boundary when T % 4 == 0; then each group of 4 draws is one
 * 4-element access if the slots are aligned to it. */
static int softmax_vec(int64_t T, const void *const *ptrs, const int *elem_bytes, int n) {
    if (T % 4 != 0) return 0;
    for (int i = 0; i < n; i++)
        if (ptrs[i] && !tg_aligned(ptrs[i], 4u * (unsigned)elem_bytes[i])) return 0;
    return 1;
}

template <class TS, class TP>
static void launch_softmax(const tg_cuda_op_args *a, int64_t rows, int64_t H, int64_t T) {
    const unsigned blocks = (unsigned)((rows * 32 + SM_THREADS - 1) / SM_THREADS);
    const tg_softmax_params *sp = &a->op->p.softmax;
    sm_drop drop = softmax_drop(a, sp->key, sp->p, a->out[1] != NULL);
    const void *ptrs[3] = {a->in[0], a->out[0], a->out[1]};
    const int sizes[3] = {(int)sizeof(TS), (int)sizeof(TP), (int)sizeof(TP)};
    drop.vec = softmax_vec(T, ptrs, sizes, 3);
    attn_softmax_kernel<TS, TP><<<blocks, SM_THREADS, 0, a->ctx->stream>>>(
        (const TS *)a->in[0], (const float *)a->in[1], (const float *)a->in[2], (TP *)a->out[0], (TP *)a->out[1], rows,
        H, T, sp->causal != 0, sp->scale, drop);
}

int tg_launch_attn_softmax(const tg_cuda_op_args *a, tg_err *err) {
    const tg_softmax_params *sp = &a->op->p.softmax;
    const int64_t B = sp->b, H = sp->h, T = sp->t;
    const int64_t rows = B * H * T;
    if (rows <= 0) return 0;
    const int sd = a->in_dtype[0], pd = a->out_dtype[0];
    if (sd != TG_F32 && sd != pd) /* tg_check_dtypes refuses it; never read 16 bits as another type */
        return tg_fail(err, "unsupported dtypes scores=%s probs=%s", tg_dtype_name(sd), tg_dtype_name(pd));
    if (sd == TG_BF16)
        launch_softmax<tg_bf16, tg_bf16>(a, rows, H, T);
    else if (sd == TG_F16)
        launch_softmax<tg_f16, tg_f16>(a, rows, H, T);
    else if (pd == TG_BF16)
        launch_softmax<float, tg_bf16>(a, rows, H, T);
    else if (pd == TG_F16)
        launch_softmax<float, tg_f16>(a, rows, H, T);
    else
        launch_softmax<float, float>(a, rows, H, T);
    return 0;
}

int tg_launch_attn_softmax_bwd(const tg_cuda_op_args *a, tg_err *err) {
    const tg_softmax_bwd_params *sp = &a->op->p.softmax_bwd;
    const int64_t B = sp->b, H = sp->h, T = sp->t;
    const int64_t rows = B * H * T;
    if (rows <= 0) return 0;
    const unsigned blocks = (unsigned)((rows * 32 + SM_THREADS - 1) / SM_THREADS);
    sm_drop drop = softmax_drop(a, sp->key, sp->p, 1);
    const float *step = (const float *)a->in[2];
    const int es = tg_storage_bytes(a->out_dtype[0]);
    const void *ptrs[3] = {a->in[0], a->in[1], a->out[0]};
    const int sizes[3] = {es, es, es};
    drop.vec = softmax_vec(T, ptrs, sizes, 3);
    if (a->out_dtype[0] == TG_BF16)
        attn_softmax_bwd_kernel<tg_bf16><<<blocks, SM_THREADS, 0, a->ctx->stream>>>(
            (const tg_bf16 *)a->in[0], (const tg_bf16 *)a->in[1], step, (tg_bf16 *)a->out[0], rows, T, sp->scale,
            drop);
    else if (a->out_dtype[0] == TG_F16)
        attn_softmax_bwd_kernel<tg_f16><<<blocks, SM_THREADS, 0, a->ctx->stream>>>(
            (const tg_f16 *)a->in[0], (const tg_f16 *)a->in[1], step, (tg_f16 *)a->out[0], rows, T, sp->scale,
            drop);
    else
        attn_softmax_bwd_kernel<float><<<blocks, SM_THREADS, 0, a->ctx->stream>>>(
            (const float *)a->in[0], (const float *)a->in[1], step, (float *)a->out[0], rows, T, sp->scale, drop);
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

/* Access of `vb` bytes: 16 (float4 / 8 16-bit), 8 (4 16-bit), or one element (4 or 2). */
template <bool TO_HEADS>
static int launch_heads(const tg_cuda_op_args *a, tg_err *err) {
    const tg_heads_params *hp = &a->op->p.heads;
    const int64_t B = hp->b, T = hp->t, H = hp->h, Dh = hp->head_dim;
    const int64_t P = hp->parts < 1 ? 1 : hp->parts;
    if (P > 3) return tg_fail(err, "P = %lld (must be 1..3)", (long long)P);
    if (B * T * H * Dh <= 0) return 0;
    const unsigned es = (unsigned)tg_storage_bytes(TO_HEADS ? a->in_dtype[0] : a->out_dtype[0]);
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
