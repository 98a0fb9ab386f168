/* BATCHNORM and BATCHNORM_BWD on channels-last activations viewed as [M, C] (M = n hw rows,
 * plan/ops.def).
 *
 * Each is a per-channel sum over the M rows, then an elementwise pass. The sums: stage 1
 * gives each (32-channel tile, chunk of rows) block double partials (8 row lanes, added in
 * lane order through shared memory), stage 2 (a thread per channel) adds the chunks in
 * chunk order and finishes the channel's scalars into a table in the scratch, so results
 * are reproducible run to run. The forward's statistics are sums of x - x[0, c] and its
 * square (one pass over x; the shift by the channel's first value keeps the variance's
 * subtraction well conditioned, and the sums are doubles): mean = shift + s1 / M, var =
 * s2 / M - (s1 / M)^2. The elementwise passes use the CPU's float expressions with
 * non-contracting intrinsics. The executor's GEMM tuning pass (ctx->gemm_tune), whose results
 * are discarded, normalises as a training step does but leaves the running statistics. */
#include "kernels/cuda_common.cuh"

#define BN_TX 32       /* channels per stage-1 block */
#define BN_TY 8        /* row lanes per stage-1 block */
#define BN_BLOCKS 1056 /* stage-1 blocks aimed at (8 per SM of an H100) */
#define BN_THREADS 256

/* The stage-1 partition: a function of (M, C) alone, so the scratch formula and the launch
 * agree. */
typedef struct bn_grid {
    int64_t m, c, tiles, chunks, rows;
} bn_grid;

static bn_grid bn_grid_of(int64_t m, int64_t c) {
    bn_grid g = {m, c, (c + BN_TX - 1) / BN_TX, 1, m};
    int64_t chunks = (BN_BLOCKS + g.tiles - 1) / g.tiles;
    const int64_t most = (m + 8 * BN_TY - 1) / (8 * BN_TY); /* at least 8 rows a lane */
    if (chunks > most) chunks = most;
    if (chunks < 1) chunks = 1;
    if (chunks > 65535) chunks = 65535;
    g.rows = (m + chunks - 1) / chunks;
    g.chunks = m > 0 ? (m + g.rows - 1) / g.rows : 1;
    return g;
}

/* The scratch: partial sums [chunks][2][C] doubles, then the channel table [BN_TABLE][C]
 * floats. */
#define BN_TABLE 5

static int64_t bn_scratch_floats(int64_t m, int64_t c) {
    const bn_grid g = bn_grid_of(m, c);
    return 4 * g.chunks * c + BN_TABLE * c + 4;
}

extern "C" int64_t tg_scratch_batchnorm(const tg_op *op) {
    const tg_batchnorm_params *p = &op->p.batchnorm;
    return bn_scratch_floats(p->n * p->hw, p->c);
}

extern "C" int64_t tg_scratch_batchnorm_bwd(const tg_op *op) {
    const tg_batchnorm_bwd_params *p = &op->p.batchnorm_bwd;
    return bn_scratch_floats(p->n * p->hw, p->c);
}

/* ---- stage 1 ------------------------------------------------------------------------------ */

/* Forward: s1 = sum (x - x[0, c]), s2 = sum (x - x[0, c])^2. */
template <class T>
struct bn_stat_terms {
    const T *x;
    __device__ __forceinline__ void begin(int64_t c, int64_t C) { shift = (double)tg_ld(x, c); }
    __device__ __forceinline__ void terms(int64_t i, int64_t c, double &a, double &b) const {
        const double d = (double)tg_ld(x, i) - shift;
        a = d, b = d * d;
    }
    double shift;
};

/* dy, or 0 where the fused ReLU6's output y (NULL: none) is not in (0, 6): RELU6_BWD's rule. */
template <class T>
static __device__ __forceinline__ float bn_masked(float g, const T *y, int64_t i) {
    if (!y) return g;
    const float v = tg_ld(y, i);
    return v > 0.0f && v < 6.0f ? g : 0.0f;
}

