/* The memory estimate (plan/memory_estimate.c) of hand-made plans against its documented
 * formulas: the CUDA reduction scratch each op kind asks for (small and large embedding
 * tables, LayerNorm backwards over few and many rows, the fused bias gradients), the parts
 * of a CPU and a CUDA estimate, and how they are printed; and the plan's names and sizes
 * (plan/plan.c) inside and outside their enums. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/memory_estimate.h"
#include "plan/plan.h"
#include "tests/harness.h"

enum { MAX_T = 16, MAX_O = 16 };

typedef struct small_plan {
    tg_plan p;
    tg_tensor t[MAX_T];
    tg_op o[MAX_O];
} small_plan;

static void init_plan(small_plan *s) {
    memset(s, 0, sizeof *s);
    s->p.tensors = s->t;
    s->p.ops = s->o;
    s->p.train.replicas = 1;
}

/* A tensor of the given dims (ndim 1 or 2; d1 0: one dim) in the activations pool. */
static int32_t tensor(small_plan *s, int64_t d0, int64_t d1) {
    tg_tensor *x = &s->t[s->p.n_tensors];
    x->dtype = TG_F32;
    x->pool = TG_POOL_ACTIVATIONS;
    x->ndim = d1 ? 2 : 1;
    x->shape[0] = d0, x->shape[1] = d1;
    x->bytes = (uint64_t)(d0 * (d1 ? d1 : 1)) * 4;
    x->grad = x->master = x->group = -1;
    return s->p.n_tensors++;
}

static tg_op *op(small_plan *s, int kind) {
    tg_op *o = &s->o[s->p.n_ops++];
    *o = tg_test_op(kind);
    return o;
}

static uint64_t scratch(small_plan *s) { return tg_op_scratch_bound_floats(&s->p, s->p.n_ops - 1); }

/* Attention where cuDNN may take it (head dim 64 or 128, p 0; kernels/cudnn_attention.h):
 * a non-causal op's key mask as a 16-bit B T T bias (floats rounded to 4), the backward's
 * fp32 dQ accumulator B H T Dh with T rounded to 128; a causal op's mask needs no bias. */
TG_TEST(test_plan_memory_estimate_scratch_attention) {
    small_plan s;
    init_plan(&s);
    tg_op *e = op(&s, TG_OP_ATTENTION);
    e->p.attention = (tg_attention_params){.b = 2, .h = 3, .t = 130, .head_dim = 64, .scale = 0.125f};
    e->in[3] = tensor(&s, 2, 130);
    const uint64_t bias = (2 * 130 * 130 / 2 + 3) / 4 * 4, dq = 2 * 3 * 256 * 64;
    CHECK(scratch(&s) == bias, "attention with a key mask: %llu", (unsigned long long)scratch(&s));
    e->kind = TG_OP_ATTENTION_BWD;
    CHECK(scratch(&s) == bias + dq, "attention_bwd with a key mask: %llu", (unsigned long long)scratch(&s));
    e->p.attention.causal = 1;
    CHECK(scratch(&s) == dq, "causal attention_bwd with a key mask: %llu", (unsigned long long)scratch(&s));
    e->kind = TG_OP_ATTENTION;
    CHECK(scratch(&s) == 0, "causal attention with a key mask: %llu", (unsigned long long)scratch(&s));
    e->p.attention.causal = 0, e->in[3] = -1;
    CHECK(scratch(&s) == 0, "attention without a key mask: %llu", (unsigned long long)scratch(&s));
    e->kind = TG_OP_ATTENTION_BWD, e->in[3] = 0, e->p.attention.head_dim = 32;
    CHECK(scratch(&s) == 0, "attention_bwd of head dim 32: %llu", (unsigned long long)scratch(&s));
    e->p.attention.head_dim = 128, e->p.attention.p = 0.1f;
    CHECK(scratch(&s) == 0, "attention_bwd with dropout: %llu", (unsigned long long)scratch(&s));
    e->p.attention.p = 0.0f;
    CHECK(scratch(&s) == bias + 2 * 3 * 256 * 128, "attention_bwd of head dim 128: %llu",
          (unsigned long long)scratch(&s));
}

