/* TG_OP_MATMUL through cuBLASLt. Row-major C[M,N] = op(A) op(B) is computed as the
 * column-major product C^T[N,M] = op(B)^T op(A)^T, which reads the same memory without
 * copies: a row-major X is a column-major X^T. The algorithm for each shape is chosen once
 * with the heuristic API and cached; launches never allocate, so they can be captured. */
#include <cublasLt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_ops.h"

typedef struct gemm_key {
    int64_t m, n, k, batch;
    int32_t ta, tb, bias, accumulate, tf32;
    int32_t type_a, type_b, type_c, type_bias, pad; /* tg_dtype of A, B, C and the bias */
} gemm_key;

static cudaDataType_t cuda_type(int dtype) { return dtype == TG_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

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

#define GEMM_CACHE_MAGIC 0x31434D47u /* "GMC1" */

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

extern "C" int tg_cuda_matmul(const tg_cuda_op_args *a, tg_err *err) {
    const tg_op *op = a->op;
    tg_cuda_ctx *ctx = a->ctx;
    const int64_t M = op->i[0], N = op->i[1], K = op->i[2], batch = op->i[5];
    const int ta = (int)op->i[3], tb = (int)op->i[4], acc = (int)op->i[6];
    const float alpha = op->f[0], beta = acc ? 1.0f : 0.0f;
    const void *bias = a->in[2];
    /* Column-major problem: m = N, n = M, k = K; A' = B's memory, B' = A's memory. */
    gemm_key key;
    memset(&key, 0, sizeof key);
    key.m = N, key.n = M, key.k = K, key.batch = batch, key.ta = ta, key.tb = tb;
    key.bias = bias != NULL, key.accumulate = acc, key.tf32 = ctx->allow_tf32;
    key.type_a = a->in_dtype[0], key.type_b = a->in_dtype[1], key.type_c = a->out_dtype[0];
    key.type_bias = bias ? a->in_dtype[2] : TG_F32;
    for (int s = 0; s < 3; s++)
        if ((s < 2 || bias) && a->in_dtype[s] != TG_F32 && a->in_dtype[s] != TG_BF16)
            return tg_fail(err, "matmul: input %d has dtype %s", s, tg_dtype_name(a->in_dtype[s]));
    if (key.type_c != TG_F32 && key.type_c != TG_BF16)
        return tg_fail(err, "matmul: output has dtype %s", tg_dtype_name(key.type_c));
    /* TF32 is an fp32-input mode; bf16 inputs always multiply in bf16 with fp32 sums. */
    const int fp32_inputs = key.type_a == TG_F32 && key.type_b == TG_F32;
    cublasOperation_t op_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    int rc = 0;
    cublasLtHandle_t lt = (cublasLtHandle_t)ctx->cublaslt;
    cublasComputeType_t compute = ctx->allow_tf32 && fp32_inputs ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    LT_TRY(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
    LT_TRY(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a), "set TRANSA");
    LT_TRY(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b), "set TRANSB");
    if (bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        LT_TRY(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "set EPILOGUE");
        LT_TRY(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
               "set BIAS_POINTER");
        cudaDataType_t bias_type = cuda_type(key.type_bias);
        LT_TRY(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type),
               "set BIAS_DATA_TYPE");
    }
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
    {
        tg_gemm_cache *cache = ctx->gemm_cache;
        const cublasLtMatmulAlgo_t *algo = NULL;
        for (int i = 0; i < cache->n && !algo; i++) {
            gemm_entry *e = &cache->entries[i];
            if (memcmp(&e->key, &key, sizeof key)) continue;
            if (e->imported) {
                /* From the cache file: make sure this cuBLASLt still runs it for this problem. */
                cublasLtMatmulHeuristicResult_t check;
                if (cublasLtMatmulAlgoCheck(lt, desc, la, lb, lc, lc, &e->algo, &check) != CUBLAS_STATUS_SUCCESS ||
                    check.workspaceSize > ctx->gemm_workspace_bytes) {
                    e->key.m = -1; /* stale: never matches again */
                    continue;
                }
                e->imported = 0;
            }
            algo = &e->algo;
        }
        if (!algo) {
            LT_TRY(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
            size_t ws = ctx->gemm_workspace_bytes;
            LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                   "set MAX_WORKSPACE_BYTES");
            cublasLtMatmulHeuristicResult_t result;
            int found = 0;
            LT_TRY(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &result, &found),
                   "cublasLtMatmulAlgoGetHeuristic");
            if (!found) {
                rc = tg_fail(err, "matmul M=%lld N=%lld K=%lld: cuBLASLt has no algorithm for this shape",
                             (long long)M, (long long)N, (long long)K);
                goto out;
            }
            if (cache_add(cache, &key, &result.algo, 0)) {
                rc = tg_fail(err, "out of memory");
                goto out;
            }
            algo = &cache->entries[cache->n - 1].algo;
        }
        LT_TRY(cublasLtMatmul(lt, desc, &alpha, a->in[1], la, a->in[0], lb, &beta, a->out[0], lc, a->out[0], lc, algo,
                              ctx->gemm_workspace, ctx->gemm_workspace_bytes, ctx->stream),
               "cublasLtMatmul");
    }
out:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (desc) cublasLtMatmulDescDestroy(desc);
    return rc;
}
