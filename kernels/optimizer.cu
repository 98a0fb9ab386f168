/* SCHEDULE, GRAD_NORM, GRAD_SQUARES, NORM_OF_SQUARES, BIAS_GRAD, ADAMW, ADAN.
 *
 * Everything a captured step needs from the previous step (step counter, total, lr,
 * norm) is read from device memory inside the kernels, never on the host.
 *
 * SCHEDULE is one thread doing the CPU's double arithmetic (in0 and out1 alias).
 * GRAD_NORM is two-stage and deterministic: one CUDA block per TG_NORM_BLOCK gradients
 * writes that block's sum of squares (double, rounded to float) to scratch; one block adds
 * them in double in a fixed order and writes the sqrt. GRAD_SQUARES is the first stage
 * into a tensor (ZeRO-1: a replica's own blocks), NORM_OF_SQUARES the second, so that the
 * norm from ZeRO-1's shards equals GRAD_NORM's bit for bit.
 * BIAS_GRAD is the two-stage column sum of kernels/column_sums.cuh (LayerNorm's dgamma /
 * dbeta column stages have the same shape): 64-column x 128-row stripes read as 16-byte
 * vectors, double partials per (row chunk, column), then a fixed-order sum of those.
 * ADAMW is one multi-tensor launch: each block owns a contiguous range of the pooled
 * parameter elements; a thread binary-searches its first segment once (segments sorted
 * by offset) and walks forward. Elements in the alignment gaps between segments are not
 * touched. The scalars (clip, lr/bc1, sqrt(bc2)) are computed per block in double as the
 * CPU does, and the update uses non-contracting float ops in the CPU's order, so params,
 * m and v match the CPU bit for bit. Gradients are only read. In bf16 and fp16 plans out[3]
 * is the parameter copies' pool (bf16 or half, same element indexing as params): every
 * updated element of every segment is also written there, rounded to nearest even, in the same pass (gaps are
 * left alone). A launch may cover a range of the elements (the executor's deferred update
 * runs the update in chunks beside the next forward, kernels/cuda_ops.h), and may be
 * gated by a device flag, doing nothing while it is 0. ZeRO-1 (zero_slice) updates the
 * replica's slice only, m and v indexed from the slice's first element. With bf16 state
 * (optimizer_state) the moments are widened, updated as above and stored rounded
 * stochastically from the same Philox words as the CPU's (kernels/state_rounding.h).
 *
 * BIAS_GRAD reads dout as float, bf16 or half (widened exactly); everything else is fp32. */
#include "kernels/column_sums.cuh"
#include "kernels/adan_update.h"
#include "kernels/loss_scale.h"
#include "kernels/lr_schedule.h"
#include "kernels/state_rounding.h"

#define NORM_THREADS 256
#define NORM_MAX_BLOCKS 1024 /* the final sum's threads */
#define ADAM_THREADS 256
#define ADAM_ITERS 8 /* float4 groups per thread: a block owns 256*4*8 = 8192 elements */

/* ---- schedule --------------------------------------------------------------------- */

__global__ void schedule_kernel(const float *step, const float *total_steps, const float *norm, float *lr,
                                float *step_out, double warmup, float base_lr, int form) {
    const double s = step[0], total = total_steps[0]; /* read before step_out (aliases step) */
    const bool skipped = norm && !isfinite(norm[0]);
    lr[0] = (float)((double)base_lr * tg_lr_multiplier(form, s, total, warmup));
    if (step_out) step_out[0] = (float)(skipped ? s : s + 1.0);
}

int tg_launch_schedule(const tg_cuda_op_args *a, tg_err *err) {
    schedule_kernel<<<1, 1, 0, a->ctx->stream>>>((const float *)a->in[0], (const float *)a->in[1],
                                                 (const float *)a->in[2], (float *)a->out[0],
                                                 (float *)a->out[1], (double)a->op->p.schedule.warmup,
                                                 a->op->p.schedule.lr, (int)a->op->p.schedule.form);
    return 0;
}

