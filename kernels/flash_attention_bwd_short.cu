/* ATTENTION_BWD for sequences of at most 128 (bf16 or f16, a template on the type ST): one block per (batch, head) holds the
 * whole sequence and computes dQ, dK and dV in one kernel, sharing dS through shared
 * memory (kernels/flash_attention.cuh has the shared arrangement; flash_attention_bwd.cu
 * the two-kernel backward for longer sequences and the launcher that picks this one). */
#include "kernels/flash_attention.cuh"

/* When the whole sequence fits one block (T <= TP = 64 or 128), a block of TP / 16 warps
 * owns every query and key of one (b, h) and computes dQ, dK and dV together: warp w takes
 * keys 16w .. 16w + 15 through the dK/dV kernel's arrangement (flash_attention_bwd.cu; per
 * 64-query tile: S^T = K Q^T, dP^T = V dO^T, dV += D^T dO, dK += dS^T Q) and leaves its
 * dS^T rows (ST, as rounded for the dK product) in shared memory; after one barrier warp
 * w takes queries 16w .. and forms dQ = dS K from them. Five tile products instead of the
 * two kernels' seven, one launch, still no atomics (each output row has one owner). delta
 * = rowsum(dO * O) is formed in the block first (and stored, as the dQ kernel does). Not
 * capped to two blocks per SM: at 128 registers it spills, and measured slower (BERT T =
 * 128: 70 us per layer against 68 uncapped, and 82 for the two kernels). */
template <int DP, int TP, class ST>
struct fs_smem {
    static constexpr int LD = fa_tile<DP>::LD;          /* K, V, Q, dO: [TP][LD] ST */
    static constexpr int LDS = TP + 8;                   /* dS^T: [TP keys][LDS] ST */
    static constexpr int TILE = TP * LD;
    static constexpr int DS_ELEMS = TP * LDS > TILE ? TP * LDS : TILE; /* also holds O first */
    static constexpr size_t BYTES = (4 * (size_t)TILE + (size_t)DS_ELEMS) * sizeof(ST) +
                                    3 * TP * sizeof(float) + (size_t)TP * (TP / 32) * sizeof(uint32_t);
};

template <int DP, int TP, class ST>
__global__ void __launch_bounds__(TP * 2, 1) fa_bwd_short_kernel(fa_args a) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    typedef fs_smem<DP, TP, ST> L;
    constexpr int LD = L::LD, LDS = L::LDS, NWORD = TP / 32;
    ST *sK = reinterpret_cast<ST *>(fa_smem), *sV = sK + L::TILE, *sQ = sV + L::TILE, *sdO = sQ + L::TILE;
    ST *sdS = sdO + L::TILE; /* first O (for delta), then dS^T */
    float *sL = reinterpret_cast<float *>(sdS + L::DS_ELEMS), *sD = sL + TP, *sM = sD + TP;
    uint32_t *sB = reinterpret_cast<uint32_t *>(sM + TP); /* [TP queries][NWORD] keep bits */
    const int T = a.T, H = a.H, Dh = a.Dh;
    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int w0 = warp * 16; /* this warp's first key, and later its first query */
    const ST *Q = (const ST *)a.q + (int64_t)b * T * a.ldq + h * Dh;
    const ST *K = (const ST *)a.k + (int64_t)b * T * a.ldk + h * Dh;
    const ST *V = (const ST *)a.v + (int64_t)b * T * a.ldv + h * Dh;
    const ST *dO = (const ST *)a.dout + (int64_t)b * T * a.ldo + h * Dh;
    const ST *O = (const ST *)a.o + (int64_t)b * T * a.ldo + h * Dh;
    load_tile<DP, TP, TP * 2>(sK, K, a.ldk, 0, T, Dh, a.vec);
    load_tile<DP, TP, TP * 2>(sV, V, a.ldv, 0, T, Dh, a.vec);
    load_tile<DP, TP, TP * 2>(sQ, Q, a.ldq, 0, T, Dh, a.vec);
    load_tile<DP, TP, TP * 2>(sdO, dO, a.ldo, 0, T, Dh, a.vec);
    load_tile<DP, TP, TP * 2>(sdS, O, a.ldo, 0, T, Dh, a.vec); /* O in the dS^T area, LD rows */
    cp_async_commit();
    for (int i = threadIdx.x; i < TP; i += blockDim.x) {
        sL[i] = i < T ? a.lse[(int64_t)bh * T + i] * FA_LOG2E : 0.0f;
        sM[i] = i < T && (!a.mask || a.mask[(int64_t)b * T + i] != 0.0f) ? 1.0f : 0.0f;
    }
    if (a.drop)
        for (int i = threadIdx.x; i < TP * NWORD; i += blockDim.x) {
            const int q = i / NWORD, wi = i % NWORD;
            sB[i] = q < T && wi < a.W ? a.bits[((int64_t)bh * T + q) * a.W + wi] : 0u;
        }
    cp_async_wait<0>();
    __syncthreads();
    /* delta of the warp's 16 queries, as the dQ kernel forms it. */
    {
        const float acc = row_delta<DP>(sdO, sdS, w0, lane);
        const int r = w0 + lane;
        if (lane < 16) {
            sD[r] = acc;
            if (r < T) a.delta[(int64_t)bh * T + r] = acc;
        }
    }
    __syncthreads(); /* delta complete; O no longer needed */

    const float sl2 = a.scale * FA_LOG2E;
    const bool kv[2] = {sM[w0 + g] != 0.0f, sM[w0 + g + 8] != 0.0f};
    float dk[DP / 8][4], dv[DP / 8][4];
    for (int d = 0; d < DP / 8; d++)
        for (int e = 0; e < 4; e++) dk[d][e] = dv[d][e] = 0.0f;
