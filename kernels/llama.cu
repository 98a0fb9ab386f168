/* Llama's RMSNORM, ROPE and SWIGLU and their backwards.
 *
 * RMSNorm: one warp per row; the sum of squares in double as the CPU does (a fixed
 * butterfly across the lanes), y = gamma * (x * rstd) with non-contracting float ops in
 * HF's order. The backward's dx rows likewise (the row mean of dy*g*xhat in double), and
 * dgamma (+=) as the deterministic two-stage column sums of kernels/column_sums.cuh over
 * dy * x * rstd.
 * ROPE: one thread per (row, pair (i, i + Dh/2)), the angle pos x inv_freq[i] from
 * kernels/rope.h (the CPU's formula; CUDA's powf, cosf and sinf are within 2 ulp of
 * glibc's) taken once for every head of the row. ROPE_BWD likewise: q heads rotated back,
 * each kv head's G heads' gradients added in head order first. Where Dh/2 and the parts'
 * rows allow, a thread takes 8 (16-bit) or 4 (fp32) consecutive pairs as 16-byte accesses.
 * SWIGLU: the CPU's formulas, a thread per 8 consecutive elements (16-bit) or 4 (fp32)
 * of a row as one 16-byte access where the rows allow, else per element. RMSNorm's rows
 * likewise take 16-byte accesses where D allows.
 * x, y, dy and dx are T (float, bf16 or half: widened on load, rounded on store); gamma,
 * rstd and dgamma are fp32, position ids int32. */
#include "kernels/column_sums.cuh"
#include "kernels/rope.h"

#define LL_THREADS 256

template <class T>
static unsigned rows_blocks(int64_t rows) {
    return (unsigned)((rows * 32 + LL_THREADS - 1) / LL_THREADS);
}

/* ---- RMSNorm -------------------------------------------------------------------------- */

template <class T>
__global__ void __launch_bounds__(LL_THREADS)
rmsnorm_kernel(const T *__restrict__ x, const float *__restrict__ g, T *__restrict__ y, float *__restrict__ rstd,
               int64_t M, int64_t D, float eps) {
    const int lane = threadIdx.x & 31;
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= M) return;
    const T *xr = x + row * D;
    double ss = 0;
    for (int64_t d = lane; d < D; d += 32) {
        const double v = (double)tg_ld(xr, d);
        ss = __dadd_rn(ss, __dmul_rn(v, v));
    }
    ss = warp_sum_d(ss);
    const float rs = (float)(1.0 / sqrt(ss / (double)D + (double)eps));
    for (int64_t d = lane; d < D; d += 32) tg_st(y + row * D, d, fmul(g[d], fmul(tg_ld(xr, d), rs)));
    if (lane == 0 && rstd) rstd[row] = rs;
}

template <class T>
__global__ void __launch_bounds__(LL_THREADS)
rmsnorm_bwd_kernel(const T *__restrict__ dy, const T *__restrict__ x, const float *__restrict__ g,
                   const float *__restrict__ rstd, T *__restrict__ dx, int64_t M, int64_t D) {
    const int lane = threadIdx.x & 31;
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= M) return;
    const T *dyr = dy + row * D, *xr = x + row * D;
    const float rs = rstd[row];
    double s = 0;
    for (int64_t d = lane; d < D; d += 32)
        s = __dadd_rn(s, __dmul_rn((double)fmul(tg_ld(dyr, d), g[d]), (double)fmul(tg_ld(xr, d), rs)));
    const float mean = (float)(warp_sum_d(s) / (double)D);
    for (int64_t d = lane; d < D; d += 32)
        tg_st(dx + row * D, d, fmul(rs, fsub(fmul(tg_ld(dyr, d), g[d]), fmul(fmul(tg_ld(xr, d), rs), mean))));
}

/* The same two kernels reading and writing W consecutive elements as one access (D % W
 * == 0, rows aligned to W elements): each lane's partial sums in its own element order,
 * then the same butterfly. */
