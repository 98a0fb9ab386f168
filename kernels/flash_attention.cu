/* ATTENTION / ATTENTION_BWD: fused attention that never stores the [B,H,T,T] scores.
 *
 * bf16 plans: tensor-core kernels (mma.sync m16n8k16, bf16 in, fp32 accumulate) in the
 * FlashAttention-2 arrangement. A block of 4 warps owns 64 rows; each warp owns 16 of
 * them and everything it accumulates, so no warp ever reduces with another and no
 * float atomics are used (results are bitwise reproducible).
 *   forward  rows = queries; per 64-key tile: S = Q K^T, online softmax (exp2 domain,
 *            running max and sum per row), dropout, O += P V; out: O / sum, LSE.
 *   dQ       rows = queries; first delta = rowsum(dO * O) (written: the dK/dV kernel
 *            reads it), then per key tile: P from LSE, dP = dO V^T,
 *            dS = P (dP keep/(1-p) - delta) scale, dQ += dS K.
 *   dK, dV   rows = keys; per 64-query tile: P^T from LSE, dV += D^T dO,
 *            dP^T = V dO^T, dS^T as above, dK += dS^T Q.
 * The backward recomputes QK^T twice (once per kernel) instead of accumulating dQ with
 * atomics across key tiles: 7 instead of 5 tile products, the price of determinism.
 * With causal masking, tiles wholly above the diagonal are skipped. Sequences of at most
 * 128 take one kernel instead (fa_bwd_short_kernel): a block per (batch, head) holds the
 * whole sequence and shares dS through shared memory, 5 products, no recomputation.
 *
 * Occupancy: the backward kernels are capped to 4 (dQ) and 3 (dK/dV) blocks of 4 warps
 * per SM at DP <= 64 (128 and 168 registers, a few bytes of spill), which measured 7-11%
 * faster than 2-3 blocks without spills; the forward at 159 registers (3 blocks) is
 * faster than capped to 128 (which spills 120 bytes).
 *
 * Head dim: any Dh <= 128; tiles are padded with zero columns to DP = 16, 32, 64 or
 * 128 (the mma k-step is 16), and only the Dh real columns are stored.
 *
 * Dropout: the mask is TG_OP_ATTN_SOFTMAX's (kernels/philox.h; element
 * ((b*H + h)*T + q)*T + k), drawn once, in the forward: when T % 4 == 0 every Philox
 * block (4 consecutive keys of one query) lies inside one warp's tile, so each lane draws
 * one block per 16 x 8 fragment and hands the keep bits to the lanes holding those
 * elements by shuffle (one Philox call per 4 elements); otherwise each element draws its
 * own. The forward stores the kept-and-taking-part bits (1 bit per pair: 1/16 of a bf16
 * probability tensor) and both backward kernels read them, so the backward draws nothing.
 *
 * fp32 plans: plain fp32 kernels (a warp per row; dots in float, sums over keys in
 * double), the oracle-precision path for fp32 training and tests. */
#include <math.h>
#include <string.h>

#include "kernels/cuda_common.cuh"
#include "kernels/philox.h"

#define FA_ROWS 64    /* rows per block (queries, or keys for dK/dV) */
#define FA_COLS 64    /* columns per tile (keys, or queries for dK/dV) */
#define FA_THREADS 128
#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

struct fa_args {
    const void *q, *k, *v; /* column 0 of head 0 of each part */
    int64_t ldq, ldk, ldv; /* row strides in elements */
    const void *o, *dout;  /* forward output and its gradient (backward) */
    void *o_out;           /* forward: O */
    void *dq, *dk, *dv;
    int64_t ldo, lddq, lddk, lddv;
    float *lse;            /* forward writes, backward reads */
    float *delta;          /* backward: dQ kernel writes, dK/dV kernel reads */
    const float *mask;     /* [B,T] or NULL */
    const float *step;     /* step counter, or NULL (forward) */
    uint32_t *bits;        /* keep bits [B,H,T,W]: forward writes, backward reads; or NULL */
    int W;                 /* words per row of bits: ceil(T/32) */
    int B, H, T, Dh, causal, vec;
    float scale;
    /* dropout */
    uint64_t seed;
    uint32_t key;
    float p, inv_keep;
    int drop, drop_vec;
};

/* 2^x by the SFU (ex2.approx: 2 ulp, exp2(-inf) = 0), for the bf16 kernels. */
static __device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* ---- tensor-core primitives ------------------------------------------------------ */

static __device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const tg_bf16 *p) {
    const unsigned addr = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

static __device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const tg_bf16 *p) {
    const unsigned addr = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* Shared tiles are [64][DP + 8] bf16: the 16-byte pad puts the 8 rows of every ldmatrix
 * phase in distinct banks. */
template <int DP>
struct fa_tile {
    static constexpr int LD = DP + 8;
    static constexpr int ELEMS = FA_ROWS * LD;
};

/* A fragment (16 rows x 16 k) of a row-major tile, rows r0.., columns k0.. */
template <int DP>
static __device__ __forceinline__ void frag_a(uint32_t (&a)[4], const tg_bf16 *t, int r0, int k0, int lane) {
    ldsm_x4(a, t + (r0 + (lane & 15)) * fa_tile<DP>::LD + k0 + (lane >> 4) * 8);
}

/* B fragments of two n8 tiles (n0.., n0+8..) x k16 from a tile stored [n][k]. */
template <int DP>
static __device__ __forceinline__ void frag_b_nk(uint32_t (&b)[4], const tg_bf16 *t, int n0, int k0, int lane) {
    ldsm_x4(b, t + (n0 + (lane & 7) + ((lane >> 4) << 3)) * fa_tile<DP>::LD + k0 + ((lane >> 3) & 1) * 8);
}

/* B fragments of two n8 tiles x k16 from a tile stored [k][n] (transposing load). */
template <int DP>
static __device__ __forceinline__ void frag_b_kn(uint32_t (&b)[4], const tg_bf16 *t, int k0, int n0, int lane) {
    ldsm_x4_t(b, t + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * fa_tile<DP>::LD + n0 + (lane >> 4) * 8);
}

/* The accumulator of two adjacent n8 tiles (16 x 16, fp32) as the A fragment of the
 * next product, rounded to bf16. */
static __device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
    a[0] = tg_bf16_pack(c0[0], c0[1]);
    a[1] = tg_bf16_pack(c0[2], c0[3]);
    a[2] = tg_bf16_pack(c1[0], c1[1]);
    a[3] = tg_bf16_pack(c1[2], c1[3]);
}

