/* Internal to the fused attention (ATTENTION / ATTENTION_BWD) kernels: what the forward
 * (flash_attention_fwd.cu), the two-kernel backward (flash_attention_bwd.cu) and the
 * short-sequence backward (flash_attention_bwd_short.cu) share: the launch arguments and
 * their setup from the op, the tensor-core primitives (mma, ldmatrix fragment loaders, tile
 * products), the shared-memory tile layout and its cp.async loads, masking, and the fp32
 * kernels' row helpers.
 *
 * Fused attention never stores the [B,H,T,T] scores.
 *
 * bf16 and fp16 plans: tensor-core kernels (bf16 or f16 in, fp32 accumulate; one template
 * on the 16-bit storage type ST) in the FlashAttention-2 arrangement. Each warp owns 16
 * rows and everything it accumulates, so no warp ever reduces with another and no float
 * atomics are used (results are bitwise reproducible). At head dims 64 and 128 (DP) the
 * tile products are Hopper's warpgroup MMA (wgmma, kernels/wgmma.cuh: 4 warps, 64 rows,
 * operands from swizzled shared tiles); the forward's blocks are two warpgroups (128
 * queries) when it draws no dropout, and then each warpgroup runs a tile's softmax while
 * the previous tile's P V is still on the tensor cores (fa_fwd_pipe_kernel); with dropout
 * a tile's Q K^T runs beside its dropout draws. At DP 16 and 32 the products are per-warp mma.sync
 * m16n8k16 and a block is 4 warps, 64 rows.
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
 * 128 take one kernel instead (fa_bwd_short_kernel, flash_attention_bwd_short.cu): a block
 * per (batch, head) holds the whole sequence and shares dS through shared memory, 5
 * products, no recomputation.
 *
 * Occupancy: the backward kernels are capped to 4 (dQ) and 3 (dK/dV) blocks of 4 warps
 * per SM at DP <= 64 (128 and 168 registers), which measured 7-11% faster than 2-3
 * blocks; two-warpgroup backward blocks (128 rows, 2 per SM at 128 registers, or 1)
 * measured 10-20% slower than these. The forward: without dropout 2 two-warpgroup blocks
 * at DP 64 (128 registers, 16 bytes of spill) and 1 at DP 128 (201 registers; 128 KB of
 * tiles); with dropout 3 one-warpgroup blocks.
 *
 * Head dim: any Dh <= 128; tiles are padded with zero columns to DP = 16, 32, 64 or
 * 128 (the mma k-step is 16), and only the Dh real columns are stored.
 *
 * Dropout: the mask is TG_OP_ATTN_SOFTMAX's (kernels/philox.h; element
 * ((b*H + h)*T + q)*T + k; dropout's 16-bit draws), drawn once, in the forward: when
 * T % 8 == 0 every Philox block (8 consecutive keys of one query) is one 16 x 8
 * fragment's row, so each lane draws a block for every other fragment and hands the keep
 * bits to the lanes holding those elements by shuffle (one Philox call per 8 elements);
 * otherwise each element draws its own; keep is the integer test of an element's 16 bits
 * >= tg_dropout_keep_threshold(p), the same decision as uniform >= p without the
 * conversions. The forward stores the kept-and-taking-part bits (1 bit per pair: 1/16 of a bf16
 * probability tensor) and both backward kernels read them, so the backward draws nothing.
 *
 * fp32 plans: plain fp32 kernels (a warp per row; dots in float, sums over keys in
 * double), the oracle-precision path for fp32 training and tests. */
#ifndef TUNEGRAPH_FLASH_ATTENTION_CUH
#define TUNEGRAPH_FLASH_ATTENTION_CUH

#include <math.h>
#include <string.h>

#include "kernels/cuda_common.cuh"
#include "kernels/cudnn_attention.h"
#include "kernels/philox.h"
#include "kernels/wgmma.cuh"

#define FA_ROWS 64    /* rows per warpgroup tile (queries, or keys for dK/dV) */
#define FA_COLS 64    /* columns per tile (keys, or queries for dK/dV) */
#define FA_THREADS 128 /* a warpgroup */
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
    uint32_t keep_thr; /* tg_dropout_keep_threshold(p) */
    int drop, drop_vec;
};

