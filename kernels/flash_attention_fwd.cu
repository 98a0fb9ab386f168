/* ATTENTION: the fused attention forward (kernels/flash_attention.cuh describes the
 * arrangement). bf16 and fp16 plans: the tensor-core kernel (a template on the 16-bit type), per 64-key tile S = Q K^T, online
 * softmax (exp2 domain, running max and sum per row), dropout, O += P V; out: O / sum, LSE,
 * and the keep bits the backward reads (the dropout mask is drawn here only); without
 * dropout at DP 64 and 128 a pipelined kernel overlaps each tile's softmax with the
 * previous tile's P V. fp32 plans: a
 * warp per query row, dots in float, sums over keys in double. */
#include "kernels/flash_attention.cuh"

/* ---- dropout bits (tensor-core kernel) ------------------------------------------------- */

/* Keep bits of one 16 x 8 fragment (rows are queries q, columns keys k): rows
 * r0 + 0..15, columns c0 + 0..7; bits[0] for row g, bits[1] for row g + 8, bit i for
 * column 2c + i; element by element (T % 8 != 0: Philox blocks straddle rows). */
static __device__ __forceinline__ void keep_bits(unsigned (&bits)[2], const fa_args &a, uint64_t step, int64_t bh,
                                                 int r0, int c0, int lane) {
    const int g = lane >> 2, c = lane & 3;
    const float p = a.p;
    const int64_t T = a.T;
    for (int half = 0; half < 2; half++) {
        unsigned m = 0;
        for (int i = 0; i < 2; i++) {
            const int64_t q = r0 + g + 8 * half, k = c0 + 2 * c + i;
            if (q < T && k < T)
                m |= (unsigned)(tg_dropout_uniform(a.seed, step, a.key, (uint64_t)((bh * T + q) * T + k)) >= p) << i;
        }
        bits[half] = m;
    }
}

/* The taking-part-and-kept bits of a warp's 16 rows for key tile k0: each lane holds
 * its own columns; OR over the 4 lanes of a row gives the row's two words, which lanes
 * c = 0 (row g) and c = 1 (row g + 8) store. */
static __device__ __forceinline__ void store_bits(const fa_args &a, const uint32_t (&rb)[2][2], int64_t bh, int row0,
                                                  int k0, int lane) {
    uint32_t w[2][2];
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint32_t v = rb[r][h];
            v |= __shfl_xor_sync(0xffffffffu, v, 1);
            v |= __shfl_xor_sync(0xffffffffu, v, 2);
            w[r][h] = v;
        }
    const int c = lane & 3, g = lane >> 2;
    if (c > 1) return;
    const int row = row0 + g + 8 * c;
    if (row >= a.T) return;
    uint32_t *dst = a.bits + ((int64_t)bh * a.T + row) * a.W;
    const int w0 = k0 >> 5;
    if (w0 < a.W) dst[w0] = w[c][0];
    if (w0 + 1 < a.W) dst[w0 + 1] = w[c][1];
}

/* ---- forward (bf16 / f16: ST) --------------------------------------------------------- */

/* The forward's block: at DP 64 and 128 (only with dropout or keep bits: without, the
 * pipelined kernel below takes them) one warpgroup, as the Philox draws bound the kernel
 * and at T = 128 - 512 smaller blocks measured faster than two-warpgroup ones, with K and
 * V in NBUF slots so that the next tiles stream in while a tile's P V reads its V. */
template <int DP, bool BITS>
struct fa_fwd_cfg {
    typedef fa_stile<DP, 1> L;
    static constexpr int NBUF = L::WG ? 3 : 2;
    static constexpr int MIN_BLOCKS = L::WG && DP == 64 ? 3 : 1; /* registers */
};

/* The keep bits of a warp's 16 rows for key tile k0, drawn while the tile's scores are
 * being multiplied. frag: 4 bits per 8-key fragment j for the lane's own elements (bit
 * 4j + 2 half + i: row g + 8 half, column 8j + 2c + i). row (when T % 8 == 0, else 0):
 * the lane's own draws, byte i = keys 8j .. 8j + 7 of row wr0 + (L & 15) for fragment
 * j = 2i + (L >> 4), from which store_row_bits forms a row's words without the
 * per-element bookkeeping. */
