/* The matrix products of a training step in bf16 and in FP8 (E4M3 inputs, bf16 output,
 * fp32 accumulation, per-tensor scales), through cuBLASLt on one GPU: what `precision =
 * fp8` could gain on the GEMMs before any cast, transpose or scaling work is paid.
 *
 * Every product is timed in the "TN" form FP8 needs on Hopper (A transposed, B not, column
 * major: C[m x n] = A^T B with A k x m and B k x n), bf16 in the same form, so the two
 * differ only in the input type. A model's linear layer y = x W^T over T tokens gives
 * three products: the forward (m = out, n = T, k = in), the input gradient (m = in,
 * n = T, k = out) and the weight gradient (m = out, n = in, k = T); FP8 training makes the
 * transposed operands the last two need with its casts (not timed here). Each repetition
 * first overwrites a 256 MiB buffer (no input left in L2), then times the product alone
 * with an event pair; the best of cuBLASLt's first 8 heuristic algorithms by median over
 * the repetitions is reported. Inputs are random bytes (finite in both encodings).
 *
 *   gemm_fp8 [--reps N]
 *
 * Output: one line per product (ms and TFLOP/s for bf16 and FP8, the ratio), then per
 * model the sum over one step's products (layers x the three products of each linear). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#define FLUSH_BYTES ((size_t)256 << 20)
#define WORKSPACE_BYTES ((size_t)32 << 20)
#define MAX_ALGOS 8

static void cuda_check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return;
    fprintf(stderr, "gemm_fp8: %s: %s\n", what, cudaGetErrorString(e));
    exit(1);
}

static void lt_check(cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "gemm_fp8: %s: cuBLASLt status %d\n", what, (int)s);
    exit(1);
}

/* A linear layer of a model: in and out features, and how many of it a step has. */
typedef struct linear {
    const char *name;
    int in, out, count;
} linear;

typedef struct model_case {
    const char *name;
    int tokens;
    linear layers[6];
    int n_layers;
} model_case;

static const model_case MODELS[] = {
    {"bert-base B32 T128", 4096,
     {{"qkv", 768, 2304, 12}, {"attn.out", 768, 768, 12}, {"ffn1", 768, 3072, 12}, {"ffn2", 3072, 768, 12}}, 4},
    {"bert-base B8 T512", 4096,
     {{"qkv", 768, 2304, 12}, {"attn.out", 768, 768, 12}, {"ffn1", 768, 3072, 12}, {"ffn2", 3072, 768, 12}}, 4},
    {"gpt2 B16 T1024", 16384,
     {{"qkv", 768, 2304, 12},
      {"attn.out", 768, 768, 12},
      {"ffn1", 768, 3072, 12},
      {"ffn2", 3072, 768, 12},
      {"lm_head", 768, 50304, 1}},
     5},
};
#define N_MODELS (int)(sizeof MODELS / sizeof MODELS[0])

typedef struct bench {
    cublasLtHandle_t lt;
    cudaStream_t stream;
    void *flush, *workspace, *a, *b, *d;
    float *scale; /* 1.0 on the device: the FP8 scale pointers */
    cudaEvent_t e0, e1;
    int reps;
} bench;

static int by_float(const void *x, const void *y) {
    const float a = *(const float *)x, b = *(const float *)y;
    return (a > b) - (a < b);
}

/* Median milliseconds of C[m x n] = A^T B (A k x m, B k x n) with inputs of `in_type`,
 * over the best of the heuristic's algorithms; -1 when cuBLASLt has none. */
static float time_product(bench *bm, int m, int n, int k, cudaDataType_t in_type) {
    const int fp8 = in_type == CUDA_R_8F_E4M3;
    cublasLtMatmulDesc_t desc;
    lt_check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    lt_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "TRANSA");
    lt_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "TRANSB");
    if (fp8) {
        lt_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &bm->scale, sizeof bm->scale),
                 "A_SCALE_POINTER");
        lt_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &bm->scale, sizeof bm->scale),
                 "B_SCALE_POINTER");
    }
    cublasLtMatrixLayout_t la, lb, ld;
    lt_check(cublasLtMatrixLayoutCreate(&la, in_type, k, m, k), "layout A");
    lt_check(cublasLtMatrixLayoutCreate(&lb, in_type, k, n, k), "layout B");
    lt_check(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, m, n, m), "layout D");
    cublasLtMatmulPreference_t pref;
    lt_check(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
    const size_t ws = WORKSPACE_BYTES;
    lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
             "MAX_WORKSPACE");
    cublasLtMatmulHeuristicResult_t algos[MAX_ALGOS];
    int found = 0;
    const cublasStatus_t hs =
        cublasLtMatmulAlgoGetHeuristic(bm->lt, desc, la, lb, ld, ld, pref, MAX_ALGOS, algos, &found);
    float best = -1.0f;
    const float alpha = 1.0f, beta = 0.0f;
    float *ms = malloc(sizeof *ms * (size_t)bm->reps);
    for (int i = 0; hs == CUBLAS_STATUS_SUCCESS && ms && i < found; i++) {
        int ok = 1;
        for (int r = 0; r < bm->reps && ok; r++) {
            cuda_check(cudaMemsetAsync(bm->flush, r & 0xff, FLUSH_BYTES, bm->stream), "flush");
            cuda_check(cudaEventRecord(bm->e0, bm->stream), "event");
            ok = cublasLtMatmul(bm->lt, desc, &alpha, bm->a, la, bm->b, lb, &beta, bm->d, ld, bm->d, ld,
                                &algos[i].algo, bm->workspace, WORKSPACE_BYTES, bm->stream) == CUBLAS_STATUS_SUCCESS;
            cuda_check(cudaEventRecord(bm->e1, bm->stream), "event");
            cuda_check(cudaEventSynchronize(bm->e1), "synchronize");
            cuda_check(cudaEventElapsedTime(&ms[r], bm->e0, bm->e1), "elapsed");
        }
        if (!ok) continue;
        qsort(ms, (size_t)bm->reps, sizeof *ms, by_float);
        const float med = ms[bm->reps / 2];
        if (best < 0 || med < best) best = med;
    }
    free(ms);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    return best;
}