template <class T, int W>
__global__ void __launch_bounds__(LL_THREADS)
rmsnorm_vec_kernel(const T *__restrict__ x, const float *__restrict__ g, T *__restrict__ y, float *__restrict__ rstd,
                   int64_t M, int64_t D, float eps) {
    const int lane = threadIdx.x & 31;
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5, DW = D / W;
    if (row >= M) return;
    const T *xr = x + row * D;
    double ss = 0;
    for (int64_t k = lane; k < DW; k += 32) {
        float v[W];
        tg_vec<T, W>::load(xr, k, v);
#pragma unroll
        for (int j = 0; j < W; j++) ss = __dadd_rn(ss, __dmul_rn((double)v[j], (double)v[j]));
    }
    ss = warp_sum_d(ss);
    const float rs = (float)(1.0 / sqrt(ss / (double)D + (double)eps));
    for (int64_t k = lane; k < DW; k += 32) {
        float v[W], o[W];
        tg_vec<T, W>::load(xr, k, v);
#pragma unroll
        for (int j = 0; j < W; j++) o[j] = fmul(g[k * W + j], fmul(v[j], rs));
        tg_vec<T, W>::store(y + row * D, k, o);
    }
    if (lane == 0 && rstd) rstd[row] = rs;
}

template <class T, int W>
__global__ void __launch_bounds__(LL_THREADS)
rmsnorm_bwd_vec_kernel(const T *__restrict__ dy, const T *__restrict__ x, const float *__restrict__ g,
                       const float *__restrict__ rstd, T *__restrict__ dx, int64_t M, int64_t D) {
    const int lane = threadIdx.x & 31;
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5, DW = D / W;
    if (row >= M) return;
    const T *dyr = dy + row * D, *xr = x + row * D;
    const float rs = rstd[row];
    double s = 0;
    for (int64_t k = lane; k < DW; k += 32) {
        float d[W], v[W];
        tg_vec<T, W>::load(dyr, k, d);
        tg_vec<T, W>::load(xr, k, v);
#pragma unroll
        for (int j = 0; j < W; j++)
            s = __dadd_rn(s, __dmul_rn((double)fmul(d[j], g[k * W + j]), (double)fmul(v[j], rs)));
    }
    const float mean = (float)(warp_sum_d(s) / (double)D);
    for (int64_t k = lane; k < DW; k += 32) {
        float d[W], v[W], o[W];
        tg_vec<T, W>::load(dyr, k, d);
        tg_vec<T, W>::load(xr, k, v);
#pragma unroll
        for (int j = 0; j < W; j++) o[j] = fmul(rs, fsub(fmul(d[j], g[k * W + j]), fmul(fmul(v[j], rs), mean)));
        tg_vec<T, W>::store(dx + row * D, k, o);
    }
}

/* Whether rows of D elements at these pointers take W-element accesses. */
static int rows_vectorize(int64_t D, int W, size_t es, const void *a, const void *b, const void *c) {
    const uintptr_t align = (uintptr_t)W * es;
    return D % W == 0 && (uintptr_t)a % align == 0 && (!b || (uintptr_t)b % align == 0) &&
           (!c || (uintptr_t)c % align == 0);
}

/* dy * (x * rstd[r]) as the column sums read it (dgamma). */
template <class T>
struct rmsnorm_dgamma_row {
    const T *dy, *x;
    const float *rstd;
    int64_t N;
    __device__ __forceinline__ void operator()(int64_t r, int64_t k, float (&v)[1]) const {
        v[0] = fmul(tg_ld(dy + r * N, k), fmul(tg_ld(x + r * N, k), rstd[r]));
    }
};

int64_t tg_scratch_rmsnorm_bwd(const tg_op *op) {
    return op->out[1] >= 0 ? tg_col_sum_scratch(op->p.rmsnorm.m, op->p.rmsnorm.d) : 0;
}

template <class T>
static int launch_rmsnorm(const tg_cuda_op_args *a, tg_err *err) {
    const tg_rmsnorm_params *p = &a->op->p.rmsnorm;
    constexpr int W = sizeof(T) == 2 ? 8 : 4;
    if (rows_vectorize(p->d, W, sizeof(T), a->in[0], a->out[0], NULL)) {
        rmsnorm_vec_kernel<T, W><<<rows_blocks<T>(p->m), LL_THREADS, 0, a->ctx->stream>>>(
            (const T *)a->in[0], (const float *)a->in[1], (T *)a->out[0], (float *)a->out[1], p->m, p->d, p->eps);
        return 0;
    }
    rmsnorm_kernel<T><<<rows_blocks<T>(p->m), LL_THREADS, 0, a->ctx->stream>>>(
        (const T *)a->in[0], (const float *)a->in[1], (T *)a->out[0], (float *)a->out[1], p->m, p->d, p->eps);
    return 0;
}

