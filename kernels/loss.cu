/* SELECT_TOKEN(_BWD), CROSS_ENTROPY(_BWD).
 *
 * Select: a block per sequence finds the selected token with a max-reduction over t
 * (the largest t whose id is not the pad id, 0 if none) and copies the row; the
 * backward's blocks each recompute it and write dout there, zeros elsewhere. Bitwise.
 *
 * Cross entropy: rows can be 50257 wide and 16384 deep, so one block per row makes one
 * online pass with 16-byte loads where rows allow: each thread keeps a running float max
 * and a double sum of expf(x - max) (rescaled in double when the max grows, once per
 * vector), combined over the block in a fixed tree; lse = log(sum) + max in double, as the CPU's. Accumulating the float
 * exponentials in double keeps lse accurate where it matters (softmax near 1).
 * Each thread loads CE_UNROLL vectors before it works on them (its chunks in the same
 * order as one at a time, so the same bits), which keeps enough bytes in flight for the
 * bandwidth at the occupancy the double sums leave.
 * The forward writes one double loss per row to scratch and a single block adds them in
 * a fixed order and divides by the number of counted rows (labels in [0, C); -100 and
 * other out-of-range labels are ignored, as on the CPU), and, when the plan keeps it, the
 * row's lse as hi + lo floats. The backward first computes coef = dloss / n_valid in one
 * tiny block (the CPU's float), then per row writes coef * (softmax - onehot), with the
 * forward's lse when given (one pass over the logits instead of two); the label's entry is
 * computed in double to avoid the cancellation of p - 1 when p is close to 1.
 *
 * Span loss (question answering): the rows are short (T positions of one side, read with
 * stride 2 from the [B*T, 2] logits), so the forward is one block that takes the 2B rows in
 * order, each reduced over the block (max, then a double sum of exp(x - max)), and adds
 * the row losses in double in that order; no scratch. The backward has a block per (row,
 * side) that counts its side's counted rows itself and writes coef * (softmax - onehot)
 * in double, coef = dloss / 2 / n_side in float as on the CPU.
 *
 * Storage: the selected rows and their gradients, logits and dlogits are T (float, or
 * bf16 in bf16 plans: widened on load, rounded on store; select copies are bitwise);
 * loss, dloss and all accumulation stay fp32/double. */
#include "kernels/cuda_common.cuh"

#define SEL_THREADS 256
#define SEL_CHUNK 4096 /* elements of dx per backward block */
#define FIN_THREADS 1024
#define CE_UNROLL 4 /* vectors a thread loads before using them */

/* ---- select token ----------------------------------------------------------------- */

/* Selected token of sequence b, returned to every thread of the block. */
static __device__ int selected_token(const int *__restrict__ ids, int64_t b, int64_t T, int last_non_pad, int pad) {
    __shared__ int s_red[32];
    if (!last_non_pad) return 0;
    int best = -1;
    for (int64_t t = threadIdx.x; t < T; t += blockDim.x)
        if (ids[b * T + t] != pad) best = (int)t;
    for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) s_red[warp] = best;
    __syncthreads();
    int r = -1;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) r = max(r, s_red[w]);
    __syncthreads();
    return r < 0 ? 0 : r;
}

/* TV: the storage type (float, bf16 or half), copied as is (bitwise). */
template <class TV>
__global__ void __launch_bounds__(SEL_THREADS)
select_kernel(const TV *__restrict__ x, const int *__restrict__ ids, TV *__restrict__ y, int64_t T, int64_t D,
              int last_non_pad, int pad) {
    const int64_t b = blockIdx.x;
    const int64_t t = selected_token(ids, b, T, last_non_pad, pad);
    const TV *src = x + (b * T + t) * D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) y[b * D + d] = src[d];
}