struct tile_keep {
    uint32_t frag, row;
};

static __device__ __forceinline__ tile_keep tile_keep_bits(const fa_args &a, uint64_t step, int64_t bh, int wr0,
                                                           int k0, int lane) {
    tile_keep t = {0u, 0u};
    if (a.drop_vec) {
        /* A fragment's 8 keys of one query are one Philox block of dropout's draws
         * (element index / 8: T % 8 == 0). Lane L draws fragments j = 2i + (L >> 4) of
         * query wr0 + (L & 15), a byte of keep bits each, and shares them: row g's byte of
         * fragment j sits in lane g + 16 (j & 1), row g + 8's in lane g + 8 + 16 (j & 1),
         * as their draw i = j >> 1; lane c takes bits 2c, 2c + 1. */
        const int g = lane >> 2, c = lane & 3;
        const int64_t q = wr0 + (lane & 15);
        const uint64_t base = (uint64_t)(((bh * a.T + q) * a.T + k0) >> 3) + (uint64_t)(lane >> 4);
        const uint32_t thr = a.keep_thr; /* uniform >= p, as integers */
#pragma unroll
        for (int i = 0; i < FA_COLS / 16; i++) {
            uint32_t w[4];
            tg_philox_block(a.seed, step, a.key, base + 2 * (uint64_t)i, w);
            unsigned mine = 0;
#pragma unroll
            for (int e = 0; e < 8; e++) mine |= (unsigned)(tg_dropout_bits16(w, (uint64_t)e) >= thr) << e;
            t.row |= mine << (8 * i);
#pragma unroll
            for (int odd = 0; odd < 2; odd++) {
                const int j = 2 * i + odd;
                const unsigned lo = __shfl_sync(0xffffffffu, mine, g + 16 * odd);
                const unsigned hi = __shfl_sync(0xffffffffu, mine, g + 8 + 16 * odd);
                t.frag |= (((lo >> (2 * c)) & 3u) | ((hi >> (2 * c)) & 3u) << 2) << (4 * j);
            }
        }
        return t;
    }
#pragma unroll
    for (int j = 0; j < FA_COLS / 8; j++) {
        unsigned kb[2];
        keep_bits(kb, a, step, bh, wr0, k0 + 8 * j, lane);
        t.frag |= (kb[0] | kb[1] << 2) << (4 * j);
    }
    return t;
}

/* The stored bits of a tile every key of which takes part in every row (no mask, no
 * causal pair, inside T): the keep bits themselves. Lane L < 16 joins its bytes (the even
 * fragments) with lane L + 16's (the odd ones) into row wr0 + L's two words. */
static __device__ __forceinline__ void store_row_bits(const fa_args &a, uint32_t row_bytes, int64_t bh, int wr0,
                                                      int k0, int lane) {
    const uint32_t other = __shfl_xor_sync(0xffffffffu, row_bytes, 16);
    const int row = wr0 + lane;
    if (lane >= 16 || row >= a.T) return;
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int j = 0; j < FA_COLS / 8; j++) /* even fragments drawn by this lane, odd ones by lane + 16 */
        w[j >> 2] |= (((j & 1 ? other : row_bytes) >> (8 * (j >> 1))) & 0xFFu) << (8 * (j & 3));
    uint32_t *dst = a.bits + ((int64_t)bh * a.T + row) * a.W;
    const int w0 = k0 >> 5;
    dst[w0] = w[0];
    if (w0 + 1 < a.W) dst[w0 + 1] = w[1];
}

/* The end of a warp's 16 rows of the 16-bit forward: the row sums met over the row's 4
 * lanes, O / sum stored, and the LSE (natural log) of each row (0 for a row with nothing
 * kept). m: the running maxima (exp2 domain), l: the lane's part of the sums. */