/* acc = rows r0 .. r0+15 of tile A times tile B^T (both stored [row][DP]): a 16 x 64
 * product such as Q K^T, fp32. */
template <int DP>
static __device__ __forceinline__ void tile_abt(float (&acc)[FA_COLS / 8][4], const tg_bf16 *sA, const tg_bf16 *sB,
                                                int r0, int lane) {
    for (int j = 0; j < FA_COLS / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < DP / 16; kk++) {
        uint32_t af[4];
        frag_a<DP>(af, sA, r0, kk * 16, lane);
#pragma unroll
        for (int nj = 0; nj < FA_COLS / 16; nj++) {
            uint32_t bf[4];
            frag_b_nk<DP>(bf, sB, nj * 16, kk * 16, lane);
            mma16816(acc[2 * nj], af, bf[0], bf[1]);
            mma16816(acc[2 * nj + 1], af, bf[2], bf[3]);
        }
    }
}

/* acc += P B: P a 16 x 64 fp32 fragment (rounded to bf16 for the product), B a tile
 * stored [64][DP], such as P V. */
template <int DP>
static __device__ __forceinline__ void tile_pb(float (&acc)[DP / 8][4], const float (&p)[FA_COLS / 8][4],
                                               const tg_bf16 *sB, int lane) {
#pragma unroll
    for (int kk = 0; kk < FA_COLS / 16; kk++) {
        uint32_t pa[4];
        acc_to_a(pa, p[2 * kk], p[2 * kk + 1]);
#pragma unroll
        for (int dj = 0; dj < DP / 16; dj++) {
            uint32_t bf[4];
            frag_b_kn<DP>(bf, sB, kk * 16, dj * 16, lane);
            mma16816(acc[2 * dj], pa, bf[0], bf[1]);
            mma16816(acc[2 * dj + 1], pa, bf[2], bf[3]);
        }
    }
}

/* Asynchronous 16-byte global -> shared copies (sm_80+): the next tile streams in while
 * the current one is computed. src_bytes 0 zero-fills. */
static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* Rows row0 .. row0+ROWS-1 (of T; rows past T and columns past Dh are zero) of one head,
 * g pointing at row 0 column 0 of that head, by the block's THREADS threads. With 16-byte
 * rows the copy is asynchronous (part of the caller's next cp.async group); otherwise
 * element by element. */
template <int DP, int ROWS = FA_ROWS, int THREADS = FA_THREADS>
static __device__ __forceinline__ void load_tile(tg_bf16 *s, const tg_bf16 *g, int64_t ld, int row0, int T, int Dh,
                                                 int vec) {
    constexpr int LD = fa_tile<DP>::LD;
    if (vec) {
        constexpr int CH = DP / 8; /* 16-byte chunks per row */
        for (int i = threadIdx.x; i < ROWS * CH; i += THREADS) {
            const int r = i / CH, c = (i % CH) * 8;
            const bool in = row0 + r < T && c < Dh;
            cp_async16(s + r * LD + c, in ? g + (int64_t)(row0 + r) * ld + c : g, in ? 16 : 0);
        }
    } else {
        const tg_bf16 zero = __float2bfloat16_rn(0.0f);
        for (int i = threadIdx.x; i < ROWS * DP; i += THREADS) {
            const int r = i / DP, c = i % DP;
            s[r * LD + c] = row0 + r < T && c < Dh ? g[(int64_t)(row0 + r) * ld + c] : zero;
        }
    }
}

/* delta = rowsum(dO * O) of tile row r (stored, rounded O), by a warp: lane L sums half
 * (L >> 4) of row r0 + (L & 15) and the halves meet by shuffle, so lanes L and L ^ 16 both
 * return that row's sum. */
template <int DP>
static __device__ __forceinline__ float row_delta(const tg_bf16 *sdO, const tg_bf16 *sO, int r0, int lane) {
    constexpr int LD = fa_tile<DP>::LD;
    const int r = r0 + (lane & 15), d0 = (lane >> 4) * (DP / 2);
    float acc = 0.0f;
    for (int d = d0; d < d0 + DP / 2; d++) acc += __bfloat162float(sdO[r * LD + d]) * __bfloat162float(sO[r * LD + d]);
    return acc + __shfl_xor_sync(0xffffffffu, acc, 16);
}

/* The key mask of columns col0 .. col0+63: nonzero where the key is real (inside T and
 * mask != 0). Mask values stream in with the caller's cp.async group (4-byte copies,
 * zero past T) so no thread waits on a global load here; without a mask the tile is
 * written directly. */
static __device__ __forceinline__ void load_key_mask(float *s, const float *mask, int b, int T, int col0) {
    for (int i = threadIdx.x; i < FA_COLS; i += FA_THREADS) {
        const int k = col0 + i;
        if (!mask) {
            s[i] = k < T ? 1.0f : 0.0f;
            continue;
        }
        const float *src = k < T ? mask + (int64_t)b * T + k : mask;
        const unsigned dst = (unsigned)__cvta_generic_to_shared(s + i);
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(k < T ? 4 : 0));
    }
}