template <class T>
static int launch_rmsnorm_bwd(const tg_cuda_op_args *a, tg_err *err) {
    const tg_rmsnorm_params *p = &a->op->p.rmsnorm;
    const T *dy = (const T *)a->in[0], *x = (const T *)a->in[1];
    const float *rstd = (const float *)a->in[3];
    constexpr int W = sizeof(T) == 2 ? 8 : 4;
    if (a->out[0] && rows_vectorize(p->d, W, sizeof(T), dy, x, a->out[0]))
        rmsnorm_bwd_vec_kernel<T, W><<<rows_blocks<T>(p->m), LL_THREADS, 0, a->ctx->stream>>>(
            dy, x, (const float *)a->in[2], rstd, (T *)a->out[0], p->m, p->d);
    else if (a->out[0])
        rmsnorm_bwd_kernel<T><<<rows_blocks<T>(p->m), LL_THREADS, 0, a->ctx->stream>>>(
            dy, x, (const float *)a->in[2], rstd, (T *)a->out[0], p->m, p->d);
    if (!a->out[1]) return 0;
    if (tg_scratch_check(a, tg_scratch_rmsnorm_bwd(a->op), err)) return -1;
    return col_sums<1>(rmsnorm_dgamma_row<T>{dy, x, rstd, p->d}, p->m, p->d, (double *)a->ctx->reduce_scratch,
                       (float *)a->out[1], 0, a->ctx->stream, err);
}

/* ---- rotary positions ------------------------------------------------------------------ */

/* Where q, k and v of a row lie (element offsets and row strides from the first tensor, or
 * three tensors made apart): ROPE's inputs, ROPE_BWD's outputs. */
template <class P>
struct rope_parts {
    P base[3];
    int64_t stride[3];
};

template <class P>
static rope_parts<P> parts_of(const tg_rope_params *p, P first, P k, P v) {
    const int64_t H = p->h, Hkv = p->kv_heads, Dh = p->head_dim;
    if (k) return rope_parts<P>{{first, k, v}, {H * Dh, Hkv * Dh, Hkv * Dh}};
    const int64_t row = (H + 2 * Hkv) * Dh;
    return rope_parts<P>{{first, first + H * Dh, first + (H + Hkv) * Dh}, {row, row, row}};
}

/* Thread per (row, pair i): the angle's cosine and sine once, then every output head of
 * the row at that pair (q and k rotated, k and v from kv head j / G): the transcendentals
 * are shared by the 2H rotated heads instead of made per head. */
template <class T>
__global__ void __launch_bounds__(LL_THREADS)
rope_kernel(rope_parts<const T *> x, const int32_t *__restrict__ pos, T *__restrict__ y, tg_rope_params p) {
    const int64_t half = p.head_dim / 2, H = p.h, G = p.h / p.kv_heads, Dh = p.head_dim;
    const int64_t total = p.n * half;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = t % half, r = t / half;
        const T *q = x.base[0] + r * x.stride[0], *k = x.base[1] + r * x.stride[1], *v = x.base[2] + r * x.stride[2];
        T *yr = y + r * 3 * H * Dh;
        const float angle = fmul((float)pos[r], tg_rope_inv_freq(&p, i)), c = cosf(angle), sn = sinf(angle);
        for (int64_t j = 0; j < 3 * H; j++) {
            const T *src = j < H ? q + j * Dh : j < 2 * H ? k + ((j - H) / G) * Dh : v + ((j - 2 * H) / G) * Dh;
            float a = tg_ld(src, i), b = tg_ld(src, i + half);
            if (j < 2 * H) tg_rope_rotate(a, b, c, sn, 0, &a, &b);
            tg_st(yr + j * Dh, i, a);
            tg_st(yr + j * Dh, i + half, b);
        }
    }
}

/* Thread per (row, pair i): q heads rotated back; each kv head's G heads of k (or v)
 * added in head order, k's then rotated back. */