template <int DP, class ST>
static __device__ __forceinline__ void fwd_store(const fa_args &a, float (&o)[DP / 8][4], const float (&m)[2],
                                                 float (&l)[2], int b, int h, int bh, int wr0, int lane) {
    const int g = lane >> 2, c = lane & 3, T = a.T;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    ST *O = (ST *)a.o_out + (int64_t)b * T * a.ldo + h * a.Dh;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
#pragma unroll
        for (int d = 0; d < DP / 8; d++) o[d][2 * r] *= inv, o[d][2 * r + 1] *= inv;
        const int row = wr0 + g + 8 * r;
        if (c == 0 && row < T) a.lse[(int64_t)bh * T + row] = l[r] > 0.0f ? (m[r] + log2f(l[r])) * FA_LN2 : 0.0f;
    }
    store_rows<DP>(O, a.ldo, o, wr0, T, a.Dh, a.vec, lane);
}

/* BITS: the launch draws dropout or writes keep bits (else neither is compiled in; at
 * DP 64 and 128 BITS is always set). With wgmma a tile's S = Q K^T runs while its
 * dropout bits are drawn. */
template <int DP, class ST, bool BITS>
__global__ void __launch_bounds__(fa_fwd_cfg<DP, BITS>::L::THREADS, fa_fwd_cfg<DP, BITS>::MIN_BLOCKS)
    fa_fwd_kernel(fa_args a) {
    typedef typename fa_fwd_cfg<DP, BITS>::L L;
    constexpr int E = L::ELEMS, NBUF = fa_fwd_cfg<DP, BITS>::NBUF;
    static_assert(BITS || !L::WG, "without dropout DP 64 and 128 take fa_fwd_pipe_kernel");
    ST *sQ = reinterpret_cast<ST *>(fa_smem_base<DP>()), *sKV = sQ + L::BLOCK_ELEMS; /* [slot][K, V] */
    float *sM2 = reinterpret_cast<float *>(sKV + 2 * NBUF * E);                      /* [slot][64] */
    const int T = a.T, H = a.H, Dh = a.Dh;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * L::BR; /* long causal rows first */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, c = lane & 3;
    const int wr0 = q0 + warp * 16;             /* this warp's first query */
    const int gr0 = q0 + (warp >> 2) * FA_ROWS; /* its warpgroup's (4 warps') first query */
    const uint64_t step = a.drop ? tg_dropout_step(a.step) : 0;
    const ST *Q = (const ST *)a.q + (int64_t)b * T * a.ldq + h * Dh;
    const ST *K = (const ST *)a.k + (int64_t)b * T * a.ldk + h * Dh;
    const ST *V = (const ST *)a.v + (int64_t)b * T * a.ldv + h * Dh;
    int ktiles = (T + FA_COLS - 1) / FA_COLS;
    if (a.causal) ktiles = min(ktiles, (q0 + L::BR - 1) / FA_COLS + 1);
    load_tile<DP, L::BR, L::THREADS, L::WG>(sQ, Q, a.ldq, q0, T, Dh, a.vec);
    const key_tiles<DP, ST> kv = {K, V, a.ldk, a.ldv, a.mask, b, T, Dh, a.vec};
    load_key_tile<DP, L::THREADS>(sKV, sM2, 0, kv, 0);
    cp_async_commit();

    float o[DP / 8][4];
    for (int d = 0; d < DP / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    uint32_t pa[4][4]; /* the A fragments of the P V product in flight (wgmma) */
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const float sl2 = a.scale * FA_LOG2E;
    for (int kt = 0; kt < ktiles; kt++) {
        const int k0 = kt * FA_COLS, buf = kt % NBUF;
        advance_key_tile<DP, L::THREADS, NBUF>(sKV, sM2, kt, ktiles, kv);
        const ST *sK = sKV + 2 * E * buf, *sV = sK + E;
        const float *sM = sM2 + FA_COLS * buf;
        /* Causal: the last tile lies wholly after the first warpgroup's rows (their keys
         * are masked but their bits are still written); every other tile reaches every
         * warp's rows. */
        if (!a.causal || k0 <= gr0 + FA_ROWS - 1) {
            float s[FA_COLS / 8][4];
            tile_keep kw = {0xFFFFFFFFu, 0u}; /* every key kept without dropout */
            if constexpr (L::WG) {
                wg_abt_issue<DP, ST>(s, sQ + (warp >> 2) * E, sK);
                if (BITS && a.drop) kw = tile_keep_bits(a, step, bh, wr0, k0, lane);
                wg_wait_all(); /* S (the last tile's P V was waited for within its tile) */
                wg_keep<FA_COLS / 8>(s);
                wg_keep<DP / 8>(o);
                wg_keep_a<4>(pa);
            } else {
                tile_abt<DP>(s, sQ, sK, warp * 16, lane);
                if (BITS && a.drop) kw = tile_keep_bits(a, step, bh, wr0, k0, lane);
            }
            float mx[2] = {m[0], m[1]};
            const bool masked = tile_needs_mask(sM, a.causal, k0, wr0, lane);
            if (masked)
                scale_mask_rows<1>(s, mx, sM, sl2, a.causal, k0, wr0, lane);
            else
                scale_mask_rows<0>(s, mx, sM, sl2, a.causal, k0, wr0, lane);
            float alpha[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                alpha[r] = mx[r] == -INFINITY ? 1.0f : fa_exp2(m[r] - mx[r]);
                m[r] = mx[r];
            }
            /* A row with nothing kept so far subtracts 0 instead of -inf (its scores are all
             * -inf, so every exp is 0 either way, without inf - inf). */
            const float mb[2] = {m[0] == -INFINITY ? 0.0f : m[0], m[1] == -INFINITY ? 0.0f : m[1]};
            /* Taking-part bits of rows g, g+8 (the lane's columns of the 64 keys), element by
             * element only in a masked tile. */
            const uint32_t all = 0x03030303u << (2 * c);
            uint32_t rb[2][2] = {{all, all}, {all, all}};
            if (BITS && masked) rb[0][0] = rb[0][1] = rb[1][0] = rb[1][1] = 0u;
#pragma unroll
            for (int j = 0; j < FA_COLS / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int col = 8 * j + 2 * c + (e & 1);
                    if (BITS && masked && s[j][e] != -INFINITY) rb[e >> 1][col >> 5] |= 1u << (col & 31);
                    const float pv = fa_exp2(s[j][e] - mb[e >> 1]);
                    s[j][e] = pv;
                    rs[e >> 1] += pv;
                }
            l[0] = l[0] * alpha[0] + rs[0];
            l[1] = l[1] * alpha[1] + rs[1];
#pragma unroll
            for (int d = 0; d < DP / 8; d++)
                o[d][0] *= alpha[0], o[d][1] *= alpha[0], o[d][2] *= alpha[1], o[d][3] *= alpha[1];
            if (BITS && a.drop) {
#pragma unroll
                for (int j = 0; j < FA_COLS / 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const bool keep = (kw.frag >> (4 * j + e)) & 1u; /* bit 2 (e >> 1) + (e & 1) */
                        s[j][e] = keep ? s[j][e] * a.inv_keep : 0.0f;
                    }
            }
            if (BITS && a.bits) {
                if (a.drop && a.drop_vec && !masked) {
                    store_row_bits(a, kw.row, bh, wr0, k0, lane);
                } else {
                    /* kept and taking part: the keep bits of the lane's columns over rb */
#pragma unroll
                    for (int j = 0; j < FA_COLS / 8; j++)
#pragma unroll
                        for (int h = 0; h < 2; h++)
                            rb[h][j >> 2] &= ~((~(kw.frag >> (4 * j + 2 * h)) & 3u) << ((8 * j + 2 * c) & 31));
                    store_bits(a, rb, bh, wr0, k0, lane);
                }
            }
            if constexpr (L::WG) {
                wg_pb_issue<DP, ST>(o, s, sV, pa);
                /* P V is waited for here: run on into the next tile's draws, ptxas serializes
                 * the products (C7515), 1.5% slower as measured. */
                wg_wait_all();
                wg_keep<DP / 8>(o);
                wg_keep_a<4>(pa);
            } else
                tile_pb<DP>(o, s, sV, lane);
        } else if (BITS && a.bits) {
            const uint32_t zero[2][2] = {{0u, 0u}, {0u, 0u}};
            store_bits(a, zero, bh, wr0, k0, lane);
        }
        /* Slot `buf` is refilled NBUF - 1 tiles on, after every warp waited for the P V
         * reading it. */
        __syncthreads();
    }
    if constexpr (L::WG) {
        wg_wait_all();
        wg_keep<DP / 8>(o);
        wg_keep_a<4>(pa);
    }
    /* Words of key tiles this block never visits (past the causal diagonal) are zero. */
    if (a.bits)
        for (int i = lane; i < 16 * a.W; i += 32) {
            const int row = wr0 + i / a.W, wi = i % a.W;
            if (row < T && wi >= 2 * ktiles) a.bits[((int64_t)bh * T + row) * a.W + wi] = 0u;
        }
    fwd_store<DP, ST>(a, o, m, l, b, h, bh, wr0, lane);
}

/* ---- forward without dropout (bf16 / f16 at DP 64 and 128): the softmax beside P V ------ */

/* Without dropout a warpgroup's products and its softmax overlap, as FlashAttention-3's
 * intra-warpgroup pipelining does: for key tile kt it starts S_kt = Q K_kt^T, then
 * P_{kt-1} V_{kt-1} (P rounded into registers by the previous tile's softmax), waits for
 * S_kt alone and runs its softmax while P V is still on the tensor cores; only the running
 * rescale of O waits for P V. Two warpgroups (128 queries) share each K/V tile. K and V
 * stream into 3 slots: the load into tile kt + 1's slot (tile kt - 2's) starts after tile
 * kt's barrier, which every warp reaches only after its P V of tile kt - 2 completed. */
template <int DP>
struct fa_pipe_cfg {
    typedef fa_stile<DP, 2> L;
    static constexpr int NBUF = 3;
    static constexpr int MIN_BLOCKS = DP == 64 ? 2 : 1; /* registers at DP 64; shared memory at 128 */
};

/* The online softmax of one warp's 16 rows of key tile k0's scores (mask sM): S becomes P
 * (exp2 domain, less the new running row maxima m), alpha the factor that rescales what
 * was accumulated before, rs the lane's part of P's row sums. */
static __device__ __forceinline__ void pipe_softmax(float (&s)[FA_COLS / 8][4], float (&m)[2], float (&alpha)[2],
                                                    float (&rs)[2], const float *sM, float sl2, int causal, int k0,
                                                    int wr0, int lane) {
    float mx[2] = {m[0], m[1]};
    if (tile_needs_mask(sM, causal, k0, wr0, lane))
        scale_mask_rows<1>(s, mx, sM, sl2, causal, k0, wr0, lane);
    else
        scale_mask_rows<0>(s, mx, sM, sl2, causal, k0, wr0, lane);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        alpha[r] = mx[r] == -INFINITY ? 1.0f : fa_exp2(m[r] - mx[r]);
        m[r] = mx[r];
        rs[r] = 0.0f;
    }
    /* A row with nothing kept so far subtracts 0 instead of -inf (every exp is 0). */
    const float mb[2] = {m[0] == -INFINITY ? 0.0f : m[0], m[1] == -INFINITY ? 0.0f : m[1]};
#pragma unroll
    for (int j = 0; j < FA_COLS / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float pv = fa_exp2(s[j][e] - mb[e >> 1]);
            s[j][e] = pv;
            rs[e >> 1] += pv;
        }
}