/* Per-row floats rows row0 .. row0+63 of a [B*H, T] statistic (LSE, delta) into shared
 * memory with the caller's cp.async group; zero past T. */
static __device__ __forceinline__ void load_row_stat(float *s, const float *src, int64_t bh, int T, int row0) {
    for (int i = threadIdx.x; i < FA_COLS; i += FA_THREADS) {
        const int q = row0 + i;
        const float *p = q < T ? src + bh * T + q : src;
        const unsigned dst = (unsigned)__cvta_generic_to_shared(s + i);
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(p), "r"(q < T ? 4 : 0));
    }
}

/* Keep bits of one 16 x 8 fragment (rows are queries q, columns keys k): rows
 * r0 + 0..15, columns c0 + 0..7; bits[0] for row g, bits[1] for row g + 8, bit i for
 * column 2c + i. */
static __device__ __forceinline__ void keep_bits(unsigned (&bits)[2], const fa_args &a, uint64_t step, int64_t bh,
                                                 int r0, int c0, int lane) {
    const int g = lane >> 2, c = lane & 3;
    const float p = a.p;
    const int64_t T = a.T;
    if (a.drop_vec) {
        /* Lane L draws one Philox block (keys c0 + 4 (L >> 4) .. +3 of query r0 + (L & 15))
         * and shares its 4 bits: (row g, keys 2c, 2c+1) sit in the block of lane
         * g + 16 (c >> 1), bits 2 (c & 1). */
        const int64_t q = r0 + (lane & 15), k = c0 + (lane >> 4) * 4;
        float u[4];
        tg_philox_uniform4(a.seed, step, a.key, (uint64_t)((bh * T + q) * T + k) >> 2, u);
        const unsigned mine = (unsigned)(u[0] >= p) | (unsigned)(u[1] >= p) << 1 | (unsigned)(u[2] >= p) << 2 |
                              (unsigned)(u[3] >= p) << 3;
        const unsigned lo = __shfl_sync(0xffffffffu, mine, g + 16 * (c >> 1));
        const unsigned hi = __shfl_sync(0xffffffffu, mine, g + 8 + 16 * (c >> 1));
        bits[0] = (lo >> ((c & 1) * 2)) & 3u;
        bits[1] = (hi >> ((c & 1) * 2)) & 3u;
        return;
    }
    for (int half = 0; half < 2; half++) {
        unsigned m = 0;
        for (int i = 0; i < 2; i++) {
            const int64_t q = r0 + g + 8 * half, k = c0 + 2 * c + i;
            if (q < T && k < T)
                m |= (unsigned)(tg_philox_uniform(a.seed, step, a.key, (uint64_t)((bh * T + q) * T + k)) >= p) << i;
        }
        bits[half] = m;
    }
}

/* Rows r0 + g and r0 + g + 8 of a 16-row accumulator (columns below Dh, rows below T)
 * to a bf16 [rows, ld] head. */
