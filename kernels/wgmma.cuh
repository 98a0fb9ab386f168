/* Hopper warpgroup matrix multiply (wgmma, sm_90a) for the tensor-core kernels: the
 * 128-byte-swizzled shared-memory tile layout the instruction reads, its matrix
 * descriptors, the fences, and two tile products of a 4-warp block (one warpgroup):
 *   wg_abt_issue: acc[64 x 64]  = A[64 x DP] B[64 x DP]^T   (both tiles from shared memory)
 *   wg_pb_issue:  acc[64 x DP] += P[64 x 64] B[64 x DP]     (P from registers, B from shared memory;
 *                 wg_pa_issue takes P already rounded into A fragments)
 * such as Q K^T and P V, each started asynchronously and waited for with wg_wait_all
 * (wg_pb is the second with its wait). The accumulators are laid out as mma.sync's m16n8
 * fragments: warp w of the group holds rows 16w .. 16w + 15, acc[j] columns 8j .. 8j + 7
 * (lane L: rows L / 4 and L / 4 + 8, columns 2 (L % 4) and +1), so code written for
 * per-warp mma.sync fragments reads them unchanged.
 *
 * Tile layout (DP = 64 or 128 columns of 16-bit elements, ROWS rows): column half hb
 * (64 columns, 128 bytes a row) is a block of ROWS rows; in each row the 16-byte chunk
 * j (8 columns) sits at chunk position j ^ (row % 8), the hardware's 128-byte swizzle, so
 * the 8 rows of an 8 x 8 core matrix fall in distinct banks. Every 8-row group is one
 * 1024-byte swizzle atom, and tiles must start on 1024 bytes. As wgmma operands:
 *   K-major (A, and B of wg_abt_issue: the 64 columns of one half are k): 8-row groups 1024
 *     bytes apart (the stride byte offset); a k step of 16 columns is +32 bytes inside the
 *     atom, where the hardware applies the swizzle to the address;
 *   MN-major (B of wg_pb_issue: rows are k, columns n): 8-row groups 1024 bytes apart (stride
 *     byte offset), column halves ROWS * 128 bytes apart (leading byte offset). */
#ifndef TUNEGRAPH_WGMMA_CUH
#define TUNEGRAPH_WGMMA_CUH

#include "kernels/cuda_common.cuh"

/* Element index of (row r, column col) in a swizzled [ROWS][DP] tile. */
template <int ROWS>
static __device__ __forceinline__ int wg_index(int r, int col) {
    return (col >> 6) * ROWS * 64 + r * 64 + ((((col >> 3) & 7) ^ (r & 7)) << 3) + (col & 7);
}

/* The shared-memory matrix descriptor: start address, leading and stride byte offsets
 * (16-byte units, 14 bits each) and the 128-byte swizzle mode (1 in bits 62-63). */
static __device__ __forceinline__ uint64_t wg_desc(const void *smem, uint32_t lbo, uint32_t sbo) {
    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(smem);
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)((lbo >> 4) & 0x3FFF) << 16 |
           (uint64_t)((sbo >> 4) & 0x3FFF) << 32 | 1ull << 62;
}

/* Registers written by ordinary instructions become visible to the next wgmma. */
static __device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
/* Waits until at most N of this warpgroup's committed groups are pending (the newest). */
template <int N>
static __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Shared memory written by ordinary stores or cp.async becomes visible to wgmma (the async
 * proxy); each writing thread fences before the barrier that publishes the tile. */
static __device__ __forceinline__ void wg_fence_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* Ties registers to the point after the wait: the compiler may neither read an
 * accumulator before the product landed nor reuse an A register while it is read. */
template <int N>
static __device__ __forceinline__ void wg_keep(float (&d)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++)
        asm volatile("" : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])::"memory");
}
template <int N>
static __device__ __forceinline__ void wg_keep_a(uint32_t (&a)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++) asm volatile("" : "+r"(a[j][0]), "+r"(a[j][1]), "+r"(a[j][2]), "+r"(a[j][3])::"memory");
}

/* m64nNk16, fp32 accumulators: A and B from shared memory (both K-major; scale_d 0
 * overwrites d), or A from registers and B MN-major from shared memory (d += A B). */
template <int N, class ST>
struct wg_ss;
template <int N, class ST>
struct wg_rs;

/* The accumulator operands of d[N][4], in the instruction's register order. */
#define TG_WG_ACC4(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define TG_WG_ACC32(d)                                                                        \
    TG_WG_ACC4(d, 0), TG_WG_ACC4(d, 1), TG_WG_ACC4(d, 2), TG_WG_ACC4(d, 3), TG_WG_ACC4(d, 4), \
        TG_WG_ACC4(d, 5), TG_WG_ACC4(d, 6), TG_WG_ACC4(d, 7)