/* Before key tile kt is used: wait until it landed (its load started at tile kt - 1), make
 * it visible, then start tile kt + 1's load into the slot of tile kt - 2, whose P V every
 * warp has finished by this barrier. Every thread of the block calls it for every tile. */
template <int DP, int THREADS, int NBUF, class ST>
static __device__ __forceinline__ void pipe_next_tile(ST *sKV, float *sM2, int kt, int ktiles,
                                                      const key_tiles<DP, ST> &kv) {
    cp_async_wait<0>();
    fa_publish_tiles<DP>();
    if (kt + 1 < ktiles) {
        load_key_tile<DP, THREADS>(sKV, sM2, (kt + 1) % NBUF, kv, (kt + 1) * FA_COLS);
        cp_async_commit();
    }
}

template <int DP, class ST>
__global__ void __launch_bounds__(fa_pipe_cfg<DP>::L::THREADS, fa_pipe_cfg<DP>::MIN_BLOCKS)
    fa_fwd_pipe_kernel(fa_args a) {
    typedef typename fa_pipe_cfg<DP>::L L;
    constexpr int E = L::ELEMS, NBUF = fa_pipe_cfg<DP>::NBUF, TH = L::THREADS;
    ST *sQ = reinterpret_cast<ST *>(fa_smem_base<DP>()), *sKV = sQ + L::BLOCK_ELEMS; /* [slot][K, V] */
    float *sM2 = reinterpret_cast<float *>(sKV + 2 * NBUF * E);                      /* [slot][64] */
    const int T = a.T, H = a.H, Dh = a.Dh;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * L::BR; /* long causal rows first */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wr0 = q0 + warp * 16;
    const int gr0 = q0 + (warp >> 2) * FA_ROWS;
    const ST *Q = (const ST *)a.q + (int64_t)b * T * a.ldq + h * Dh;
    const ST *K = (const ST *)a.k + (int64_t)b * T * a.ldk + h * Dh;
    const ST *V = (const ST *)a.v + (int64_t)b * T * a.ldv + h * Dh;
    int ktiles = (T + FA_COLS - 1) / FA_COLS;
    if (a.causal) ktiles = min(ktiles, (q0 + L::BR - 1) / FA_COLS + 1);
    /* This warpgroup's tiles: causal, the block's last tile may lie wholly after the first
     * warpgroup's rows (then nk = ktiles - 1). */
    const int nk = a.causal ? min(ktiles, (gr0 + FA_ROWS - 1) / FA_COLS + 1) : ktiles;
    load_tile<DP, L::BR, TH, L::WG>(sQ, Q, a.ldq, q0, T, Dh, a.vec);
    const key_tiles<DP, ST> kv = {K, V, a.ldk, a.ldv, a.mask, b, T, Dh, a.vec};
    load_key_tile<DP, TH>(sKV, sM2, 0, kv, 0);
    cp_async_commit();

    float o[DP / 8][4], s[FA_COLS / 8][4];
    for (int d = 0; d < DP / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    uint32_t pa[4][4]; /* P of the previous tile as A fragments */
    float m[2] = {-INFINITY, -INFINITY}, l[2], alpha[2], rs[2];
    const float sl2 = a.scale * FA_LOG2E;
    const ST *sQw = sQ + (warp >> 2) * E;
    /* tile 0: its scores alone */
    pipe_next_tile<DP, TH, NBUF>(sKV, sM2, 0, ktiles, kv);
    wg_abt_issue<DP, ST>(s, sQw, sKV);
    wg_wait<0>();
    wg_keep<FA_COLS / 8>(s);
    pipe_softmax(s, m, alpha, rs, sM2, sl2, a.causal, 0, wr0, lane);
    l[0] = rs[0], l[1] = rs[1];
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wg_acc_to_a<ST>(pa[kk], s[2 * kk], s[2 * kk + 1]);
    /* tiles 1 .. nk - 1: S of tile kt beside P V of tile kt - 1 */
    for (int kt = 1; kt < nk; kt++) {
        pipe_next_tile<DP, TH, NBUF>(sKV, sM2, kt, ktiles, kv);
        const int slot = kt % NBUF, prev = (kt - 1) % NBUF;
        wg_abt_issue<DP, ST>(s, sQw, sKV + 2 * E * slot);
        wg_pa_issue<DP, ST>(o, pa, sKV + 2 * E * prev + E);
        wg_wait<1>(); /* S; P V stays in flight */
        wg_keep<FA_COLS / 8>(s);
        pipe_softmax(s, m, alpha, rs, sM2 + FA_COLS * slot, sl2, a.causal, kt * FA_COLS, wr0, lane);
        wg_wait<0>();
        wg_keep<DP / 8>(o);
        wg_keep_a<4>(pa);
        l[0] = l[0] * alpha[0] + rs[0];
        l[1] = l[1] * alpha[1] + rs[1];
#pragma unroll
        for (int d = 0; d < DP / 8; d++)
            o[d][0] *= alpha[0], o[d][1] *= alpha[0], o[d][2] *= alpha[1], o[d][3] *= alpha[1];
#pragma unroll
        for (int kk = 0; kk < 4; kk++) wg_acc_to_a<ST>(pa[kk], s[2 * kk], s[2 * kk + 1]);
    }
    /* the block's barrier of its last tile, which this warpgroup skips */
    if (nk < ktiles) pipe_next_tile<DP, TH, NBUF>(sKV, sM2, nk, ktiles, kv);
    wg_pa_issue<DP, ST>(o, pa, sKV + 2 * E * ((nk - 1) % NBUF) + E);
    wg_wait<0>();
    wg_keep<DP / 8>(o);
    wg_keep_a<4>(pa);
    fwd_store<DP, ST>(a, o, m, l, b, h, bh, wr0, lane);
}

/* ---- forward (fp32, a warp per row) -------------------------------------------------- */

static __device__ __forceinline__ float fa_keep_scale(const fa_args &a, uint64_t step, int64_t bh, int q, int k) {
    if (!a.drop) return 1.0f;
    const int64_t e = (bh * a.T + q) * a.T + k;
    return tg_dropout_uniform(a.seed, step, a.key, (uint64_t)e) >= a.p ? a.inv_keep : 0.0f;
}

__global__ void __launch_bounds__(FA32_WARPS * 32) fa32_fwd_kernel(fa_args a) {
    __shared__ float sw[FA32_WARPS][32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t row = (int64_t)blockIdx.x * FA32_WARPS + w; /* (b, h, q) */
    const int T = a.T, H = a.H, Dh = a.Dh;
    if (row >= (int64_t)a.B * H * T) return;
    const int q = (int)(row % T);
    const int64_t bh = row / T;
    const int b = (int)(bh / H), h = (int)(bh % H);
    const float *Q = (const float *)a.q + ((int64_t)b * T + q) * a.ldq + h * Dh;
    const float *K = (const float *)a.k + (int64_t)b * T * a.ldk + h * Dh;
    const float *V = (const float *)a.v + (int64_t)b * T * a.ldv + h * Dh;
    const uint64_t step = a.drop ? tg_dropout_step(a.step) : 0;
    float mx = -INFINITY;
    for (int k = lane; k < T; k += 32)
        if (fa_kept(a, b, q, k)) mx = fmaxf(mx, fmul(a.scale, fa_dot(Q, K + (int64_t)k * a.ldk, Dh)));
    mx = warp_max_f(mx);
    double sum = 0.0;
    if (mx != -INFINITY)
        for (int k = lane; k < T; k += 32)
            if (fa_kept(a, b, q, k)) sum += (double)expf(fsub(fmul(a.scale, fa_dot(Q, K + (int64_t)k * a.ldk, Dh)), mx));
    sum = warp_sum_d(sum);
    const float inv = sum > 0.0 ? (float)(1.0 / sum) : 0.0f;
    double acc[FA32_MAXD] = {0.0, 0.0, 0.0, 0.0};
    for (int k0 = 0; k0 < T; k0 += 32) {
        const int k = k0 + lane;
        float dk = 0.0f;
        bool bit = false; /* taking part and kept */
        if (k < T && fa_kept(a, b, q, k)) {
            const float pk = fmul(expf(fsub(fmul(a.scale, fa_dot(Q, K + (int64_t)k * a.ldk, Dh)), mx)), inv);
            const float factor = fa_keep_scale(a, step, bh, q, k);
            dk = fmul(pk, factor);
            bit = factor != 0.0f;
        }
        const unsigned word = __ballot_sync(0xffffffffu, bit);
        if (a.bits && lane == 0) a.bits[row * a.W + k0 / 32] = word;
        sw[w][lane] = dk;
        __syncwarp();
        const int n = min(32, T - k0);
        for (int j = 0; j < n; j++) {
            const float dj = sw[w][j];
            if (dj == 0.0f) continue;
            const float *vr = V + (int64_t)(k0 + j) * a.ldv;
            for (int i = 0; i < FA32_MAXD; i++)
                if (lane + 32 * i < Dh) acc[i] += (double)dj * vr[lane + 32 * i];
        }
        __syncwarp();
    }
    float *O = (float *)a.o_out + ((int64_t)b * T + q) * a.ldo + h * Dh;
    for (int i = 0; i < FA32_MAXD; i++)
        if (lane + 32 * i < Dh) O[lane + 32 * i] = (float)acc[i];
    if (lane == 0) a.lse[row] = sum > 0.0 ? mx + (float)log(sum) : 0.0f;
}

/* ---- launcher ----------------------------------------------------------------------- */

/* Sets a forward kernel's shared memory and launches it over (query blocks of br rows, B H). */
static int fa_launch_fwd_kernel(void (*kernel)(fa_args), size_t smem, int threads, int br, const fa_args &f,
                                cudaStream_t s, tg_err *err) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e == cudaSuccess) /* L1 as shared memory: the register count stays the limit */
        e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess) return tg_fail(err, "cudaFuncSetAttribute(attention forward): %s", cudaGetErrorString(e));
    dim3 grid((unsigned)((f.T + br - 1) / br), (unsigned)(f.B * f.H));
    kernel<<<grid, threads, smem, s>>>(f);
    return 0;
}