TG_TEST(test_plan_memory_estimate_scratch_per_op) {
    small_plan s;
    init_plan(&s);
    tg_op *e;
    /* EMBEDDING_BWD: dout [N, D] into [V, D]. */
    e = op(&s, TG_OP_EMBEDDING_BWD); /* N 300, V 10, D 40: 4N + 5 + (2 ceil(N/256) + 2)(ceil(D/32) + D) */
    e->in[1] = tensor(&s, 300, 40), e->out[0] = tensor(&s, 10, 40);
    CHECK(scratch(&s) == 4 * 300 + 5 + 6 * (2 + 40), "embedding_bwd N 300: %llu", (unsigned long long)scratch(&s));
    e = op(&s, TG_OP_EMBEDDING_BWD); /* N 5000 > 4096: 3V + N + 5 + chunks (ceil(D/32) + D) */
    e->in[1] = tensor(&s, 5000, 8), e->out[0] = tensor(&s, 100, 8);
    CHECK(scratch(&s) == 3 * 100 + 5000 + 5 + 42 * (1 + 8), "embedding_bwd N 5000: %llu",
          (unsigned long long)scratch(&s));
    e = op(&s, TG_OP_EMBEDDING_BWD); /* V 4: column sums, 2 ceil(N/128) D */
    e->in[1] = 0, e->out[0] = tensor(&s, 4, 40); /* dout: tensor 0, [300, 40] */
    CHECK(scratch(&s) == 2 * 3 * 40, "embedding_bwd V 4: %llu", (unsigned long long)scratch(&s));
    e->out[0] = tensor(&s, 10, 0); /* a 1-D table: D 10, V 1 */
    CHECK(scratch(&s) == 2 * 10 * 10, /* N 1200 of width 10 into V 1 */ "embedding_bwd 1-D table: %llu",
          (unsigned long long)scratch(&s));
    e->out[0] = tensor(&s, 10, 0), s.t[e->out[0]].shape[0] = 0; /* D 0 */
    CHECK(scratch(&s) == 0, "embedding_bwd D 0: %llu", (unsigned long long)scratch(&s));
    e->out[0] = tensor(&s, 0, 40); /* V 0 */
    CHECK(scratch(&s) == 0, "embedding_bwd V 0: %llu", (unsigned long long)scratch(&s));
    e->out[0] = -1;
    CHECK(scratch(&s) == 0, "embedding_bwd without a table: %llu", (unsigned long long)scratch(&s));
    e->out[0] = s.p.n_tensors; /* outside the table */
    CHECK(scratch(&s) == 0, "embedding_bwd table past the tensors: %llu", (unsigned long long)scratch(&s));
    e->out[0] = 1, s.t[1].ndim = 0;
    CHECK(scratch(&s) == 0, "embedding_bwd 0-D table: %llu", (unsigned long long)scratch(&s));
    s.t[1].ndim = TG_MAX_DIMS + 1;
    CHECK(scratch(&s) == 0, "embedding_bwd table of 5 dims: %llu", (unsigned long long)scratch(&s));
    s.t[1].ndim = 2;
    e->in[1] = s.p.n_tensors; /* dout outside the table: N 0 */
    CHECK(scratch(&s) == 0, "embedding_bwd dout past the tensors: %llu", (unsigned long long)scratch(&s));

    init_plan(&s);
    /* LayerNorm backwards: dy [M, D]; max(2 col sums, 2 min(ceil(M/8), 512) D). */
    e = op(&s, TG_OP_LAYERNORM_BWD);
    e->in[0] = tensor(&s, 20, 16);
    CHECK(scratch(&s) == 2 * 3 * 16, "layernorm_bwd M 20: %llu", (unsigned long long)scratch(&s));
    e->in[0] = tensor(&s, 8000, 4); /* 1000 blocks, at most 512 */
    CHECK(scratch(&s) == 2 * 512 * 4, "layernorm_bwd M 8000: %llu", (unsigned long long)scratch(&s));
    e->in[0] = tensor(&s, 1, 2048); /* one row: the column sums, 2 * 2 * 1 * D, win */
    CHECK(scratch(&s) == 2 * 2 * 2048, "layernorm_bwd one row: %llu", (unsigned long long)scratch(&s));
    e->kind = TG_OP_RESIDUAL_LAYERNORM_BWD;
    e->in[0] = tensor(&s, 2000, 4);
    CHECK(scratch(&s) == 2 * 250 * 4, "residual_layernorm_bwd M 2000: %llu", (unsigned long long)scratch(&s));
    e->in[0] = tensor(&s, 0, 4); /* M 0 */
    CHECK(scratch(&s) == 0, "layernorm_bwd M 0: %llu", (unsigned long long)scratch(&s));
    e->in[0] = tensor(&s, 4, 0), s.t[e->in[0]].shape[0] = 0; /* D 0 */
    CHECK(scratch(&s) == 0, "layernorm_bwd D 0: %llu", (unsigned long long)scratch(&s));

    init_plan(&s);
    /* BIAS_GRAD: dout [M, N] -> [N]: 2 ceil(M/128) N. */
    e = op(&s, TG_OP_BIAS_GRAD);
    e->in[0] = tensor(&s, 300, 5), e->out[0] = tensor(&s, 5, 0);
    CHECK(scratch(&s) == 2 * 3 * 5, "bias_grad: %llu", (unsigned long long)scratch(&s));
    e->out[0] = tensor(&s, 0, 0);
    s.t[e->out[0]].ndim = 1;
    CHECK(scratch(&s) == 0, "bias_grad of no columns: %llu", (unsigned long long)scratch(&s));
    e->in[0] = tensor(&s, 0, 5), e->out[0] = 1; /* M 0 */
    CHECK(scratch(&s) == 0, "bias_grad of no rows: %llu", (unsigned long long)scratch(&s));
    /* GELU_BWD's fused bias gradient: dx viewed as [n / N, N]. */
    e = op(&s, TG_OP_GELU_BWD);
    e->in[0] = tensor(&s, 600, 0), e->out[1] = tensor(&s, 6, 0);
    CHECK(scratch(&s) == 2 * 1 * 6, "gelu_bwd with bias gradient: %llu", (unsigned long long)scratch(&s));
    e->out[1] = -1;
    CHECK(scratch(&s) == 0, "gelu_bwd: %llu", (unsigned long long)scratch(&s));
    /* MATMUL's: the larger operand viewed as [K, L]. */
    e = op(&s, TG_OP_MATMUL);
    e->in[0] = tensor(&s, 4, 3), e->in[1] = tensor(&s, 3, 5), e->out[1] = tensor(&s, 5, 0);
    CHECK(scratch(&s) == 2 * 1 * 5, "matmul bias_grad 2: %llu", (unsigned long long)scratch(&s));
    e->in[0] = tensor(&s, 1000, 5), e->out[1] = tensor(&s, 5, 0); /* A the larger: 1000 rows, 8 chunks */
    CHECK(scratch(&s) == 2 * 8 * 5, "matmul bias_grad of A: %llu", (unsigned long long)scratch(&s));
    e->out[1] = -1;
    CHECK(scratch(&s) == 0, "matmul: %llu", (unsigned long long)scratch(&s));
    /* The losses and the norm. */
    e = op(&s, TG_OP_CROSS_ENTROPY);
    e->in[1] = tensor(&s, 7, 0);
    CHECK(scratch(&s) == 14, "cross_entropy: %llu", (unsigned long long)scratch(&s));
    op(&s, TG_OP_CROSS_ENTROPY_BWD);
    CHECK(scratch(&s) == 4, "cross_entropy_bwd: %llu", (unsigned long long)scratch(&s));
    e = op(&s, TG_OP_GRAD_NORM);
    e->p.count.n = 2047 * TG_NORM_BLOCK + 1; /* a float per block of squares */
    CHECK(scratch(&s) == 2048, "grad_norm: %llu", (unsigned long long)scratch(&s));
    op(&s, TG_OP_ADD);
    CHECK(scratch(&s) == 0, "add: %llu", (unsigned long long)scratch(&s));
    /* Ops outside the schedule; the plan's bound: the largest, at least the minimum. */
    CHECK(tg_op_scratch_bound_floats(&s.p, -1) == 0 && tg_op_scratch_bound_floats(&s.p, s.p.n_ops) == 0,
          "ops outside the schedule have scratch");
    CHECK(tg_reduce_scratch_bound_floats(&s.p) == 2048, "plan bound %llu, want 2048 (grad_norm)",
          (unsigned long long)tg_reduce_scratch_bound_floats(&s.p));
    /* Still 0 where the memory next to the table holds ops with scratch: the add alone,
     * between the grad_norm and a second one. */
    const int n_all = s.p.n_ops;
    s.o[n_all] = tg_test_op(TG_OP_GRAD_NORM);
    s.p.ops = &s.o[n_all - 1], s.p.n_ops = 1;
    CHECK(s.p.ops[-1].kind == TG_OP_GRAD_NORM && tg_op_scratch_bound_floats(&s.p, -1) == 0 &&
              tg_op_scratch_bound_floats(&s.p, 0) == 0 && tg_op_scratch_bound_floats(&s.p, 1) == 0 &&
              tg_op_scratch_bound_floats(&s.p, INT32_MIN) == 0,
          "ops beside the table counted: %llu %llu", (unsigned long long)tg_op_scratch_bound_floats(&s.p, -1),
          (unsigned long long)tg_op_scratch_bound_floats(&s.p, 1));
    CHECK(tg_reduce_scratch_bound_floats(&s.p) == TG_MEM_REDUCE_SCRATCH_MIN_FLOATS, "the add's plan bound %llu",
          (unsigned long long)tg_reduce_scratch_bound_floats(&s.p));
    s.p.ops = s.o, s.p.n_ops = n_all;
    s.p.n_ops = 1; /* the bias_grad's 0 and nothing else: the minimum */
    CHECK(tg_reduce_scratch_bound_floats(&s.p) == TG_MEM_REDUCE_SCRATCH_MIN_FLOATS, "plan bound %llu",
          (unsigned long long)tg_reduce_scratch_bound_floats(&s.p));
}

