/* TG_OP_MATMUL through cuBLASLt. Row-major C[M,N] = op(A) op(B) is computed as the
 * column-major product C^T[N,M] = op(B)^T op(A)^T, which reads the same memory without
 * copies: a row-major X is a column-major X^T. The algorithm for each shape is chosen once
 * with the heuristic API and cached; launches never allocate, so they can be captured.
 *
 * A fused bias gradient (bias_grad, plan/ops.def) is the BGRADB epilogue when it
 * sums op(A) (A' = B's memory is cuBLASLt's A, so our A is its B) and BGRADA when it sums
 * op(B), for bf16 and half products (CUDA_R_16BF / CUDA_R_16F A, B and C, fp32 compute).
 * Where cuBLASLt offers no algorithm with that epilogue, and for
 * fp32 products, the plain product runs and the BIAS_GRAD kernel sums the same operand
 * into the zeroed output: same semantics.
 *
 * The GELU epilogues (activation) are GELU_AUX_BIAS (GELU_AUX without a bias; the aux matrix is
 * the pre-activation out2) and DGELU (aux = the saved pre-activation in3). The aux matrix
 * has C's column-major layout [N rows, M columns], leading dimension N, and C's data type
 * (cuBLASLt's default, so the aux type attribute stays unset). Which form runs is decided
 * from the launch alone, never by timing, so results are reproducible: the epilogue for
 * bf16 and half outputs when the aux leading dimension is a multiple of 8 (cuBLASLt's rule) and the
 * pointers are 16-byte aligned, and cuBLASLt has an algorithm for it; otherwise (and for
 * every fp32 output, whose GELU must stay at the CPU reference's precision, which an
 * epilogue with a fast tanh need not) the plain product (with its bias epilogue) and then
 * the GELU or GELU_BWD kernel, which complete the op with the separate ops' formulas. */
#include <cublasLt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_common.cuh"

typedef struct gemm_key {
    int64_t m, n, k, batch;
    int32_t ta, tb, bias, accumulate, tf32;
    int32_t type_a, type_b, type_c, type_bias; /* tg_dtype of A, B, C and the bias */
    int32_t bgrad; /* bias_grad; + BGRAD_FALLBACK when the plain product plus the column-sum kernel */
    int32_t act;   /* activation; + ACT_FALLBACK when the plain product plus the GELU(_BWD) kernel */
    int32_t pad;   /* explicit, so keys compare and persist without padding bytes */
} gemm_key;

#define BGRAD_FALLBACK 16
#define ACT_FALLBACK 16

static cudaDataType_t cuda_type(int dtype) {
    return dtype == TG_BF16 ? CUDA_R_16BF : dtype == TG_F16 ? CUDA_R_16F : CUDA_R_32F;
}

typedef struct gemm_entry {
    gemm_key key;
    cublasLtMatmulAlgo_t algo;
    int32_t imported;  /* from the cache file: still to be checked */
    int32_t pad;
} gemm_entry;

struct tg_gemm_cache {
    gemm_entry *entries;
    int n, cap;
    int n_new, n_imported;
};

#define GEMM_CACHE_MAGIC 0x33434D47u /* "GMC3": choices may be split-K forms */

static int cache_add(tg_gemm_cache *cache, const gemm_key *key, const cublasLtMatmulAlgo_t *algo, int imported) {
    if (cache->n == cache->cap) {
        int cap = cache->cap ? 2 * cache->cap : 64;
        gemm_entry *e = (gemm_entry *)realloc(cache->entries, sizeof *e * (size_t)cap);
        if (!e) return -1;
        cache->entries = e, cache->cap = cap;
    }
    gemm_entry *e = &cache->entries[cache->n++];
    memset(e, 0, sizeof *e);
    e->key = *key, e->algo = *algo, e->imported = imported;
    if (imported) cache->n_imported++;
    else cache->n_new++;
    return 0;
}

extern "C" int tg_gemm_cache_export(const tg_gemm_cache *cache, void **bytes, size_t *len) {
    size_t per = sizeof(gemm_key) + sizeof(cublasLtMatmulAlgo_t);
    *len = 8 + per * (size_t)cache->n;
    uint8_t *b = (uint8_t *)malloc(*len);
    if (!b) return -1;
    uint32_t head[2] = {GEMM_CACHE_MAGIC, (uint32_t)cache->n};
    memcpy(b, head, 8);
    for (int i = 0; i < cache->n; i++) {
        memcpy(b + 8 + per * i, &cache->entries[i].key, sizeof(gemm_key));
        memcpy(b + 8 + per * i + sizeof(gemm_key), &cache->entries[i].algo, sizeof(cublasLtMatmulAlgo_t));
    }
    *bytes = b;
    return 0;
}