/* ---- grad norm ----------------------------------------------------------------- */

static int64_t norm_count(const tg_op *op, const int64_t *in_numel) {
    if (op->p.count.n > 0) return op->p.count.n;
    return in_numel ? in_numel[0] : 0;
}

static int64_t norm_blocks(int64_t n) { return (n + TG_NORM_BLOCK - 1) / TG_NORM_BLOCK; }

int64_t tg_scratch_grad_norm(const tg_op *op, const int64_t *in_numel) {
    const int64_t b = norm_blocks(norm_count(op, in_numel));
    return b > 0 ? b : 1;
}

/* Block b of TG_NORM_BLOCK gradients (one CUDA block each, blocks [b0, b1) of `blocks`):
 * the sum of their squares in double, in a fixed order (each thread's elements, then a
 * fixed tree), written rounded to float; 0 for the blocks outside [b0, b1). The same
 * block gives the same sum whichever launch computes it: GRAD_NORM and GRAD_SQUARES agree. */
__global__ void __launch_bounds__(NORM_THREADS)
norm_squares_kernel(const float *__restrict__ g, int64_t n, int64_t b0, int64_t b1, int vec, float *__restrict__ out) {
    __shared__ double s_red[32];
    const int64_t b = blockIdx.x;
    if (b < b0 || b >= b1) {
        if (threadIdx.x == 0) out[b] = 0.0f;
        return;
    }
    const int64_t i0 = b * TG_NORM_BLOCK, len = n - i0 < TG_NORM_BLOCK ? n - i0 : TG_NORM_BLOCK;
    const float *x = g + i0;
    double s = 0;
    if (vec && len == TG_NORM_BLOCK) {
        for (int64_t i = threadIdx.x; i < TG_NORM_BLOCK / 4; i += NORM_THREADS) {
            float4 v = reinterpret_cast<const float4 *>(x)[i];
            s += (double)v.x * v.x;
            s += (double)v.y * v.y;
            s += (double)v.z * v.z;
            s += (double)v.w * v.w;
        }
    } else {
        /* The same association as the vector loop: thread t's elements 4k..4k+3 in order. */
        for (int64_t i = threadIdx.x; i * 4 < len; i += NORM_THREADS)
            for (int k = 0; k < 4 && i * 4 + k < len; k++) s += (double)x[i * 4 + k] * x[i * 4 + k];
    }
    s = block_sum_d<NORM_THREADS>(s, s_red);
    if (threadIdx.x == 0) out[b] = (float)s;
}

/* sqrt(the blocks' sums added in double in a fixed order) / scale. */
__global__ void __launch_bounds__(NORM_MAX_BLOCKS)
norm_final_kernel(const float *__restrict__ squares, int64_t blocks, const float *__restrict__ scale,
                  float *__restrict__ out) {
    __shared__ double s_red[32];
    double s = 0;
    for (int64_t i = threadIdx.x; i < blocks; i += NORM_MAX_BLOCKS) s += (double)squares[i];
    s = block_sum_d<NORM_MAX_BLOCKS>(s, s_red);
    /* fp16 plans: the unscaled gradients' norm (the scale, a power of two, divides exactly). */
    if (threadIdx.x == 0) out[0] = scale ? __fdiv_rn((float)sqrt(s), scale[0]) : (float)sqrt(s);
}

static int launch_squares(const float *g, int64_t n, int64_t b0, int64_t b1, float *out, cudaStream_t st, tg_err *err) {
    const int64_t blocks = norm_blocks(n);
    if (blocks <= 0) return 0;
    if (blocks > INT32_MAX) return tg_fail(err, "GRAD_SQUARES: %lld blocks of squares past a grid", (long long)blocks);
    norm_squares_kernel<<<(unsigned)blocks, NORM_THREADS, 0, st>>>(g, n, b0, b1, tg_aligned16(g), out);
    return 0;
}