template <int DP>
static __device__ __forceinline__ void store_rows(tg_bf16 *base, int64_t ld, const float (&acc)[DP / 8][4], int r0,
                                                  int T, int Dh, int vec, int lane) {
    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = r0 + g + 8 * r;
        if (row >= T) continue;
        tg_bf16 *drow = base + (int64_t)row * ld;
#pragma unroll
        for (int d = 0; d < DP / 8; d++) {
            const int col = 8 * d + 2 * c;
            if (col + 1 < Dh && vec)
                *reinterpret_cast<uint32_t *>(drow + col) = tg_bf16_pack(acc[d][2 * r], acc[d][2 * r + 1]);
            else {
                if (col < Dh) drow[col] = __float2bfloat16_rn(acc[d][2 * r]);
                if (col + 1 < Dh) drow[col + 1] = __float2bfloat16_rn(acc[d][2 * r + 1]);
            }
        }
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

/* K, V and the key mask of key tile k0 into double-buffer slot `buf` (sKV: [buf][K, V],
 * sM2: [buf][64]), as part of the caller's next cp.async group. */
template <int DP>
struct key_tiles {
    const tg_bf16 *K, *V; /* head columns of row 0 */
    int64_t ldk, ldv;
    const float *mask;
    int b, T, Dh, vec;
};

template <int DP>
static __device__ __forceinline__ void load_key_tile(tg_bf16 *sKV, float *sM2, int buf, const key_tiles<DP> &kv,
                                                     int k0) {
    constexpr int E = fa_tile<DP>::ELEMS;
    tg_bf16 *dst = sKV + 2 * E * buf;
    load_tile<DP>(dst, kv.K, kv.ldk, k0, kv.T, kv.Dh, kv.vec);
    load_tile<DP>(dst + E, kv.V, kv.ldv, k0, kv.T, kv.Dh, kv.vec);
    load_key_mask(sM2 + FA_COLS * buf, kv.mask, kv.b, kv.T, k0);
}

/* Before key tile kt is used: start the next one streaming into the other slot, wait
 * until tile kt has landed, and make it visible to the whole block. */
template <int DP>
static __device__ __forceinline__ void advance_key_tile(tg_bf16 *sKV, float *sM2, int kt, int ktiles,
                                                        const key_tiles<DP> &kv) {
    if (kt + 1 < ktiles) {
        load_key_tile<DP>(sKV, sM2, (kt + 1) & 1, kv, (kt + 1) * FA_COLS);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    __syncthreads();
}

/* ---- forward (bf16) ---------------------------------------------------------------- */

/* Scales a 16 x 64 score fragment into the exp2 domain and masks it (keys past T or
 * masked, and with causal masking keys after the row's query, become -inf); returns the
 * row maxima folded into mx. MASKED = 0 is the fast path for tiles wholly visible. */
template <int MASKED>
static __device__ __forceinline__ void scale_mask_rows(float (&s)[FA_COLS / 8][4], float (&mx)[2], const float *sM,
                                                       float sl2, int causal, int k0, int row0, int lane) {
    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int j = 0; j < FA_COLS / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float v = s[j][e] * sl2;
            if (MASKED) {
                const int col = 8 * j + 2 * c + (e & 1), row = row0 + g + 8 * (e >> 1);
                if (sM[col] == 0.0f || (causal && k0 + col > row)) v = -INFINITY;
            }
            s[j][e] = v;
            mx[e >> 1] = fmaxf(mx[e >> 1], v);
        }
}

/* Whether a warp must mask its 16 rows x 64 keys element by element. */
static __device__ __forceinline__ bool tile_needs_mask(const float *sM, int causal, int k0, int row0, int lane) {
    const bool full = __all_sync(0xffffffffu, sM[lane] != 0.0f && sM[lane + 32] != 0.0f);
    return !full || (causal && k0 + FA_COLS - 1 > row0);
}

template <int DP>
__global__ void __launch_bounds__(FA_THREADS) fa_fwd_kernel(fa_args a) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    constexpr int E = fa_tile<DP>::ELEMS;
    tg_bf16 *sQ = reinterpret_cast<tg_bf16 *>(fa_smem), *sKV = sQ + E; /* [buf][K, V] */
    float *sM2 = reinterpret_cast<float *>(sKV + 4 * E);              /* [buf][64] */
    const int T = a.T, H = a.H, Dh = a.Dh;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * FA_ROWS; /* long causal rows first */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int wr0 = q0 + warp * 16; /* this warp's first query */
    const uint64_t step = a.drop ? tg_dropout_step(a.step) : 0;
    const tg_bf16 *Q = (const tg_bf16 *)a.q + (int64_t)b * T * a.ldq + h * Dh;
    const tg_bf16 *K = (const tg_bf16 *)a.k + (int64_t)b * T * a.ldk + h * Dh;
    const tg_bf16 *V = (const tg_bf16 *)a.v + (int64_t)b * T * a.ldv + h * Dh;
    int ktiles = (T + FA_COLS - 1) / FA_COLS;
    if (a.causal) ktiles = min(ktiles, (q0 + FA_ROWS - 1) / FA_COLS + 1);
    load_tile<DP>(sQ, Q, a.ldq, q0, T, Dh, a.vec);
    const key_tiles<DP> kv = {K, V, a.ldk, a.ldv, a.mask, b, T, Dh, a.vec};
    load_key_tile<DP>(sKV, sM2, 0, kv, 0);
    cp_async_commit();

    float o[DP / 8][4];
    for (int d = 0; d < DP / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const float sl2 = a.scale * FA_LOG2E;
    for (int kt = 0; kt < ktiles; kt++) {
        const int k0 = kt * FA_COLS, buf = kt & 1;
        advance_key_tile<DP>(sKV, sM2, kt, ktiles, kv);
        const tg_bf16 *sK = sKV + 2 * E * buf, *sV = sK + E;
        const float *sM = sM2 + FA_COLS * buf;
        if (!a.causal || k0 <= wr0 + 15) { /* else the warp's rows see none of these keys */
            float s[FA_COLS / 8][4];
            tile_abt<DP>(s, sQ, sK, warp * 16, lane);
            float mx[2] = {m[0], m[1]};
            if (tile_needs_mask(sM, a.causal, k0, wr0, lane))
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
            uint32_t rb[2][2] = {{0u, 0u}, {0u, 0u}}; /* taking-part bits of rows g, g+8 (64 keys) */
#pragma unroll
            for (int j = 0; j < FA_COLS / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int col = 8 * j + 2 * c + (e & 1);
                    if (s[j][e] != -INFINITY) rb[e >> 1][col >> 5] |= 1u << (col & 31);
                    const float pv = fa_exp2(s[j][e] - mb[e >> 1]);
                    s[j][e] = pv;
                    rs[e >> 1] += pv;
                }
            l[0] = l[0] * alpha[0] + rs[0];
            l[1] = l[1] * alpha[1] + rs[1];
#pragma unroll
            for (int d = 0; d < DP / 8; d++)
                o[d][0] *= alpha[0], o[d][1] *= alpha[0], o[d][2] *= alpha[1], o[d][3] *= alpha[1];
            if (a.drop) {
#pragma unroll
                for (int j = 0; j < FA_COLS / 8; j++) {
                    unsigned kb[2];
                    keep_bits(kb, a, step, bh, wr0, k0 + 8 * j, lane);
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const bool keep = (kb[e >> 1] >> (e & 1)) & 1u;
                        s[j][e] = keep ? s[j][e] * a.inv_keep : 0.0f;
                        if (!keep) {
                            const int col = 8 * j + 2 * c + (e & 1);
                            rb[e >> 1][col >> 5] &= ~(1u << (col & 31));
                        }
                    }
                }
            }
            if (a.bits) store_bits(a, rb, bh, wr0, k0, lane);
            tile_pb<DP>(o, s, sV, lane);
        } else if (a.bits) {
            const uint32_t zero[2][2] = {{0u, 0u}, {0u, 0u}};
            store_bits(a, zero, bh, wr0, k0, lane);
        }
        __syncthreads(); /* buffer `buf` is refilled next iteration */
    }
    /* Words of key tiles this block never visits (past the causal diagonal) are zero. */
    if (a.bits)
        for (int i = lane; i < 16 * a.W; i += 32) {
            const int row = wr0 + i / a.W, wi = i % a.W;
            if (row < T && wi >= 2 * ktiles) a.bits[((int64_t)bh * T + row) * a.W + wi] = 0u;
        }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    tg_bf16 *O = (tg_bf16 *)a.o_out + (int64_t)b * T * a.ldo + h * Dh;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
#pragma unroll
        for (int d = 0; d < DP / 8; d++) o[d][2 * r] *= inv, o[d][2 * r + 1] *= inv;
        const int row = wr0 + g + 8 * r;
        if (c == 0 && row < T) a.lse[(int64_t)bh * T + row] = l[r] > 0.0f ? (m[r] + log2f(l[r])) * FA_LN2 : 0.0f;
    }
    store_rows<DP>(O, a.ldo, o, wr0, T, Dh, a.vec, lane);
}