/* Backward: sum dy and sum dy * xhat, xhat = (x - mean) * rstd in float, from the stats
 * (dy masked by the fused ReLU6's output y where there is one). */
template <class T>
struct bn_grad_terms {
    const T *dy, *x, *y;
    const float *stats;
    float eps;
    __device__ __forceinline__ void begin(int64_t c, int64_t C) {
        mean = stats[c];
        rstd = (float)(1.0 / sqrt((double)stats[C + c] + (double)eps));
    }
    __device__ __forceinline__ void terms(int64_t i, int64_t c, double &a, double &b) const {
        const float g = bn_masked(tg_ld(dy, i), y, i);
        a = (double)g, b = (double)g * (double)fmul(fsub(tg_ld(x, i), mean), rstd);
    }
    float mean, rstd;
};

template <class F>
__global__ void __launch_bounds__(BN_TX *BN_TY) bn_partial_kernel(F f, double *__restrict__ partial, bn_grid g) {
    __shared__ double sp[2][BN_TY][BN_TX];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t c = (int64_t)blockIdx.x * BN_TX + tx, chunk = blockIdx.y;
    double a = 0.0, b = 0.0;
    if (c < g.c) {
        f.begin(c, g.c);
        const int64_t r1 = min(g.m, (chunk + 1) * g.rows);
#pragma unroll 4
        for (int64_t r = chunk * g.rows + ty; r < r1; r += BN_TY) {
            double ta, tb;
            f.terms(r * g.c + c, c, ta, tb);
            a += ta, b += tb;
        }
    }
    sp[0][ty][tx] = a, sp[1][ty][tx] = b;
    __syncthreads();
    if (ty == 0 && c < g.c) {
        for (int l = 1; l < BN_TY; l++) a += sp[0][l][tx], b += sp[1][l][tx];
        partial[(chunk * 2) * g.c + c] = a;
        partial[(chunk * 2 + 1) * g.c + c] = b;
    }
}

/* The stage-2 blocks: BN_TX channels x BN_TY lanes; lane l adds chunks l, l + BN_TY, ... in
 * order, then lane 0 adds the lane sums in lane order (the same partition every run). */
static __device__ __forceinline__ bool bn_chunk_sums(const double *partial, const bn_grid &g, int64_t c, double &a,
                                                     double &b) {
    __shared__ double sp[2][BN_TY][BN_TX];
    const int tx = threadIdx.x, ty = threadIdx.y;
    a = 0.0, b = 0.0;
    /* unrolled so that several chunks' loads are in flight at once (the adds stay in order) */
    if (c < g.c)
#pragma unroll 8
        for (int64_t k = ty; k < g.chunks; k += BN_TY) a += partial[(k * 2) * g.c + c], b += partial[(k * 2 + 1) * g.c + c];
    sp[0][ty][tx] = a, sp[1][ty][tx] = b;
    __syncthreads();
    if (ty != 0 || c >= g.c) return false;
    for (int l = 1; l < BN_TY; l++) a += sp[0][l][tx], b += sp[1][l][tx];
    return true;
}

/* ---- forward -------------------------------------------------------------------------------- */

/* A block per BN_TX channels (BN_TY lanes adding the chunks): the statistics (the batch's, or the running ones in eval), stats,
 * the running update in training, and table rows 0..2 = mean, scale = rstd gamma, shift = beta. */