int tg_launch_grad_norm(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t n = norm_count(a->op, a->in_numel), blocks = norm_blocks(n);
    if (tg_scratch_check(a, blocks > 0 ? blocks : 1, err)) return -1;
    float *squares = (float *)a->ctx->reduce_scratch;
    if (launch_squares((const float *)a->in[0], n, 0, blocks, squares, a->ctx->stream, err)) return -1;
    norm_final_kernel<<<1, NORM_MAX_BLOCKS, 0, a->ctx->stream>>>(squares, blocks, (const float *)a->in[1],
                                                                 (float *)a->out[0]);
    return 0;
}

int tg_launch_grad_squares(const tg_cuda_op_args *a, tg_err *err) {
    const tg_squares_params *p = &a->op->p.squares;
    const int64_t blocks = norm_blocks(p->n);
    int64_t b0 = 0, b1 = blocks;
    /* One replica without the others (no communicator, or the GEMM tuning pass) holds every slice. */
    if (p->slice > 0 && a->ctx->nccl_comm && a->ctx->ranks > 1 && !a->ctx->gemm_tune) {
        const int64_t per = p->slice / TG_NORM_BLOCK;
        b0 = per * a->ctx->rank < blocks ? per * a->ctx->rank : blocks;
        b1 = b0 + per < blocks ? b0 + per : blocks;
    }
    return launch_squares((const float *)a->in[0], p->n, b0, b1, (float *)a->out[0], a->ctx->stream, err);
}

int tg_launch_norm_of_squares(const tg_cuda_op_args *a, tg_err *err) {
    norm_final_kernel<<<1, NORM_MAX_BLOCKS, 0, a->ctx->stream>>>((const float *)a->in[0], a->in_numel[0],
                                                                 (const float *)a->in[1], (float *)a->out[0]);
    return 0;
}

/* ---- loss scale ------------------------------------------------------------------- */

__global__ void loss_scale_kernel(const float *__restrict__ norm, float *scale, float *tracker, tg_loss_scale_params p) {
    float s = scale[0], t = tracker[0];
    tg_loss_scale_step(norm[0], p.growth_factor, p.backoff_factor, p.growth_interval, &s, &t);
    scale[0] = s, tracker[0] = t;
}

int tg_launch_loss_scale_update(const tg_cuda_op_args *a, tg_err *err) {
    /* out0 and out1 are in1 and in2 (in place, plan/ops.def). */
    loss_scale_kernel<<<1, 1, 0, a->ctx->stream>>>((const float *)a->in[0], (float *)a->out[0], (float *)a->out[1],
                                                   a->op->p.loss_scale);
    return 0;
}

/* ---- bias grad -------------------------------------------------------------------- */

int64_t tg_scratch_bias_grad(const tg_op *op) { return tg_col_sum_scratch(op->p.bias_grad.m, op->p.bias_grad.n); }

/* BIAS_GRAD over a 16-bit dout: 16-, 8-byte or scalar accesses. */
template <class T>
static int bias_grad_16(const tg_cuda_op_args *a, int64_t M, int64_t N, double *partial, float *db, int ow,
                        tg_err *err) {
    const T *dy = (const T *)a->in[0];
    cudaStream_t st = a->ctx->stream;
    if (N % 8 == 0 && tg_aligned16(dy)) return col_sums<8>(col_read<T, 8>{dy, N}, M, N, partial, db, ow, st, err);
    if (N % 4 == 0 && tg_aligned8(dy)) return col_sums<4>(col_read<T, 4>{dy, N}, M, N, partial, db, ow, st, err);
    return col_sums<1>(col_read<T, 1>{dy, N}, M, N, partial, db, ow, st, err);
}