template <class T>
__global__ void __launch_bounds__(LL_THREADS)
rope_bwd_kernel(const T *__restrict__ dy, const int32_t *__restrict__ pos, rope_parts<T *> dx, tg_rope_params p) {
    const int64_t half = p.head_dim / 2, H = p.h, Hkv = p.kv_heads, G = p.h / p.kv_heads, Dh = p.head_dim;
    const int64_t total = p.n * half;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = t % half, r = t / half;
        const T *dyr = dy + r * 3 * H * Dh;
        const float angle = fmul((float)pos[r], tg_rope_inv_freq(&p, i)), c = cosf(angle), sn = sinf(angle);
        for (int64_t j = 0; j < H + 2 * Hkv; j++) {
            const int part = j < H ? 0 : j < H + Hkv ? 1 : 2;
            const int64_t head = part == 0 ? j : part == 1 ? j - H : j - H - Hkv;
            float a, b;
            if (part == 0) {
                a = tg_ld(dyr + j * Dh, i), b = tg_ld(dyr + j * Dh, i + half);
            } else {
                const T *src = dyr + (part * H + head * G) * Dh;
                a = tg_ld(src, i), b = tg_ld(src, i + half);
                for (int64_t g = 1; g < G; g++) a = fadd(a, tg_ld(src + g * Dh, i)), b = fadd(b, tg_ld(src + g * Dh, i + half));
            }
            if (part < 2) tg_rope_rotate(a, b, c, sn, 1, &a, &b);
            T *dst = dx.base[part] + r * dx.stride[part] + head * Dh;
            tg_st(dst, i, a);
            tg_st(dst, i + half, b);
        }
    }
}

/* The same per W consecutive pairs (i .. i+W-1 with their partners i+Dh/2 ..) of a row as
 * two W-element accesses per head, where Dh/2 % W == 0 and every part's start is aligned
 * to W elements: the rotary ops move (H + 2 Hkv) + 3H heads a row, and 2-byte accesses
 * left them at about 40% of the memory's bandwidth. The arithmetic is the scalar kernels'
 * per element. */
template <class T, int W>
__global__ void __launch_bounds__(LL_THREADS)
rope_vec_kernel(rope_parts<const T *> x, const int32_t *__restrict__ pos, T *__restrict__ y, tg_rope_params p) {
    const int64_t H = p.h, G = p.h / p.kv_heads, Dh = p.head_dim, C = p.head_dim / 2 / W;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < p.n * C; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c = t % C, r = t / C;
        const T *q = x.base[0] + r * x.stride[0], *k = x.base[1] + r * x.stride[1], *v = x.base[2] + r * x.stride[2];
        T *yr = y + r * 3 * H * Dh;
        float cs[W], sn[W];
#pragma unroll
        for (int w = 0; w < W; w++) {
            const float angle = fmul((float)pos[r], tg_rope_inv_freq(&p, c * W + w));
            cs[w] = cosf(angle), sn[w] = sinf(angle);
        }
        for (int64_t j = 0; j < 3 * H; j++) {
            const T *src = j < H ? q + j * Dh : j < 2 * H ? k + ((j - H) / G) * Dh : v + ((j - 2 * H) / G) * Dh;
            float a[W], b[W];
            tg_vec<T, W>::load(src, c, a);
            tg_vec<T, W>::load(src, c + C, b);
            if (j < 2 * H)
#pragma unroll
                for (int w = 0; w < W; w++) tg_rope_rotate(a[w], b[w], cs[w], sn[w], 0, &a[w], &b[w]);
            tg_vec<T, W>::store(yr + j * Dh, c, a);
            tg_vec<T, W>::store(yr + j * Dh, c + C, b);
        }
    }
}

