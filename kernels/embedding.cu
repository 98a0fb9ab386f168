/* EMBEDDING (gather) and EMBEDDING_BWD (deterministic scatter-add).
 *
 * The forward is a float4 gather from the fp32 table into out0 (float, or bf16 / half
 * rounded on store in bf16 / fp16 plans); out-of-range ids give a zero row, as on the CPU. The backward
 * reads dout as float, bf16 or half (widened exactly) and sums in float into fp32 dtable.
 *
 * The backward must not depend on thread timing, so it never adds floats atomically.
 * Instead it groups the token indices by id with a stable counting sort, then sums each
 * id's dout rows in token order:
 *   1. histogram of ids (integer atomics: counts do not depend on order),
 *   2. one block scans the counts into per-id start offsets (and numbers the chunks of
 *      long ids, see 4),
 *   3. one block walks the tokens in tiles of 4096 in index order; each tile is sorted
 *      by the unique key (id, position) with cub::BlockRadixSort, so equal ids keep index
 *      order, and placed after the id's tokens from earlier tiles (a per-id cursor),
 *   4. one warp per (start of a chunk of <= 256 consecutive tokens of one id, 128
 *      columns) adds the rows in token order. An id with at most 256 tokens is summed
 *      straight into dtable starting from its old value: exactly the CPU's sequence of
 *      float additions, so bitwise equal to it. A longer id (a padding token that is not
 *      the padding index) would serialise one warp over thousands of rows, so its chunks
 *      are summed in parallel into scratch (the first one starting from dtable's value),
 *      and the warp that finishes the id's last chunk adds them in chunk order:
 *      deterministic, within float rounding of the CPU's order.
 * When every token fits one tile (N <= 4096: BERT at B x T = 4096), steps 1-3 are one
 * block's sort of that tile: the sorted runs of equal ids are the segments, so nothing
 * the size of the table is counted, scanned or cleared.
 * Ids equal to the padding index (padding_idx) or outside [0, V) contribute nothing.
 *
 * Tables of at most SMALL_V rows (token types) skip the sort: every id there is long,
 * and sorting thousands of tokens in one block to find that out cost more than the sums.
 * Each id's row is the column sum of the dy rows with that id (kernels/column_sums.cuh,
 * one pass per id, the other rows read as zeros), in double, added onto dtable's value:
 * deterministic, within float rounding of the CPU's order (like the long ids above). */
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/column_sums.cuh"

#define EMB_THREADS 256
#define SCAN_THREADS 1024
#define SCAN_ITEMS 8
#define SORT_THREADS 512
#define SORT_ITEMS 8
#define TILE (SORT_THREADS * SORT_ITEMS) /* 4096 tokens */
#define TILE_BITS 12
#define CHUNK 256                        /* tokens summed sequentially by one warp */
#define INVALID_KEY 0xFFFFFFFFu
#define SMALL_V 4                        /* tables of at most this many rows: column sums */

static_assert(TILE == 1 << TILE_BITS, "tile size");

/* Scratch layout (int32 / float units from ctx->reduce_scratch). */
struct emb_layout {
    int64_t start, cursor, arrive, chunk_base, sorted, partial, zeroed, total;
};

static emb_layout layout_of(int64_t N, int64_t V, int64_t D) {
    emb_layout l;
    const int64_t max_chunks = 2 * ((N + CHUNK - 1) / CHUNK) + 2; /* sum of ceil(S/CHUNK) over S > CHUNK */
    l.start = 0;                 /* V + 1: counts, then exclusive offsets; [V] = tokens kept */
    l.cursor = V + 1;            /* V: tokens of each id placed by earlier tiles */
    l.arrive = 2 * V + 1;        /* per (long id, column slice): its chunks summed so far */
    l.zeroed = l.arrive + max_chunks * ((D + 31) / 32); /* counts, cursors and arrivals start at 0 */
    l.chunk_base = l.zeroed;     /* V + 1: first partial row of each long id */
    l.sorted = l.chunk_base + V + 1; /* N: token indices grouped by id, index order */
    l.partial = (l.sorted + N + 3) / 4 * 4;  /* 16-byte aligned floats */
    l.total = l.partial + max_chunks * D;
    return l;
}