int tg_launch_bias_grad(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t M = a->op->p.bias_grad.m, N = a->op->p.bias_grad.n;
    if (M <= 0 || N <= 0) return 0;
    if (tg_scratch_check(a, tg_scratch_bias_grad(a->op), err)) return -1;
    double *partial = (double *)a->ctx->reduce_scratch;
    float *db = (float *)a->out[0];
    const int ow = a->op->p.bias_grad.overwrite != 0;
    cudaStream_t st = a->ctx->stream;
    if (a->in_dtype[0] == TG_BF16) return bias_grad_16<tg_bf16>(a, M, N, partial, db, ow, err);
    if (a->in_dtype[0] == TG_F16) return bias_grad_16<tg_f16>(a, M, N, partial, db, ow, err);
    const float *dy = (const float *)a->in[0];
    if (N % 4 == 0 && tg_aligned16(dy)) return col_sums<4>(col_read<float, 4>{dy, N}, M, N, partial, db, ow, st, err);
    return col_sums<1>(col_read<float, 1>{dy, N}, M, N, partial, db, ow, st, err);
}

/* ---- adamw ------------------------------------------------------------------------ */

struct adam_hyper {
    float b1, b2, eps, wd, max_norm;
};

/* One element, exactly the CPU's expression order. */
static __device__ __forceinline__ void adam_elem(float g, float &p, float &m, float &v, float clip, float decay,
                                                 float b1, float b2, float eps, float step_size, float sqrt_bc2) {
    g = fmul(g, clip);
    p = fsub(p, fmul(decay, p));
    m = fadd(fmul(b1, m), fmul(fsub(1.0f, b1), g));
    v = fadd(fmul(b2, v), fmul(fmul(fsub(1.0f, b2), g), g));
    p = fsub(p, __fdiv_rn(fmul(step_size, m), fadd(__fdiv_rn(__fsqrt_rn(v), sqrt_bc2), eps)));
}

/* Last segment whose offset <= e (segments sorted by offset), or -1. */
static __device__ __forceinline__ int seg_find(const tg_param_segment *seg, int nseg, int64_t e) {
    int lo = 0, hi = nseg - 1, r = -1;
    while (lo <= hi) {
        int mid = (lo + hi) >> 1;
        if (seg[mid].offset <= e) r = mid, lo = mid + 1;
        else hi = mid - 1;
    }
    return r;
}

/* The step a draw is taken at: the step counter as the CPU reads it. */
static __device__ __forceinline__ uint64_t round_step(const float *step_ptr) {
    const float s = step_ptr[0];
    return s > 0.0f ? (uint64_t)s : 0;
}

/* COPY: also write the updated parameters, rounded to PT (bf16, or half in fp16 plans:
 * round to nearest even, past 65504 to infinity), to pbf (element i of the copies' pool
 * = element i of params), in the same pass. ST: the state's type, float or bf16 (then
 * rounded stochastically, one Philox block per 4 elements). */
