/* The memory estimate of a plan (plan/memory_estimate.h). */
#include "plan/memory_estimate.h"

#include <stdio.h>
#include <string.h>

/* The reduction kernels' layout constants the scratch bound depends on. They mirror
 * kernels/column_sums.cuh (COL_ROWS), kernels/layernorm.cu (LN_THREADS / 32 rows per
 * block, FC_GRID), kernels/embedding.cu (CHUNK, TILE, SMALL_V), kernels/batchnorm.cu
 * (BN_BLOCKS, 8 rows a lane of 8) and kernels/conv.cu (WG_BLOCKS, 4 rows a lane of 8); the norm's blocks are
 * TG_NORM_BLOCK (plan/ops.h); tests/gpu/test_cuda_memory.c checks the bound against the kernels'
 * own formulas (tg_cuda_op_scratch_floats), so a change there that breaks it fails. */
#define COL_ROWS 128
#define LN_ROWS_PER_BLOCK 8
#define FC_GRID 512
#define EMB_CHUNK 256
#define EMB_TILE 4096
#define EMB_SMALL_V 4
#define BN_BLOCKS 1056
#define BN_CHUNK_ROWS 64
#define WG_BLOCKS 1056
#define WG_CHUNK_ROWS 32

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static int64_t numel_of(const tg_plan *p, int32_t t) {
    return t >= 0 && t < p->n_tensors ? tg_tensor_numel(&p->tensors[t]) : 0;
}

static int64_t last_dim(const tg_plan *p, int32_t t) {
    if (t < 0 || t >= p->n_tensors || p->tensors[t].ndim < 1 || p->tensors[t].ndim > TG_MAX_DIMS) return 0;
    return p->tensors[t].shape[p->tensors[t].ndim - 1];
}

/* Column sums of an [M, N] matrix, deterministic: stage 1 writes a double (2 floats) per
 * (chunk of COL_ROWS rows, column), which stage 2 adds. */
static int64_t col_sums_bound(int64_t M, int64_t N) {
    return M > 0 && N > 0 ? 2 * ceil_div(M, COL_ROWS) * N : 0; /* GCOVR_EXCL_BR_LINE: every caller passes N > 0 */
}

/* The LayerNorm backwards' dgamma and dbeta over [M, D]: two column sums at once (4
 * floats per chunk and column), or the fused form's two floats per (block of rows, at
 * most FC_GRID blocks, column), whichever is larger. */
static int64_t layernorm_bwd_bound(int64_t M, int64_t D) {
    if (M <= 0 || D <= 0) return 0; /* GCOVR_EXCL_BR_LINE: the caller passes D > 0 */
    int64_t blocks = ceil_div(M, LN_ROWS_PER_BLOCK);
    if (blocks > FC_GRID) blocks = FC_GRID;
    return max64(2 * col_sums_bound(M, D), 2 * blocks * D);
}

/* EMBEDDING_BWD of N rows of width D into a [V, D] table: small tables are column sums;
 * else the sort's ints (4N for one tile of tokens, else counts, offsets and cursors per
 * id, 3V + N), an arrival counter per (chunk, 32 columns) and a partial row per chunk of
 * a long id (2 ceil(N / EMB_CHUNK) + 2 chunks), with a few for alignment. */
static int64_t embedding_bwd_bound(int64_t N, int64_t V, int64_t D) {
    if (N <= 0 || V <= 0 || D <= 0) return 0; /* GCOVR_EXCL_BR_LINE: the caller passes D > 0 */
    if (V <= EMB_SMALL_V) return col_sums_bound(N, D);
    const int64_t chunks = 2 * ceil_div(N, EMB_CHUNK) + 2;
    return (N <= EMB_TILE ? 4 * N : 3 * V + N) + 5 + chunks * (ceil_div(D, 32) + D);
}

/* BATCHNORM(_BWD) over [M, C]: two doubles per (chunk, channel), at most BN_BLOCKS chunks
 * of at least BN_CHUNK_ROWS rows, then a table of 5 floats per channel and 4 to align. */
static int64_t batchnorm_bound(int64_t M, int64_t C) {
    if (M <= 0 || C <= 0) return 0;
    int64_t chunks = ceil_div(M, BN_CHUNK_ROWS);
    if (chunks > BN_BLOCKS) chunks = BN_BLOCKS;
    if (chunks < 1) chunks = 1;
    return 4 * chunks * C + 5 * C + 4;
}

/* CONV2D_BWD's weight and bias gradients: a double per (chunk, output channel, weight
 * element or the bias), at most WG_BLOCKS chunks of at least WG_CHUNK_ROWS positions. */