template <int DP, class ST, bool BITS>
static int fa_launch_fwd_bits(const fa_args &f, cudaStream_t s, tg_err *err) {
    typedef typename fa_fwd_cfg<DP, BITS>::L L;
    constexpr int NBUF = fa_fwd_cfg<DP, BITS>::NBUF;
    const size_t smem =
        (L::BLOCK_ELEMS + 2 * NBUF * L::ELEMS) * sizeof(ST) + NBUF * FA_COLS * sizeof(float) + L::ALIGN;
    return fa_launch_fwd_kernel(fa_fwd_kernel<DP, ST, BITS>, smem, L::THREADS, L::BR, f, s, err);
}

template <int DP, class ST>
static int fa_launch_fwd(const fa_args &f, cudaStream_t s, tg_err *err) {
    if (f.bits || f.drop) return fa_launch_fwd_bits<DP, ST, true>(f, s, err);
    if constexpr (fa_stile<DP>::WG) {
        typedef typename fa_pipe_cfg<DP>::L L;
        constexpr int NBUF = fa_pipe_cfg<DP>::NBUF;
        const size_t smem =
            (L::BLOCK_ELEMS + 2 * NBUF * L::ELEMS) * sizeof(ST) + NBUF * FA_COLS * sizeof(float) + L::ALIGN;
        return fa_launch_fwd_kernel(fa_fwd_pipe_kernel<DP, ST>, smem, L::THREADS, L::BR, f, s, err);
    } else
        return fa_launch_fwd_bits<DP, ST, false>(f, s, err);
}

