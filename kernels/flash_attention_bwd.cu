/* ATTENTION_BWD: the fused attention backward (kernels/flash_attention.cuh describes the
 * arrangement), reading the forward's LSE and keep bits (nothing is drawn again). bf16
 * and fp16 plans (one template on the 16-bit type) with T > 128: two tensor-core kernels, dQ (rows = queries; first delta =
 * rowsum(dO * O), written for the other kernel, then per key tile P from LSE, dP = dO V^T,
 * dS = P (dP keep/(1-p) - delta) scale, dQ += dS K) and dK/dV (rows = keys; per query tile
 * P^T from LSE, dV += D^T dO, dP^T = V dO^T, dS^T as above, dK += dS^T Q), which recompute
 * QK^T once each instead of summing dQ with atomics; T <= 128 takes the one-kernel backward
 * (flash_attention_bwd_short.cu). fp32 plans: a warp per query row (dQ, delta) and per key
 * row (dK, dV). */
#include "kernels/flash_attention.cuh"

/* ---- backward: dQ (and delta) (bf16 / f16: ST) ------------------------------------ */

/* Blocks per SM the backward kernels are capped to (registers), as measured (see
 * flash_attention.cuh). */
template <int DP>
struct fa_bwd_occupancy {
    static constexpr int DQ = DP <= 64 ? 4 : 2;
    static constexpr int DKDV = DP <= 64 ? 3 : 2;
};