template <class T>
__global__ void __launch_bounds__(BN_TX *BN_TY)
bn_fwd_final_kernel(const double *__restrict__ partial, const T *__restrict__ x, const float *gamma,
                    const float *beta, const float *run_mean_in, const float *run_var_in, float *__restrict__ stats,
                    float *run_mean, float *run_var, float *__restrict__ table, bn_grid g, float eps, float momentum,
                    int batch_stats, int update_running) {
    const int64_t c = (int64_t)blockIdx.x * BN_TX + threadIdx.x;
    double s1 = 0.0, s2 = 0.0;
    if (batch_stats) {
        if (!bn_chunk_sums(partial, g, c, s1, s2)) return;
    } else if (threadIdx.y != 0 || c >= g.c) {
        return;
    }
    float mean, var;
    if (batch_stats) {
        const double m = (double)g.m, d = s1 / m;
        const double shift = (double)tg_ld(x, c); /* the channel's first value, as stage 1 took it */
        const double ss = fmax(s2 - s1 * d, 0.0); /* the squared deviations from the mean */
        mean = (float)(shift + d), var = (float)(ss / m);
        if (update_running) {
            const float unbiased = g.m > 1 ? (float)(ss / (double)(g.m - 1)) : var;
            run_mean[c] = fadd(fmul(fsub(1.0f, momentum), run_mean[c]), fmul(momentum, mean));
            run_var[c] = fadd(fmul(fsub(1.0f, momentum), run_var[c]), fmul(momentum, unbiased));
        }
    } else {
        mean = run_mean_in[c], var = run_var_in[c];
    }
    stats[c] = mean, stats[g.c + c] = var;
    const float rstd = (float)(1.0 / sqrt((double)var + (double)eps));
    table[c] = mean, table[g.c + c] = fmul(rstd, gamma[c]), table[2 * g.c + c] = beta[c];
}

/* y = (x - mean) * scale + shift, clamped to [0, 6] with relu6, W elements at a time (W divides C); I as conv.cu's (int
 * where the n elements fit with room for the grid stride). */
template <class T, int W, class I>
__global__ void __launch_bounds__(BN_THREADS)
bn_apply_kernel(const T *__restrict__ x, T *__restrict__ y, const float *__restrict__ table, I n, I C, int relu6) {
    const I nv = n / W;
    for (I k = (I)blockIdx.x * blockDim.x + threadIdx.x; k < nv; k += (I)gridDim.x * blockDim.x) {
        float v[W];
        tg_vec<T, W>::load(x, k, v);
        const I c0 = (k * W) % C;
#pragma unroll
        for (int j = 0; j < W; j++)
            v[j] = fadd(fmul(fsub(v[j], table[c0 + j]), table[C + c0 + j]), table[2 * C + c0 + j]);
        if (relu6) /* RELU6's comparisons (a NaN stays NaN) */
#pragma unroll
            for (int j = 0; j < W; j++) v[j] = v[j] < 0.0f ? 0.0f : v[j] > 6.0f ? 6.0f : v[j];
        tg_vec<T, W>::store(y, k, v);
    }
}

/* ---- backward ------------------------------------------------------------------------------- */

/* A block per BN_TX channels (BN_TY lanes adding the chunks): dgamma, dbeta, and table rows 0..4 = mean, rstd, scale = gamma rstd,
 * mdy = sum dy / M, mdyx = sum dy xhat / M. */
__global__ void __launch_bounds__(BN_TX *BN_TY)
bn_bwd_final_kernel(const double *__restrict__ partial, const float *gamma, const float *stats, float *dgamma,
                    float *dbeta, float *__restrict__ table, bn_grid g, float eps, int overwrite) {
    const int64_t c = (int64_t)blockIdx.x * BN_TX + threadIdx.x;
    double sdy, sdyx;
    if (!bn_chunk_sums(partial, g, c, sdy, sdyx)) return;
    const float rstd = (float)(1.0 / sqrt((double)stats[g.c + c] + (double)eps));
    table[c] = stats[c], table[g.c + c] = rstd, table[2 * g.c + c] = fmul(gamma[c], rstd);
    table[3 * g.c + c] = (float)(sdy / (double)g.m), table[4 * g.c + c] = (float)(sdyx / (double)g.m);
    if (dgamma) tg_grad_store(dgamma + c, (float)sdyx, overwrite);
    if (dbeta) tg_grad_store(dbeta + c, (float)sdy, overwrite);
}

/* dx = scale * (dy - mdy - xhat * mdyx), W elements at a time (dy masked by y, the fused
 * ReLU6's output, where given). */