template <bool VEC, bool COPY, class PT, class ST>
__global__ void __launch_bounds__(ADAM_THREADS)
adamw_kernel(const float *__restrict__ grads, float *__restrict__ params, ST *__restrict__ m_all,
             ST *__restrict__ v_all, PT *__restrict__ pbf, const float *__restrict__ lr_ptr, const float *__restrict__ step_ptr,
             const float *__restrict__ norm_ptr, const float *__restrict__ scale_ptr,
             const tg_param_segment *__restrict__ seg, int nseg, int64_t first,
             int64_t n, int64_t state_first, const int *__restrict__ gate, adam_hyper h, uint64_t seed) {
    constexpr bool ROUND = sizeof(ST) == 2;
    __shared__ float s_lr, s_clip, s_step_size, s_sqrt_bc2;
    if (gate && *gate == 0) return;
    if (norm_ptr && !isfinite(norm_ptr[0])) return; /* a non-finite gradient: the step is skipped */
    if (threadIdx.x == 0) {
        const float lr = lr_ptr[0];
        float clip = 1.0f;
        if (h.max_norm > 0.0f && norm_ptr) clip = (float)fmin(1.0, (double)h.max_norm / ((double)norm_ptr[0] + 1e-6));
        if (scale_ptr) clip = __fmul_rn(clip, __frcp_rn(scale_ptr[0])); /* fp16: unscale (ops.def ADAMW in4) */
        const double t = step_ptr[0];
        const double bc1 = 1.0 - pow((double)h.b1, t), bc2 = 1.0 - pow((double)h.b2, t);
        s_lr = lr;
        s_clip = clip;
        s_step_size = (float)((double)lr / bc1);
        s_sqrt_bc2 = (float)sqrt(bc2);
    }
    __syncthreads();
    const float lr = s_lr, clip = s_clip, step_size = s_step_size, sqrt_bc2 = s_sqrt_bc2;
    const float lr_wd = fmul(lr, h.wd);
    const uint64_t rstep = ROUND ? round_step(step_ptr) : 0;
    const int64_t block_first = first + (int64_t)blockIdx.x * ADAM_THREADS * 4 * ADAM_ITERS;
    int s = -1;
    for (int it = 0; it < ADAM_ITERS; it++) {
        const int64_t e = block_first + ((int64_t)it * ADAM_THREADS + threadIdx.x) * 4;
        if (e >= n) break;
        if (s < 0) s = seg_find(seg, nseg, e);
        else
            while (s + 1 < nseg && seg[s + 1].offset <= e) s++;
        if (s < 0) continue; /* before the first segment */
        int64_t end = seg[s].offset + seg[s].numel;
        uint32_t w[4] = {0, 0, 0, 0}; /* the draws of elements e .. e+3 (e is a multiple of 4) */
        if (ROUND) tg_state_round_words(seed, rstep, TG_STATE_ROUND_KEY, (uint64_t)e >> 2, w);
        if (VEC && e + 4 <= end && e + 4 <= n) {
            const float decay = seg[s].decay ? lr_wd : 0.0f;
            const int64_t i4 = e / 4;
            float4 g = reinterpret_cast<const float4 *>(grads)[i4];
            float4 p = reinterpret_cast<float4 *>(params)[i4];
            const int64_t k4 = i4 - state_first / 4; /* state_first: a multiple of 4 */
            float m[4], v[4];
            tg_vec<ST, 4>::load(m_all, k4, m);
            tg_vec<ST, 4>::load(v_all, k4, v);
            adam_elem(g.x, p.x, m[0], v[0], clip, decay, h.b1, h.b2, h.eps, step_size, sqrt_bc2);
            adam_elem(g.y, p.y, m[1], v[1], clip, decay, h.b1, h.b2, h.eps, step_size, sqrt_bc2);
            adam_elem(g.z, p.z, m[2], v[2], clip, decay, h.b1, h.b2, h.eps, step_size, sqrt_bc2);
            adam_elem(g.w, p.w, m[3], v[3], clip, decay, h.b1, h.b2, h.eps, step_size, sqrt_bc2);
            if (ROUND)
                for (int j = 0; j < 4; j++) {
                    m[j] = tg_bf16_round_stochastic(m[j], w[j]);
                    v[j] = tg_bf16_round_stochastic(v[j], w[j] >> 16);
                }
            reinterpret_cast<float4 *>(params)[i4] = p;
            tg_vec<ST, 4>::store(m_all, k4, m);
            tg_vec<ST, 4>::store(v_all, k4, v);
            if (COPY) {
                const float pv[4] = {p.x, p.y, p.z, p.w};
                tg_vec<PT, 4>::store(pbf, i4, pv);
            }
        } else { /* segment tail, gap, or unaligned pools: element by element */
            for (int j = 0; j < 4 && e + j < n; j++) {
                const int64_t i = e + j;
                while (s + 1 < nseg && seg[s + 1].offset <= i) s++;
                end = seg[s].offset + seg[s].numel;
                if (i >= end) continue;
                const int64_t k = i - state_first;
                float p = params[i], m = tg_ld(m_all, k), v = tg_ld(v_all, k);
                adam_elem(grads[i], p, m, v, clip, seg[s].decay ? lr_wd : 0.0f, h.b1, h.b2, h.eps, step_size,
                          sqrt_bc2);
                if (ROUND) {
                    const uint32_t wj = tg_philox_word(w, (unsigned)j);
                    m = tg_bf16_round_stochastic(m, wj), v = tg_bf16_round_stochastic(v, wj >> 16);
                }
                params[i] = p;
                tg_st(m_all, k, m), tg_st(v_all, k, v);
                if (COPY) tg_st(pbf, i, p);
            }
        }
    }
}