template <int DP, class ST>
__global__ void __launch_bounds__(FA_THREADS, fa_bwd_occupancy<DP>::DQ) fa_bwd_dq_kernel(fa_args a) {
    typedef fa_stile<DP> L; /* one warpgroup: FA_ROWS rows */
    constexpr int E = L::ELEMS;
    constexpr bool SWZ = L::WG;
    ST *sQ = reinterpret_cast<ST *>(fa_smem_base<DP>()), *sdO = sQ + E, *sO = sdO + E, *sKV = sO + E;
    float *sM2 = reinterpret_cast<float *>(sKV + 4 * E);
    const int T = a.T, H = a.H, Dh = a.Dh;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * FA_ROWS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int wr0 = q0 + warp * 16;
    const ST *Q = (const ST *)a.q + (int64_t)b * T * a.ldq + h * Dh;
    const ST *K = (const ST *)a.k + (int64_t)b * T * a.ldk + h * Dh;
    const ST *V = (const ST *)a.v + (int64_t)b * T * a.ldv + h * Dh;
    const ST *dO = (const ST *)a.dout + (int64_t)b * T * a.ldo + h * Dh;
    const ST *O = (const ST *)a.o + (int64_t)b * T * a.ldo + h * Dh;
    int ktiles = (T + FA_COLS - 1) / FA_COLS;
    if (a.causal) ktiles = min(ktiles, (q0 + FA_ROWS - 1) / FA_COLS + 1);
    load_tile<DP, FA_ROWS, FA_THREADS, SWZ>(sQ, Q, a.ldq, q0, T, Dh, a.vec);
    load_tile<DP, FA_ROWS, FA_THREADS, SWZ>(sdO, dO, a.ldo, q0, T, Dh, a.vec);
    load_tile<DP, FA_ROWS, FA_THREADS, SWZ>(sO, O, a.ldo, q0, T, Dh, a.vec);
    cp_async_commit();
    const key_tiles<DP, ST> kv = {K, V, a.ldk, a.ldv, a.mask, b, T, Dh, a.vec};
    load_key_tile<DP, FA_THREADS>(sKV, sM2, 0, kv, 0);
    cp_async_commit();
    cp_async_wait<1>();
    fa_publish_tiles<DP>();
    /* delta of the warp's 16 rows (lanes L and L ^ 16 hold row L & 15's). */
    float dl[2], lse2[2];
    {
        const float acc = row_delta<DP, SWZ>(sdO, sO, warp * 16, lane);
        if (lane < 16 && wr0 + lane < T) a.delta[(int64_t)bh * T + wr0 + lane] = acc;
        dl[0] = __shfl_sync(0xffffffffu, acc, g);
        dl[1] = __shfl_sync(0xffffffffu, acc, g + 8);
    }
    for (int r = 0; r < 2; r++) {
        const int row = wr0 + g + 8 * r;
        lse2[r] = row < T ? a.lse[(int64_t)bh * T + row] * FA_LOG2E : 0.0f;
    }
    float dq[DP / 8][4];
    for (int d = 0; d < DP / 8; d++) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;
    const float sl2 = a.scale * FA_LOG2E;
    for (int kt = 0; kt < ktiles; kt++) {
        const int k0 = kt * FA_COLS, buf = kt & 1;
        advance_key_tile<DP, FA_THREADS, 2>(sKV, sM2, kt, ktiles, kv);
        const ST *sK = sKV + 2 * E * buf, *sV = sK + E;
        const float *sM = sM2 + FA_COLS * buf;
        { /* every warp's rows see some of these keys (the last tile is the diagonal one) */
            /* The forward's keep bits of rows g and g + 8 for these 64 keys. */
            uint32_t kb[2][2] = {{0u, 0u}, {0u, 0u}};
            if (a.drop)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int row = wr0 + g + 8 * r, w0 = k0 >> 5;
                    if (row >= T) continue;
                    const uint32_t *src = a.bits + ((int64_t)bh * T + row) * a.W;
                    kb[r][0] = w0 < a.W ? src[w0] : 0u;
                    kb[r][1] = w0 + 1 < a.W ? src[w0 + 1] : 0u;
                }
            float s[FA_COLS / 8][4], dp[FA_COLS / 8][4];
            fa_abt2<DP>(s, sQ, sK, dp, sdO, sV, warp * 16, lane); /* S = Q K^T, dD = dO V^T */
            float unused[2] = {0.0f, 0.0f};
            if (tile_needs_mask(sM, a.causal, k0, wr0, lane))
                scale_mask_rows<1>(s, unused, sM, sl2, a.causal, k0, wr0, lane);
            else
                scale_mask_rows<0>(s, unused, sM, sl2, a.causal, k0, wr0, lane);
#pragma unroll
            for (int j = 0; j < FA_COLS / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int col = 8 * j + 2 * c + (e & 1);
                    const float pv = fa_exp2(s[j][e] - lse2[e >> 1]); /* masked: exp2(-inf) = 0 */
                    float dpv = dp[j][e];
                    if (a.drop) dpv = (kb[e >> 1][col >> 5] >> (col & 31)) & 1u ? dpv * a.inv_keep : 0.0f;
                    s[j][e] = pv * (dpv - dl[e >> 1]) * a.scale; /* dS */
                }
            fa_pb<DP>(dq, s, sK, lane); /* dQ += dS K */
        }
        __syncthreads();
    }
    store_rows<DP>((ST *)a.dq + (int64_t)b * T * a.lddq + h * Dh, a.lddq, dq, wr0, T, Dh, a.vec, lane);
}

/* ---- backward: dK, dV (bf16 / f16: ST) --------------------------------------------- */