template <class T, int W, class I>
__global__ void __launch_bounds__(BN_THREADS)
bn_dx_kernel(const T *__restrict__ dy, const T *__restrict__ x, const T *__restrict__ y, T *__restrict__ dx,
             const float *__restrict__ table, I n, I C) {
    const I nv = n / W;
    for (I k = (I)blockIdx.x * blockDim.x + threadIdx.x; k < nv; k += (I)gridDim.x * blockDim.x) {
        float g[W], v[W];
        tg_vec<T, W>::load(dy, k, g);
        tg_vec<T, W>::load(x, k, v);
        if (y) { /* the fused ReLU6's mask */
            float o[W];
            tg_vec<T, W>::load(y, k, o);
#pragma unroll
            for (int j = 0; j < W; j++) g[j] = o[j] > 0.0f && o[j] < 6.0f ? g[j] : 0.0f;
        }
        const I c0 = (k * W) % C;
#pragma unroll
        for (int j = 0; j < W; j++) {
            const I c = c0 + j;
            const float xhat = fmul(fsub(v[j], table[c]), table[C + c]);
            v[j] = fmul(table[2 * C + c], fsub(fsub(g[j], table[3 * C + c]), fmul(xhat, table[4 * C + c])));
        }
        tg_vec<T, W>::store(dx, k, v);
    }
}

/* An elementwise pass over n elements: int indices where they fit with room for the grid
 * stride, else int64_t. */
static int bn_fits_int(int64_t n) { return n < (int64_t)INT32_MAX - (1 << 22); }

/* ---- launchers ------------------------------------------------------------------------------ */

/* The scratch's two parts: the partials (doubles) and the table behind them. */
static void bn_scratch_parts(const tg_cuda_op_args *a, const bn_grid &g, double **partial, float **table) {
    *partial = (double *)a->ctx->reduce_scratch;
    *table = a->ctx->reduce_scratch + 4 * g.chunks * g.c;
}

/* 16-byte accesses where C and every pointer allow them. */
template <class T>
static int bn_width(int64_t C, const void *p0, const void *p1, const void *p2) {
    const int W = sizeof(T) == 4 ? 4 : 8;
    return C % W == 0 && tg_aligned16(p0) && tg_aligned16(p1) && tg_aligned16(p2) ? W : 1;
}

template <class T>
static int bn_forward(const tg_cuda_op_args *a, tg_err *err) {
    const tg_batchnorm_params *p = &a->op->p.batchnorm;
    const bn_grid g = bn_grid_of(p->n * p->hw, p->c);
    if (g.m <= 0 || g.c <= 0) return 0;
    if (tg_scratch_check(a, bn_scratch_floats(g.m, g.c), err)) return -1;
    const T *x = (const T *)a->in[0];
    T *y = (T *)a->out[0];
    const float *run_mean_in = (const float *)a->in[3], *run_var_in = (const float *)a->in[4];
    const int use_running = !a->training && run_mean_in && run_var_in;
    double *partial;
    float *table;
    bn_scratch_parts(a, g, &partial, &table);
    cudaStream_t st = a->ctx->stream;
    if (!use_running) {
        bn_stat_terms<T> f = {x, 0.0};
        bn_partial_kernel<<<dim3((unsigned)g.tiles, (unsigned)g.chunks), dim3(BN_TX, BN_TY), 0, st>>>(f, partial, g);
    }
    bn_fwd_final_kernel<T><<<(unsigned)g.tiles, dim3(BN_TX, BN_TY), 0, st>>>(
        partial, x, (const float *)a->in[1], (const float *)a->in[2], run_mean_in,
        run_var_in, (float *)a->out[1], (float *)a->out[2], (float *)a->out[3], table, g, p->eps, p->momentum,
        !use_running, a->training && !a->ctx->gemm_tune && a->out[2] && a->out[3]);
    const int64_t n = g.m * g.c;
    const int relu6 = p->relu6 != 0;
    constexpr int W = sizeof(T) == 4 ? 4 : 8;
    const int w = bn_width<T>(g.c, x, y, NULL);
    const unsigned blocks = tg_blocks(n / w, BN_THREADS);
    if (w > 1 && bn_fits_int(n))
        bn_apply_kernel<T, W, int><<<blocks, BN_THREADS, 0, st>>>(x, y, table, (int)n, (int)g.c, relu6);
    else if (w > 1)
        bn_apply_kernel<T, W, int64_t><<<blocks, BN_THREADS, 0, st>>>(x, y, table, n, g.c, relu6);
    else if (bn_fits_int(n))
        bn_apply_kernel<T, 1, int><<<blocks, BN_THREADS, 0, st>>>(x, y, table, (int)n, (int)g.c, relu6);
    else
        bn_apply_kernel<T, 1, int64_t><<<blocks, BN_THREADS, 0, st>>>(x, y, table, n, g.c, relu6);
    return 0;
}