int main(int argc, char **argv) {
    bench bm;
    memset(&bm, 0, sizeof bm);
    bm.reps = 30;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) bm.reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: gemm_fp8 [--reps N]\n");
            return 2;
        }
    }
    if (bm.reps < 1) bm.reps = 1;
    lt_check(cublasLtCreate(&bm.lt), "cublasLtCreate");
    cuda_check(cudaStreamCreate(&bm.stream), "stream");
    cuda_check(cudaEventCreate(&bm.e0), "event"), cuda_check(cudaEventCreate(&bm.e1), "event");
    /* The largest operand: GPT-2's LM head, 50304 x 16384 outputs, k up to 16384. */
    const size_t max_elems = (size_t)50304 * 16384;
    cuda_check(cudaMalloc(&bm.flush, FLUSH_BYTES), "flush buffer");
    cuda_check(cudaMalloc(&bm.workspace, WORKSPACE_BYTES), "workspace");
    cuda_check(cudaMalloc(&bm.a, max_elems * 2), "A"), cuda_check(cudaMalloc(&bm.b, max_elems * 2), "B");
    cuda_check(cudaMalloc(&bm.d, max_elems * 2), "D");
    cuda_check(cudaMalloc((void **)&bm.scale, sizeof(float)), "scale");
    /* Inputs: random bytes with the top exponent bits cleared (finite, moderate values in
     * either encoding; constant inputs would draw less power and let the clocks run higher
     * than training data does), a 64 MiB host block copied over each buffer. */
    const size_t block = (size_t)64 << 20;
    uint8_t *host = malloc(block);
    if (!host) return fprintf(stderr, "gemm_fp8: out of host memory\n"), 1;
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < block; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        host[i] = (uint8_t)(x >> 56) & 0xBB; /* no byte 0x7F/0xFF: no NaN or infinity either way */
    }
    for (size_t at = 0; at < max_elems * 2; at += block) {
        const size_t n = max_elems * 2 - at < block ? max_elems * 2 - at : block;
        cuda_check(cudaMemcpy((uint8_t *)bm.a + at, host, n, cudaMemcpyHostToDevice), "A fill");
        cuda_check(cudaMemcpy((uint8_t *)bm.b + at, host, n, cudaMemcpyHostToDevice), "B fill");
    }
    free(host);
    const float one = 1.0f;
    cuda_check(cudaMemcpy(bm.scale, &one, sizeof one, cudaMemcpyHostToDevice), "scale");
    struct cudaDeviceProp prop;
    cuda_check(cudaGetDeviceProperties(&prop, 0), "properties");
    printf("device: %s, %d reps, L2 flushed\n", prop.name, bm.reps);
    printf("%-22s %-9s %6s %6s %6s   %9s %7s   %9s %7s   %s\n", "model", "product", "m", "n", "k", "bf16 ms", "TF/s",
           "fp8 ms", "TF/s", "fp8/bf16");
    for (int c = 0; c < N_MODELS; c++) {
        const model_case *mc = &MODELS[c];
        double sum16 = 0, sum8 = 0;
        for (int l = 0; l < mc->n_layers; l++) {
            const linear *li = &mc->layers[l];
            const int shapes[3][3] = {{li->out, mc->tokens, li->in}, {li->in, mc->tokens, li->out}, {li->out, li->in, mc->tokens}};
            static const char *const what[3] = {"fwd", "dgrad", "wgrad"};
            for (int s = 0; s < 3; s++) {
                const int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
                const float t16 = time_product(&bm, m, n, k, CUDA_R_16BF), t8 = time_product(&bm, m, n, k, CUDA_R_8F_E4M3);
                const double flop = 2.0 * m * n * k;
                char label[40];
                snprintf(label, sizeof label, "%s.%s", li->name, what[s]);
                printf("%-22s %-9s %6d %6d %6d   %9.4f %7.1f   %9.4f %7.1f   %.3f\n", mc->name, label, m, n, k, t16,
                       t16 > 0 ? flop / t16 / 1e9 : 0.0, t8, t8 > 0 ? flop / t8 / 1e9 : 0.0, t16 > 0 && t8 > 0 ? t8 / t16 : 0.0);
                sum16 += li->count * (double)t16, sum8 += li->count * (double)t8;
            }
        }
        printf("%-22s step's products: bf16 %.3f ms, fp8 %.3f ms (%.3f ms less, %.2fx)\n\n", mc->name, sum16, sum8,
               sum16 - sum8, sum8 > 0 ? sum16 / sum8 : 0.0);
    }
    return 0;
}