static int64_t conv2d_bwd_bound(const tg_conv2d_bwd_params *c) {
    if (c->k <= 0 || c->stride <= 0 || c->groups <= 0 || c->c_out <= 0) return 0;
    const int64_t oh = (c->h + 2 * c->pad - c->k) / c->stride + 1, ow = (c->w + 2 * c->pad - c->k) / c->stride + 1;
    const int64_t positions = c->n * oh * ow;
    if (positions <= 0) return 0;
    int64_t chunks = ceil_div(positions, WG_CHUNK_ROWS);
    if (chunks > WG_BLOCKS) chunks = WG_BLOCKS;
    return 2 * chunks * c->c_out * (c->c_in / c->groups * c->k * c->k + 1);
}

/* Floats of scratch op `op` may need, from its tensors' shapes (plan/ops.def gives them). */
static int64_t op_scratch_bound(const tg_plan *p, const tg_op *op) {
    switch (op->kind) {
    case TG_OP_EMBEDDING_BWD: { /* in1 dout [N, D] -> out0 dtable [V, D] */
        const int64_t D = last_dim(p, op->out[0]);
        return D > 0 ? embedding_bwd_bound(numel_of(p, op->in[1]) / D, numel_of(p, op->out[0]) / D, D) : 0;
    }
    case TG_OP_LAYERNORM_BWD:
    case TG_OP_RESIDUAL_LAYERNORM_BWD: { /* in0 dy [M, D] */
        const int64_t D = last_dim(p, op->in[0]);
        return D > 0 ? layernorm_bwd_bound(numel_of(p, op->in[0]) / D, D) : 0;
    }
    case TG_OP_RMSNORM_BWD: { /* in0 dy [M, D], optional out1 dgamma [D]: its column sums */
        const int64_t D = numel_of(p, op->out[1]);
        return D > 0 ? col_sums_bound(numel_of(p, op->in[0]) / D, D) : 0;
    }
    case TG_OP_BIAS_GRAD: { /* in0 dout [M, N] -> out0 [N] */
        const int64_t N = numel_of(p, op->out[0]);
        return N > 0 ? col_sums_bound(numel_of(p, op->in[0]) / N, N) : 0;
    }
    case TG_OP_GELU_BWD: { /* optional out1 [N]: the column sums of dx viewed as [n / N, N] */
        const int64_t N = numel_of(p, op->out[1]);
        return N > 0 ? col_sums_bound(numel_of(p, op->in[0]) / N, N) : 0;
    }
    case TG_OP_MATMUL: { /* optional out1 [L]: the sums over K of one operand, [K, L] */
        const int64_t L = numel_of(p, op->out[1]);
        return L > 0 ? col_sums_bound(max64(numel_of(p, op->in[0]), numel_of(p, op->in[1])) / L, L) : 0;
    }
    case TG_OP_BATCHNORM: return batchnorm_bound(op->p.batchnorm.n * op->p.batchnorm.hw, op->p.batchnorm.c);
    case TG_OP_BATCHNORM_BWD: return batchnorm_bound(op->p.batchnorm_bwd.n * op->p.batchnorm_bwd.hw, op->p.batchnorm_bwd.c);
    case TG_OP_CONV2D_BWD: return conv2d_bwd_bound(&op->p.conv2d_bwd);
    case TG_OP_CROSS_ENTROPY: return 2 * numel_of(p, op->in[1]); /* a double per row (labels [N]) */
    case TG_OP_CROSS_ENTROPY_BWD: return 4;
    case TG_OP_GRAD_NORM: { /* a float per block of squares (plan/ops.def) */
        const int64_t n = op->p.count.n > 0 ? op->p.count.n : numel_of(p, op->in[0]);
        return n > 0 ? ceil_div(n, TG_NORM_BLOCK) : 1;
    }
    case TG_OP_ATTENTION:
    case TG_OP_ATTENTION_BWD: { /* where cuDNN may take the op (kernels/cudnn_attention.h: head dim
                                   64 or 128, p 0): a non-causal op's key mask's 16-bit bias,
                                   B T T, in floats rounded to 4, then the backward's fp32 dQ
                                   accumulator, B H T Dh with T rounded up to 128 */
        const tg_attention_params *at = &op->p.attention;
        if ((at->head_dim != 64 && at->head_dim != 128) || at->p != 0.0f) return 0;
        const int64_t dq = op->kind == TG_OP_ATTENTION_BWD ? at->b * at->h * ((at->t + 127) / 128 * 128) * at->head_dim : 0;
        return dq + (op->in[3] >= 0 && !at->causal ? (at->b * at->t * at->t / 2 + 3) / 4 * 4 : 0);
    }
    default: return 0;
    }
}

uint64_t tg_op_scratch_bound_floats(const tg_plan *plan, int op) {
    return op >= 0 && op < plan->n_ops ? (uint64_t)op_scratch_bound(plan, &plan->ops[op]) : 0;
}

uint64_t tg_reduce_scratch_bound_floats(const tg_plan *plan) {
    uint64_t floats = TG_MEM_REDUCE_SCRATCH_MIN_FLOATS;
    for (int o = 0; o < plan->n_ops; o++) {
        const uint64_t need = tg_op_scratch_bound_floats(plan, o);
        if (need > floats) floats = need;
    }
    return floats;
}