/* ---- backward: dQ (and delta) (bf16) ----------------------------------------------- */

template <int DP>
__global__ void __launch_bounds__(FA_THREADS, DP <= 64 ? 4 : 2) fa_bwd_dq_kernel(fa_args a) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    constexpr int E = fa_tile<DP>::ELEMS;
    tg_bf16 *sQ = reinterpret_cast<tg_bf16 *>(fa_smem), *sdO = sQ + E, *sO = sdO + E, *sKV = sO + E;
    float *sM2 = reinterpret_cast<float *>(sKV + 4 * E);
    const int T = a.T, H = a.H, Dh = a.Dh;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * FA_ROWS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int wr0 = q0 + warp * 16;
        const tg_bf16 *Q = (const tg_bf16 *)a.q + (int64_t)b * T * a.ldq + h * Dh;
    const tg_bf16 *K = (const tg_bf16 *)a.k + (int64_t)b * T * a.ldk + h * Dh;
    const tg_bf16 *V = (const tg_bf16 *)a.v + (int64_t)b * T * a.ldv + h * Dh;
    const tg_bf16 *dO = (const tg_bf16 *)a.dout + (int64_t)b * T * a.ldo + h * Dh;
    const tg_bf16 *O = (const tg_bf16 *)a.o + (int64_t)b * T * a.ldo + h * Dh;
    int ktiles = (T + FA_COLS - 1) / FA_COLS;
    if (a.causal) ktiles = min(ktiles, (q0 + FA_ROWS - 1) / FA_COLS + 1);
    load_tile<DP>(sQ, Q, a.ldq, q0, T, Dh, a.vec);
    load_tile<DP>(sdO, dO, a.ldo, q0, T, Dh, a.vec);
    load_tile<DP>(sO, O, a.ldo, q0, T, Dh, a.vec);
    cp_async_commit();
    const key_tiles<DP> kv = {K, V, a.ldk, a.ldv, a.mask, b, T, Dh, a.vec};
    load_key_tile<DP>(sKV, sM2, 0, kv, 0);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    /* delta of the warp's 16 rows (lanes L and L ^ 16 hold row L & 15's). */
    float dl[2], lse2[2];
    {
        const float acc = row_delta<DP>(sdO, sO, warp * 16, lane);
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
        advance_key_tile<DP>(sKV, sM2, kt, ktiles, kv);
        const tg_bf16 *sK = sKV + 2 * E * buf, *sV = sK + E;
        const float *sM = sM2 + FA_COLS * buf;
        if (!a.causal || k0 <= wr0 + 15) {
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
            tile_abt<DP>(s, sQ, sK, warp * 16, lane);   /* S = Q K^T */
            tile_abt<DP>(dp, sdO, sV, warp * 16, lane); /* dD = dO V^T */
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
            tile_pb<DP>(dq, s, sK, lane); /* dQ += dS K */
        }
        __syncthreads();
    }
    store_rows<DP>((tg_bf16 *)a.dq + (int64_t)b * T * a.lddq + h * Dh, a.lddq, dq, wr0, T, Dh, a.vec, lane);
}

/* ---- backward: dK, dV (bf16) ------------------------------------------------------- */