/* 2^x by the SFU (ex2.approx: 2 ulp, exp2(-inf) = 0), for the tensor-core kernels. */
static __device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* ---- tensor-core primitives ------------------------------------------------------ */

/* c += a b for 16-bit A (4 registers of 2 elements) and B (2 registers) fragments of
 * type ST, fp32 accumulators. */
template <class ST>
struct fa_mma;
template <>
struct fa_mma<tg_bf16> {
    static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <>
struct fa_mma<tg_f16> {
    static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <class ST>
static __device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    fa_mma<ST>::run(c, a, b0, b1);
}

/* ldmatrix moves 16-bit elements whatever their format. */
static __device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p) {
    const unsigned addr = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

static __device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void *p) {
    const unsigned addr = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* Shared tiles are [64][DP + 8] 16-bit elements: the 16-byte pad puts the 8 rows of every ldmatrix
 * phase in distinct banks. */
template <int DP>
struct fa_tile {
    static constexpr int LD = DP + 8;
    static constexpr int ELEMS = FA_ROWS * LD;
};

/* The two-kernel forward and backward (T > 128 for the backward) at DP 64 and 128 take
 * their tile products from wgmma (kernels/wgmma.cuh): each warpgroup (4 warps) owns 64
 * rows, and a block has WGS of them (the forward 2: every key tile it loads serves 128
 * queries, half the tile traffic of 64-row blocks; the backward 1, which measured faster
 * than 2 at the registers two-warpgroup blocks leave). Their tiles are swizzled for
 * wgmma, a 128-row tile being two 64-row ones back to back. At DP 16 and 32, and in the
 * short backward, blocks are 4 warps and 64 rows, tiles [rows][DP + 8] and the products
 * per-warp mma.sync. */
template <int DP, int WGS = 1>
struct fa_stile {
    static constexpr bool WG = DP >= 64;
    static constexpr int ELEMS = WG ? FA_ROWS * DP : fa_tile<DP>::ELEMS; /* a 64-row tile */
    static constexpr int BR = WG ? WGS * FA_ROWS : FA_ROWS;                /* rows a block owns */
    static constexpr int THREADS = WG ? WGS * FA_THREADS : FA_THREADS;
    static constexpr int BLOCK_ELEMS = (BR / FA_ROWS) * ELEMS;            /* a tile of the block's rows */
    static constexpr int ALIGN = WG ? 1024 : 0; /* extra dynamic shared bytes to align the tiles */
};

/* Index of (row r, column col) in a tile of the two-kernel arrangement: swizzled 64-row
 * tiles back to back (SWZ), or a padded [rows][DP + 8] tile. */
template <int DP, bool SWZ>
static __device__ __forceinline__ int fa_at(int r, int col) {
    if constexpr (SWZ) return (r >> 6) * FA_ROWS * DP + wg_index<FA_ROWS>(r & (FA_ROWS - 1), col);
    return r * fa_tile<DP>::LD + col;
}

/* The dynamic shared memory of a two-kernel-arrangement block, 1024-byte aligned when its
 * tiles are swizzled (the launcher asks for fa_stile::ALIGN more). */
template <int DP>
static __device__ __forceinline__ unsigned char *fa_smem_base() {
    extern __shared__ __align__(16) unsigned char fa_dyn_smem[];
    if constexpr (fa_stile<DP>::WG) {
        const uint32_t at = (uint32_t)__cvta_generic_to_shared(fa_dyn_smem);
        return fa_dyn_smem + ((1024u - (at & 1023u)) & 1023u);
    }
    return fa_dyn_smem;
}

/* A fragment (16 rows x 16 k) of a row-major tile, rows r0.., columns k0.. */
template <int DP, class ST>
static __device__ __forceinline__ void frag_a(uint32_t (&a)[4], const ST *t, int r0, int k0, int lane) {
    ldsm_x4(a, t + (r0 + (lane & 15)) * fa_tile<DP>::LD + k0 + (lane >> 4) * 8);
}

/* B fragments of two n8 tiles (n0.., n0+8..) x k16 from a tile stored [n][k]. */
template <int DP, class ST>
static __device__ __forceinline__ void frag_b_nk(uint32_t (&b)[4], const ST *t, int n0, int k0, int lane) {
    ldsm_x4(b, t + (n0 + (lane & 7) + ((lane >> 4) << 3)) * fa_tile<DP>::LD + k0 + ((lane >> 3) & 1) * 8);
}

/* B fragments of two n8 tiles x k16 from a tile stored [k][n] (transposing load). */
template <int DP, class ST>
static __device__ __forceinline__ void frag_b_kn(uint32_t (&b)[4], const ST *t, int k0, int n0, int lane) {
    ldsm_x4_t(b, t + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * fa_tile<DP>::LD + n0 + (lane >> 4) * 8);
}

/* acc = rows r0 .. r0+15 of tile A times tile B^T (both stored [row][DP]): a 16 x 64
 * product such as Q K^T, fp32. */
template <int DP, class ST>
static __device__ __forceinline__ void tile_abt(float (&acc)[FA_COLS / 8][4], const ST *sA, const ST *sB,
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
            mma16816<ST>(acc[2 * nj], af, bf[0], bf[1]);
            mma16816<ST>(acc[2 * nj + 1], af, bf[2], bf[3]);
        }
    }
}