template <class T, int W>
__global__ void __launch_bounds__(LL_THREADS)
rope_bwd_vec_kernel(const T *__restrict__ dy, const int32_t *__restrict__ pos, rope_parts<T *> dx, tg_rope_params p) {
    const int64_t H = p.h, Hkv = p.kv_heads, G = p.h / p.kv_heads, Dh = p.head_dim, C = p.head_dim / 2 / W;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < p.n * C; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c = t % C, r = t / C;
        const T *dyr = dy + r * 3 * H * Dh;
        float cs[W], sn[W];
#pragma unroll
        for (int w = 0; w < W; w++) {
            const float angle = fmul((float)pos[r], tg_rope_inv_freq(&p, c * W + w));
            cs[w] = cosf(angle), sn[w] = sinf(angle);
        }
        for (int64_t j = 0; j < H + 2 * Hkv; j++) {
            const int part = j < H ? 0 : j < H + Hkv ? 1 : 2;
            const int64_t head = part == 0 ? j : part == 1 ? j - H : j - H - Hkv;
            const T *src = part == 0 ? dyr + j * Dh : dyr + (part * H + head * G) * Dh;
            float a[W], b[W];
            tg_vec<T, W>::load(src, c, a);
            tg_vec<T, W>::load(src, c + C, b);
            for (int64_t g = 1; part > 0 && g < G; g++) {
                float a2[W], b2[W];
                tg_vec<T, W>::load(src + g * Dh, c, a2);
                tg_vec<T, W>::load(src + g * Dh, c + C, b2);
#pragma unroll
                for (int w = 0; w < W; w++) a[w] = fadd(a[w], a2[w]), b[w] = fadd(b[w], b2[w]);
            }
            if (part < 2)
#pragma unroll
                for (int w = 0; w < W; w++) tg_rope_rotate(a[w], b[w], cs[w], sn[w], 1, &a[w], &b[w]);
            T *dst = dx.base[part] + r * dx.stride[part] + head * Dh;
            tg_vec<T, W>::store(dst, c, a);
            tg_vec<T, W>::store(dst, c + C, b);
        }
    }
}

/* Whether every part's rows take W-element accesses at the pairs' two halves. */
template <class P>
static int rope_aligned(const rope_parts<P> &x, int64_t head_dim, int W, size_t es) {
    if ((head_dim / 2) % W) return 0;
    for (int k = 0; k < 3; k++)
        if (x.stride[k] % W || (uintptr_t)x.base[k] % (W * es)) return 0;
    return 1;
}

static unsigned grid_of(int64_t total) {
    const int64_t blocks = (total + LL_THREADS - 1) / LL_THREADS;
    return (unsigned)(blocks < 132 * 16 ? (blocks > 0 ? blocks : 1) : 132 * 16);
}

template <class T>
static int launch_rope(const tg_cuda_op_args *a, int bwd, tg_err *err) {
    const tg_rope_params *p = &a->op->p.rope;
    const int64_t pairs = p->n * (p->head_dim / 2);
    constexpr int W = sizeof(T) == 2 ? 8 : 4;
    /* The packed output (or input) rows: 3 H Dh, at a W-aligned start. */
    const void *packed = bwd ? a->in[0] : a->out[0];
    if ((uintptr_t)packed % (W * sizeof(T)) == 0) {
        if (bwd) {
            const rope_parts<T *> dx = parts_of<T *>(p, (T *)a->out[0], (T *)a->out[1], (T *)a->out[2]);
            if (rope_aligned(dx, p->head_dim, W, sizeof(T))) {
                rope_bwd_vec_kernel<T, W><<<grid_of(pairs / W), LL_THREADS, 0, a->ctx->stream>>>(
                    (const T *)a->in[0], (const int32_t *)a->in[1], dx, *p);
                return 0;
            }
        } else {
            const rope_parts<const T *> x =
                parts_of<const T *>(p, (const T *)a->in[0], (const T *)a->in[2], (const T *)a->in[3]);
            if (rope_aligned(x, p->head_dim, W, sizeof(T))) {
                rope_vec_kernel<T, W><<<grid_of(pairs / W), LL_THREADS, 0, a->ctx->stream>>>(
                    x, (const int32_t *)a->in[1], (T *)a->out[0], *p);
                return 0;
            }
        }
    }
    if (bwd)
        rope_bwd_kernel<T><<<grid_of(pairs), LL_THREADS, 0, a->ctx->stream>>>(
            (const T *)a->in[0], (const int32_t *)a->in[1],
            parts_of<T *>(p, (T *)a->out[0], (T *)a->out[1], (T *)a->out[2]), *p);
    else
        rope_kernel<T><<<grid_of(pairs), LL_THREADS, 0, a->ctx->stream>>>(
            parts_of<const T *>(p, (const T *)a->in[0], (const T *)a->in[2], (const T *)a->in[3]),
            (const int32_t *)a->in[1], (T *)a->out[0], *p);
    return 0;
}

/* ---- SwiGLU ------------------------------------------------------------------------------ */

static __device__ __forceinline__ float sigmoid_f(float v) { return __fdiv_rn(1.0f, fadd(1.0f, expf(-v))); }

/* gate and up of a row: one [M, 2I] tensor (gate | up per row, stride 2I), or two [M, I]. */
template <class P>
struct glu_parts {
    P gate, up;
    int64_t stride;
};