/* grid (chunks of T*D, B) */
template <class TV>
__global__ void __launch_bounds__(SEL_THREADS)
select_bwd_kernel(const TV *__restrict__ dy, const int *__restrict__ ids, TV *__restrict__ dx, int64_t T, int64_t D,
                  int last_non_pad, int pad) {
    const int64_t b = blockIdx.y;
    const int64_t sel = selected_token(ids, b, T, last_non_pad, pad);
    const int64_t e0 = (int64_t)blockIdx.x * SEL_CHUNK, e1 = min(e0 + SEL_CHUNK, T * D);
    for (int64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
        const int64_t t = e / D;
        if (t == sel)
            dx[b * T * D + e] = dy[b * D + (e - t * D)];
        else
            tg_st(dx, b * T * D + e, 0.0f);
    }
}

int tg_launch_select_token(const tg_cuda_op_args *a, tg_err *err) {
    const tg_select_params *sp = &a->op->p.select;
    const int64_t B = sp->b, T = sp->t, D = sp->d;
    if (B <= 0 || T <= 0 || D <= 0) return 0;
    if (B > INT32_MAX) return tg_fail(err, "batch %lld too large", (long long)B);
    const int last = sp->mode == TG_SELECT_LAST_NON_PAD && a->in[1];
    const int *ids = (const int *)a->in[1];
    if (a->out_dtype[0] == TG_BF16)
        select_kernel<tg_bf16><<<(unsigned)B, SEL_THREADS, 0, a->ctx->stream>>>(
            (const tg_bf16 *)a->in[0], ids, (tg_bf16 *)a->out[0], T, D, last, (int)sp->pad_id);
    else if (a->out_dtype[0] == TG_F16)
        select_kernel<tg_f16><<<(unsigned)B, SEL_THREADS, 0, a->ctx->stream>>>(
            (const tg_f16 *)a->in[0], ids, (tg_f16 *)a->out[0], T, D, last, (int)sp->pad_id);
    else
        select_kernel<float><<<(unsigned)B, SEL_THREADS, 0, a->ctx->stream>>>(
            (const float *)a->in[0], ids, (float *)a->out[0], T, D, last, (int)sp->pad_id);
    return 0;
}

int tg_launch_select_token_bwd(const tg_cuda_op_args *a, tg_err *err) {
    const tg_select_params *sp = &a->op->p.select;
    const int64_t B = sp->b, T = sp->t, D = sp->d;
    if (B <= 0 || T <= 0 || D <= 0) return 0;
    if (B > 65535) return tg_fail(err, "batch %lld exceeds the grid", (long long)B);
    const int last = sp->mode == TG_SELECT_LAST_NON_PAD && a->in[1];
    const dim3 grid((unsigned)((T * D + SEL_CHUNK - 1) / SEL_CHUNK), (unsigned)B);
    const int *ids = (const int *)a->in[1];
    if (a->out_dtype[0] == TG_BF16)
        select_bwd_kernel<tg_bf16><<<grid, SEL_THREADS, 0, a->ctx->stream>>>(
            (const tg_bf16 *)a->in[0], ids, (tg_bf16 *)a->out[0], T, D, last, (int)sp->pad_id);
    else if (a->out_dtype[0] == TG_F16)
        select_bwd_kernel<tg_f16><<<grid, SEL_THREADS, 0, a->ctx->stream>>>(
            (const tg_f16 *)a->in[0], ids, (tg_f16 *)a->out[0], T, D, last, (int)sp->pad_id);
    else
        select_bwd_kernel<float><<<grid, SEL_THREADS, 0, a->ctx->stream>>>(
            (const float *)a->in[0], ids, (float *)a->out[0], T, D, last, (int)sp->pad_id);
    return 0;
}

/* ---- cross entropy ---------------------------------------------------------------- */

int64_t tg_scratch_cross_entropy(const tg_op *op) {
    const int64_t n = op->p.cross_entropy.n;
    return n > 0 ? 2 * n : 0;
}
int64_t tg_scratch_cross_entropy_bwd(const tg_op *op) { return 4; }

static __device__ __forceinline__ int ce_counted(int label, int64_t C) { return label >= 0 && label < C; }

/* log(sum_c exp(x_c)) over the first V of a row, in double, returned to every thread.
 * W elements per access (W = 1, or a 16-byte vector when the row allows it: C % W == 0
 * and the base aligned): each thread takes the max of its W values, rescales its running
 * double sum once if that max is new, and adds the W float exponentials as one float
 * partial, so the per-element work is float only. */