extern "C" int tg_gemm_cache_import(tg_gemm_cache *cache, const void *bytes, size_t len) {
    size_t per = sizeof(gemm_key) + sizeof(cublasLtMatmulAlgo_t);
    uint32_t head[2];
    if (len < 8) return -1;
    memcpy(head, bytes, 8);
    if (head[0] != GEMM_CACHE_MAGIC || len != 8 + per * head[1]) return -1;
    const uint8_t *b = (const uint8_t *)bytes + 8;
    for (uint32_t i = 0; i < head[1]; i++) {
        gemm_key key;
        cublasLtMatmulAlgo_t algo;
        memcpy(&key, b + per * i, sizeof key);
        memcpy(&algo, b + per * i + sizeof key, sizeof algo);
        if (cache_add(cache, &key, &algo, 1)) return -1;
    }
    return 0;
}

extern "C" int tg_gemm_cache_new_entries(const tg_gemm_cache *cache) { return cache->n_new; }
extern "C" int tg_gemm_cache_imported(const tg_gemm_cache *cache) { return cache->n_imported; }

extern "C" int tg_gemm_cache_create(tg_gemm_cache **cache, tg_err *err) {
    *cache = (tg_gemm_cache *)calloc(1, sizeof **cache);
    return *cache ? 0 : tg_fail(err, "out of memory");
}

extern "C" void tg_gemm_cache_destroy(tg_gemm_cache *cache) {
    if (!cache) return;
    free(cache->entries);
    free(cache);
}

static int lt_fail(tg_err *err, const char *what, cublasStatus_t st, const gemm_key *k) {
    return tg_fail(err, "matmul M=%lld N=%lld K=%lld batch=%lld transA=%d transB=%d: %s failed: %s (%d)",
                   (long long)k->n, (long long)k->m, (long long)k->k, (long long)k->batch, k->ta, k->tb, what,
                   cublasLtGetStatusString(st), (int)st);
}

#define LT_TRY(call, what)                                      \
    do {                                                        \
        cublasStatus_t st_ = (call);                            \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                     \
            rc = lt_fail(err, what, st_, &key);                 \
            goto out;                                           \
        }                                                       \
    } while (0)

/* The BIAS_GRAD op equivalent to a fused bias gradient: the column sums of the stored
 * dC operand ([K, M] for bias_grad = 1, [K, N] for bias_grad = 2). */
static tg_op bgrad_sum_op(const tg_op *op) {
    tg_op s;
    memset(&s, 0, sizeof s);
    s.kind = TG_OP_BIAS_GRAD;
    const tg_matmul_params *mm = &op->p.matmul;
    s.p.bias_grad.m = mm->k;
    s.p.bias_grad.n = mm->bias_grad == 1 ? mm->m : mm->n;
    return s;
}

extern "C" int64_t tg_scratch_matmul(const tg_op *op) {
    if (!op->p.matmul.bias_grad) return 0;
    tg_op s = bgrad_sum_op(op);
    return tg_scratch_bias_grad(&s);
}

/* Runs the fallback: zero out1, then BIAS_GRAD's column sums (+=) of dC into it. */
static int bgrad_fallback(const tg_cuda_op_args *a, tg_err *err) {
    tg_op s = bgrad_sum_op(a->op);
    tg_cuda_op_args sa;
    memset(&sa, 0, sizeof sa);
    const int slot = a->op->p.matmul.bias_grad == 1 ? 0 : 1;
    sa.op = &s, sa.ctx = a->ctx, sa.training = a->training;
    sa.in[0] = a->in[slot], sa.in_dtype[0] = a->in_dtype[slot];
    sa.out[0] = a->out[1], sa.out_dtype[0] = TG_F32;
    const cudaError_t e = cudaMemsetAsync(a->out[1], 0, (size_t)s.p.bias_grad.n * sizeof(float), a->ctx->stream);
    if (e != cudaSuccess) return tg_fail(err, "cudaMemsetAsync of the bias gradient: %s", cudaGetErrorString(e));
    return tg_launch_bias_grad(&sa, err);
}