/* Rows of width 1 (a table, a LayerNorm, a bias of one column) still need their scratch:
 * only a width of 0 needs none. */
TG_TEST(test_plan_memory_estimate_scratch_of_width_one) {
    small_plan s;
    init_plan(&s);
    tg_op *e = op(&s, TG_OP_EMBEDDING_BWD); /* N 300, V 10, D 1: 4N + 5 + (2 ceil(N/256) + 2)(ceil(D/32) + D) */
    e->in[1] = tensor(&s, 300, 1), e->out[0] = tensor(&s, 10, 1);
    CHECK(scratch(&s) == 4 * 300 + 5 + 6 * (1 + 1), "embedding_bwd D 1: %llu", (unsigned long long)scratch(&s));
    e->out[0] = tensor(&s, 3, 1); /* V 3: the column sums, 2 ceil(N/128) D */
    CHECK(scratch(&s) == 2 * 3 * 1, "embedding_bwd V 3, D 1: %llu", (unsigned long long)scratch(&s));
    e = op(&s, TG_OP_LAYERNORM_BWD); /* M 300, D 1: max(2 * 2 * 3 * 1, 2 * 38 * 1) */
    e->in[0] = tensor(&s, 300, 1);
    CHECK(scratch(&s) == 2 * 38, "layernorm_bwd D 1: %llu", (unsigned long long)scratch(&s));
    e->kind = TG_OP_RESIDUAL_LAYERNORM_BWD;
    CHECK(scratch(&s) == 2 * 38, "residual_layernorm_bwd D 1: %llu", (unsigned long long)scratch(&s));
    e = op(&s, TG_OP_BIAS_GRAD); /* dout [300, 1] -> [1] */
    e->in[0] = tensor(&s, 300, 1), e->out[0] = tensor(&s, 1, 0);
    CHECK(scratch(&s) == 2 * 3 * 1, "bias_grad of one column: %llu", (unsigned long long)scratch(&s));
    e = op(&s, TG_OP_GELU_BWD); /* dx [300] viewed as [300, 1] */
    e->in[0] = tensor(&s, 300, 0), e->out[1] = tensor(&s, 1, 0);
    CHECK(scratch(&s) == 2 * 3 * 1, "gelu_bwd with a bias of one column: %llu", (unsigned long long)scratch(&s));
    e = op(&s, TG_OP_MATMUL); /* the larger operand, [300, 1], over L 1 */
    e->in[0] = tensor(&s, 300, 1), e->in[1] = tensor(&s, 1, 1), e->out[1] = tensor(&s, 1, 0);
    CHECK(scratch(&s) == 2 * 3 * 1, "matmul bias_grad of one column: %llu", (unsigned long long)scratch(&s));
    e->in[0] = tensor(&s, 1, 1), e->in[1] = tensor(&s, 1, 300); /* B the larger */
    CHECK(scratch(&s) == 2 * 3 * 1, "matmul bias_grad of B: %llu", (unsigned long long)scratch(&s));
}