#define TG_WG_ACC64(d)                                                                           \
    TG_WG_ACC32(d), TG_WG_ACC4(d, 8), TG_WG_ACC4(d, 9), TG_WG_ACC4(d, 10), TG_WG_ACC4(d, 11),    \
        TG_WG_ACC4(d, 12), TG_WG_ACC4(d, 13), TG_WG_ACC4(d, 14), TG_WG_ACC4(d, 15)
#define TG_WG_REGS32                                                                         \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                    \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define TG_WG_REGS64                                                                         \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                    \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "              \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "              \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

/* The three shapes for one 16-bit type (PTX its name in the instruction). */
#define TG_WG_DEFINE(ST, PTX)                                                                                   \
    template <>                                                                                                 \
    struct wg_ss<64, ST> {                                                                                      \
        static __device__ __forceinline__ void run(float (&d)[8][4], uint64_t da, uint64_t db, int scale_d) {   \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                            \
                         "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX "." PTX " " TG_WG_REGS32             \
                         ", %32, %33, p, 1, 1, 0, 0;\n}\n"                                                      \
                         : TG_WG_ACC32(d)                                                                       \
                         : "l"(da), "l"(db), "r"(scale_d));                                                     \
        }                                                                                                       \
    };                                                                                                          \
    template <>                                                                                                 \
    struct wg_rs<64, ST> {                                                                                      \
        static __device__ __forceinline__ void run(float (&d)[8][4], const uint32_t (&a)[4], uint64_t db) {     \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                            \
                         "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX "." PTX " " TG_WG_REGS32             \
                         ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                                         \
                         : TG_WG_ACC32(d)                                                                       \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));                         \
        }                                                                                                       \
    };                                                                                                          \
    template <>                                                                                                 \
    struct wg_rs<128, ST> {                                                                                     \
        static __device__ __forceinline__ void run(float (&d)[16][4], const uint32_t (&a)[4], uint64_t db) {    \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                            \
                         "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTX "." PTX " " TG_WG_REGS64            \
                         ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                         \
                         : TG_WG_ACC64(d)                                                                       \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));                         \
        }                                                                                                       \
    };
TG_WG_DEFINE(tg_bf16, "bf16")
TG_WG_DEFINE(tg_f16, "f16")
#undef TG_WG_DEFINE


/* Starts acc = A B^T for A, B swizzled [64][DP] tiles (64 x 64, fp32); acc may be read
 * only after wg_wait_all() and wg_keep(acc). */
template <int DP, class ST>
static __device__ __forceinline__ void wg_abt_issue(float (&acc)[8][4], const ST *sA, const ST *sB) {
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < DP / 16; kk++) {
        const int off = (kk >> 2) * 64 * 64 + (kk & 3) * 16; /* column half, then 16 columns (32 bytes) */
        wg_ss<64, ST>::run(acc, wg_desc(sA + off, 16, 1024), wg_desc(sB + off, 16, 1024), kk > 0);
    }
    wg_commit();
}

/* The accumulator of two adjacent n8 column blocks (16 x 16, fp32) as an A fragment of
 * 16-bit ST (the same layout as mma.sync's). */
template <class ST>
static __device__ __forceinline__ void wg_acc_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
    a[0] = tg_h16<ST>::pack(c0[0], c0[1]);
    a[1] = tg_h16<ST>::pack(c0[2], c0[3]);
    a[2] = tg_h16<ST>::pack(c1[0], c1[1]);
    a[3] = tg_h16<ST>::pack(c1[2], c1[3]);
}

/* Starts acc += P B: P 64 x 64 fp32 (rounded to ST into pa, the A fragments, which must
 * stay untouched until the wait), B a swizzled [64][DP] tile whose rows are the k index. */
template <int DP, class ST>
static __device__ __forceinline__ void wg_pa_issue(float (&acc)[DP / 8][4], const uint32_t (&pa)[4][4], const ST *sB) {
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) /* 16 rows of k: two 1024-byte atoms */
        wg_rs<DP, ST>::run(acc, pa[kk], wg_desc(sB + kk * 16 * 64, 64 * 128, 1024));
    wg_commit();
}

template <int DP, class ST>
static __device__ __forceinline__ void wg_pb_issue(float (&acc)[DP / 8][4], const float (&p)[8][4], const ST *sB,
                                                   uint32_t (&pa)[4][4]) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wg_acc_to_a<ST>(pa[kk], p[2 * kk], p[2 * kk + 1]);
    wg_pa_issue<DP, ST>(acc, pa, sB);
}

/* acc += P B, waited for. */
template <int DP, class ST>
static __device__ __forceinline__ void wg_pb(float (&acc)[DP / 8][4], const float (&p)[8][4], const ST *sB) {
    uint32_t pa[4][4];
    wg_pb_issue<DP, ST>(acc, p, sB, pa);
    wg_wait_all();
    wg_keep<DP / 8>(acc);
    wg_keep_a<4>(pa);
}

#endif