template <class P>
static glu_parts<P> glu_of(int64_t I, P first, P up) {
    return up ? glu_parts<P>{first, up, I} : glu_parts<P>{first, first + I, 2 * I};
}

template <class T>
__global__ void __launch_bounds__(LL_THREADS)
swiglu_kernel(glu_parts<const T *> x, T *__restrict__ y, int64_t M, int64_t I) {
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < M * I; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = t / I, i = t % I;
        const float g = tg_ld(x.gate, m * x.stride + i), u = tg_ld(x.up, m * x.stride + i);
        tg_st(y, t, fmul(fmul(g, sigmoid_f(g)), u));
    }
}

template <class T>
__global__ void __launch_bounds__(LL_THREADS)
swiglu_bwd_kernel(const T *__restrict__ dy, glu_parts<const T *> x, glu_parts<T *> dx, int64_t M, int64_t I) {
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < M * I; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = t / I, i = t % I;
        const float g = tg_ld(x.gate, m * x.stride + i), u = tg_ld(x.up, m * x.stride + i), d = tg_ld(dy, t);
        const float s = sigmoid_f(g);
        tg_st(dx.gate, m * dx.stride + i, fmul(fmul(d, u), fmul(s, fadd(1.0f, fmul(g, fsub(1.0f, s))))));
        tg_st(dx.up, m * dx.stride + i, fmul(d, fmul(g, s)));
    }
}

/* The same per element, W consecutive elements of a row (I % W == 0, every part's row
 * start aligned to W elements) as one access each, the row and column found once. */
template <class T, int W>
__global__ void __launch_bounds__(LL_THREADS)
swiglu_vec_kernel(glu_parts<const T *> x, T *__restrict__ y, int64_t M, int64_t I) {
    const int64_t IW = I / W;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < M * IW; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = t / IW, iw = t % IW;
        float g[W], u[W], o[W];
        tg_vec<T, W>::load(x.gate + m * x.stride, iw, g);
        tg_vec<T, W>::load(x.up + m * x.stride, iw, u);
#pragma unroll
        for (int j = 0; j < W; j++) o[j] = fmul(fmul(g[j], sigmoid_f(g[j])), u[j]);
        tg_vec<T, W>::store(y, t, o);
    }
}

template <class T, int W>
__global__ void __launch_bounds__(LL_THREADS)
swiglu_bwd_vec_kernel(const T *__restrict__ dy, glu_parts<const T *> x, glu_parts<T *> dx, int64_t M, int64_t I) {
    const int64_t IW = I / W;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < M * IW; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = t / IW, iw = t % IW;
        float g[W], u[W], d[W], dg[W], du[W];
        tg_vec<T, W>::load(x.gate + m * x.stride, iw, g);
        tg_vec<T, W>::load(x.up + m * x.stride, iw, u);
        tg_vec<T, W>::load(dy, t, d);
#pragma unroll
        for (int j = 0; j < W; j++) {
            const float sg = sigmoid_f(g[j]);
            dg[j] = fmul(fmul(d[j], u[j]), fmul(sg, fadd(1.0f, fmul(g[j], fsub(1.0f, sg)))));
            du[j] = fmul(d[j], fmul(g[j], sg));
        }
        tg_vec<T, W>::store(dx.gate + m * dx.stride, iw, dg);
        tg_vec<T, W>::store(dx.up + m * dx.stride, iw, du);
    }
}

template <class P>
static int glu_aligned(const glu_parts<P> &g, int64_t I, int W, size_t es) {
    return I % W == 0 && g.stride % W == 0 && (uintptr_t)g.gate % (W * es) == 0 && (uintptr_t)g.up % (W * es) == 0;
}