TG_TEST(test_plan_memory_estimate_parts) {
    small_plan s;
    init_plan(&s);
    /* A trainable parameter, its view, a frozen parameter (bf16: uploaded as fp32), a
     * buffer of int32, and a bf16 copy: only the frozen one and the buffer add to the
     * pools' upload. */
    const int32_t w = tensor(&s, 10, 10), v = tensor(&s, 100, 0), fz = tensor(&s, 6, 0), buf = tensor(&s, 3, 0),
                  copy = tensor(&s, 100, 0);
    s.t[w].flags = TG_TENSOR_PARAM, s.t[w].pool = TG_POOL_PARAMS;
    s.t[v].flags = TG_TENSOR_PARAM | TG_TENSOR_VIEW, s.t[v].pool = TG_POOL_PARAMS;
    s.t[fz].flags = TG_TENSOR_FROZEN, s.t[fz].pool = TG_POOL_FROZEN, s.t[fz].dtype = TG_BF16;
    s.t[buf].flags = TG_TENSOR_BUFFER, s.t[buf].pool = TG_POOL_BUFFERS, s.t[buf].dtype = TG_I32;
    s.t[copy].flags = TG_TENSOR_PARAM_COPY | TG_TENSOR_FROZEN, s.t[copy].pool = TG_POOL_PARAMS_BF16;
    s.p.pool_bytes[TG_POOL_PARAMS] = 512, s.p.pool_bytes[TG_POOL_PARAMS_BF16] = 256;
    s.p.pool_bytes[TG_POOL_INPUTS] = 300;
    s.p.peak_bytes = 5000;
    tg_memory_estimate est;
    tg_estimate_memory(&s.p, TG_MEM_DEVICE_CPU, &est);
    CHECK(est.device == TG_MEM_DEVICE_CPU && est.part[TG_MEM_POOLS] == 5000 && est.part[TG_MEM_BATCH_STAGING] == 900 &&
              est.part[TG_MEM_WEIGHTS_UPLOAD] == 512 + 256 + 6 * 4 + 3 * 4 && est.part[TG_MEM_GEMM_WORKSPACE] == 0 &&
              est.part[TG_MEM_NCCL] == 0 && est.part[TG_MEM_CUDA_CONTEXT] == 0,
          "CPU parts: pools %llu staging %llu upload %llu", (unsigned long long)est.part[TG_MEM_POOLS],
          (unsigned long long)est.part[TG_MEM_BATCH_STAGING], (unsigned long long)est.part[TG_MEM_WEIGHTS_UPLOAD]);
    CHECK(est.total == 5000 + 900 + 804, "CPU total %llu", (unsigned long long)est.total);

    tg_estimate_memory(&s.p, TG_MEM_DEVICE_CUDA, &est);
    /* Staging: two slots of the inputs rounded up to 256 (512), and 256 of slack. */
    CHECK(est.device == TG_MEM_DEVICE_CUDA && est.part[TG_MEM_BATCH_STAGING] == 2 * 512 + 256 &&
              est.part[TG_MEM_GEMM_WORKSPACE] == TG_MEM_GEMM_WORKSPACE_BYTES &&
              est.part[TG_MEM_REDUCE_SCRATCH] == TG_MEM_REDUCE_SCRATCH_MIN_FLOATS * 4 && est.part[TG_MEM_NCCL] == 0 &&
              est.part[TG_MEM_CUDA_CONTEXT] == TG_MEM_CUDA_CONTEXT_BYTES &&
              est.part[TG_MEM_CUDA_KERNELS] == TG_MEM_CUDA_KERNELS_BYTES && est.part[TG_MEM_WEIGHTS_UPLOAD] == 0,
          "CUDA parts: staging %llu scratch %llu", (unsigned long long)est.part[TG_MEM_BATCH_STAGING],
          (unsigned long long)est.part[TG_MEM_REDUCE_SCRATCH]);
    s.p.train.replicas = 2;
    s.p.pool_bytes[TG_POOL_INPUTS] = 512; /* already a multiple of 256 */
    tg_estimate_memory(&s.p, TG_MEM_DEVICE_CUDA, &est);
    CHECK(est.part[TG_MEM_NCCL] == TG_MEM_NCCL_BYTES && est.part[TG_MEM_BATCH_STAGING] == 2 * 512 + 256,
          "CUDA data parallel: nccl %llu staging %llu", (unsigned long long)est.part[TG_MEM_NCCL],
          (unsigned long long)est.part[TG_MEM_BATCH_STAGING]);
    uint64_t sum = 0;
    for (int k = 0; k < TG_MEM_PART_COUNT; k++) sum += est.part[k];
    CHECK(est.total == sum, "total %llu, parts %llu", (unsigned long long)est.total, (unsigned long long)sum);

    /* Printed. */
    char b[64], parts[256];
    CHECK(!strcmp(tg_mem_format_bytes(260, b, sizeof b), "260 B") && !strcmp(tg_mem_format_bytes(1023, b, sizeof b), "1023 B") &&
              !strcmp(tg_mem_format_bytes(1024, b, sizeof b), "1.0 KiB") &&
              !strcmp(tg_mem_format_bytes(1536, b, sizeof b), "1.5 KiB") &&
              !strcmp(tg_mem_format_bytes((1u << 20) - 1, b, sizeof b), "1024.0 KiB") &&
              !strcmp(tg_mem_format_bytes(1u << 20, b, sizeof b), "1.0 MiB") &&
              !strcmp(tg_mem_format_bytes(32u << 20, b, sizeof b), "32.0 MiB") &&
              !strcmp(tg_mem_format_bytes(1ull << 30, b, sizeof b), "1.0 GiB") &&
              !strcmp(tg_mem_format_bytes(44237824819ull, b, sizeof b), "41.2 GiB"),
          "byte formats (last '%s')", b);
    tg_memory_estimate e2;
    memset(&e2, 0, sizeof e2);
    e2.part[TG_MEM_POOLS] = 2048, e2.part[TG_MEM_NCCL] = 300, e2.part[TG_MEM_WEIGHTS_UPLOAD] = 1u << 20;
    CHECK(!strcmp(tg_memory_estimate_parts(&e2, -1, parts, sizeof parts),
                  "pools 2.0 KiB + NCCL buffers 300 B + weights upload 1.0 MiB"),
          "parts: '%s'", parts);
    CHECK(!strcmp(tg_memory_estimate_parts(&e2, TG_MEM_POOLS, parts, sizeof parts),
                  "NCCL buffers 300 B + weights upload 1.0 MiB"),
          "parts but pools: '%s'", parts);
    CHECK(!strcmp(tg_memory_estimate_parts(&e2, -1, parts, 12), "pools 2.0 K"), "parts in 12 bytes: '%s'", parts);
    snprintf(parts, sizeof parts, "untouched");
    CHECK(!strcmp(tg_memory_estimate_parts(&e2, -1, parts, 0), "untouched"), "parts in 0 bytes: '%s'", parts);
    memset(&e2, 0, sizeof e2);
    CHECK(!strcmp(tg_memory_estimate_parts(&e2, -1, parts, sizeof parts), ""), "no parts: '%s'", parts);

    static const char *const keys[TG_MEM_PART_COUNT] = {"pools", "gemm_workspace", "reduce_scratch", "batch_staging",
                                                        "nccl", "cuda_context", "cuda_kernels", "weights_upload"};
    for (int k = 0; k < TG_MEM_PART_COUNT; k++)
        CHECK(!strcmp(tg_mem_part_key(k), keys[k]), "part %d key '%s'", k, tg_mem_part_key(k));
    CHECK(!strcmp(tg_mem_part_label(TG_MEM_GEMM_WORKSPACE), "cuBLASLt workspace") &&
              !strcmp(tg_mem_part_label(TG_MEM_WEIGHTS_UPLOAD), "weights upload"),
          "part labels");
    CHECK(!strcmp(tg_mem_part_key(-1), "?") && !strcmp(tg_mem_part_key(TG_MEM_PART_COUNT), "?") &&
              !strcmp(tg_mem_part_label(-1), "?") && !strcmp(tg_mem_part_label(TG_MEM_PART_COUNT), "?"),
          "parts outside the enum");
}