/* acc += P B: P a 16 x 64 fp32 fragment (rounded to ST for the product), B a tile
 * stored [64][DP], such as P V. */
template <int DP, class ST>
static __device__ __forceinline__ void tile_pb(float (&acc)[DP / 8][4], const float (&p)[FA_COLS / 8][4],
                                               const ST *sB, int lane) {
#pragma unroll
    for (int kk = 0; kk < FA_COLS / 16; kk++) {
        uint32_t pa[4];
        wg_acc_to_a<ST>(pa, p[2 * kk], p[2 * kk + 1]);
#pragma unroll
        for (int dj = 0; dj < DP / 16; dj++) {
            uint32_t bf[4];
            frag_b_kn<DP>(bf, sB, kk * 16, dj * 16, lane);
            mma16816<ST>(acc[2 * dj], pa, bf[0], bf[1]);
            mma16816<ST>(acc[2 * dj + 1], pa, bf[2], bf[3]);
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
 * g pointing at row 0 column 0 of that head, by the block's THREADS threads, into a padded
 * or (SWZ) swizzled tile. With 16-byte
 * rows the copy is asynchronous (part of the caller's next cp.async group); otherwise
 * element by element. */
template <int DP, int ROWS = FA_ROWS, int THREADS = FA_THREADS, bool SWZ = false, class ST>
static __device__ __forceinline__ void load_tile(ST *s, const ST *g, int64_t ld, int row0, int T, int Dh,
                                                 int vec) {
    if (vec) {
        constexpr int CH = DP / 8; /* 16-byte chunks per row */
        for (int i = threadIdx.x; i < ROWS * CH; i += THREADS) {
            const int r = i / CH, c = (i % CH) * 8;
            const bool in = row0 + r < T && c < Dh;
            cp_async16(s + fa_at<DP, SWZ>(r, c), in ? g + (int64_t)(row0 + r) * ld + c : g, in ? 16 : 0);
        }
    } else {
        const ST zero = tg_h16<ST>::from(0.0f);
        for (int i = threadIdx.x; i < ROWS * DP; i += THREADS) {
            const int r = i / DP, c = i % DP;
            s[fa_at<DP, SWZ>(r, c)] = row0 + r < T && c < Dh ? g[(int64_t)(row0 + r) * ld + c] : zero;
        }
    }
}

/* delta = rowsum(dO * O) of tile row r (stored, rounded O), by a warp: lane L sums half
 * (L >> 4) of row r0 + (L & 15) and the halves meet by shuffle, so lanes L and L ^ 16 both
 * return that row's sum. */
template <int DP, bool SWZ = false, class ST>
static __device__ __forceinline__ float row_delta(const ST *sdO, const ST *sO, int r0, int lane) {
    const int r = r0 + (lane & 15), d0 = (lane >> 4) * (DP / 2);
    float acc = 0.0f;
    for (int d = d0; d < d0 + DP / 2; d++) acc += tg_ld(sdO, fa_at<DP, SWZ>(r, d)) * tg_ld(sO, fa_at<DP, SWZ>(r, d));
    return acc + __shfl_xor_sync(0xffffffffu, acc, 16);
}

/* The key mask of columns col0 .. col0+63: nonzero where the key is real (inside T and
 * mask != 0). Mask values stream in with the caller's cp.async group (4-byte copies,
 * zero past T) so no thread waits on a global load here; without a mask the tile is
 * written directly. */
static __device__ __forceinline__ void load_key_mask(float *s, const float *mask, int b, int T, int col0) {
    for (int i = threadIdx.x; i < FA_COLS; i += blockDim.x) {
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
    for (int i = threadIdx.x; i < FA_COLS; i += blockDim.x) {
        const int q = row0 + i;
        const float *p = q < T ? src + bh * T + q : src;
        const unsigned dst = (unsigned)__cvta_generic_to_shared(s + i);
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(p), "r"(q < T ? 4 : 0));
    }
}

/* Rows r0 + g and r0 + g + 8 of a 16-row accumulator (columns below Dh, rows below T)
 * to a 16-bit [rows, ld] head. */
template <int DP, class ST>
static __device__ __forceinline__ void store_rows(ST *base, int64_t ld, const float (&acc)[DP / 8][4], int r0,
                                                  int T, int Dh, int vec, int lane) {
    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = r0 + g + 8 * r;
        if (row >= T) continue;
        ST *drow = base + (int64_t)row * ld;
#pragma unroll
        for (int d = 0; d < DP / 8; d++) {
            const int col = 8 * d + 2 * c;
            if (col + 1 < Dh && vec)
                *reinterpret_cast<uint32_t *>(drow + col) = tg_h16<ST>::pack(acc[d][2 * r], acc[d][2 * r + 1]);
            else {
                if (col < Dh) tg_st(drow, col, acc[d][2 * r]);
                if (col + 1 < Dh) tg_st(drow, col + 1, acc[d][2 * r + 1]);
            }
        }
    }
}

/* K, V and the key mask of key tile k0 into double-buffer slot `buf` (sKV: [buf][K, V],
 * sM2: [buf][64]), as part of the caller's next cp.async group. */
template <int DP, class ST>
struct key_tiles {
    const ST *K, *V; /* head columns of row 0 */
    int64_t ldk, ldv;
    const float *mask;
    int b, T, Dh, vec;
};

template <int DP, int THREADS, class ST>
static __device__ __forceinline__ void load_key_tile(ST *sKV, float *sM2, int buf, const key_tiles<DP, ST> &kv,
                                                     int k0) {
    constexpr int E = fa_stile<DP>::ELEMS;
    constexpr bool SWZ = fa_stile<DP>::WG;
    ST *dst = sKV + 2 * E * buf;
    load_tile<DP, FA_COLS, THREADS, SWZ>(dst, kv.K, kv.ldk, k0, kv.T, kv.Dh, kv.vec);
    load_tile<DP, FA_COLS, THREADS, SWZ>(dst + E, kv.V, kv.ldv, k0, kv.T, kv.Dh, kv.vec);
    load_key_mask(sM2 + FA_COLS * buf, kv.mask, kv.b, kv.T, k0);
}

/* Makes the block's landed tile copies visible to the whole block (and, for swizzled
 * tiles, to wgmma). */
template <int DP>
static __device__ __forceinline__ void fa_publish_tiles() {
    if constexpr (fa_stile<DP>::WG) wg_fence_smem();
    __syncthreads();
}

/* The P B tile product of the two-kernel arrangement: per warp with mma.sync, or a
 * warpgroup's 64 rows together with wgmma. */
template <int DP, class ST>
static __device__ __forceinline__ void fa_pb(float (&acc)[DP / 8][4], const float (&p)[FA_COLS / 8][4], const ST *sB,
                                             int lane) {
    if constexpr (fa_stile<DP>::WG)
        wg_pb<DP, ST>(acc, p, sB);
    else
        tile_pb<DP>(acc, p, sB, lane);
}

/* Two products sharing one wait (the backward's S and dP, or dV and dK): with wgmma the
 * second is issued before the first has finished. */
template <int DP, class ST>
static __device__ __forceinline__ void fa_abt2(float (&acc1)[FA_COLS / 8][4], const ST *sA1, const ST *sB1,
                                               float (&acc2)[FA_COLS / 8][4], const ST *sA2, const ST *sB2, int r0,
                                               int lane) {
    if constexpr (fa_stile<DP>::WG) {
        const int off = (r0 / FA_ROWS) * FA_ROWS * DP;
        wg_abt_issue<DP, ST>(acc1, sA1 + off, sB1);
        wg_abt_issue<DP, ST>(acc2, sA2 + off, sB2);
        wg_wait_all();
        wg_keep<FA_COLS / 8>(acc1);
        wg_keep<FA_COLS / 8>(acc2);
    } else {
        tile_abt<DP>(acc1, sA1, sB1, r0, lane);
        tile_abt<DP>(acc2, sA2, sB2, r0, lane);
    }
}
template <int DP, class ST>
static __device__ __forceinline__ void fa_pb2(float (&acc1)[DP / 8][4], const float (&p1)[FA_COLS / 8][4],
                                              const ST *sB1, float (&acc2)[DP / 8][4],
                                              const float (&p2)[FA_COLS / 8][4], const ST *sB2, int lane) {
    if constexpr (fa_stile<DP>::WG) {
        uint32_t pa1[4][4], pa2[4][4];
        wg_pb_issue<DP, ST>(acc1, p1, sB1, pa1);
        wg_pb_issue<DP, ST>(acc2, p2, sB2, pa2);
        wg_wait_all();
        wg_keep<DP / 8>(acc1);
        wg_keep<DP / 8>(acc2);
        wg_keep_a<4>(pa1);
        wg_keep_a<4>(pa2);
    } else {
        tile_pb<DP>(acc1, p1, sB1, lane);
        tile_pb<DP>(acc2, p2, sB2, lane);
    }
}

/* Before key tile kt is used: start the next one streaming into its slot (of NBUF), wait
 * until tile kt has landed, and make it visible to the whole block. */
template <int DP, int THREADS, int NBUF, class ST>
static __device__ __forceinline__ void advance_key_tile(ST *sKV, float *sM2, int kt, int ktiles,
                                                        const key_tiles<DP, ST> &kv) {
    if (kt + 1 < ktiles) {
        load_key_tile<DP, THREADS>(sKV, sM2, (kt + 1) % NBUF, kv, (kt + 1) * FA_COLS);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    fa_publish_tiles<DP>();
}

/* ---- score masking (forward and dQ) ------------------------------------------------- */

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

/* ---- fp32 kernels' helpers (a warp per row) ------------------------------------------ */

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

/* ---- launch setup ------------------------------------------------------------------- */

/* Fills the shape, the Q/K/V parts (packed or not, slots q_slot..q_slot+2: 0 in the
 * forward, 5 in the backward) and dropout. */
static inline int fa_setup(const tg_cuda_op_args *a, int q_slot, int mask_slot, fa_args *f, tg_err *err) {
    const tg_attention_params *at = &a->op->p.attention; /* ATTENTION and ATTENTION_BWD share the set */
    memset(f, 0, sizeof *f);
    f->B = (int)at->b, f->H = (int)at->h, f->T = (int)at->t, f->causal = at->causal != 0;
    f->Dh = (int)at->head_dim;
    f->scale = at->scale;
    if (f->Dh < 1 || f->Dh > 128) return tg_fail(err, "head dim %d: the fused attention kernels take 1..128", f->Dh);
    const int64_t D = (int64_t)f->H * f->Dh;
    const int es = tg_storage_bytes(a->in_dtype[q_slot]);
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
    f->keep_thr = tg_dropout_keep_threshold(f->p);
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
    f->drop_vec = f->T % 8 == 0; /* a fragment's 8 keys of a query: one Philox block */
    /* 16-byte row chunks: every row start and head column aligned to 8 16-bit elements. */
    f->vec = es == 2 && f->Dh % 8 == 0 && D % 8 == 0 && tg_aligned16(f->q) && tg_aligned16(f->k) && tg_aligned16(f->v);
    return 0;
}

/* The one-kernel backward for T <= 128 (flash_attention_bwd_short.cu), 16-bit storage
 * `dtype` (TG_BF16 or TG_F16). */
int tg_fa_launch_bwd_short(const fa_args &f, int dtype, cudaStream_t s, tg_err *err);

#endif