/* Elements [first, end) of the parameters, whose m and v sit at [first - state_first, ...). */
template <class ST>
static void adamw_launch_as(const tg_cuda_op_args *a, int64_t first, int64_t end, int64_t state_first, const int *gate,
                            int64_t blocks, const adam_hyper &h) {
    const tg_cuda_ctx *ctx = a->ctx;
    const float *g = (const float *)a->in[0];
    float *p = (float *)a->out[0];
    ST *m = (ST *)a->out[1], *v = (ST *)a->out[2];
    void *pbf = a->out[3]; /* bf16 / fp16 plans: the parameter copies' pool, else NULL */
    const int state_vec = sizeof(ST) == 4 ? tg_aligned16(m) && tg_aligned16(v) : tg_aligned8(m) && tg_aligned8(v);
    const int vec = tg_aligned16(g) && tg_aligned16(p) && state_vec && tg_aligned8(pbf);
    const float *lr = (const float *)a->in[1], *step = (const float *)a->in[2], *norm = (const float *)a->in[3];
    const float *scale = (const float *)a->in[4];
#define ADAMW(VEC, COPY, PT)                                                                                          \
    adamw_kernel<VEC, COPY, PT, ST><<<(unsigned)blocks, ADAM_THREADS, 0, ctx->stream>>>(                              \
        g, p, m, v, (PT *)pbf, lr, step, norm, scale, ctx->segments, ctx->n_segments, first, end, state_first, gate, h, \
        ctx->seed)
    const int f16 = pbf && a->out_dtype[3] == TG_F16;
    if (vec && f16)
        ADAMW(true, true, tg_f16);
    else if (f16)
        ADAMW(false, true, tg_f16);
    else if (vec && pbf)
        ADAMW(true, true, tg_bf16);
    else if (vec)
        ADAMW(true, false, tg_bf16);
    else if (pbf)
        ADAMW(false, true, tg_bf16);
    else
        ADAMW(false, false, tg_bf16);
#undef ADAMW
}

static int adamw_launch(const tg_cuda_op_args *a, int64_t first, int64_t end, int64_t state_first, const int *gate,
                        tg_err *err) {
    const tg_cuda_ctx *ctx = a->ctx;
    const tg_adamw_params *ap = &a->op->p.adamw;
    if (end > ap->n) end = ap->n;
    if (first >= end || ctx->n_segments <= 0) return 0;
    if (first % 4 || state_first % 4)
        return tg_fail(err, "AdamW range starts at element %lld (state at %lld), not a multiple of 4", (long long)first,
                       (long long)state_first);
    if (!ctx->segments) return tg_fail(err, "no parameter segment table");
    const adam_hyper h = {ap->beta1, ap->beta2, ap->eps, ap->weight_decay, ap->max_grad_norm};
    const int64_t per_block = (int64_t)ADAM_THREADS * 4 * ADAM_ITERS;
    const int64_t blocks = (end - first + per_block - 1) / per_block;
    if (blocks > INT32_MAX) return tg_fail(err, "%lld parameters exceed the grid", (long long)(end - first));
    if (a->out_dtype[1] == TG_BF16) adamw_launch_as<tg_bf16>(a, first, end, state_first, gate, blocks, h);
    else adamw_launch_as<float>(a, first, end, state_first, gate, blocks, h);
    return 0;
}

int tg_cuda_adamw_range(const tg_cuda_op_args *a, int64_t first, int64_t end, const int *gate, tg_err *err) {
    if (a->op->p.adamw.zero_slice > 0) return tg_fail(err, "a ZeRO-1 AdamW updates only its replica's slice, not a range");
    return adamw_launch(a, first, end, 0, gate, err);
}