template <int DP>
__global__ void __launch_bounds__(FA_THREADS, DP <= 64 ? 3 : 2) fa_bwd_dkdv_kernel(fa_args a) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    constexpr int E = fa_tile<DP>::ELEMS;
    tg_bf16 *sK = reinterpret_cast<tg_bf16 *>(fa_smem), *sV = sK + E, *sQO = sV + E; /* [buf][Q, dO] */
    float *sLD = reinterpret_cast<float *>(sQO + 4 * E); /* [buf][LSE 64, delta 64] (natural log) */
    float *sM = sLD + 4 * FA_COLS;
    uint32_t *sB = reinterpret_cast<uint32_t *>(sM + FA_COLS); /* [buf][64 queries][2 words] */
    const int T = a.T, H = a.H, Dh = a.Dh;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int k0 = blockIdx.x * FA_ROWS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int wk0 = k0 + warp * 16; /* this warp's first key */
    const tg_bf16 *Q = (const tg_bf16 *)a.q + (int64_t)b * T * a.ldq + h * Dh;
    const tg_bf16 *K = (const tg_bf16 *)a.k + (int64_t)b * T * a.ldk + h * Dh;
    const tg_bf16 *V = (const tg_bf16 *)a.v + (int64_t)b * T * a.ldv + h * Dh;
    const tg_bf16 *dO = (const tg_bf16 *)a.dout + (int64_t)b * T * a.ldo + h * Dh;
    const int qtiles = (T + FA_COLS - 1) / FA_COLS;
    const int qt0 = a.causal ? k0 / FA_COLS : 0;
    load_tile<DP>(sK, K, a.ldk, k0, T, Dh, a.vec);
    load_tile<DP>(sV, V, a.ldv, k0, T, Dh, a.vec);
    load_key_mask(sM, a.mask, b, T, k0);
    /* Query tile qt goes to buffer (qt - qt0) & 1 with its LSE and delta. */
    auto load_queries = [&](int qt, int buf) {
        const int q0 = qt * FA_COLS;
        tg_bf16 *dst = sQO + 2 * E * buf;
        load_tile<DP>(dst, Q, a.ldq, q0, T, Dh, a.vec);
        load_tile<DP>(dst + E, dO, a.ldo, q0, T, Dh, a.vec);
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
    bool kv[2] = {true, true};
    for (int qt = qt0; qt < qtiles; qt++) {
        const int q0 = qt * FA_COLS, buf = (qt - qt0) & 1;
        if (qt + 1 < qtiles) {
            load_queries(qt + 1, buf ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (qt == qt0) kv[0] = sM[warp * 16 + g] != 0.0f, kv[1] = sM[warp * 16 + g + 8] != 0.0f;
        const tg_bf16 *sQ = sQO + 2 * E * buf, *sdO = sQ + E;
        const float *sL = sLD + 2 * FA_COLS * buf, *sD = sL + FA_COLS;
        const uint32_t *sBb = sB + 2 * FA_COLS * buf;
        if (!a.causal || q0 + FA_COLS - 1 >= wk0) { /* else every query precedes the warp's keys */
            float s[FA_COLS / 8][4], dp[FA_COLS / 8][4];
            tile_abt<DP>(s, sK, sQ, warp * 16, lane);   /* S^T = K Q^T */
            tile_abt<DP>(dp, sV, sdO, warp * 16, lane); /* dD^T = V dO^T */
            /* Element-wise masking only where a query past T or a causal pair can occur. */
            const bool masked = q0 + FA_COLS > T || (a.causal && q0 < wk0 + 15);
            /* s becomes D^T (dropped probabilities), dp becomes dS^T. */
#pragma unroll
            for (int j = 0; j < FA_COLS / 8; j++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int qc = 8 * j + 2 * c + (e & 1);
                    const int ko = warp * 16 + g + 8 * (e >> 1); /* key within the block's 64 */
                    bool ok = kv[e >> 1];
                    if (masked) ok = ok && q0 + qc < T && (!a.causal || wk0 + g + 8 * (e >> 1) <= q0 + qc);
                    const float pv = ok ? fa_exp2(s[j][e] * sl2 - sL[qc] * FA_LOG2E) : 0.0f;
                    const bool keep = !a.drop || ((sBb[2 * qc + (ko >> 5)] >> (ko & 31)) & 1u);
                    const float dpv = keep ? (a.drop ? dp[j][e] * a.inv_keep : dp[j][e]) : 0.0f;
                    s[j][e] = keep ? (a.drop ? pv * a.inv_keep : pv) : 0.0f;
                    dp[j][e] = pv * (dpv - sD[qc]) * a.scale;
                }
            }
            tile_pb<DP>(dv, s, sdO, lane); /* dV += D^T dO */
            tile_pb<DP>(dk, dp, sQ, lane); /* dK += dS^T Q */
        }
        __syncthreads();
    }
    store_rows<DP>((tg_bf16 *)a.dk + (int64_t)b * T * a.lddk + h * Dh, a.lddk, dk, wk0, T, Dh, a.vec, lane);
    store_rows<DP>((tg_bf16 *)a.dv + (int64_t)b * T * a.lddv + h * Dh, a.lddv, dv, wk0, T, Dh, a.vec, lane);
}

/* ---- backward for short sequences: one block per (batch, head) (bf16) --------------- */

/* When the whole sequence fits one block (T <= TP = 64 or 128), a block of TP / 16 warps
 * owns every query and key of one (b, h) and computes dQ, dK and dV together: warp w
 * takes keys 16w .. 16w + 15 through the dK/dV arrangement above (per 64-query tile:
 * S^T = K Q^T, dP^T = V dO^T, dV += D^T dO, dK += dS^T Q) and leaves its dS^T rows
 * (bf16, as rounded for the dK product) in shared memory; after one barrier warp w takes
 * queries 16w .. and forms dQ = dS K from them. Five tile products instead of the two
 * kernels' seven, one launch, still no atomics (each output row has one owner). delta =
 * rowsum(dO * O) is formed in the block first (and stored, as the dQ kernel does).
 * Not capped to two blocks per SM: at 128 registers it spills, and measured slower (BERT
 * T = 128: 70 us per layer against 68 uncapped, and 82 for the two kernels). */
template <int DP, int TP>
struct fs_smem {
    static constexpr int LD = fa_tile<DP>::LD;          /* K, V, Q, dO: [TP][LD] bf16 */
    static constexpr int LDS = TP + 8;                   /* dS^T: [TP keys][LDS] bf16 */
    static constexpr int TILE = TP * LD;
    static constexpr int DS_ELEMS = TP * LDS > TILE ? TP * LDS : TILE; /* also holds O first */
    static constexpr size_t BYTES = (4 * (size_t)TILE + (size_t)DS_ELEMS) * sizeof(tg_bf16) +
                                    3 * TP * sizeof(float) + (size_t)TP * (TP / 32) * sizeof(uint32_t);
};

template <int DP, int TP>
__global__ void __launch_bounds__(TP * 2, 1) fa_bwd_short_kernel(fa_args a) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    typedef fs_smem<DP, TP> L;
    constexpr int LD = L::LD, LDS = L::LDS, NWORD = TP / 32;
    tg_bf16 *sK = reinterpret_cast<tg_bf16 *>(fa_smem), *sV = sK + L::TILE, *sQ = sV + L::TILE, *sdO = sQ + L::TILE;
    tg_bf16 *sdS = sdO + L::TILE; /* first O (for delta), then dS^T */
    float *sL = reinterpret_cast<float *>(sdS + L::DS_ELEMS), *sD = sL + TP, *sM = sD + TP;
    uint32_t *sB = reinterpret_cast<uint32_t *>(sM + TP); /* [TP queries][NWORD] keep bits */
    const int T = a.T, H = a.H, Dh = a.Dh;
    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int w0 = warp * 16; /* this warp's first key, and later its first query */
    const tg_bf16 *Q = (const tg_bf16 *)a.q + (int64_t)b * T * a.ldq + h * Dh;
    const tg_bf16 *K = (const tg_bf16 *)a.k + (int64_t)b * T * a.ldk + h * Dh;
    const tg_bf16 *V = (const tg_bf16 *)a.v + (int64_t)b * T * a.ldv + h * Dh;
    const tg_bf16 *dO = (const tg_bf16 *)a.dout + (int64_t)b * T * a.ldo + h * Dh;
    const tg_bf16 *O = (const tg_bf16 *)a.o + (int64_t)b * T * a.ldo + h * Dh;
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
        const tg_bf16 *sQt = sQ + q0 * LD, *sdOt = sdO + q0 * LD;
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
            tg_bf16 *row = sdS + (w0 + g) * LDS + q0 + 8 * j + 2 * c;
            *reinterpret_cast<uint32_t *>(row) = tg_bf16_pack(dp[j][0], dp[j][1]);
            *reinterpret_cast<uint32_t *>(row + 8 * LDS) = tg_bf16_pack(dp[j][2], dp[j][3]);
        }
        tile_pb<DP>(dv, s, sdOt, lane); /* dV += D^T dO */
        tile_pb<DP>(dk, dp, sQt, lane); /* dK += dS^T Q */
    }
    const int64_t boff = (int64_t)b * T;
    store_rows<DP>((tg_bf16 *)a.dk + boff * a.lddk + h * Dh, a.lddk, dk, w0, T, Dh, a.vec, lane);
    store_rows<DP>((tg_bf16 *)a.dv + boff * a.lddv + h * Dh, a.lddv, dv, w0, T, Dh, a.vec, lane);
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
            mma16816(dq[2 * dj], af, bf[0], bf[1]);
            mma16816(dq[2 * dj + 1], af, bf[2], bf[3]);
        }
    }
    store_rows<DP>((tg_bf16 *)a.dq + boff * a.lddq + h * Dh, a.lddq, dq, w0, T, Dh, a.vec, lane);
}