/* ---- plan.c: names and sizes ------------------------------------------------------------- */

TG_TEST(test_plan_memory_estimate_plan_names) {
    struct {
        const char *(*name)(int);
        int count;
        const char *first, *last;
    } tables[] = {
        {tg_pool_name, TG_POOL_COUNT, "params", "buffers"},
        {tg_phase_name, TG_PHASE_COUNT, "forward", "optimizer"},
        {tg_dtype_name, TG_DTYPE_COUNT, "f32", "u8"},
        {tg_arch_name, TG_ARCH_COUNT, "bert", "mobilenet_v2"},
        {tg_task_name, TG_TASK_COUNT, "classify", "qa"},
        {tg_precision_name, TG_PREC_COUNT, "fp32", "fp16"},
        {tg_attention_mode_name, TG_ATTENTION_MODE_COUNT, "fused", "unfused"},
        {tg_last_batch_name, TG_LAST_BATCH_COUNT, "pad", "wrap"},
        {tg_tensor_class_name, TG_CLASS_COUNT, "none", "buffer"},
    };
    for (size_t k = 0; k < sizeof tables / sizeof tables[0]; k++) {
        const int n = tables[k].count;
        CHECK(!strcmp(tables[k].name(0), tables[k].first) && !strcmp(tables[k].name(n - 1), tables[k].last) &&
                  !strcmp(tables[k].name(-1), "?") && !strcmp(tables[k].name(n), "?"),
              "table %zu: '%s' .. '%s', outside '%s' '%s'", k, tables[k].name(0), tables[k].name(n - 1),
              tables[k].name(-1), tables[k].name(n));
    }
    CHECK(tg_dtype_size(TG_F32) == 4 && tg_dtype_size(TG_I32) == 4 && tg_dtype_size(TG_BF16) == 2 &&
              tg_dtype_size(-1) == 0 && tg_dtype_size(TG_DTYPE_COUNT) == 0,
          "dtype sizes");
    tg_tensor t;
    memset(&t, 0, sizeof t);
    t.flags = TG_TENSOR_FROZEN | TG_TENSOR_BUFFER;
    CHECK(tg_tensor_class_of(&t) == TG_CLASS_FROZEN, "frozen before buffer");
    t.flags = TG_TENSOR_BUFFER | TG_TENSOR_VIEW;
    CHECK(tg_tensor_class_of(&t) == TG_CLASS_BUFFER && !tg_tensor_is_value(&t), "a buffer view is not a value");
    t.flags = TG_TENSOR_BUFFER;
    CHECK(tg_tensor_is_value(&t), "a buffer is a value");
    t.flags = 0;
    CHECK(tg_tensor_class_of(&t) == TG_CLASS_NONE && !tg_tensor_is_value(&t), "an activation is not a value");
    t.ndim = 0;
    CHECK(tg_tensor_numel(&t) == 1, "a 0-D tensor has %lld elements", (long long)tg_tensor_numel(&t));

    /* Buckets: lengths 4, 8 and the plan's 16. */
    tg_plan p, b[2];
    memset(&p, 0, sizeof p);
    memset(b, 0, sizeof b);
    p.train.n_buckets = 3, p.train.bucket_seq[0] = 4, p.train.bucket_seq[1] = 8, p.train.bucket_seq[2] = 16;
    CHECK(tg_plan_bucket(&p, 0) == &p, "no bucket plans: bucket 0 is the plan");
    p.buckets = b;
    CHECK(tg_plan_bucket(&p, 0) == &b[0] && tg_plan_bucket(&p, 1) == &b[1] && tg_plan_bucket(&p, 2) == &p &&
              tg_plan_bucket(&p, -1) == &p && tg_plan_bucket(&p, 3) == &p,
          "bucket plans by index");
    CHECK(tg_plan_bucket_for(&p, 1) == 0 && tg_plan_bucket_for(&p, 4) == 0 && tg_plan_bucket_for(&p, 5) == 1 &&
              tg_plan_bucket_for(&p, 8) == 1 && tg_plan_bucket_for(&p, 9) == 2 && tg_plan_bucket_for(&p, 100) == 2,
          "bucket for a length");
    p.train.n_buckets = 1;
    CHECK(tg_plan_bucket_for(&p, 100) == 0, "one bucket");
    p.buckets = NULL;
    tg_plan_free(NULL); /* nothing to free */
    tg_plan_free(&p);
    CHECK(!p.tensors && !p.ops && p.n_tensors == 0, "freed plan");
}