template <class T>
static int bn_backward(const tg_cuda_op_args *a, tg_err *err) {
    const tg_batchnorm_bwd_params *p = &a->op->p.batchnorm_bwd;
    const bn_grid g = bn_grid_of(p->n * p->hw, p->c);
    if (g.m <= 0 || g.c <= 0) return 0;
    if (tg_scratch_check(a, bn_scratch_floats(g.m, g.c), err)) return -1;
    const T *dy = (const T *)a->in[0], *x = (const T *)a->in[1];
    const float *gamma = (const float *)a->in[2], *stats = (const float *)a->in[3];
    T *dx = (T *)a->out[0];
    double *partial;
    float *table;
    bn_scratch_parts(a, g, &partial, &table);
    cudaStream_t st = a->ctx->stream;
    const T *y = p->relu6 ? (const T *)a->in[4] : NULL;
    if (p->relu6 && !y) return tg_fail(err, "batchnorm_bwd: relu6 needs the forward's output (in4)");
    bn_grad_terms<T> f = {dy, x, y, stats, p->eps, 0.0f, 0.0f};
    bn_partial_kernel<<<dim3((unsigned)g.tiles, (unsigned)g.chunks), dim3(BN_TX, BN_TY), 0, st>>>(f, partial, g);
    bn_bwd_final_kernel<<<(unsigned)g.tiles, dim3(BN_TX, BN_TY), 0, st>>>(
        partial, gamma, stats, (float *)a->out[1], (float *)a->out[2], table, g, p->eps, p->overwrite != 0);
    const int64_t n = g.m * g.c;
    constexpr int W = sizeof(T) == 4 ? 4 : 8;
    const int w = bn_width<T>(g.c, dy, x, dx) > 1 && tg_aligned16(y) ? bn_width<T>(g.c, dy, x, dx) : 1;
    const unsigned blocks = tg_blocks(n / w, BN_THREADS);
    if (w > 1 && bn_fits_int(n))
        bn_dx_kernel<T, W, int><<<blocks, BN_THREADS, 0, st>>>(dy, x, y, dx, table, (int)n, (int)g.c);
    else if (w > 1)
        bn_dx_kernel<T, W, int64_t><<<blocks, BN_THREADS, 0, st>>>(dy, x, y, dx, table, n, g.c);
    else if (bn_fits_int(n))
        bn_dx_kernel<T, 1, int><<<blocks, BN_THREADS, 0, st>>>(dy, x, y, dx, table, (int)n, (int)g.c);
    else
        bn_dx_kernel<T, 1, int64_t><<<blocks, BN_THREADS, 0, st>>>(dy, x, y, dx, table, n, g.c);
    return 0;
}

int tg_launch_batchnorm(const tg_cuda_op_args *a, tg_err *err) {
    if (a->out_dtype[0] == TG_BF16) return bn_forward<tg_bf16>(a, err);
    if (a->out_dtype[0] == TG_F16) return bn_forward<tg_f16>(a, err);
    return bn_forward<float>(a, err);
}

int tg_launch_batchnorm_bwd(const tg_cuda_op_args *a, tg_err *err) {
    if (a->out_dtype[0] == TG_BF16) return bn_backward<tg_bf16>(a, err);
    if (a->out_dtype[0] == TG_F16) return bn_backward<tg_f16>(a, err);
    return bn_backward<float>(a, err);
}