/* Calls f(v, k) on each chunk k of W values this thread owns (k = threadIdx.x + j BS,
 * chunks in all), in order, loading CE_UNROLL chunks before using them. */
template <int BS, int W, class TX, class F>
static __device__ __forceinline__ void ce_chunks(const TX *__restrict__ x, int64_t chunks, F f) {
    int64_t k = threadIdx.x;
    for (; k + (CE_UNROLL - 1) * BS < chunks; k += CE_UNROLL * BS) {
        float v[CE_UNROLL][W];
#pragma unroll
        for (int u = 0; u < CE_UNROLL; u++) tg_vec<TX, W>::load(x, k + u * BS, v[u]);
#pragma unroll
        for (int u = 0; u < CE_UNROLL; u++) f(v[u], k + u * BS);
    }
    for (; k < chunks; k += BS) {
        float v[W];
        tg_vec<TX, W>::load(x, k, v);
        f(v, k);
    }
}

/* Folds W values (chunk k of the row) into a thread's running (max m, double sum s). */
template <int W>
static __device__ __forceinline__ void lse_fold(float (&v)[W], int64_t k, int64_t V, float &m, double &s) {
    float cm = -INFINITY;
#pragma unroll
    for (int i = 0; i < W; i++) {
        if (k * W + i >= V) v[i] = -INFINITY; /* padding columns */
        cm = fmaxf(cm, v[i]);
    }
    if (cm == -INFINITY) return;
    if (cm > m) {
        s = m == -INFINITY ? 0.0 : s * exp((double)m - (double)cm);
        m = cm;
    }
    float cs = 0.0f;
#pragma unroll
    for (int i = 0; i < W; i++) cs += expf(v[i] - m);
    s += (double)cs;
}

template <int BS, int W, class TX>
static __device__ double row_lse(const TX *__restrict__ x, int64_t C, int64_t V) {
    __shared__ float s_m[32];
    __shared__ double s_s[32];
    float m = -INFINITY;
    double s = 0.0;
    ce_chunks<BS, W>(x, (W == 1 ? V : C) / W, [&](float(&v)[W], int64_t k) { lse_fold<W>(v, k, V, m, s); });
    /* The block's max first, then each thread's sum rescaled to it once (one double exp
     * a thread) and summed in a fixed tree: log(sum) + max, in double. */
    const float bm = block_max_f<BS>(m, s_m);
    const double ts = m == -INFINITY ? 0.0 : s * exp((double)m - (double)bm);
    const double bs = block_sum_d<BS>(ts, s_s);
    return log(bs) + (double)bm;
}

template <int BS, int W, class TX>
__global__ void __launch_bounds__(BS)
ce_fwd_rows(const TX *__restrict__ logits, const int *__restrict__ labels, double *__restrict__ row_loss,
            float *__restrict__ lse_out, int64_t C, int64_t V) {
    const int64_t n = blockIdx.x;
    const int l = labels[n];
    if (!ce_counted(l, V)) {
        if (threadIdx.x == 0) row_loss[n] = 0.0;
        if (threadIdx.x == 0 && lse_out) lse_out[2 * n] = lse_out[2 * n + 1] = 0.0f;
        return;
    }
    const TX *x = logits + n * C;
    const double lse = row_lse<BS, W>(x, C, V);
    if (threadIdx.x == 0) row_loss[n] = lse - (double)tg_ld(x, l);
    if (threadIdx.x == 0 && lse_out) {
        const float hi = (float)lse;
        lse_out[2 * n] = hi, lse_out[2 * n + 1] = (float)(lse - (double)hi);
    }
}

/* The summed loss's divisor: the optional normaliser where positive (grad_accumulation's
 * window count, plan/ops.def), else the rows that count. */
static __device__ double ce_divisor(const float *norm, int valid) {
    return norm && norm[0] > 0.0f ? (double)norm[0] : (double)valid;
}