void tg_estimate_memory(const tg_plan *plan, int device, tg_memory_estimate *est) {
    memset(est, 0, sizeof *est);
    est->device = device;
    /* A staging image holds a step's whole window of micro-batches (grad_accumulation). */
    const uint64_t micro = plan->train.grad_accumulation > 1 ? (uint64_t)plan->train.grad_accumulation : 1;
    const uint64_t inputs = plan->pool_bytes[TG_POOL_INPUTS] * micro;
    est->part[TG_MEM_POOLS] = plan->peak_bytes;
    if (device == TG_MEM_DEVICE_CUDA) {
        est->part[TG_MEM_GEMM_WORKSPACE] = TG_MEM_GEMM_WORKSPACE_BYTES;
        est->part[TG_MEM_REDUCE_SCRATCH] = tg_reduce_scratch_bound_floats(plan) * sizeof(float);
        const uint64_t slot = (inputs + TG_MEM_STAGING_ALIGN - 1) / TG_MEM_STAGING_ALIGN * TG_MEM_STAGING_ALIGN;
        est->part[TG_MEM_BATCH_STAGING] = TG_MEM_STAGING_SLOTS * slot + TG_MEM_STAGING_ALIGN;
        est->part[TG_MEM_NCCL] = plan->train.replicas > 1 ? TG_MEM_NCCL_BYTES : 0;
        est->part[TG_MEM_CUDA_CONTEXT] = TG_MEM_CUDA_CONTEXT_BYTES;
        est->part[TG_MEM_CUDA_KERNELS] = TG_MEM_CUDA_KERNELS_BYTES;
    } else {
        est->part[TG_MEM_BATCH_STAGING] = TG_MEM_CPU_STAGING_BUFFERS * inputs;
        est->part[TG_MEM_WEIGHTS_UPLOAD] = plan->pool_bytes[TG_POOL_PARAMS] + plan->pool_bytes[TG_POOL_PARAMS_BF16];
        /* The frozen parameters and buffers, each in fp32 or int32 whatever its storage
         * dtype (runtime/weights.h's image). */
        for (int t = 0; t < plan->n_tensors; t++) {
            const tg_tensor *x = &plan->tensors[t];
            if (tg_tensor_is_value(x) && tg_tensor_class_of(x) != TG_CLASS_TRAINABLE)
                est->part[TG_MEM_WEIGHTS_UPLOAD] += (uint64_t)tg_tensor_numel(x) * 4;
        }
    }
    for (int k = 0; k < TG_MEM_PART_COUNT; k++) est->total += est->part[k];
}

static const char *const part_keys[TG_MEM_PART_COUNT] = {
    "pools", "gemm_workspace", "reduce_scratch", "batch_staging", "nccl", "cuda_context", "cuda_kernels",
    "weights_upload",
};
static const char *const part_labels[TG_MEM_PART_COUNT] = {
    "pools",        "cuBLASLt workspace", "reduction scratch", "batch staging", "NCCL buffers",
    "CUDA context", "CUDA kernels",       "weights upload",
};
_Static_assert(sizeof part_keys / sizeof part_keys[0] == TG_MEM_PART_COUNT, "memory part keys");
_Static_assert(sizeof part_labels / sizeof part_labels[0] == TG_MEM_PART_COUNT, "memory part labels");

const char *tg_mem_part_key(int part) { return part >= 0 && part < TG_MEM_PART_COUNT ? part_keys[part] : "?"; }
const char *tg_mem_part_label(int part) { return part >= 0 && part < TG_MEM_PART_COUNT ? part_labels[part] : "?"; }

char *tg_mem_format_bytes(uint64_t bytes, char *buf, size_t len) {
    const double b = (double)bytes;
    if (bytes >= (1ull << 30)) snprintf(buf, len, "%.1f GiB", b / (1ull << 30));
    else if (bytes >= (1ull << 20)) snprintf(buf, len, "%.1f MiB", b / (1ull << 20));
    else if (bytes >= (1ull << 10)) snprintf(buf, len, "%.1f KiB", b / (1ull << 10));
    else snprintf(buf, len, "%llu B", (unsigned long long)bytes);
    return buf;
}

char *tg_memory_estimate_parts(const tg_memory_estimate *est, int skip, char *buf, size_t len) {
    size_t n = 0;
    if (len) buf[0] = 0;
    for (int k = 0; k < TG_MEM_PART_COUNT && n < len; k++) {
        if (!est->part[k] || k == skip) continue;
        char size[32];
        int w = snprintf(buf + n, len - n, "%s%s %s", n ? " + " : "", part_labels[k],
                         tg_mem_format_bytes(est->part[k], size, sizeof size));
        if (w < 0) break; /* GCOVR_EXCL_BR_LINE: snprintf of plain %s fields does not fail */
        n += (size_t)w;
    }
    return buf;
}