/* One tile (N <= TILE): arrival counters first (the part cleared), then sorted[N],
 * run_start[N], run_end[N], chunk_at[N], n_valid, the partials. */
struct emb_tile_layout {
    int64_t arrive, zeroed, sorted, run_start, run_end, chunk_at, n_valid, partial, total;
};

static emb_tile_layout tile_layout_of(int64_t N, int64_t D) {
    emb_tile_layout l;
    const int64_t max_chunks = 2 * ((N + CHUNK - 1) / CHUNK) + 2;
    l.arrive = 0;
    l.zeroed = max_chunks * ((D + 31) / 32);
    l.sorted = l.zeroed;
    l.run_start = l.sorted + N;
    l.run_end = l.run_start + N;
    l.chunk_at = l.run_end + N;
    l.n_valid = l.chunk_at + N;
    l.partial = (l.n_valid + 1 + 3) / 4 * 4; /* 16-byte aligned floats */
    l.total = l.partial + max_chunks * D;
    return l;
}

int64_t tg_scratch_embedding_bwd(const tg_op *op) {
    const tg_embedding_params *e = &op->p.embedding;
    const int64_t N = e->n, V = e->vocab, D = e->dim;
    if (N <= 0 || V <= 0 || D <= 0) return 0;
    if (V <= SMALL_V) return tg_col_sum_scratch(N, D);
    return N <= TILE ? tile_layout_of(N, D).total : layout_of(N, V, D).total;
}

static __device__ __forceinline__ int valid_id(int id, int V, int pad) { return id >= 0 && id < V && id != pad; }

/* ---- W-float vectors (W = 4: float4, 1: scalar) ------------------------------ */

template <int W>
struct vec_t;
template <>
struct vec_t<4> {
    typedef float4 T;
    static __device__ __forceinline__ T zero() { return make_float4(0.f, 0.f, 0.f, 0.f); }
    static __device__ __forceinline__ void acc(T &a, const T &b) {
        a.x = fadd(a.x, b.x);
        a.y = fadd(a.y, b.y);
        a.z = fadd(a.z, b.z);
        a.w = fadd(a.w, b.w);
    }
};
template <>
struct vec_t<1> {
    typedef float T;
    static __device__ __forceinline__ T zero() { return 0.0f; }
    static __device__ __forceinline__ void acc(T &a, const T &b) { a = fadd(a, b); }
};

/* ---- forward ----------------------------------------------------------------------- */

/* W = 4: 4-float columns (table float4, out float4 or 8 bytes of bf16), 1: scalars.
 * The table is fp32; the row is narrowed to TO (bf16 plans) on store. */
template <int W, class TO>
__global__ void __launch_bounds__(EMB_THREADS)
emb_fwd_kernel(const int *__restrict__ ids, const float *__restrict__ table, TO *__restrict__ y, int64_t N, int V,
               int64_t DW) {
    const int64_t total = N * DW, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        int64_t n = e / DW, c = e - n * DW;
        int id = ids[n];
        float v[W];
        if (id >= 0 && id < V)
            tg_vec<float, W>::load(table, (int64_t)id * DW + c, v);
        else
#pragma unroll
            for (int j = 0; j < W; j++) v[j] = 0.0f;
        tg_vec<TO, W>::store(y, e, v);
    }
}

template <class TO>
static void launch_emb_fwd(const tg_cuda_op_args *a, int64_t N, int64_t V, int64_t D) {
    const int *ids = (const int *)a->in[0];
    const float *table = (const float *)a->in[1];
    TO *y = (TO *)a->out[0];
    if (D % 4 == 0 && tg_aligned16(table) && tg_aligned(y, 4 * sizeof(TO)))
        emb_fwd_kernel<4, TO><<<tg_blocks(N * D / 4, EMB_THREADS), EMB_THREADS, 0, a->ctx->stream>>>(ids, table, y, N,
                                                                                                     (int)V, D / 4);
    else
        emb_fwd_kernel<1, TO><<<tg_blocks(N * D, EMB_THREADS), EMB_THREADS, 0, a->ctx->stream>>>(ids, table, y, N,
                                                                                                 (int)V, D);
}