int tg_launch_adamw(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t slice = a->op->p.adamw.zero_slice; /* ZeRO-1: this replica's slice, its state from m[0] */
    if (slice > 0) return adamw_launch(a, (int64_t)a->ctx->rank * slice, (int64_t)(a->ctx->rank + 1) * slice,
                                       (int64_t)a->ctx->rank * slice, NULL, err);
    return adamw_launch(a, 0, a->op->p.adamw.n, 0, NULL, err);
}

/* ---- adan ------------------------------------------------------------------------- */

/* One element after another, each thread taking every ADAM_THREADS-th element of its
 * block's stretch (coalesced), the update itself kernels/adan_update.h's. The per-update
 * constants come from device memory (lr, step, norm), as AdamW's. ST: the state's type
 * (bf16: rounded stochastically, the element's word of each of the two streams). */
template <bool COPY, class PT, class ST>
__global__ void __launch_bounds__(ADAM_THREADS)
adan_kernel(const float *__restrict__ grads, float *__restrict__ params, ST *__restrict__ m_d,
            ST *__restrict__ v_gprev, PT *__restrict__ pbf, const float *__restrict__ lr_ptr,
            const float *__restrict__ step_ptr, const float *__restrict__ norm_ptr, const float *__restrict__ scale_ptr,
            const tg_param_segment *__restrict__ seg, int nseg, int64_t first, int64_t n, int64_t state_first,
            int64_t state, const int *__restrict__ gate, tg_adan_params h, uint64_t seed) {
    constexpr bool ROUND = sizeof(ST) == 2;
    __shared__ tg_adan_step s_step;
    if (gate && *gate == 0) return;
    if (norm_ptr && !isfinite(norm_ptr[0])) return; /* a non-finite gradient: the step is skipped */
    if (threadIdx.x == 0) {
        s_step = tg_adan_step_of(lr_ptr[0], step_ptr[0], norm_ptr ? norm_ptr[0] : 0.0f, norm_ptr ? h.max_grad_norm : 0.0f,
                                 h.beta1, h.beta2, h.beta3, h.eps, (int)h.no_prox);
        if (scale_ptr) s_step.clip = __fmul_rn(s_step.clip, __frcp_rn(scale_ptr[0])); /* fp16: unscale */
    }
    __syncthreads();
    const tg_adan_step st = s_step;
    const float lr_wd = fmul(lr_ptr[0], h.weight_decay);
    const uint64_t rstep = ROUND ? round_step(step_ptr) : 0;
    const int64_t block_first = first + (int64_t)blockIdx.x * ADAM_THREADS * 4 * ADAM_ITERS;
    int s = -1;
    for (int it = 0; it < 4 * ADAM_ITERS; it++) {
        const int64_t i = block_first + (int64_t)it * ADAM_THREADS + threadIdx.x;
        if (i >= n) break;
        if (s < 0) s = seg_find(seg, nseg, i);
        else
            while (s + 1 < nseg && seg[s + 1].offset <= i) s++;
        if (s < 0 || i >= seg[s].offset + seg[s].numel) continue; /* before the first segment, or a gap */
        const int64_t k = i - state_first;
        float p = params[i], m = tg_ld(m_d, k), d = tg_ld(m_d, state + k), v = tg_ld(v_gprev, k),
              gp = tg_ld(v_gprev, state + k);
        tg_adan_element(&st, seg[s].decay ? lr_wd : 0.0f, grads[i], &p, &m, &d, &v, &gp);
        if (ROUND) {
            uint32_t w1[4], w2[4];
            tg_state_round_words(seed, rstep, TG_STATE_ROUND_KEY, (uint64_t)i >> 2, w1);
            tg_state_round_words(seed, rstep, TG_STATE_ROUND_KEY2, (uint64_t)i >> 2, w2);
            const uint32_t r1 = tg_philox_word(w1, (unsigned)(i & 3)), r2 = tg_philox_word(w2, (unsigned)(i & 3));
            m = tg_bf16_round_stochastic(m, r1), d = tg_bf16_round_stochastic(d, r1 >> 16);
            v = tg_bf16_round_stochastic(v, r2), gp = tg_bf16_round_stochastic(gp, r2 >> 16);
        }
        params[i] = p;
        tg_st(m_d, k, m), tg_st(m_d, state + k, d), tg_st(v_gprev, k, v), tg_st(v_gprev, state + k, gp);
        if (COPY) tg_st(pbf, i, p);
    }
}