__global__ void __launch_bounds__(FIN_THREADS)
ce_fwd_final(const double *__restrict__ row_loss, const int *__restrict__ labels, const float *__restrict__ norm,
             float *__restrict__ loss, int64_t N, int64_t C) {
    __shared__ double s_d[32];
    __shared__ int s_i[32];
    double s = 0;
    int valid = 0;
    for (int64_t n = threadIdx.x; n < N; n += FIN_THREADS) {
        s += row_loss[n];
        valid += ce_counted(labels[n], C);
    }
    s = block_sum_d<FIN_THREADS>(s, s_d);
    valid = block_sum_i<FIN_THREADS>(valid, s_i);
    if (threadIdx.x != 0) return;
    const double divisor = ce_divisor(norm, valid);
    loss[0] = divisor > 0 ? (float)(s / divisor) : 0.0f;
}

__global__ void __launch_bounds__(FIN_THREADS)
ce_bwd_coef(const float *__restrict__ dloss, const int *__restrict__ labels, const float *__restrict__ norm,
            float *__restrict__ coef, int64_t N, int64_t C) {
    __shared__ int s_i[32];
    int valid = 0;
    for (int64_t n = threadIdx.x; n < N; n += FIN_THREADS) valid += ce_counted(labels[n], C);
    valid = block_sum_i<FIN_THREADS>(valid, s_i);
    if (threadIdx.x != 0) return;
    const double divisor = ce_divisor(norm, valid);
    coef[0] = divisor > 0 ? (float)((double)dloss[0] / divisor) : 0.0f;
}

/* coef * (softmax - onehot) of chunk k's W logits, in place. */
template <int W>
static __device__ __forceinline__ void ce_grad(float (&v)[W], int64_t k, int l, int64_t V, float coef, double lse) {
#pragma unroll
    for (int i = 0; i < W; i++) {
        const int64_t c = k * W + i;
        v[i] = c >= V ? 0.0f /* padding columns */
               : c == l ? (float)((double)coef * (exp((double)v[i] - lse) - 1.0))
                        : fmul(coef, expf((float)((double)v[i] - lse)));
    }
}

template <int BS, int W, class TX>
__global__ void __launch_bounds__(BS)
ce_bwd_rows(const TX *__restrict__ logits, const int *__restrict__ labels, const float *__restrict__ coef_ptr,
            const float *__restrict__ lse_in, TX *__restrict__ dlogits, int64_t C, int64_t V) {
    const int64_t n = blockIdx.x;
    const int l = labels[n];
    const float coef = coef_ptr[0];
    TX *d = dlogits + n * C;
    const int64_t chunks = C / W; /* W == 1 or C % W == 0 */
    if (!ce_counted(l, V) || coef == 0.0f) {
        const float z[W] = {};
        for (int64_t k = threadIdx.x; k < chunks; k += BS) tg_vec<TX, W>::store(d, k, z);
        return;
    }
    const TX *x = logits + n * C;
    const double lse = lse_in ? (double)lse_in[2 * n] + (double)lse_in[2 * n + 1] : row_lse<BS, W>(x, C, V);
    ce_chunks<BS, W>(x, chunks, [&](float(&v)[W], int64_t k) {
        ce_grad<W>(v, k, l, V, coef, lse);
        tg_vec<TX, W>::store(d, k, v);
    });
}

/* 16-byte accesses when every row starts aligned to them. */
template <class TX>
static int ce_vec_ok(const void *p, const void *q, int64_t C) {
    const int w = 16 / (int)sizeof(TX);
    return C % w == 0 && tg_aligned16(p) && (!q || tg_aligned16(q));
}

template <int BS, class TX>
static void launch_ce_fwd_bs(const TX *x, const int *labels, double *row_loss, float *lse, int64_t N, int64_t C,
                             int64_t V, int vec, cudaStream_t st) {
    constexpr int W = 16 / sizeof(TX);
    if (vec)
        ce_fwd_rows<BS, W, TX><<<(unsigned)N, BS, 0, st>>>(x, labels, row_loss, lse, C, V);
    else
        ce_fwd_rows<BS, 1, TX><<<(unsigned)N, BS, 0, st>>>(x, labels, row_loss, lse, C, V);
}