int tg_launch_embedding(const tg_cuda_op_args *a, tg_err *err) {
    const tg_embedding_params *ep = &a->op->p.embedding;
    const int64_t N = ep->n, V = ep->vocab, D = ep->dim;
    if (N <= 0 || D <= 0) return 0;
    if (a->out_dtype[0] == TG_BF16)
        launch_emb_fwd<tg_bf16>(a, N, V, D);
    else if (a->out_dtype[0] == TG_F16)
        launch_emb_fwd<tg_f16>(a, N, V, D);
    else
        launch_emb_fwd<float>(a, N, V, D);
    return 0;
}

/* ---- backward: 1. histogram ------------------------------------------------------- */

__global__ void __launch_bounds__(EMB_THREADS)
emb_hist_kernel(const int *__restrict__ ids, int *__restrict__ counts, int64_t N, int V, int pad) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; n < N; n += stride) {
        int id = ids[n];
        if (valid_id(id, V, pad)) atomicAdd(&counts[id], 1);
    }
}

/* ---- 2. scan ---------------------------------------------------------------------- */

__global__ void __launch_bounds__(SCAN_THREADS) emb_scan_kernel(int *__restrict__ start, int *__restrict__ chunk_base, int V) {
    typedef cub::BlockScan<int, SCAN_THREADS> scan_t;
    __shared__ typename scan_t::TempStorage ts;
    int carry_a = 0, carry_b = 0;
    for (int base = 0; base < V; base += SCAN_THREADS * SCAN_ITEMS) {
        int c[SCAN_ITEMS], k[SCAN_ITEMS];
#pragma unroll
        for (int j = 0; j < SCAN_ITEMS; j++) {
            int idx = base + threadIdx.x * SCAN_ITEMS + j;
            c[j] = idx < V ? start[idx] : 0;
            k[j] = c[j] > CHUNK ? (c[j] + CHUNK - 1) / CHUNK : 0;
        }
        int agg_a, agg_b;
        scan_t(ts).ExclusiveSum(c, c, agg_a);
        __syncthreads();
        scan_t(ts).ExclusiveSum(k, k, agg_b);
        __syncthreads();
#pragma unroll
        for (int j = 0; j < SCAN_ITEMS; j++) {
            int idx = base + threadIdx.x * SCAN_ITEMS + j;
            if (idx < V) {
                start[idx] = c[j] + carry_a;
                chunk_base[idx] = k[j] + carry_b;
            }
        }
        carry_a += agg_a;
        carry_b += agg_b;
    }
    if (threadIdx.x == 0) {
        start[V] = carry_a;
        chunk_base[V] = carry_b;
    }
}

/* ---- 3. stable placement ---------------------------------------------------------- */

struct imax_op {
    __device__ __forceinline__ int operator()(int a, int b) const { return a > b ? a : b; }
};

typedef cub::BlockRadixSort<unsigned, SORT_THREADS, SORT_ITEMS> emb_sort_t;
typedef cub::BlockScan<int, SORT_THREADS> emb_scan_t;
union emb_sort_storage {
    typename emb_sort_t::TempStorage sort;
    typename emb_scan_t::TempStorage scan;
};

/* The tokens [tile, tile + TILE) sorted by id, position order within an id (invalid ids
 * last): thread t holds sorted items [8t, 8t + 8) as keys (id << TILE_BITS | position in
 * the tile), and head[j] = the sorted index where item j's run of equal ids starts. */
static __device__ __forceinline__ void emb_sort_tile(const int *__restrict__ ids, int64_t tile, int64_t N, int V,
                                                     int pad, int end_bit, emb_sort_storage &ts, unsigned *s_first,
                                                     unsigned *s_last, unsigned (&key)[SORT_ITEMS],
                                                     int (&head)[SORT_ITEMS]) {
    const int t = threadIdx.x;
#pragma unroll
    for (int j = 0; j < SORT_ITEMS; j++) {
        int q = t * SORT_ITEMS + j;
        int64_t n = tile + q;
        key[j] = INVALID_KEY;
        if (n < N) {
            int id = ids[n];
            if (valid_id(id, V, pad)) key[j] = ((unsigned)id << TILE_BITS) | (unsigned)q;
        }
    }
    /* Only the id bits: the sort is stable and the keys enter in position order, so equal
     * ids keep it (the low TILE_BITS only make keys unique). */
    emb_sort_t(ts.sort).Sort(key, TILE_BITS, end_bit);
    s_first[t] = key[0];
    s_last[t] = key[SORT_ITEMS - 1];
    __syncthreads();
#pragma unroll
    for (int j = 0; j < SORT_ITEMS; j++) {
        int q = t * SORT_ITEMS + j;
        unsigned prev = j ? key[j - 1] : (t ? s_last[t - 1] : INVALID_KEY);
        int is_head = key[j] != INVALID_KEY && (q == 0 || (prev >> TILE_BITS) != (key[j] >> TILE_BITS));
        head[j] = is_head ? q : 0;
    }
    emb_scan_t(ts.scan).InclusiveScan(head, head, imax_op()); /* run start of every item */
}