template <int DP, class ST>
__global__ void __launch_bounds__(FA_THREADS, fa_bwd_occupancy<DP>::DKDV) fa_bwd_dkdv_kernel(fa_args a) {
    typedef fa_stile<DP> L; /* one warpgroup: FA_ROWS keys */
    constexpr int E = L::ELEMS;
    constexpr bool SWZ = L::WG;
    ST *sK = reinterpret_cast<ST *>(fa_smem_base<DP>()), *sV = sK + E, *sQO = sV + E; /* [buf][Q, dO] */
    float *sLD = reinterpret_cast<float *>(sQO + 4 * E); /* [buf][LSE 64, delta 64] (natural log) */
    float *sM = sLD + 4 * FA_COLS;
    uint32_t *sB = reinterpret_cast<uint32_t *>(sM + FA_COLS); /* [buf][64 queries][2 words] */
    const int T = a.T, H = a.H, Dh = a.Dh;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int k0 = blockIdx.x * FA_ROWS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int wk0 = k0 + warp * 16; /* this warp's first key */
    const ST *Q = (const ST *)a.q + (int64_t)b * T * a.ldq + h * Dh;
    const ST *K = (const ST *)a.k + (int64_t)b * T * a.ldk + h * Dh;
    const ST *V = (const ST *)a.v + (int64_t)b * T * a.ldv + h * Dh;
    const ST *dO = (const ST *)a.dout + (int64_t)b * T * a.ldo + h * Dh;
    const int qtiles = (T + FA_COLS - 1) / FA_COLS;
    const int qt0 = a.causal ? k0 / FA_COLS : 0;
    load_tile<DP, FA_ROWS, FA_THREADS, SWZ>(sK, K, a.ldk, k0, T, Dh, a.vec);
    load_tile<DP, FA_ROWS, FA_THREADS, SWZ>(sV, V, a.ldv, k0, T, Dh, a.vec);
    load_key_mask(sM, a.mask, b, T, k0);
    /* Query tile qt goes to buffer (qt - qt0) & 1 with its LSE and delta. */
    auto load_queries = [&](int qt, int buf) {
        const int q0 = qt * FA_COLS;
        ST *dst = sQO + 2 * E * buf;
        load_tile<DP, FA_COLS, FA_THREADS, SWZ>(dst, Q, a.ldq, q0, T, Dh, a.vec);
        load_tile<DP, FA_COLS, FA_THREADS, SWZ>(dst + E, dO, a.ldo, q0, T, Dh, a.vec);
        float *ld = sLD + 2 * FA_COLS * buf;
        load_row_stat(ld, a.lse, bh, T, q0);
        load_row_stat(ld + FA_COLS, a.delta, bh, T, q0);
        if (a.drop) /* the two words of this block's 64 keys for each query */
            for (int i = threadIdx.x; i < 2 * FA_COLS; i += FA_THREADS) {
                const int q = q0 + (i >> 1), wi = (k0 >> 5) + (i & 1);
                const bool in = q < T && wi < a.W;
                const uint32_t *src = in ? a.bits + ((int64_t)bh * T + q) * a.W + wi : a.bits;
                const unsigned dst = (unsigned)__cvta_generic_to_shared(sB + 2 * FA_COLS * buf + i);
                asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(in ? 4 : 0));
            }
        cp_async_commit();
    };
    if (qt0 < qtiles) load_queries(qt0, 0);
    float dk[DP / 8][4], dv[DP / 8][4];
    for (int d = 0; d < DP / 8; d++)
        for (int e = 0; e < 4; e++) dk[d][e] = dv[d][e] = 0.0f;
    const float sl2 = a.scale * FA_LOG2E;
    const float ik = a.drop ? a.inv_keep : 1.0f; /* x * 1.0f is x: the same values without dropout */
    bool kv[2] = {true, true};
    for (int qt = qt0; qt < qtiles; qt++) {
        const int q0 = qt * FA_COLS, buf = (qt - qt0) & 1;
        if (qt + 1 < qtiles) {
            load_queries(qt + 1, buf ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        fa_publish_tiles<DP>();
        if (qt == qt0) kv[0] = sM[warp * 16 + g] != 0.0f, kv[1] = sM[warp * 16 + g + 8] != 0.0f;
        const ST *sQ = sQO + 2 * E * buf, *sdO = sQ + E;
        const float *sL = sLD + 2 * FA_COLS * buf, *sD = sL + FA_COLS;
        const uint32_t *sBb = sB + 2 * FA_COLS * buf;
        { /* every warp's keys meet some of these queries (the first tile is the diagonal one) */
            float s[FA_COLS / 8][4], dp[FA_COLS / 8][4];
            fa_abt2<DP>(s, sK, sQ, dp, sV, sdO, warp * 16, lane); /* S^T = K Q^T, dD^T = V dO^T */
            /* Element-wise masking only where a query past T or a causal pair can occur. */
            const bool masked = q0 + FA_COLS > T || (a.causal && q0 < wk0 + 15);
            /* s becomes D^T (dropped probabilities), dp becomes dS^T. The lane's two keys
             * (rows g and g + 8 of its warp's 16) lie in one 32-key word of the keep bits,
             * so one word per query serves both. */
            const int ko = warp * 16 + g; /* the lane's first key within the block's 64 */
#pragma unroll
            for (int j = 0; j < FA_COLS / 8; j++) {
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int qc = 8 * j + 2 * c + i;
                    const float lse2 = sL[qc] * FA_LOG2E, dlt = sD[qc];
                    const uint32_t word = a.drop ? sBb[2 * qc + (ko >> 5)] : 0xFFFFFFFFu;
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int e = 2 * h + i;
                        bool ok = kv[h];
                        if (masked) ok = ok && q0 + qc < T && (!a.causal || wk0 + g + 8 * h <= q0 + qc);
                        const float pv = ok ? fa_exp2(s[j][e] * sl2 - lse2) : 0.0f;
                        const bool keep = (word >> ((ko + 8 * h) & 31)) & 1u;
                        const float dpv = keep ? dp[j][e] * ik : 0.0f;
                        s[j][e] = keep ? pv * ik : 0.0f;
                        dp[j][e] = pv * (dpv - dlt) * a.scale;
                    }
                }
            }
            fa_pb2<DP>(dv, s, sdO, dk, dp, sQ, lane); /* dV += D^T dO, dK += dS^T Q */
        }
        __syncthreads();
    }
    store_rows<DP>((ST *)a.dk + (int64_t)b * T * a.lddk + h * Dh, a.lddk, dk, wk0, T, Dh, a.vec, lane);
    store_rows<DP>((ST *)a.dv + (int64_t)b * T * a.lddv + h * Dh, a.lddv, dv, wk0, T, Dh, a.vec, lane);
}