template <class TX>
static void launch_ce_fwd(const void *logits, const int *labels, double *row_loss, float *lse, int64_t N, int64_t C,
                          int64_t V, cudaStream_t st) {
    const TX *x = (const TX *)logits;
    const int vec = ce_vec_ok<TX>(logits, NULL, C);
    if (C >= 4096)
        launch_ce_fwd_bs<512, TX>(x, labels, row_loss, lse, N, C, V, vec, st);
    else if (C >= 256)
        launch_ce_fwd_bs<128, TX>(x, labels, row_loss, lse, N, C, V, vec, st);
    else
        launch_ce_fwd_bs<32, TX>(x, labels, row_loss, lse, N, C, V, vec, st);
}

/* Classes that count: classes when set (rows padded to c for aligned GEMMs), else c. Both
 * kinds use the cross_entropy set. */
static int64_t ce_classes(const tg_op *op) {
    const tg_cross_entropy_params *ce = &op->p.cross_entropy;
    return ce->classes > 0 ? ce->classes : ce->c;
}

int tg_launch_cross_entropy(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t N = a->op->p.cross_entropy.n, C = a->op->p.cross_entropy.c;
    float *loss = (float *)a->out[0];
    if (N <= 0 || C <= 0) {
        cudaError_t e = cudaMemsetAsync(loss, 0, 4, a->ctx->stream);
        return e == cudaSuccess ? 0 : tg_fail(err, "cudaMemsetAsync: %s", cudaGetErrorString(e));
    }
    if (N > INT32_MAX) return tg_fail(err, "%lld rows exceed the grid", (long long)N);
    if (tg_scratch_check(a, tg_scratch_cross_entropy(a->op), err)) return -1;
    const int *labels = (const int *)a->in[1];
    double *row_loss = (double *)a->ctx->reduce_scratch;
    cudaStream_t st = a->ctx->stream;
    const int64_t V = ce_classes(a->op);
    float *lse = (float *)a->out[1]; /* optional (ops.def) */
    if (a->in_dtype[0] == TG_BF16)
        launch_ce_fwd<tg_bf16>(a->in[0], labels, row_loss, lse, N, C, V, st);
    else if (a->in_dtype[0] == TG_F16)
        launch_ce_fwd<tg_f16>(a->in[0], labels, row_loss, lse, N, C, V, st);
    else
        launch_ce_fwd<float>(a->in[0], labels, row_loss, lse, N, C, V, st);
    ce_fwd_final<<<1, FIN_THREADS, 0, st>>>(row_loss, labels, (const float *)a->in[2], loss, N, V);
    return 0;
}

template <int BS, class TX>
static void launch_ce_bwd_bs(const TX *x, const int *labels, const float *coef, const float *lse, TX *d, int64_t N,
                             int64_t C, int64_t V, int vec, cudaStream_t st) {
    constexpr int W = 16 / sizeof(TX);
    if (vec)
        ce_bwd_rows<BS, W, TX><<<(unsigned)N, BS, 0, st>>>(x, labels, coef, lse, d, C, V);
    else
        ce_bwd_rows<BS, 1, TX><<<(unsigned)N, BS, 0, st>>>(x, labels, coef, lse, d, C, V);
}

template <class TX>
static void launch_ce_bwd(const void *logits, const int *labels, const float *coef, const float *lse, void *dlogits,
                          int64_t N, int64_t C, int64_t V, cudaStream_t st) {
    const TX *x = (const TX *)logits;
    TX *d = (TX *)dlogits;
    const int vec = ce_vec_ok<TX>(logits, dlogits, C);
    if (C >= 4096)
        launch_ce_bwd_bs<512, TX>(x, labels, coef, lse, d, N, C, V, vec, st);
    else if (C >= 256)
        launch_ce_bwd_bs<128, TX>(x, labels, coef, lse, d, N, C, V, vec, st);
    else
        launch_ce_bwd_bs<32, TX>(x, labels, coef, lse, d, N, C, V, vec, st);
}