/* The key after sorted item j of thread t (INVALID_KEY past the end). */
static __device__ __forceinline__ unsigned emb_next_key(const unsigned (&key)[SORT_ITEMS], int j,
                                                        const unsigned *s_first) {
    const int t = threadIdx.x;
    return j < SORT_ITEMS - 1 ? key[j + 1] : (t < SORT_THREADS - 1 ? s_first[t + 1] : INVALID_KEY);
}

/* Whether a valid key ends its run: the next key has another id. */
static __device__ __forceinline__ bool emb_run_tail(unsigned key, unsigned next) {
    return next == INVALID_KEY || (next >> TILE_BITS) != (key >> TILE_BITS);
}

__global__ void __launch_bounds__(SORT_THREADS)
emb_place_kernel(const int *__restrict__ ids, const int *__restrict__ start, int *__restrict__ cursor,
                 int *__restrict__ sorted, int64_t N, int V, int pad, int end_bit) {
    __shared__ emb_sort_storage ts;
    __shared__ unsigned s_first[SORT_THREADS], s_last[SORT_THREADS];
    const int t = threadIdx.x;
    for (int64_t tile = 0; tile < N; tile += TILE) {
        unsigned key[SORT_ITEMS];
        int head[SORT_ITEMS];
        emb_sort_tile(ids, tile, N, V, pad, end_bit, ts, s_first, s_last, key, head);
        int base[SORT_ITEMS];
#pragma unroll
        for (int j = 0; j < SORT_ITEMS; j++) {
            base[j] = 0;
            if (key[j] == INVALID_KEY) continue;
            int q = t * SORT_ITEMS + j, id = (int)(key[j] >> TILE_BITS);
            base[j] = cursor[id];
            sorted[start[id] + base[j] + (q - head[j])] = (int)(tile + (key[j] & (TILE - 1)));
        }
        __syncthreads(); /* every cursor read before any is advanced */
#pragma unroll
        for (int j = 0; j < SORT_ITEMS; j++) {
            if (key[j] == INVALID_KEY) continue;
            int q = t * SORT_ITEMS + j;
            if (emb_run_tail(key[j], emb_next_key(key, j, s_first)))
                cursor[key[j] >> TILE_BITS] = base[j] + (q - head[j]) + 1;
        }
        __syncthreads();
    }
}

/* ---- one tile: the sorted runs are the segments ------------------------------------ */

/* When every token fits one tile (N <= TILE), the sorted tile is the whole grouping: for
 * sorted position p, sorted[p] is the token, run_start[p] where its id's run starts, and
 * at each run start h, run_end[h] where it ends and chunk_at[h] (runs longer than CHUNK)
 * its first partial row; *n_valid counts the tokens with a valid id. No per-id histogram,
 * scan or cursor: nothing the size of the table. */