/* The GELU(_BWD) op that completes a GELU epilogue's fallback, on the product the plain
 * GEMM wrote: forward, out0 = gelu(out2); backward, out0 = out0 * gelu'(in3), in place
 * (each element is read, then written, by one thread). */
static int act_fallback(const tg_cuda_op_args *a, tg_err *err) {
    const tg_matmul_params *mm = &a->op->p.matmul;
    tg_op s;
    memset(&s, 0, sizeof s);
    s.kind = mm->activation == TG_MATMUL_ACT_GELU ? TG_OP_GELU : TG_OP_GELU_BWD;
    if (s.kind == TG_OP_GELU) {
        s.p.gelu.n = mm->m * mm->n;
        s.p.gelu.form = TG_GELU_TANH;
    } else {
        s.p.gelu_bwd.n = mm->m * mm->n;
        s.p.gelu_bwd.form = TG_GELU_TANH; /* bias_cols 0: no bias gradient */
    }
    tg_cuda_op_args sa;
    memset(&sa, 0, sizeof sa);
    sa.op = &s, sa.ctx = a->ctx, sa.training = a->training;
    sa.out[0] = a->out[0], sa.out_dtype[0] = a->out_dtype[0];
    if (s.kind == TG_OP_GELU) {
        sa.in[0] = a->out[2], sa.in_dtype[0] = a->out_dtype[2];
        return tg_launch_gelu(&sa, err);
    }
    sa.in[0] = a->out[0], sa.in_dtype[0] = a->out_dtype[0];
    sa.in[1] = a->in[3], sa.in_dtype[1] = a->in_dtype[3];
    return tg_launch_gelu_bwd(&sa, err);
}

/* Heuristic candidates asked for per shape (cuBLASLt 13 returns at most 8 for the
 * shapes of the benchmark models), each timed. */
#define TUNE_CANDIDATES 32
#define TUNE_REPS 5
/* A candidate replaces the one chosen so far (the epilogue form before the fallback, the
 * heuristic's order, unsplit before split) only when it is faster by this fraction: the
 * timings of near-equal candidates differ by noise, and a choice made by noise changed
 * the BERT step by up to 1.3% from one process to the next. */
#define TUNE_MARGIN 0.03f

/* What a descriptor's epilogue computes, and its buffers. */
typedef struct epilogue {
    cublasLtEpilogue_t kind;  /* CUBLASLT_EPILOGUE_DEFAULT: none */
    const void *vec;          /* BIAS_POINTER: the bias (in) or the bias gradient (out) */
    int vec_dtype;            /* tg_dtype of vec */
    const void *aux;          /* EPILOGUE_AUX_POINTER: the GELU pre-activation (out or in) */
    int64_t aux_ld;           /* its leading dimension, in elements */
} epilogue;

/* The matmul descriptor: transposes and the epilogue. */
static cublasStatus_t make_desc(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute, cublasOperation_t op_a,
                                cublasOperation_t op_b, const epilogue *e) {
    cublasStatus_t st = cublasLtMatmulDescCreate(desc, compute, CUDA_R_32F);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b);
    if (st != CUBLAS_STATUS_SUCCESS || e->kind == CUBLASLT_EPILOGUE_DEFAULT) return st;
    st = cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e->kind, sizeof e->kind);
    if (st == CUBLAS_STATUS_SUCCESS && e->vec) {
        const cudaDataType_t type = cuda_type(e->vec_dtype);
        st = cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e->vec, sizeof e->vec);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof type);
    }
    if (st == CUBLAS_STATUS_SUCCESS && e->aux) {
        st = cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &e->aux, sizeof e->aux);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &e->aux_ld,
                                                sizeof e->aux_ld);
    }
    return st;
}

/* The cached algorithm for key, if any; an entry imported from the cache file is checked
 * against this cuBLASLt first (one that no longer fits is dropped). */