/* Elements [first, end) of the parameters, their state at [first - state_first, ...) of each part. */
template <class ST>
static void adan_launch_as(const tg_cuda_op_args *a, int64_t first, int64_t end, int64_t state_first, const int *gate,
                           int64_t blocks) {
    const tg_cuda_ctx *ctx = a->ctx;
    const tg_adan_params *ap = &a->op->p.adan;
    const float *g = (const float *)a->in[0];
    float *p = (float *)a->out[0];
    ST *md = (ST *)a->out[1], *vg = (ST *)a->out[2];
    void *pbf = a->out[3]; /* bf16 / fp16 plans: the parameter copies' pool, else NULL */
    const float *lr = (const float *)a->in[1], *step = (const float *)a->in[2], *norm = (const float *)a->in[3];
    const float *scale = (const float *)a->in[4];
    const int64_t state = ap->zero_slice > 0 ? ap->zero_slice : ap->n;
#define ADAN(COPY, PT)                                                                                                \
    adan_kernel<COPY, PT, ST><<<(unsigned)blocks, ADAM_THREADS, 0, ctx->stream>>>(                                    \
        g, p, md, vg, (PT *)pbf, lr, step, norm, scale, ctx->segments, ctx->n_segments, first, end, state_first, state, \
        gate, *ap, ctx->seed)
    if (pbf && a->out_dtype[3] == TG_F16)
        ADAN(true, tg_f16);
    else if (pbf)
        ADAN(true, tg_bf16);
    else
        ADAN(false, tg_bf16);
#undef ADAN
}

static int adan_launch(const tg_cuda_op_args *a, int64_t first, int64_t end, int64_t state_first, const int *gate,
                       tg_err *err) {
    const tg_cuda_ctx *ctx = a->ctx;
    const tg_adan_params *ap = &a->op->p.adan;
    if (end > ap->n) end = ap->n;
    if (first >= end || ctx->n_segments <= 0) return 0;
    if (!ctx->segments) return tg_fail(err, "no parameter segment table");
    const int64_t per_block = (int64_t)ADAM_THREADS * 4 * ADAM_ITERS;
    const int64_t blocks = (end - first + per_block - 1) / per_block;
    if (blocks > INT32_MAX) return tg_fail(err, "%lld parameters exceed the grid", (long long)(end - first));
    if (a->out_dtype[1] == TG_BF16) adan_launch_as<tg_bf16>(a, first, end, state_first, gate, blocks);
    else adan_launch_as<float>(a, first, end, state_first, gate, blocks);
    return 0;
}

int tg_cuda_adan_range(const tg_cuda_op_args *a, int64_t first, int64_t end, const int *gate, tg_err *err) {
    if (a->op->p.adan.zero_slice > 0) return tg_fail(err, "a ZeRO-1 Adan updates only its replica's slice, not a range");
    return adan_launch(a, first, end, 0, gate, err);
}

int tg_launch_adan(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t slice = a->op->p.adan.zero_slice; /* ZeRO-1: this replica's slice, its state from element 0 */
    if (slice > 0) return adan_launch(a, (int64_t)a->ctx->rank * slice, (int64_t)(a->ctx->rank + 1) * slice,
                                      (int64_t)a->ctx->rank * slice, NULL, err);
    return adan_launch(a, 0, a->op->p.adan.n, 0, NULL, err);
}