/* ---- fp32 kernels (a warp per row) --------------------------------------------------- */

#define FA32_WARPS 4
#define FA32_MAXD 4 /* Dh <= 128: up to 4 columns per lane */

static __device__ __forceinline__ bool fa_kept(const fa_args &a, int b, int q, int k) {
    return k < a.T && (!a.mask || a.mask[(int64_t)b * a.T + k] != 0.0f) && (!a.causal || k <= q);
}

static __device__ __forceinline__ float fa_dot(const float *x, const float *y, int Dh) {
    float s = 0.0f;
    for (int d = 0; d < Dh; d++) s = fadd(s, fmul(x[d], y[d]));
    return s;
}

static __device__ __forceinline__ float fa_keep_scale(const fa_args &a, uint64_t step, int64_t bh, int q, int k) {
    if (!a.drop) return 1.0f;
    const int64_t e = (bh * a.T + q) * a.T + k;
    return tg_philox_uniform(a.seed, step, a.key, (uint64_t)e) >= a.p ? a.inv_keep : 0.0f;
}

/* The backward's dropout factor of pair (q, k) from the forward's keep bits. */
static __device__ __forceinline__ float fa_bits_scale(const fa_args &a, int64_t bh, int q, int k) {
    if (!a.bits) return 1.0f;
    return (a.bits[(bh * a.T + q) * a.W + (k >> 5)] >> (k & 31)) & 1u ? a.inv_keep : 0.0f;
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

/* ---- launchers ---------------------------------------------------------------------- */

/* Fills the shape, the Q/K/V parts (packed or not, slots q_slot..q_slot+2: 0 in the
 * forward, 5 in the backward) and dropout. */
static int fa_setup(const tg_cuda_op_args *a, int q_slot, int mask_slot, fa_args *f, tg_err *err) {
    const tg_attention_params *at = &a->op->p.attention; /* ATTENTION and ATTENTION_BWD share the set */
    memset(f, 0, sizeof *f);
    f->B = (int)at->b, f->H = (int)at->h, f->T = (int)at->t, f->causal = at->causal != 0;
    f->Dh = (int)at->head_dim;
    f->scale = at->scale;
    if (f->Dh < 1 || f->Dh > 128) return tg_fail(err, "head dim %d: the fused attention kernels take 1..128", f->Dh);
    const int64_t D = (int64_t)f->H * f->Dh;
    const int es = a->in_dtype[q_slot] == TG_BF16 ? 2 : 4;
    if (at->packed) {
        const char *base = (const char *)a->in[q_slot];
        f->q = base, f->k = base + D * es, f->v = base + 2 * D * es;
        f->ldq = f->ldk = f->ldv = 3 * D;
    } else {
        f->q = a->in[q_slot], f->k = a->in[q_slot + 1], f->v = a->in[q_slot + 2];
        f->ldq = f->ldk = f->ldv = D;
        if (!f->k || !f->v) return tg_fail(err, "unpacked attention needs q, k and v");
    }
    f->ldo = D;
    f->mask = (const float *)a->in[mask_slot];
    f->W = (f->T + 31) / 32;
    f->seed = a->ctx->seed;
    f->key = (uint32_t)at->key;
    f->p = at->p;
    f->inv_keep = f->p < 1.0f ? 1.0f / (1.0f - f->p) : 0.0f; /* the CPU's expression */
    /* Forward: draws when training with the step counter and writes out2's bits; the
     * backward reads the bits (in4) and draws nothing. */
    if (q_slot == 0) {
        f->step = (const float *)a->in[4];
        f->bits = (uint32_t *)a->out[2];
        f->drop = a->training && f->p > 0.0f && f->step != NULL;
    } else {
        f->bits = (uint32_t *)a->in[4];
        f->drop = f->bits != NULL;
    }
    f->drop_vec = f->T % 4 == 0;
    /* 16-byte row chunks: every row start and head column aligned to 8 bf16. */
    f->vec = es == 2 && f->Dh % 8 == 0 && D % 8 == 0 && tg_aligned16(f->q) && tg_aligned16(f->k) && tg_aligned16(f->v);
    return 0;
}

template <int DP>
static int fa_launch_fwd(const fa_args &f, cudaStream_t s, tg_err *err) {
    const size_t smem = 5 * fa_tile<DP>::ELEMS * sizeof(tg_bf16) + 2 * FA_COLS * sizeof(float);
    cudaError_t e = cudaFuncSetAttribute(fa_fwd_kernel<DP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e == cudaSuccess) /* L1 as shared memory: the register count (3 blocks) stays the limit */
        e = cudaFuncSetAttribute(fa_fwd_kernel<DP>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess) return tg_fail(err, "cudaFuncSetAttribute(attention forward): %s", cudaGetErrorString(e));
    dim3 grid((unsigned)((f.T + FA_ROWS - 1) / FA_ROWS), (unsigned)(f.B * f.H));
    fa_fwd_kernel<DP><<<grid, FA_THREADS, smem, s>>>(f);
    return 0;
}

/* The one-block-per-(b, h) backward for T <= TP. */
template <int DP, int TP>
static int fa_launch_bwd_short(const fa_args &f, cudaStream_t s, tg_err *err) {
    const size_t smem = fs_smem<DP, TP>::BYTES;
    cudaError_t e =
        cudaFuncSetAttribute(fa_bwd_short_kernel<DP, TP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(fa_bwd_short_kernel<DP, TP>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess)
        return tg_fail(err, "cudaFuncSetAttribute(short attention backward): %s", cudaGetErrorString(e));
    fa_bwd_short_kernel<DP, TP><<<(unsigned)(f.B * f.H), TP * 2, smem, s>>>(f);
    return 0;
}

template <int DP>
static int fa_launch_bwd(const fa_args &f, cudaStream_t s, tg_err *err) {
    if (f.T <= 64) return fa_launch_bwd_short<DP, 64>(f, s, err);
    if (f.T <= 128) return fa_launch_bwd_short<DP, 128>(f, s, err);
    const size_t smem_q = 7 * fa_tile<DP>::ELEMS * sizeof(tg_bf16) + 2 * FA_COLS * sizeof(float);
    const size_t smem_k = 6 * fa_tile<DP>::ELEMS * sizeof(tg_bf16) + 5 * FA_COLS * sizeof(float) +
                          4 * FA_COLS * sizeof(uint32_t);
    cudaError_t e = cudaFuncSetAttribute(fa_bwd_dq_kernel<DP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_q);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(fa_bwd_dkdv_kernel<DP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_k);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(fa_bwd_dq_kernel<DP>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(fa_bwd_dkdv_kernel<DP>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess) return tg_fail(err, "cudaFuncSetAttribute(attention backward): %s", cudaGetErrorString(e));
    dim3 grid((unsigned)((f.T + FA_ROWS - 1) / FA_ROWS), (unsigned)(f.B * f.H));
    fa_bwd_dq_kernel<DP><<<grid, FA_THREADS, smem_q, s>>>(f);
    fa_bwd_dkdv_kernel<DP><<<grid, FA_THREADS, smem_k, s>>>(f);
    return 0;
}

int tg_launch_attention(const tg_cuda_op_args *a, tg_err *err) {
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
    if (f.Dh <= 16) return fa_launch_fwd<16>(f, s, err);
    if (f.Dh <= 32) return fa_launch_fwd<32>(f, s, err);
    if (f.Dh <= 64) return fa_launch_fwd<64>(f, s, err);
    return fa_launch_fwd<128>(f, s, err);
}

int tg_launch_attention_bwd(const tg_cuda_op_args *a, tg_err *err) {
    fa_args f;
    if (fa_setup(a, 5, 3, &f, err)) return -1;
    if ((int64_t)f.B * f.H * f.T == 0) return 0;
    f.dout = a->in[0];
    f.o = a->in[1];
    f.lse = (float *)a->in[2];
    f.delta = (float *)a->out[3];
    const int64_t D = (int64_t)f.H * f.Dh;
    const int es = a->in_dtype[0] == TG_BF16 ? 2 : 4;
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
    if (f.Dh <= 16) return fa_launch_bwd<16>(f, s, err);
    if (f.Dh <= 32) return fa_launch_bwd<32>(f, s, err);
    if (f.Dh <= 64) return fa_launch_bwd<64>(f, s, err);
    return fa_launch_bwd<128>(f, s, err);
}