static const cublasLtMatmulAlgo_t *cache_find(tg_cuda_ctx *ctx, cublasLtHandle_t lt, const gemm_key *key,
                                              cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                                              cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc) {
    tg_gemm_cache *cache = ctx->gemm_cache;
    for (int i = 0; i < cache->n; i++) {
        gemm_entry *e = &cache->entries[i];
        if (memcmp(&e->key, key, sizeof *key)) continue;
        if (e->imported) {
            cublasLtMatmulHeuristicResult_t check;
            if (cublasLtMatmulAlgoCheck(lt, desc, la, lb, lc, lc, &e->algo, &check) != CUBLAS_STATUS_SUCCESS ||
                check.workspaceSize > ctx->gemm_workspace_bytes) {
                e->key.m = -1; /* stale: never matches again */
                continue;
            }
            e->imported = 0;
        }
        return &e->algo;
    }
    return NULL;
}

/* The kernel that completes a fallback variant (1) after its plain product: the column
 * sums of a fused bias gradient, or the GELU(_BWD) of an activation epilogue. */
static int finish_variant(const tg_cuda_op_args *a, int variant, tg_err *err) {
    if (variant != 1) return 0;
    if (a->op->p.matmul.bias_grad) return bgrad_fallback(a, err);
    if (a->op->p.matmul.activation) return act_fallback(a, err);
    return 0;
}

/* Split-K variants of the first SPLITK_BASES heuristic candidates are timed too: K-long
 * products with few output tiles (BERT's weight gradients: K = B*T = 4096, 36-144 tiles
 * of 128 x 128 on 132 SMs) leave most SMs idle otherwise. (On an H100 the split forms
 * were timed slower than the unsplit ones for every large shape of the benchmark models;
 * a few small shapes take one.) The parts are added in fp32:
 * in place in an fp32 output (cuBLASLt orders that with counters: deterministic), else
 * in the workspace at the compute type. */
#define SPLITK_BASES 4
static const int32_t splitk_counts[] = {2, 3, 4, 6};

/* algo split into `parts` along K, checked against the problem and the workspace; 0 when
 * the algorithm cannot split or the split does not fit. */
static int splitk_variant(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                          cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, const cublasLtMatmulAlgo_t *algo,
                          int32_t parts, int type_c, size_t workspace, cublasLtMatmulAlgo_t *out) {
    int32_t support = 0;
    uint32_t schemes = 0;
    size_t got = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &support, sizeof support, &got) !=
            CUBLAS_STATUS_SUCCESS ||
        !support ||
        cublasLtMatmulAlgoCapGetAttribute(algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes,
                                          &got) != CUBLAS_STATUS_SUCCESS)
        return 0;
    uint32_t scheme = type_c == TG_F32 && (schemes & CUBLASLT_REDUCTION_SCHEME_INPLACE) ? CUBLASLT_REDUCTION_SCHEME_INPLACE
                      : (schemes & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)           ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
                                                                                      : 0;
    if (!scheme) return 0;
    *out = *algo;
    cublasLtMatmulHeuristicResult_t check;
    return cublasLtMatmulAlgoConfigSetAttribute(out, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &parts, sizeof parts) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulAlgoConfigSetAttribute(out, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulAlgoCheck(lt, desc, la, lb, lc, lc, out, &check) == CUBLAS_STATUS_SUCCESS &&
           check.workspaceSize <= workspace;
}

/* Milliseconds of one run of a candidate (the best of TUNE_REPS after a warm-up run), on
 * the op's own buffers (the product into d): only in the executor's tuning pass, outside
 * any capture, whose results are thrown away (accumulating products add into their output
 * each run). Variant 1 includes its completing kernel. INFINITY when it fails. */
static float time_candidate(const tg_cuda_op_args *a, cublasLtHandle_t lt, cublasLtMatmulDesc_t desc,
                            cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc,
                            const cublasLtMatmulAlgo_t *algo, int variant, const float *alpha, const float *beta,
                            void *d) {
    tg_cuda_ctx *ctx = a->ctx;
    cudaEvent_t ev[2] = {NULL, NULL};
    float best = INFINITY;
    if (cudaEventCreate(&ev[0]) != cudaSuccess || cudaEventCreate(&ev[1]) != cudaSuccess) goto done;
    for (int r = 0; r <= TUNE_REPS; r++) {
        if (cudaEventRecord(ev[0], ctx->stream) != cudaSuccess) break;
        if (cublasLtMatmul(lt, desc, alpha, a->in[1], la, a->in[0], lb, beta, d, lc, d, lc, algo,
                           ctx->gemm_workspace, ctx->gemm_workspace_bytes, ctx->stream) != CUBLAS_STATUS_SUCCESS)
            break;
        tg_err err;
        if (finish_variant(a, variant, &err)) break;
        float ms = 0;
        if (cudaEventRecord(ev[1], ctx->stream) != cudaSuccess || cudaEventSynchronize(ev[1]) != cudaSuccess ||
            cudaEventElapsedTime(&ms, ev[0], ev[1]) != cudaSuccess)
            break;
        if (r > 0 && ms < best) best = ms; /* run 0 warms up */
    }
done:
    (void)cudaGetLastError(); /* a candidate that failed to launch is simply not chosen */
    for (int i = 0; i < 2; i++)
        if (ev[i]) cudaEventDestroy(ev[i]);
    return best;
}