#pragma unroll 1
    for (int q0 = 0; q0 < TP; q0 += FA_COLS) {
        const ST *sQt = sQ + q0 * LD, *sdOt = sdO + q0 * LD;
        float s[FA_COLS / 8][4], dp[FA_COLS / 8][4];
        tile_abt<DP>(s, sK, sQt, w0, lane);   /* S^T = K Q^T */
        tile_abt<DP>(dp, sV, sdOt, w0, lane); /* dP^T = V dO^T */
        const bool masked = q0 + FA_COLS > T || a.causal;
#pragma unroll
        for (int j = 0; j < FA_COLS / 8; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int q = q0 + 8 * j + 2 * c + (e & 1), key = w0 + g + 8 * (e >> 1);
                bool ok = kv[e >> 1];
                if (masked) ok = ok && q < T && (!a.causal || key <= q);
                const float pv = ok ? fa_exp2(s[j][e] * sl2 - sL[q]) : 0.0f;
                const bool keep = !a.drop || ((sB[q * NWORD + (key >> 5)] >> (key & 31)) & 1u);
                const float dpv = keep ? (a.drop ? dp[j][e] * a.inv_keep : dp[j][e]) : 0.0f;
                s[j][e] = keep ? (a.drop ? pv * a.inv_keep : pv) : 0.0f; /* D^T */
                dp[j][e] = pv * (dpv - sD[q]) * a.scale;                 /* dS^T */
            }
            /* dS^T as rounded for the products, rows key g and g + 8 of the warp. */
            ST *row = sdS + (w0 + g) * LDS + q0 + 8 * j + 2 * c;
            *reinterpret_cast<uint32_t *>(row) = tg_h16<ST>::pack(dp[j][0], dp[j][1]);
            *reinterpret_cast<uint32_t *>(row + 8 * LDS) = tg_h16<ST>::pack(dp[j][2], dp[j][3]);
        }
        tile_pb<DP>(dv, s, sdOt, lane); /* dV += D^T dO */
        tile_pb<DP>(dk, dp, sQt, lane); /* dK += dS^T Q */
    }
    const int64_t boff = (int64_t)b * T;
    store_rows<DP>((ST *)a.dk + boff * a.lddk + h * Dh, a.lddk, dk, w0, T, Dh, a.vec, lane);
    store_rows<DP>((ST *)a.dv + boff * a.lddv + h * Dh, a.lddv, dv, w0, T, Dh, a.vec, lane);
    __syncthreads(); /* every dS^T row written */
    /* dQ = dS K for queries w0 .. w0 + 15: the A fragment is read transposed out of dS^T
     * ([key][query]), the B fragment out of K ([key][DP]). */
    float dq[DP / 8][4];
    for (int d = 0; d < DP / 8; d++) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < TP / 16; kk++) {
        uint32_t af[4];
        ldsm_x4_t(af, sdS + (kk * 16 + (lane & 7) + ((lane >> 4) << 3)) * LDS + w0 + ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int dj = 0; dj < DP / 16; dj++) {
            uint32_t bf[4];
            frag_b_kn<DP>(bf, sK, kk * 16, dj * 16, lane);
            mma16816<ST>(dq[2 * dj], af, bf[0], bf[1]);
            mma16816<ST>(dq[2 * dj + 1], af, bf[2], bf[3]);
        }
    }
    store_rows<DP>((ST *)a.dq + boff * a.lddq + h * Dh, a.lddq, dq, w0, T, Dh, a.vec, lane);
}

/* ---- launch ------------------------------------------------------------------------- */

/* The one-block-per-(b, h) backward for T <= TP. */
template <int DP, int TP, class ST>
static int fa_launch_bwd_short(const fa_args &f, cudaStream_t s, tg_err *err) {
    const size_t smem = fs_smem<DP, TP, ST>::BYTES;
    cudaError_t e =
        cudaFuncSetAttribute(fa_bwd_short_kernel<DP, TP, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(fa_bwd_short_kernel<DP, TP, ST>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess)
        return tg_fail(err, "cudaFuncSetAttribute(short attention backward): %s", cudaGetErrorString(e));
    fa_bwd_short_kernel<DP, TP, ST><<<(unsigned)(f.B * f.H), TP * 2, smem, s>>>(f);
    return 0;
}

/* The padded head dim DP (16, 32, 64, 128) and the padded sequence TP (64 or 128) as the
 * two-kernel launcher picks DP; the caller has checked T <= 128. */
template <class ST>
static int fa_launch_bwd_short_dh(const fa_args &f, cudaStream_t s, tg_err *err) {
    if (f.T <= 64) {
        if (f.Dh <= 16) return fa_launch_bwd_short<16, 64, ST>(f, s, err);
        if (f.Dh <= 32) return fa_launch_bwd_short<32, 64, ST>(f, s, err);
        if (f.Dh <= 64) return fa_launch_bwd_short<64, 64, ST>(f, s, err);
        return fa_launch_bwd_short<128, 64, ST>(f, s, err);
    }
    if (f.Dh <= 16) return fa_launch_bwd_short<16, 128, ST>(f, s, err);
    if (f.Dh <= 32) return fa_launch_bwd_short<32, 128, ST>(f, s, err);
    if (f.Dh <= 64) return fa_launch_bwd_short<64, 128, ST>(f, s, err);
    return fa_launch_bwd_short<128, 128, ST>(f, s, err);
}

int tg_fa_launch_bwd_short(const fa_args &f, int dtype, cudaStream_t s, tg_err *err) {
    if (dtype == TG_F16) return fa_launch_bwd_short_dh<tg_f16>(f, s, err);
    return fa_launch_bwd_short_dh<tg_bf16>(f, s, err);
}