/* The tile width DP for the head dim. */
template <class ST>
static int fa_launch_fwd_dh(const fa_args &f, cudaStream_t s, tg_err *err) {
    if (f.Dh <= 16) return fa_launch_fwd<16, ST>(f, s, err);
    if (f.Dh <= 32) return fa_launch_fwd<32, ST>(f, s, err);
    if (f.Dh <= 64) return fa_launch_fwd<64, ST>(f, s, err);
    return fa_launch_fwd<128, ST>(f, s, err);
}

int tg_launch_attention(const tg_cuda_op_args *a, tg_err *err) {
    const int taken = tg_cudnn_attention_run(a, 0, err); /* where the executor gave it to cuDNN */
    if (taken) return taken < 0 ? -1 : 0;
    fa_args f;
    if (fa_setup(a, 0, 3, &f, err)) return -1;
    if ((int64_t)f.B * f.H * f.T == 0) return 0;
    f.o_out = a->out[0];
    f.lse = (float *)a->out[1];
    f.vec = f.vec && tg_aligned16(a->out[0]);
    cudaStream_t s = a->ctx->stream;
    if (a->in_dtype[0] == TG_F32) {
        const unsigned blocks = (unsigned)(((int64_t)f.B * f.H * f.T + FA32_WARPS - 1) / FA32_WARPS);
        fa32_fwd_kernel<<<blocks, FA32_WARPS * 32, 0, s>>>(f);
        return 0;
    }
    if (a->in_dtype[0] == TG_F16) return fa_launch_fwd_dh<tg_f16>(f, s, err);
    return fa_launch_fwd_dh<tg_bf16>(f, s, err);
}