int tg_launch_cross_entropy_bwd(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t N = a->op->p.cross_entropy.n, C = a->op->p.cross_entropy.c;
    if (N <= 0 || C <= 0) return 0;
    if (N > INT32_MAX) return tg_fail(err, "%lld rows exceed the grid", (long long)N);
    if (tg_scratch_check(a, tg_scratch_cross_entropy_bwd(a->op), err)) return -1;
    const float *dloss = (const float *)a->in[0];
    const int *labels = (const int *)a->in[2];
    float *coef = a->ctx->reduce_scratch;
    cudaStream_t st = a->ctx->stream;
    const int64_t V = ce_classes(a->op);
    ce_bwd_coef<<<1, FIN_THREADS, 0, st>>>(dloss, labels, (const float *)a->in[3], coef, N, V);
    const float *lse = (const float *)a->in[4]; /* optional: the forward's row lse */
    if (a->out_dtype[0] == TG_BF16)
        launch_ce_bwd<tg_bf16>(a->in[1], labels, coef, lse, a->out[0], N, C, V, st);
    else if (a->out_dtype[0] == TG_F16)
        launch_ce_bwd<tg_f16>(a->in[1], labels, coef, lse, a->out[0], N, C, V, st);
    else
        launch_ce_bwd<float>(a->in[1], labels, coef, lse, a->out[0], N, C, V, st);
    return 0;
}

/* ---- span loss ------------------------------------------------------------------------ */

#define SPAN_THREADS 256

/* The position a row's side trains on, or -1 when ignored (HF clamps to [0, T], ignores T). */
static __device__ __forceinline__ int64_t span_target(int pos, int64_t T) { return pos < 0 ? 0 : pos < T ? pos : -1; }

/* log sum_t exp(x[2t]) over T positions (stride 2), returned to every thread. */
template <class TX>
static __device__ double span_lse(const TX *__restrict__ x, int64_t T) {
    __shared__ float s_m[SPAN_THREADS / 32];
    __shared__ double s_s[SPAN_THREADS / 32];
    __shared__ double s_lse;
    float m = -INFINITY;
    for (int64_t t = threadIdx.x; t < T; t += SPAN_THREADS) m = fmaxf(m, tg_ld(x, 2 * t));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) s_m[warp] = m;
    __syncthreads();
    m = s_m[0];
    for (int w = 1; w < SPAN_THREADS / 32; w++) m = fmaxf(m, s_m[w]);
    double s = 0.0;
    for (int64_t t = threadIdx.x; t < T; t += SPAN_THREADS) s += exp((double)tg_ld(x, 2 * t) - (double)m);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    if (lane == 0) s_s[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        for (int w = 0; w < SPAN_THREADS / 32; w++) total += s_s[w];
        s_lse = log(total) + (double)m;
    }
    __syncthreads();
    const double r = s_lse;
    __syncthreads();
    return r;
}

/* One side's divisor: the optional normaliser's entry where positive (grad_accumulation's
 * window count, plan/ops.def), else the side's counted rows. */
static __device__ double span_divisor(const float *norm, int side, int64_t counted) {
    return norm && norm[side] > 0.0f ? (double)norm[side] : (double)counted;
}

template <class TX>
__global__ void __launch_bounds__(SPAN_THREADS)
span_loss_fwd(const TX *__restrict__ logits, const int *__restrict__ pos, const float *__restrict__ norm,
              float *__restrict__ loss, int64_t B, int64_t T) {
    double total = 0.0; /* thread 0's */
    for (int side = 0; side < 2; side++) {
        double sum = 0.0;
        int64_t n = 0;
        for (int64_t b = 0; b < B; b++) {
            const int64_t p = span_target(pos[2 * b + side], T);
            if (p < 0) continue; /* the same for every thread */
            const TX *x = logits + b * T * 2 + side;
            const double lse = span_lse(x, T);
            sum += lse - (double)tg_ld(x, 2 * p);
            n++;
        }
        const double divisor = span_divisor(norm, side, n);
        if (divisor > 0) total += sum / divisor;
    }
    if (threadIdx.x == 0) loss[0] = (float)(total / 2);
}