__global__ void __launch_bounds__(SORT_THREADS)
emb_tile_kernel(const int *__restrict__ ids, int64_t N, int V, int pad, int end_bit, int *__restrict__ sorted,
                int *__restrict__ run_start, int *__restrict__ run_end, int *__restrict__ chunk_at,
                int *__restrict__ n_valid) {
    __shared__ emb_sort_storage ts;
    __shared__ unsigned s_first[SORT_THREADS], s_last[SORT_THREADS];
    __shared__ int s_valid;
    const int t = threadIdx.x;
    if (t == 0) s_valid = 0;
    unsigned key[SORT_ITEMS];
    int head[SORT_ITEMS];
    emb_sort_tile(ids, 0, N, V, pad, end_bit, ts, s_first, s_last, key, head);
#pragma unroll
    for (int j = 0; j < SORT_ITEMS; j++) {
        if (key[j] == INVALID_KEY) continue;
        const int q = t * SORT_ITEMS + j;
        const unsigned next = emb_next_key(key, j, s_first);
        sorted[q] = (int)(key[j] & (TILE - 1));
        run_start[q] = head[j];
        if (emb_run_tail(key[j], next)) run_end[head[j]] = q + 1;
        if (next == INVALID_KEY) s_valid = q + 1; /* the last valid token */
    }
    __syncthreads(); /* run_end written, the scan storage free */
    int k[SORT_ITEMS];
#pragma unroll
    for (int j = 0; j < SORT_ITEMS; j++) {
        const int q = t * SORT_ITEMS + j;
        const int len = key[j] != INVALID_KEY && head[j] == q ? run_end[q] - q : 0;
        k[j] = len > CHUNK ? (len + CHUNK - 1) / CHUNK : 0;
    }
    int first[SORT_ITEMS];
    emb_scan_t(ts.scan).ExclusiveSum(k, first);
#pragma unroll
    for (int j = 0; j < SORT_ITEMS; j++)
        if (k[j]) chunk_at[t * SORT_ITEMS + j] = first[j];
    if (t == 0) *n_valid = s_valid;
}

/* ---- 4. chunk sums in token order ------------------------------------------------- */

/* One warp per unit (sorted position p, column slice s): units whose p does not start a
 * chunk return at once. Lane covers column c = s*32 + lane (in W-float units). dout is
 * TD (float or bf16, widened on load); sums are float, dtable and partials fp32.
 * A long id's chunks go to partials; the warp that finishes its id's last chunk (counted
 * in arrive[]) then adds them in chunk order into dtable, the first one having started
 * from dtable's value: the same order whichever warp comes last. */
/* Where a sorted position's segment starts and ends: by id (start[], chunk_base[]) after
 * the several-tile placement, or by run (run_start[], run_end[], chunk_at[], *n_valid)
 * after the one-tile sort. */
struct emb_segments {
    const int *start, *chunk_base;
    const int *run_start, *run_end, *chunk_at, *n_valid;
};

template <int W, class TD, bool RUNS>
__global__ void __launch_bounds__(EMB_THREADS)
emb_chunk_kernel(const int *__restrict__ ids, const TD *__restrict__ dy, float *__restrict__ dtable,
                 emb_segments sg, const int *__restrict__ sorted, float *__restrict__ partial,
                 int *__restrict__ arrive, int V, int64_t DW, int nslices) {
    typedef vec_t<W> ops;
    const int lane = threadIdx.x & 31;
    const int64_t units = (int64_t)(RUNS ? *sg.n_valid : sg.start[V]) * nslices;
    const int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t u = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; u < units; u += nwarps) {
        const int p = (int)(u / nslices), s = (int)(u - (int64_t)p * nslices);
        const int id = ids[sorted[p]];
        const int seg = RUNS ? sg.run_start[p] : sg.start[id];
        const int cnt = (RUNS ? sg.run_end[seg] : sg.start[id + 1]) - seg, off = p - seg;
        if (off % CHUNK) continue; /* warp-uniform */
        const int64_t c = (int64_t)s * 32 + lane;
        const bool active = c < DW;
        const int e = min(p + CHUNK, seg + cnt);
        float acc[W];
        if (off == 0 && active)
            tg_vec<float, W>::load(dtable, (int64_t)id * DW + c, acc);
        else
#pragma unroll
            for (int w = 0; w < W; w++) acc[w] = 0.0f;
        int q = p;
        if (active) {
            for (; q + 8 <= e; q += 8) {
                float v[8][W];
#pragma unroll
                for (int j = 0; j < 8; j++) tg_vec<TD, W>::load(dy, (int64_t)sorted[q + j] * DW + c, v[j]);
#pragma unroll
                for (int j = 0; j < 8; j++)
#pragma unroll
                    for (int w = 0; w < W; w++) acc[w] = fadd(acc[w], v[j][w]);
            }
            for (; q < e; q++) {
                float v[W];
                tg_vec<TD, W>::load(dy, (int64_t)sorted[q] * DW + c, v);
#pragma unroll
                for (int w = 0; w < W; w++) acc[w] = fadd(acc[w], v[w]);
            }
        }
        if (cnt <= CHUNK) {
            if (active) tg_vec<float, W>::store(dtable, (int64_t)id * DW + c, acc);
            continue;
        }
        const int cb = RUNS ? sg.chunk_at[seg] : sg.chunk_base[id], nch = (cnt + CHUNK - 1) / CHUNK;
        if (active) tg_vec<float, W>::store(partial, (int64_t)(cb + off / CHUNK) * DW + c, acc);
        __threadfence(); /* this chunk's partial is visible before it is counted */
        __syncwarp();    /* every lane's part of it, before lane 0 counts the chunk */
        int last = 0;
        if (lane == 0) last = atomicAdd(&arrive[(int64_t)cb * nslices + s], 1) == nch - 1;
        if (!__shfl_sync(0xffffffffu, last, 0)) continue;
        __threadfence();
        if (!active) continue;
        typedef typename ops::T T;
        const T *part = reinterpret_cast<const T *>(partial);
        T sum = __ldcg(part + (int64_t)cb * DW + c);
        for (int k = 1; k < nch; k++) ops::acc(sum, __ldcg(part + (int64_t)(cb + k) * DW + c));
        reinterpret_cast<T *>(dtable)[(int64_t)id * DW + c] = sum;
    }
}