/* ---- backward (fp32, a warp per row) ------------------------------------------------- */

/* The backward's dropout factor of pair (q, k) from the forward's keep bits. */
static __device__ __forceinline__ float fa_bits_scale(const fa_args &a, int64_t bh, int q, int k) {
    if (!a.bits) return 1.0f;
    return (a.bits[(bh * a.T + q) * a.W + (k >> 5)] >> (k & 31)) & 1u ? a.inv_keep : 0.0f;
}

/* dQ and delta: a warp per query row. */
__global__ void __launch_bounds__(FA32_WARPS * 32) fa32_bwd_dq_kernel(fa_args a) {
    __shared__ float sw[FA32_WARPS][32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t row = (int64_t)blockIdx.x * FA32_WARPS + w;
    const int T = a.T, H = a.H, Dh = a.Dh;
    if (row >= (int64_t)a.B * H * T) return;
    const int q = (int)(row % T);
    const int64_t bh = row / T;
    const int b = (int)(bh / H), h = (int)(bh % H);
    const int64_t rq = (int64_t)b * T + q;
    const float *Q = (const float *)a.q + rq * a.ldq + h * Dh;
    const float *K = (const float *)a.k + (int64_t)b * T * a.ldk + h * Dh;
    const float *V = (const float *)a.v + (int64_t)b * T * a.ldv + h * Dh;
    const float *dO = (const float *)a.dout + rq * a.ldo + h * Dh;
    const float *O = (const float *)a.o + rq * a.ldo + h * Dh;
    double dd = 0.0;
    for (int d = lane; d < Dh; d += 32) dd += (double)dO[d] * O[d];
    const float delta = (float)warp_sum_d(dd);
    if (lane == 0) a.delta[row] = delta;
    const float lse = a.lse[row];
    double acc[FA32_MAXD] = {0.0, 0.0, 0.0, 0.0};
    for (int k0 = 0; k0 < T; k0 += 32) {
        const int k = k0 + lane;
        float ds = 0.0f;
        if (k < T && fa_kept(a, b, q, k)) {
            const float pk = expf(fsub(fmul(a.scale, fa_dot(Q, K + (int64_t)k * a.ldk, Dh)), lse));
            const float dpk = fmul(fa_dot(dO, V + (int64_t)k * a.ldv, Dh), fa_bits_scale(a, bh, q, k));
            ds = fmul(a.scale, fmul(pk, fsub(dpk, delta)));
        }
        sw[w][lane] = ds;
        __syncwarp();
        const int n = min(32, T - k0);
        for (int j = 0; j < n; j++) {
            const float dj = sw[w][j];
            if (dj == 0.0f) continue;
            const float *kr = K + (int64_t)(k0 + j) * a.ldk;
            for (int i = 0; i < FA32_MAXD; i++)
                if (lane + 32 * i < Dh) acc[i] += (double)dj * kr[lane + 32 * i];
        }
        __syncwarp();
    }
    float *dQ = (float *)a.dq + rq * a.lddq + h * Dh;
    for (int i = 0; i < FA32_MAXD; i++)
        if (lane + 32 * i < Dh) dQ[lane + 32 * i] = (float)acc[i];
}

/* dK and dV: a warp per key row. */
__global__ void __launch_bounds__(FA32_WARPS * 32) fa32_bwd_dkdv_kernel(fa_args a) {
    __shared__ float sd[FA32_WARPS][32], ss[FA32_WARPS][32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t row = (int64_t)blockIdx.x * FA32_WARPS + w; /* (b, h, k) */
    const int T = a.T, H = a.H, Dh = a.Dh;
    if (row >= (int64_t)a.B * H * T) return;
    const int k = (int)(row % T);
    const int64_t bh = row / T;
    const int b = (int)(bh / H), h = (int)(bh % H);
    const int64_t rk = (int64_t)b * T + k;
    const float *Q = (const float *)a.q + (int64_t)b * T * a.ldq + h * Dh;
    const float *Kr = (const float *)a.k + rk * a.ldk + h * Dh;
    const float *Vr = (const float *)a.v + rk * a.ldv + h * Dh;
    const float *dO = (const float *)a.dout + (int64_t)b * T * a.ldo + h * Dh;
    double acck[FA32_MAXD] = {0.0, 0.0, 0.0, 0.0}, accv[FA32_MAXD] = {0.0, 0.0, 0.0, 0.0};
    for (int q0 = a.causal ? k - (k % 32) : 0; q0 < T; q0 += 32) {
        const int q = q0 + lane;
        float dq = 0.0f, ds = 0.0f;
        if (q < T && fa_kept(a, b, q, k)) {
            const int64_t bq = bh * T + q;
            const float pk = expf(fsub(fmul(a.scale, fa_dot(Q + (int64_t)q * a.ldq, Kr, Dh)), a.lse[bq]));
            const float ks = fa_bits_scale(a, bh, q, k);
            const float dpk = fmul(fa_dot(dO + (int64_t)q * a.ldo, Vr, Dh), ks);
            dq = fmul(pk, ks);
            ds = fmul(a.scale, fmul(pk, fsub(dpk, a.delta[bq])));
        }
        sd[w][lane] = dq;
        ss[w][lane] = ds;
        __syncwarp();
        const int n = min(32, T - q0);
        for (int j = 0; j < n; j++) {
            const float dj = sd[w][j], sj = ss[w][j];
            const float *dor = dO + (int64_t)(q0 + j) * a.ldo, *qr = Q + (int64_t)(q0 + j) * a.ldq;
            for (int i = 0; i < FA32_MAXD; i++)
                if (lane + 32 * i < Dh) {
                    accv[i] += (double)dj * dor[lane + 32 * i];
                    acck[i] += (double)sj * qr[lane + 32 * i];
                }
        }
        __syncwarp();
    }
    float *dK = (float *)a.dk + rk * a.lddk + h * Dh, *dV = (float *)a.dv + rk * a.lddv + h * Dh;
    for (int i = 0; i < FA32_MAXD; i++)
        if (lane + 32 * i < Dh) dK[lane + 32 * i] = (float)acck[i], dV[lane + 32 * i] = (float)accv[i];
}

/* ---- launcher ----------------------------------------------------------------------- */

/* The dQ and the dK/dV kernels, for T > 128. */
template <int DP, class ST>
static int fa_launch_bwd(const fa_args &f, cudaStream_t s, tg_err *err) {
    typedef fa_stile<DP> L;
    const size_t smem_q = 7 * L::ELEMS * sizeof(ST) + 2 * FA_COLS * sizeof(float) + L::ALIGN;
    const size_t smem_k = 6 * L::ELEMS * sizeof(ST) + 5 * FA_COLS * sizeof(float) + 4 * FA_COLS * sizeof(uint32_t) + L::ALIGN;
    cudaError_t e = cudaFuncSetAttribute(fa_bwd_dq_kernel<DP, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_q);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(fa_bwd_dkdv_kernel<DP, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_k);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(fa_bwd_dq_kernel<DP, ST>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(fa_bwd_dkdv_kernel<DP, ST>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess) return tg_fail(err, "cudaFuncSetAttribute(attention backward): %s", cudaGetErrorString(e));
    dim3 grid((unsigned)((f.T + FA_ROWS - 1) / FA_ROWS), (unsigned)(f.B * f.H));
    fa_bwd_dq_kernel<DP, ST><<<grid, FA_THREADS, smem_q, s>>>(f);
    fa_bwd_dkdv_kernel<DP, ST><<<grid, FA_THREADS, smem_k, s>>>(f);
    return 0;
}

/* The tile width DP for the head dim. */
template <class ST>
static int fa_launch_bwd_dh(const fa_args &f, cudaStream_t s, tg_err *err) {
    if (f.Dh <= 16) return fa_launch_bwd<16, ST>(f, s, err);
    if (f.Dh <= 32) return fa_launch_bwd<32, ST>(f, s, err);
    if (f.Dh <= 64) return fa_launch_bwd<64, ST>(f, s, err);
    return fa_launch_bwd<128, ST>(f, s, err);
}

int tg_launch_attention_bwd(const tg_cuda_op_args *a, tg_err *err) {
    const int taken = tg_cudnn_attention_run(a, 1, err); /* where the executor gave it to cuDNN */
    if (taken) return taken < 0 ? -1 : 0;
    fa_args f;
    if (fa_setup(a, 5, 3, &f, err)) return -1;
    if ((int64_t)f.B * f.H * f.T == 0) return 0;
    f.dout = a->in[0];
    f.o = a->in[1];
    f.lse = (float *)a->in[2];
    f.delta = (float *)a->out[3];
    const int64_t D = (int64_t)f.H * f.Dh;
    const int es = tg_storage_bytes(a->in_dtype[0]);
    if (a->op->p.attention.packed) {
        char *base = (char *)a->out[0];
        f.dq = base, f.dk = base + D * es, f.dv = base + 2 * D * es;
        f.lddq = f.lddk = f.lddv = 3 * D;
    } else {
        f.dq = a->out[0], f.dk = a->out[1], f.dv = a->out[2];
        f.lddq = f.lddk = f.lddv = D;
        if (!f.dk || !f.dv) return tg_fail(err, "unpacked attention backward needs dk and dv outputs");
    }
    f.vec = f.vec && tg_aligned16(a->in[0]) && tg_aligned16(a->in[1]) && tg_aligned16(a->out[0]) &&
            (a->op->p.attention.packed || (tg_aligned16(a->out[1]) && tg_aligned16(a->out[2])));
    cudaStream_t s = a->ctx->stream;
    if (a->in_dtype[0] == TG_F32) {
        const unsigned blocks = (unsigned)(((int64_t)f.B * f.H * f.T + FA32_WARPS - 1) / FA32_WARPS);
        fa32_bwd_dq_kernel<<<blocks, FA32_WARPS * 32, 0, s>>>(f);
        fa32_bwd_dkdv_kernel<<<blocks, FA32_WARPS * 32, 0, s>>>(f);
        return 0;
    }
    if (f.T <= 128) return tg_fa_launch_bwd_short(f, a->in_dtype[0], s, err);
    if (a->in_dtype[0] == TG_F16) return fa_launch_bwd_dh<tg_f16>(f, s, err);
    return fa_launch_bwd_dh<tg_bf16>(f, s, err);
}