/* grid (B, 2): block (b, side). */
template <class TX>
__global__ void __launch_bounds__(SPAN_THREADS)
span_loss_bwd(const float *__restrict__ dloss, const TX *__restrict__ logits, const int *__restrict__ pos,
              const float *__restrict__ norm, TX *__restrict__ dlogits, int64_t B, int64_t T) {
    const int64_t b = blockIdx.x;
    const int side = blockIdx.y;
    int64_t n = 0;
    for (int64_t r = 0; r < B; r++) n += span_target(pos[2 * r + side], T) >= 0;
    const double divisor = span_divisor(norm, side, n);
    const float coef = divisor > 0 ? (float)((double)dloss[0] / 2.0 / divisor) : 0.0f;
    const int64_t p = span_target(pos[2 * b + side], T);
    const TX *x = logits + b * T * 2 + side;
    TX *d = dlogits + b * T * 2 + side;
    if (p < 0 || coef == 0.0f) {
        for (int64_t t = threadIdx.x; t < T; t += SPAN_THREADS) tg_st(d, 2 * t, 0.0f);
        return;
    }
    const double lse = span_lse(x, T);
    for (int64_t t = threadIdx.x; t < T; t += SPAN_THREADS)
        tg_st(d, 2 * t, (float)((double)coef * (exp((double)tg_ld(x, 2 * t) - lse) - (t == p ? 1.0 : 0.0))));
}

int tg_launch_span_loss(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t B = a->op->p.span_loss.b, T = a->op->p.span_loss.t;
    float *loss = (float *)a->out[0];
    cudaStream_t st = a->ctx->stream;
    if (B <= 0 || T <= 0) {
        cudaError_t e = cudaMemsetAsync(loss, 0, 4, st);
        return e == cudaSuccess ? 0 : tg_fail(err, "cudaMemsetAsync: %s", cudaGetErrorString(e));
    }
    const int *pos = (const int *)a->in[1];
    const float *norm = (const float *)a->in[2];
    if (a->in_dtype[0] == TG_BF16)
        span_loss_fwd<tg_bf16><<<1, SPAN_THREADS, 0, st>>>((const tg_bf16 *)a->in[0], pos, norm, loss, B, T);
    else if (a->in_dtype[0] == TG_F16)
        span_loss_fwd<tg_f16><<<1, SPAN_THREADS, 0, st>>>((const tg_f16 *)a->in[0], pos, norm, loss, B, T);
    else
        span_loss_fwd<float><<<1, SPAN_THREADS, 0, st>>>((const float *)a->in[0], pos, norm, loss, B, T);
    return 0;
}

int tg_launch_span_loss_bwd(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t B = a->op->p.span_loss.b, T = a->op->p.span_loss.t;
    if (B <= 0 || T <= 0) return 0;
    if (B > INT32_MAX) return tg_fail(err, "batch %lld exceeds the grid", (long long)B);
    const dim3 grid((unsigned)B, 2);
    const float *dloss = (const float *)a->in[0];
    const int *pos = (const int *)a->in[2];
    const float *norm = (const float *)a->in[3];
    cudaStream_t st = a->ctx->stream;
    if (a->out_dtype[0] == TG_BF16)
        span_loss_bwd<tg_bf16><<<grid, SPAN_THREADS, 0, st>>>(dloss, (const tg_bf16 *)a->in[1], pos, norm,
                                                              (tg_bf16 *)a->out[0], B, T);
    else if (a->out_dtype[0] == TG_F16)
        span_loss_bwd<tg_f16><<<grid, SPAN_THREADS, 0, st>>>(dloss, (const tg_f16 *)a->in[1], pos, norm,
                                                              (tg_f16 *)a->out[0], B, T);
    else
        span_loss_bwd<float><<<grid, SPAN_THREADS, 0, st>>>(dloss, (const float *)a->in[1], pos, norm,
                                                            (float *)a->out[0], B, T);
    return 0;
}