/* ---- small tables: per-id column sums ------------------------------------------------ */

/* Row r of dy where ids[r] is `id`, else zeros: the column sums of these rows are that
 * id's gradient row (kernels/column_sums.cuh, one pass per id). */
template <class T, int W>
struct emb_id_rows {
    const T *dy;
    const int *ids;
    int64_t D;
    int id;
    __device__ __forceinline__ void operator()(int64_t r, int64_t k, float (&v)[W]) const {
        if (ids[r] == id) {
            tg_vec<T, W>::load(dy + r * D, k, v);
        } else {
#pragma unroll
            for (int j = 0; j < W; j++) v[j] = 0.0f;
        }
    }
};

template <class T>
static int emb_small(const tg_cuda_op_args *a, int64_t N, int64_t V, int64_t D, tg_err *err) {
    const T *dy = (const T *)a->in[1];
    const int *ids = (const int *)a->in[0];
    const int pad = (int)a->op->p.embedding.padding_idx;
    double *partial = (double *)a->ctx->reduce_scratch;
    constexpr int W = sizeof(T) == 2 ? 8 : 4;
    const int vec = D % W == 0 && tg_aligned16(dy);
    for (int id = 0; id < (int)V; id++) {
        if (id == pad) continue;
        float *row = (float *)a->out[0] + (int64_t)id * D;
        int rc = vec ? col_sums<W>(emb_id_rows<T, W>{dy, ids, D, id}, N, D, partial, row, 0, a->ctx->stream, err)
                     : col_sums<1>(emb_id_rows<T, 1>{dy, ids, D, id}, N, D, partial, row, 0, a->ctx->stream, err);
        if (rc) return rc;
    }
    return 0;
}