/* A scratch op whose shape slot is absent (-1, a corrupt plan's) asks for nothing, and no
 * tensor outside the table is read for it: the table here is on the heap, so AddressSanitizer
 * sees a read of tensors[-1]. Each tensor is real, so a slot read by mistake would count. */
TG_TEST(test_plan_memory_estimate_scratch_absent_slot_on_heap) {
    enum { N_T = 48 }; /* several KiB: the allocator's redzone before it covers tensors[-1] */
    tg_plan p;
    memset(&p, 0, sizeof p);
    p.tensors = calloc(N_T, sizeof *p.tensors);
    p.ops = calloc(1, sizeof *p.ops);
    REQUIRE(p.tensors && p.ops, "out of memory");
    p.n_tensors = N_T, p.n_ops = 1, p.train.replicas = 1;
    for (int t = 0; t < N_T; t++) {
        tg_tensor *x = &p.tensors[t];
        x->dtype = TG_F32, x->pool = TG_POOL_ACTIVATIONS, x->ndim = 2, x->shape[0] = 300, x->shape[1] = 40;
        x->bytes = 300 * 40 * 4;
        x->grad = x->master = x->group = -1;
    }
    static const struct {
        int kind, in0, in1, out0;
        const char *what;
    } cases[] = {
        {TG_OP_EMBEDDING_BWD, 0, 1, -1, "embedding_bwd without a table"},
        {TG_OP_LAYERNORM_BWD, -1, 1, 2, "layernorm_bwd without dy"},
        {TG_OP_RESIDUAL_LAYERNORM_BWD, -1, 1, 2, "residual_layernorm_bwd without dy"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        p.ops[0] = tg_test_op(cases[k].kind);
        p.ops[0].in[0] = cases[k].in0, p.ops[0].in[1] = cases[k].in1, p.ops[0].out[0] = cases[k].out0;
        CHECK(tg_op_scratch_bound_floats(&p, 0) == 0, "%s: %llu floats", cases[k].what,
              (unsigned long long)tg_op_scratch_bound_floats(&p, 0));
    }
    /* With the slot present: the documented bound (dy [300, 40]: the fused form's two floats
     * per block of 8 rows and column, 2 x 38 x 40, above the column sums' 4 x 3 x 40). */
    p.ops[0] = tg_test_op(TG_OP_LAYERNORM_BWD);
    p.ops[0].in[0] = 0;
    CHECK(tg_op_scratch_bound_floats(&p, 0) == 2 * 38 * 40, "layernorm_bwd M 300, D 40: %llu",
          (unsigned long long)tg_op_scratch_bound_floats(&p, 0));
    free(p.tensors);
    free(p.ops);
}