int tg_launch_matmul(const tg_cuda_op_args *a, tg_err *err) {
    const tg_matmul_params *mm = &a->op->p.matmul;
    tg_cuda_ctx *ctx = a->ctx;
    const int64_t M = mm->m, N = mm->n, K = mm->k, batch = mm->batch;
    const int ta = (int)mm->trans_a, tb = (int)mm->trans_b, acc = (int)mm->accumulate, bgrad = (int)mm->bias_grad;
    const int act = (int)mm->activation;
    const float alpha = mm->alpha, beta = acc ? 1.0f : 0.0f;
    const void *bias = a->in[2];
    void *dbias = bgrad ? a->out[1] : NULL;
    if (bgrad && (bgrad > 2 || !dbias || bias || batch != 1 || (bgrad == 1 && !ta) || (bgrad == 2 && tb) ||
                  a->out_dtype[1] != TG_F32))
        return tg_fail(err, "matmul: fused bias gradient bias_grad=%d needs an fp32 out1, batch 1, no bias and %s", bgrad,
                       bgrad == 1 ? "transA" : "no transB");
    /* The pre-activation the GELU epilogue writes (out2) or reads (in3), typed like out0. */
    void *pre = act == TG_MATMUL_ACT_GELU ? a->out[2] : act == TG_MATMUL_ACT_GELU_BWD ? a->in[3] : NULL;
    const int pre_dtype = act == TG_MATMUL_ACT_GELU ? a->out_dtype[2] : a->in_dtype[3];
    if (act && (act > TG_MATMUL_ACT_GELU_BWD || act < 0 || !pre || pre_dtype != a->out_dtype[0] || batch != 1 ||
                acc || bgrad || (act == TG_MATMUL_ACT_GELU_BWD && bias)))
        return tg_fail(err,
                       "matmul: activation=%d needs its pre-activation (%s) typed like out0, batch 1, no "
                       "accumulate, no bias gradient%s",
                       act, act == TG_MATMUL_ACT_GELU ? "out2" : "in3",
                       act == TG_MATMUL_ACT_GELU_BWD ? " and no bias" : "");
    /* Column-major problem: m = N, n = M, k = K; A' = B's memory, B' = A's memory. */
    gemm_key key;
    memset(&key, 0, sizeof key);
    key.m = N, key.n = M, key.k = K, key.batch = batch, key.ta = ta, key.tb = tb;
    key.bias = bias != NULL, key.accumulate = acc, key.tf32 = ctx->allow_tf32;
    key.type_a = a->in_dtype[0], key.type_b = a->in_dtype[1], key.type_c = a->out_dtype[0];
    key.type_bias = bias ? a->in_dtype[2] : TG_F32;
    key.bgrad = bgrad;
    key.act = act;
    for (int s = 0; s < 3; s++)
        if ((s < 2 || bias) && a->in_dtype[s] != TG_F32 && !tg_dtype_half(a->in_dtype[s]))
            return tg_fail(err, "matmul: input %d has dtype %s", s, tg_dtype_name(a->in_dtype[s]));
    if (key.type_c != TG_F32 && !tg_dtype_half(key.type_c))
        return tg_fail(err, "matmul: output has dtype %s", tg_dtype_name(key.type_c));
    /* TF32 is an fp32-input mode; bf16 / half inputs always multiply as they are with fp32 sums. */
    const int fp32_inputs = key.type_a == TG_F32 && key.type_b == TG_F32;
    /* The GELU epilogue's conditions (see the top of the file); else only the fallback. */
    const int act_epilogue_ok = act && tg_dtype_half(key.type_c) && N % 8 == 0 && tg_aligned16(pre) &&
                                tg_aligned16(a->out[0]);
    cublasOperation_t op_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDesc_t desc = NULL, desc2 = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    int rc = 0;
    cublasLtHandle_t lt = (cublasLtHandle_t)ctx->cublaslt;
    cublasComputeType_t compute = ctx->allow_tf32 && fp32_inputs ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    /* Stored shapes (before op): A' is B's memory, B' is A's memory, C' is C^T. */
    LT_TRY(cublasLtMatrixLayoutCreate(&la, cuda_type(key.type_b), tb ? K : N, tb ? N : K, tb ? K : N), "layout A");
    LT_TRY(cublasLtMatrixLayoutCreate(&lb, cuda_type(key.type_a), ta ? M : K, ta ? K : M, ta ? M : K), "layout B");
    LT_TRY(cublasLtMatrixLayoutCreate(&lc, cuda_type(key.type_c), N, M, N), "layout C");
    if (batch > 1) {
        int32_t count = (int32_t)batch;
        int64_t sa = N * K, sb = M * K, sc = M * N;
        LT_TRY(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), "batch A");
        LT_TRY(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), "batch B");
        LT_TRY(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), "batch C");
        LT_TRY(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sa, sizeof sa), "stride A");
        LT_TRY(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sb, sizeof sb), "stride B");
        LT_TRY(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sc, sizeof sc), "stride C");
    }
    /* Variant 0: the epilogue (bias, bias gradient or GELU); variant 1 (bias gradient or
     * GELU only): the plain product (with its bias epilogue) plus the kernel that finishes
     * the op. fp32 products with a bias gradient use variant 1 only: cuBLASLt's
     * bias-gradient sums there are ~1e-5 off in relative terms (the column-sum kernel adds
     * in double), which the fp32 path, kept at the CPU reference's precision, does not
     * accept. Bias-gradient variants are timed against each other in the tuning pass; the
     * GELU variants never are: the epilogue whenever it is allowed and has an algorithm. */
    {
        const int fallback_only = (bgrad && fp32_inputs) || (act && !act_epilogue_ok);
        const int first = fallback_only ? 1 : 0, last = bgrad || act ? 1 : 0;
        cublasLtMatmulDesc_t descs[2] = {NULL, NULL};
        void *dst[2] = {a->out[0], a->out[0]}; /* the product's destination per variant */
        for (int v = first; v <= last; v++) {
            epilogue e;
            memset(&e, 0, sizeof e);
            e.kind = CUBLASLT_EPILOGUE_DEFAULT;
            if (bias) {
                e.kind = CUBLASLT_EPILOGUE_BIAS;
                e.vec = bias, e.vec_dtype = key.type_bias;
            }
            if (v == 0 && bgrad) {
                e.kind = bgrad == 1 ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BGRADA;
                e.vec = dbias, e.vec_dtype = TG_F32;
            }
            if (v == 0 && act) {
                e.kind = act == TG_MATMUL_ACT_GELU_BWD ? CUBLASLT_EPILOGUE_DGELU
                         : bias                        ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                       : CUBLASLT_EPILOGUE_GELU_AUX;
                e.aux = pre, e.aux_ld = N;
            }
            /* The GELU fallback's plain forward product is the pre-activation, out2. */
            if (v == 1 && act == TG_MATMUL_ACT_GELU) dst[v] = a->out[2];
            const cublasStatus_t st = make_desc(&descs[v], compute, op_a, op_b, &e);
            if (v == first) desc = descs[v]; /* freed at out: */
            else desc2 = descs[v];
            LT_TRY(st, "cublasLtMatmulDesc");
        }
        /* The key of each variant's cache entry. */
        gemm_key keys[2] = {key, key};
        keys[1].bgrad = bgrad ? bgrad + BGRAD_FALLBACK : 0;
        keys[1].act = act ? act + ACT_FALLBACK : 0;
        /* A cached choice (either variant, the epilogue first) wins. */
        const cublasLtMatmulAlgo_t *algo = NULL;
        int variant = -1;
        for (int v = first; v <= last && !algo; v++) {
            algo = cache_find(ctx, lt, &keys[v], descs[v], la, lb, lc);
            if (algo) variant = v;
        }
        if (!algo) {
            LT_TRY(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
            size_t ws = ctx->gemm_workspace_bytes;
            LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                   "set MAX_WORKSPACE_BYTES");
            cublasLtMatmulAlgo_t best;
            float best_ms = INFINITY;
            for (int v = first; v <= last; v++) {
                cublasLtMatmulHeuristicResult_t results[TUNE_CANDIDATES];
                int found = 0;
                const int want = ctx->gemm_tune ? TUNE_CANDIDATES : 1;
                if (cublasLtMatmulAlgoGetHeuristic(lt, descs[v], la, lb, lc, lc, pref, want, results, &found) !=
                        CUBLAS_STATUS_SUCCESS ||
                    !found)
                    continue;
                if (!ctx->gemm_tune) { /* the heuristic's first choice of the first variant that has one */
                    best = results[0].algo, variant = v;
                    break;
                }
                float first_ms = INFINITY, best_v = INFINITY;
                int best_c = -1, best_split = 1, n_split = 0;
                for (int c = 0; c < found; c++) {
                    const float ms =
                        time_candidate(a, lt, descs[v], la, lb, lc, &results[c].algo, v, &alpha, &beta, dst[v]);
                    if (c == 0) first_ms = ms;
                    if (ms < best_v * (1.0f - TUNE_MARGIN)) best_v = ms, best_c = c;
                    if (ms < best_ms * (1.0f - TUNE_MARGIN)) best_ms = ms, best = results[c].algo, variant = v;
                }
                /* The first candidates split along K too, where that fits the workspace. */
                for (int c = 0; c < found && c < SPLITK_BASES; c++)
                    for (int sk = 0; sk < (int)(sizeof splitk_counts / sizeof *splitk_counts); sk++) {
                        cublasLtMatmulAlgo_t split;
                        if (!splitk_variant(lt, descs[v], la, lb, lc, &results[c].algo, splitk_counts[sk],
                                            key.type_c, ctx->gemm_workspace_bytes, &split))
                            continue;
                        n_split++;
                        const float ms = time_candidate(a, lt, descs[v], la, lb, lc, &split, v, &alpha, &beta, dst[v]);
                        if (ms < best_v * (1.0f - TUNE_MARGIN)) best_v = ms, best_c = c, best_split = splitk_counts[sk];
                        if (ms < best_ms * (1.0f - TUNE_MARGIN)) best_ms = ms, best = split, variant = v;
                    }
                if (ctx->gemm_tune > 1)
                    fprintf(stderr,
                            "gemm tune: M=%lld N=%lld K=%lld batch=%lld trans %d%d acc %d bias_grad %d act %d form %d: "
                            "%d candidates + %d split-K, first %.1f us, best %.1f us (candidate %d, split %d)\n",
                            (long long)M, (long long)N, (long long)K, (long long)batch, ta, tb, acc, bgrad, act, v,
                            found, n_split, first_ms * 1e3, best_v * 1e3, best_c, best_split);
                if (act && variant >= 0) break; /* GELU: the epilogue when it has one that runs */
            }
            if (variant < 0) {
                rc = tg_fail(err, "matmul M=%lld N=%lld K=%lld: cuBLASLt has no algorithm for this shape",
                             (long long)M, (long long)N, (long long)K);
                goto out;
            }
            if (cache_add(ctx->gemm_cache, &keys[variant], &best, 0)) {
                rc = tg_fail(err, "out of memory");
                goto out;
            }
            algo = &ctx->gemm_cache->entries[ctx->gemm_cache->n - 1].algo;
        }
        LT_TRY(cublasLtMatmul(lt, descs[variant], &alpha, a->in[1], la, a->in[0], lb, &beta, dst[variant], lc,
                              dst[variant], lc, algo, ctx->gemm_workspace, ctx->gemm_workspace_bytes, ctx->stream),
               "cublasLtMatmul");
        rc = finish_variant(a, variant, err);
    }
out:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (desc2) cublasLtMatmulDescDestroy(desc2);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (desc) cublasLtMatmulDescDestroy(desc);
    return rc;
}

/* The algorithms cached for GELU epilogues: with the epilogue (fallback 0) or as the plain
 * product plus the GELU kernel (fallback 1), for activation act (tg_matmul_params.activation). */
extern "C" int tg_gemm_cache_act_entries(const tg_gemm_cache *cache, int act, int fallback) {
    int n = 0;
    for (int i = 0; i < cache->n; i++)
        n += cache->entries[i].key.m >= 0 && cache->entries[i].key.act == act + (fallback ? ACT_FALLBACK : 0);
    return n;
}