int tg_launch_embedding_bwd(const tg_cuda_op_args *a, tg_err *err) {
    const tg_embedding_params *ep = &a->op->p.embedding;
    const int64_t N = ep->n, V = ep->vocab, D = ep->dim;
    if (N <= 0 || V <= 0 || D <= 0) return 0;
    if (V >= (1 << (32 - TILE_BITS)) - 1) return tg_fail(err, "vocabulary of %lld rows exceeds the sort key (2^20)", (long long)V);
    if (N >= INT32_MAX / 2) return tg_fail(err, "%lld tokens exceed int32 indexing", (long long)N);
    if (V <= SMALL_V) {
        if (tg_scratch_check(a, tg_scratch_embedding_bwd(a->op), err)) return -1;
        if (a->in_dtype[1] == TG_BF16) return emb_small<tg_bf16>(a, N, V, D, err);
        if (a->in_dtype[1] == TG_F16) return emb_small<tg_f16>(a, N, V, D, err);
        return emb_small<float>(a, N, V, D, err);
    }
    const int *ids = (const int *)a->in[0];
    const void *dy = a->in[1];
    float *dt = (float *)a->out[0];
    const int pad = (int)a->op->p.embedding.padding_idx;
    const int dy_dt = a->in_dtype[1];
    cudaStream_t st = a->ctx->stream;
    int id_bits = 1;
    while (((int64_t)1 << id_bits) <= V) id_bits++; /* 2^id_bits > V: invalid keys sort last */
    int *S = (int *)a->ctx->reduce_scratch;
    emb_segments sg = {};
    int *sorted, *arrive;
    float *partial;
    cudaError_t e;
    const int runs = N <= TILE;
    if (runs) {
        const emb_tile_layout l = tile_layout_of(N, D);
        if (tg_scratch_check(a, l.total, err)) return -1;
        sorted = S + l.sorted, arrive = S + l.arrive, partial = a->ctx->reduce_scratch + l.partial;
        sg.run_start = S + l.run_start, sg.run_end = S + l.run_end, sg.chunk_at = S + l.chunk_at;
        sg.n_valid = S + l.n_valid;
        if ((e = cudaMemsetAsync(S, 0, (size_t)l.zeroed * sizeof(int), st)) != cudaSuccess) /* arrivals */
            return tg_fail(err, "cudaMemsetAsync: %s", cudaGetErrorString(e));
        emb_tile_kernel<<<1, SORT_THREADS, 0, st>>>(ids, N, (int)V, pad, TILE_BITS + id_bits, sorted, S + l.run_start,
                                                    S + l.run_end, S + l.chunk_at, S + l.n_valid);
    } else {
        const emb_layout l = layout_of(N, V, D);
        if (tg_scratch_check(a, l.total, err)) return -1;
        int *start = S + l.start, *cursor = S + l.cursor, *chunk_base = S + l.chunk_base;
        sorted = S + l.sorted, arrive = S + l.arrive, partial = a->ctx->reduce_scratch + l.partial;
        sg.start = start, sg.chunk_base = chunk_base;
        /* counts, cursors, arrivals */
        if ((e = cudaMemsetAsync(S, 0, (size_t)l.zeroed * sizeof(int), st)) != cudaSuccess)
            return tg_fail(err, "cudaMemsetAsync: %s", cudaGetErrorString(e));
        emb_hist_kernel<<<tg_blocks(N, EMB_THREADS), EMB_THREADS, 0, st>>>(ids, start, N, (int)V, pad);
        emb_scan_kernel<<<1, SCAN_THREADS, 0, st>>>(start, chunk_base, (int)V);
        emb_place_kernel<<<1, SORT_THREADS, 0, st>>>(ids, start, cursor, sorted, N, (int)V, pad, TILE_BITS + id_bits);
    }

    const int vec = D % 4 == 0 && tg_aligned(dy, 4 * (unsigned)tg_storage_bytes(dy_dt)) && tg_aligned16(dt);
    const int64_t DW = vec ? D / 4 : D;
    const int nslices = (int)((DW + 31) / 32);
    const unsigned blocks = tg_blocks(N * nslices * 32, EMB_THREADS);
#define EMB_CHUNK(W, TD)                                                                                              \
    (runs ? emb_chunk_kernel<W, TD, true><<<blocks, EMB_THREADS, 0, st>>>(ids, (const TD *)dy, dt, sg, sorted,       \
                                                                         partial, arrive, (int)V, DW, nslices)      \
          : emb_chunk_kernel<W, TD, false><<<blocks, EMB_THREADS, 0, st>>>(ids, (const TD *)dy, dt, sg, sorted,      \
                                                                          partial, arrive, (int)V, DW, nslices))
    if (vec && dy_dt == TG_BF16) EMB_CHUNK(4, tg_bf16);
    else if (vec && dy_dt == TG_F16) EMB_CHUNK(4, tg_f16);
    else if (vec) EMB_CHUNK(4, float);
    else if (dy_dt == TG_BF16) EMB_CHUNK(1, tg_bf16);
    else if (dy_dt == TG_F16) EMB_CHUNK(1, tg_f16);
    else EMB_CHUNK(1, float);
#undef EMB_CHUNK
    return 0;
}