template <class T>
static int launch_swiglu(const tg_cuda_op_args *a, int bwd, tg_err *err) {
    const int64_t M = a->op->p.swiglu.m, I = a->op->p.swiglu.i;
    constexpr int W = sizeof(T) == 2 ? 8 : 4;
    if (bwd) {
        const glu_parts<const T *> x = glu_of<const T *>(I, (const T *)a->in[1], (const T *)a->in[2]);
        const glu_parts<T *> dx = glu_of<T *>(I, (T *)a->out[0], (T *)a->out[1]);
        if (glu_aligned(x, I, W, sizeof(T)) && glu_aligned(dx, I, W, sizeof(T)) && (uintptr_t)a->in[0] % (W * sizeof(T)) == 0) {
            swiglu_bwd_vec_kernel<T, W><<<grid_of(M * I / W), LL_THREADS, 0, a->ctx->stream>>>((const T *)a->in[0], x, dx, M, I);
            return 0;
        }
    } else {
        const glu_parts<const T *> x = glu_of<const T *>(I, (const T *)a->in[0], (const T *)a->in[1]);
        if (glu_aligned(x, I, W, sizeof(T)) && (uintptr_t)a->out[0] % (W * sizeof(T)) == 0) {
            swiglu_vec_kernel<T, W><<<grid_of(M * I / W), LL_THREADS, 0, a->ctx->stream>>>(x, (T *)a->out[0], M, I);
            return 0;
        }
    }
    if (bwd)
        swiglu_bwd_kernel<T><<<grid_of(M * I), LL_THREADS, 0, a->ctx->stream>>>(
            (const T *)a->in[0], glu_of<const T *>(I, (const T *)a->in[1], (const T *)a->in[2]),
            glu_of<T *>(I, (T *)a->out[0], (T *)a->out[1]), M, I);
    else
        swiglu_kernel<T><<<grid_of(M * I), LL_THREADS, 0, a->ctx->stream>>>(
            glu_of<const T *>(I, (const T *)a->in[0], (const T *)a->in[1]), (T *)a->out[0], M, I);
    return 0;
}

/* ---- launchers ---------------------------------------------------------------------------- */

/* F<T>(a, err) for the storage type of out0 (float, bf16 or half). */
#define LL_DISPATCH(call_bf16, call_f16, call_f32) \
    (a->out_dtype[0] == TG_BF16 ? (call_bf16) : a->out_dtype[0] == TG_F16 ? (call_f16) : (call_f32))

int tg_launch_rmsnorm(const tg_cuda_op_args *a, tg_err *err) {
    if (a->op->p.rmsnorm.m <= 0 || a->op->p.rmsnorm.d <= 0) return 0;
    return LL_DISPATCH(launch_rmsnorm<tg_bf16>(a, err), launch_rmsnorm<tg_f16>(a, err), launch_rmsnorm<float>(a, err));
}
int tg_launch_rmsnorm_bwd(const tg_cuda_op_args *a, tg_err *err) {
    if (a->op->p.rmsnorm.m <= 0 || a->op->p.rmsnorm.d <= 0) return 0;
    const int dt = a->in_dtype[0]; /* out0 may be absent: dy's type */
    return dt == TG_BF16 ? launch_rmsnorm_bwd<tg_bf16>(a, err)
           : dt == TG_F16 ? launch_rmsnorm_bwd<tg_f16>(a, err)
                          : launch_rmsnorm_bwd<float>(a, err);
}
int tg_launch_rope(const tg_cuda_op_args *a, tg_err *err) {
    if (a->op->p.rope.n <= 0) return 0;
    return LL_DISPATCH(launch_rope<tg_bf16>(a, 0, err), launch_rope<tg_f16>(a, 0, err), launch_rope<float>(a, 0, err));
}
int tg_launch_rope_bwd(const tg_cuda_op_args *a, tg_err *err) {
    if (a->op->p.rope.n <= 0) return 0;
    return LL_DISPATCH(launch_rope<tg_bf16>(a, 1, err), launch_rope<tg_f16>(a, 1, err), launch_rope<float>(a, 1, err));
}
int tg_launch_swiglu(const tg_cuda_op_args *a, tg_err *err) {
    if (a->op->p.swiglu.m <= 0 || a->op->p.swiglu.i <= 0) return 0;
    return LL_DISPATCH(launch_swiglu<tg_bf16>(a, 0, err), launch_swiglu<tg_f16>(a, 0, err),
                       launch_swiglu<float>(a, 0, err));
}
int tg_launch_swiglu_bwd(const tg_cuda_op_args *a, tg_err *err) {
    if (a->op->p.swiglu.m <= 0 || a->op->p.swiglu.i <= 0) return 0;
    return LL_DISPATCH(launch_swiglu<tg_bf16>(a, 1, err), launch_swiglu<tg_f16>(a, 1, err),
                       launch_swiglu<float>(a, 1, err));
}
