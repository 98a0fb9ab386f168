/* The fused attention kernels measured alone: ATTENTION (forward) and ATTENTION_BWD
 * (backward) through tg_cuda_op_run on one GPU, bf16, at the shapes the benchmark cases
 * and the Llama work use. Each repetition first overwrites a 256 MiB buffer so that no
 * input is still in L2 (50 MiB on an H100), then times the op alone with a CUDA event
 * pair; the median of the repetitions is printed with the TFLOP/s of the FLOPs the
 * attention needs (forward 4 B H T^2 Dh, causal half of it; backward 2.5x the forward:
 * five T x T x Dh products, the recomputed Q K^T counted once), not of the work a kernel
 * chooses to repeat.
 *
 *   attention_kernels [--reps N] [--case NAME]...   (default: every case, 30 reps)
 *
 * Where cuDNN loads (kernels/cudnn_attention.h: TUNEGRAPH_CUDNN, TUNEGRAPH_ATTENTION) and
 * takes a case, the case runs again through cuDNN's graphs: its times beside the own
 * kernels', and the relative L2 difference of its O, LSE and dQ from theirs.
 *
 * Output: one line per case, direction and backend, and a final table row per case. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "kernels/cuda_ops.h"
#include "kernels/cudnn_attention.h"
#include "plan/memory_estimate.h"

typedef struct attn_case {
    const char *name;
    int b, h, t, dh, causal, packed;
    float p; /* attention dropout */
    int masked; /* a key mask: every 4th key masked, key 0 kept */
} attn_case;

static const attn_case CASES[] = {
    {"gpt2-b16-t1024-d64-causal", 16, 12, 1024, 64, 1, 1, 0.0f, 0},
    {"gpt2-b16-t1024-d64-causal-drop0.1", 16, 12, 1024, 64, 1, 1, 0.1f, 0},
    {"bert-b32-t128-d64", 32, 12, 128, 64, 0, 0, 0.0f, 0},
    {"bert-b32-t128-d64-drop0.1", 32, 12, 128, 64, 0, 0, 0.1f, 0},
    {"bert-b8-t512-d64", 8, 12, 512, 64, 0, 0, 0.0f, 0},
    {"bert-b8-t512-d64-drop0.1", 8, 12, 512, 64, 0, 0, 0.1f, 0},
    {"squad-b32-t384-d64-drop0.1", 32, 12, 384, 64, 0, 0, 0.1f, 0},
    {"llama-b4-t2048-d128-causal", 4, 32, 2048, 128, 1, 0, 0.0f, 0},
    {"llama-b2-t4096-d128-causal", 2, 32, 4096, 128, 1, 0, 0.0f, 0},
    {"llama8b-b1-t4096-d128-causal-packed", 1, 32, 4096, 128, 1, 1, 0.0f, 0},
    {"llama8b-b1-t4096-d128-causal-packed-masked", 1, 32, 4096, 128, 1, 1, 0.0f, 1},
    {"llama-b2-t200-d64-causal-packed-masked", 2, 8, 200, 64, 1, 1, 0.0f, 1},
};
#define N_CASES (int)(sizeof CASES / sizeof CASES[0])

#define FLUSH_BYTES ((size_t)256 << 20)

static void cuda_check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return;
    fprintf(stderr, "attention_kernels: %s: %s\n", what, cudaGetErrorString(e));
    exit(1);
}

static void *dev_alloc(size_t bytes, const char *what) {
    void *p = NULL;
    cuda_check(cudaMalloc(&p, bytes ? bytes : 16), what);
    return p;
}

/* bf16 of a float (round to nearest even), for the host-made inputs. */
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* n bf16 values, roughly normal (sum of 4 uniforms, variance 1), from a fixed LCG. */
static void *dev_random_bf16(size_t n, uint64_t seed, const char *what) {
    uint16_t *h = malloc(n * sizeof *h);
    if (!h) {
        fprintf(stderr, "attention_kernels: out of host memory for %s\n", what);
        exit(1);
    }
    uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (size_t i = 0; i < n; i++) {
        float s = 0.0f;
        for (int k = 0; k < 4; k++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            s += (float)(x >> 40) / (float)(1u << 24) - 0.5f;
        }
        h[i] = to_bf16(s * 1.7320508f);
    }
    void *d = dev_alloc(n * 2, what);
    cuda_check(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice), what);
    free(h);
    return d;
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median milliseconds of `reps` runs of op `a`, each after an L2 flush. */
static float time_op(const tg_cuda_op_args *a, int reps, void *flush, cudaStream_t s, const char *what) {
    cudaEvent_t e0, e1;
    cuda_check(cudaEventCreate(&e0), "cudaEventCreate");
    cuda_check(cudaEventCreate(&e1), "cudaEventCreate");
    float *ms = malloc((size_t)reps * sizeof *ms);
    if (!ms) exit(1);
    tg_err err = {0};
    for (int r = -2; r < reps; r++) { /* two untimed warm-up runs */
        cuda_check(cudaMemsetAsync(flush, r & 0xFF, FLUSH_BYTES, s), "L2 flush");
        cuda_check(cudaEventRecord(e0, s), "cudaEventRecord");
        if (tg_cuda_op_run(a, &err) != 0) {
            fprintf(stderr, "attention_kernels: %s: %s\n", what, err.msg);
            exit(1);
        }
        cuda_check(cudaEventRecord(e1, s), "cudaEventRecord");
        cuda_check(cudaEventSynchronize(e1), what);
        float t = 0.0f;
        cuda_check(cudaEventElapsedTime(&t, e0, e1), "cudaEventElapsedTime");
        if (r >= 0) ms[r] = t;
    }
    qsort(ms, (size_t)reps, sizeof *ms, cmp_float);
    const float med = reps % 2 ? ms[reps / 2] : 0.5f * (ms[reps / 2 - 1] + ms[reps / 2]);
    free(ms);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return med;
}

/* Relative L2 difference of two device arrays of n elements (bf16, or f32 when f32). */
static double rel_diff(const void *a, const void *b, int64_t n, int f32) {
    const size_t es = f32 ? 4 : 2;
    uint8_t *ha = malloc((size_t)n * es), *hb = malloc((size_t)n * es);
    if (!ha || !hb) exit(1);
    cuda_check(cudaMemcpy(ha, a, (size_t)n * es, cudaMemcpyDeviceToHost), "download");
    cuda_check(cudaMemcpy(hb, b, (size_t)n * es, cudaMemcpyDeviceToHost), "download");
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        float x, y;
        if (f32) {
            memcpy(&x, ha + 4 * i, 4), memcpy(&y, hb + 4 * i, 4);
        } else {
            uint32_t ux = (uint32_t)(ha[2 * i] | ha[2 * i + 1] << 8) << 16, uy = (uint32_t)(hb[2 * i] | hb[2 * i + 1] << 8) << 16;
            memcpy(&x, &ux, 4), memcpy(&y, &uy, 4);
        }
        num += ((double)x - y) * ((double)x - y), den += (double)y * y;
    }
    free(ha), free(hb);
    return !(num == num) ? INFINITY : den > 0 ? sqrt(num / den) : sqrt(num);
}

static void run_case(const attn_case *c, int reps, void *flush, cudaStream_t s, tg_cudnn_attention *dnn,
                     double *out_tf) {
    const int64_t B = c->b, H = c->h, T = c->t, Dh = c->dh, D = H * Dh, rows = B * T;
    const int W = (int)((T + 31) / 32);
    tg_op fwd, bwd;
    memset(&fwd, 0, sizeof fwd);
    fwd.kind = TG_OP_ATTENTION;
    for (int k = 0; k < TG_OP_MAX_IN; k++) fwd.in[k] = -1; /* no tensors of a plan: no key mask */
    for (int k = 0; k < TG_OP_MAX_OUT; k++) fwd.out[k] = -1;
    fwd.p.attention.b = B, fwd.p.attention.h = H, fwd.p.attention.t = T;
    fwd.p.attention.causal = c->causal, fwd.p.attention.key = 7, fwd.p.attention.packed = c->packed;
    fwd.p.attention.head_dim = Dh, fwd.p.attention.scale = 1.0f / sqrtf((float)Dh), fwd.p.attention.p = c->p;
    const int64_t qkv_cols = c->packed ? 3 * D : D;
    void *q = dev_random_bf16((size_t)(rows * qkv_cols), 1, "q");
    void *k = c->packed ? NULL : dev_random_bf16((size_t)(rows * D), 2, "k");
    void *v = c->packed ? NULL : dev_random_bf16((size_t)(rows * D), 3, "v");
    void *dout = dev_random_bf16((size_t)(rows * D), 4, "dO");
    void *o = dev_alloc((size_t)(rows * D) * 2, "O");
    float *lse = dev_alloc((size_t)(B * H * T) * 4, "LSE");
    float *delta = dev_alloc((size_t)(B * H * T) * 4, "delta");
    uint32_t *bits = c->p > 0.0f ? dev_alloc((size_t)(B * H * T * W) * 4, "keep bits") : NULL;
    void *dq = dev_alloc((size_t)(rows * qkv_cols) * 2, "dq");
    void *dk = c->packed ? NULL : dev_alloc((size_t)(rows * D) * 2, "dk");
    void *dv = c->packed ? NULL : dev_alloc((size_t)(rows * D) * 2, "dv");
    float *step = dev_alloc(4, "step");
    float *mask = NULL;
    if (c->masked) {
        float *hm = malloc((size_t)(B * T) * sizeof *hm);
        if (!hm) exit(1);
        for (int64_t i = 0; i < B * T; i++) hm[i] = i % T == 0 || i % 4 != 3 ? 1.0f : 0.0f;
        mask = dev_alloc((size_t)(B * T) * 4, "key mask");
        cuda_check(cudaMemcpy(mask, hm, (size_t)(B * T) * 4, cudaMemcpyHostToDevice), "key mask");
        free(hm);
        fwd.in[3] = 0; /* a key mask (any tensor id) */
    }
    const float one = 1.0f;
    cuda_check(cudaMemcpy(step, &one, 4, cudaMemcpyHostToDevice), "step");

    bwd = fwd;
    bwd.kind = TG_OP_ATTENTION_BWD;
    tg_cuda_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.stream = s;
    ctx.seed = 1234;
    tg_cuda_op_args fa, ba;
    memset(&fa, 0, sizeof fa);
    fa.op = &fwd, fa.ctx = &ctx, fa.training = 1;
    fa.in[0] = q, fa.in[1] = k, fa.in[2] = v, fa.in[3] = mask, fa.in[4] = c->p > 0.0f ? step : NULL;
    fa.in_numel[3] = mask ? B * T : 0;
    fa.in_dtype[0] = fa.in_dtype[1] = fa.in_dtype[2] = TG_BF16;
    fa.in_numel[0] = rows * qkv_cols, fa.in_numel[1] = fa.in_numel[2] = c->packed ? 0 : rows * D;
    fa.in_numel[4] = c->p > 0.0f ? 1 : 0;
    fa.out[0] = o, fa.out[1] = lse, fa.out[2] = bits;
    fa.out_dtype[0] = TG_BF16, fa.out_dtype[2] = TG_I32;
    fa.out_numel[0] = rows * D, fa.out_numel[1] = B * H * T, fa.out_numel[2] = bits ? B * H * T * W : 0;
    memset(&ba, 0, sizeof ba);
    ba.op = &bwd, ba.ctx = &ctx, ba.training = 1;
    ba.in[0] = dout, ba.in[1] = o, ba.in[2] = lse, ba.in[3] = mask, ba.in[4] = bits, ba.in[5] = q, ba.in[6] = k,
    ba.in[7] = v;
    ba.in_numel[3] = fa.in_numel[3];
    ba.in_dtype[0] = ba.in_dtype[1] = ba.in_dtype[5] = ba.in_dtype[6] = ba.in_dtype[7] = TG_BF16;
    ba.in_dtype[4] = TG_I32;
    ba.in_numel[0] = ba.in_numel[1] = rows * D, ba.in_numel[2] = B * H * T;
    ba.in_numel[4] = fa.out_numel[2], ba.in_numel[5] = fa.in_numel[0];
    ba.in_numel[6] = ba.in_numel[7] = fa.in_numel[1];
    ba.out[0] = dq, ba.out[1] = dk, ba.out[2] = dv, ba.out[3] = delta;
    ba.out_dtype[0] = ba.out_dtype[1] = ba.out_dtype[2] = TG_BF16;
    ba.out_numel[0] = rows * qkv_cols, ba.out_numel[1] = ba.out_numel[2] = c->packed ? 0 : rows * D;
    ba.out_numel[3] = B * H * T;

    const double fwd_flops = 4.0 * (double)B * H * T * T * Dh * (c->causal ? 0.5 : 1.0);
    const float fms = time_op(&fa, reps, flush, s, "forward");
    const float bms = time_op(&ba, reps, flush, s, "backward");
    out_tf[0] = fwd_flops / (fms * 1e-3) / 1e12;
    out_tf[1] = 2.5 * fwd_flops / (bms * 1e-3) / 1e12;
    printf("%-40s own   fwd %8.3f ms %7.1f TFLOP/s (%.3f TFLOP)   bwd %8.3f ms %7.1f TFLOP/s (%.3f TFLOP)\n", c->name,
           fms, out_tf[0], fwd_flops / 1e12, bms, out_tf[1], 2.5 * fwd_flops / 1e12);
    fflush(stdout);
    out_tf[2] = out_tf[3] = 0;
    void *o2 = NULL, *dq2 = NULL;
    float *lse2 = NULL, *scratch = NULL;
    void *ws = NULL;
    tg_err err = {0};
    if (dnn && tg_cudnn_attention_prepare(dnn, &fwd, TG_BF16, TG_MEM_GEMM_WORKSPACE_BYTES, &err) == 1 &&
        tg_cudnn_attention_prepare(dnn, &bwd, TG_BF16, TG_MEM_GEMM_WORKSPACE_BYTES, &err) == 1) {
        /* cuDNN's outputs beside the own kernels' (same inputs) */
        o2 = dev_alloc((size_t)(rows * D) * 2, "O (cuDNN)");
        lse2 = dev_alloc((size_t)(B * H * T) * 4, "LSE (cuDNN)");
        dq2 = dev_alloc((size_t)(rows * qkv_cols) * 2, "dq (cuDNN)");
        ctx.reduce_scratch_floats = (size_t)tg_cudnn_attention_scratch_floats(&bwd);
        scratch = dev_alloc(ctx.reduce_scratch_floats * 4, "dQ accumulator");
        ws = dev_alloc(TG_MEM_GEMM_WORKSPACE_BYTES, "cuDNN workspace");
        ctx.reduce_scratch = scratch, ctx.gemm_workspace = ws, ctx.gemm_workspace_bytes = TG_MEM_GEMM_WORKSPACE_BYTES;
        ctx.cudnn = dnn;
        tg_cuda_op_args fa2 = fa, ba2 = ba;
        fa2.out[0] = o2, fa2.out[1] = lse2;
        ba2.in[1] = o2, ba2.in[2] = lse2, ba2.out[0] = dq2;
        if (!c->packed) ba2.out[1] = dk, ba2.out[2] = dv;
        const float fms2 = time_op(&fa2, reps, flush, s, "forward (cuDNN)");
        const float bms2 = time_op(&ba2, reps, flush, s, "backward (cuDNN)");
        out_tf[2] = fwd_flops / (fms2 * 1e-3) / 1e12;
        out_tf[3] = 2.5 * fwd_flops / (bms2 * 1e-3) / 1e12;
        /* the own kernels' backward from cuDNN's O and LSE, for the dQ comparison */
        ba.in[1] = o2, ba.in[2] = lse2;
        ctx.cudnn = NULL;
        tg_err e2 = {0};
        if (tg_cuda_op_run(&ba, &e2)) {
            fprintf(stderr, "attention_kernels: backward: %s\n", e2.msg);
            exit(1);
        }
        cuda_check(cudaStreamSynchronize(s), "backward");
        printf("%-40s cudnn fwd %8.3f ms %7.1f TFLOP/s                  bwd %8.3f ms %7.1f TFLOP/s   "
               "rel. L2 vs own: O %.2e LSE %.2e dq %.2e\n",
               c->name, fms2, out_tf[2], bms2, out_tf[3], rel_diff(o2, o, rows * D, 0), rel_diff(lse2, lse, B * H * T, 1),
               rel_diff(dq2, dq, rows * qkv_cols, 0));
        fflush(stdout);
    } else if (dnn && err.msg[0]) {
        fprintf(stderr, "attention_kernels: %s: %s\n", c->name, err.msg);
        exit(1);
    }
    void *all[] = {q, k, v, dout, o, lse, delta, bits, dq, dk, dv, step, o2, lse2, dq2, scratch, ws, mask};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]) cudaFree(all[i]);
}

int main(int argc, char **argv) {
    int reps = 30;
    const char *only[N_CASES];
    int n_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
            if (reps < 1 || reps > 10000) {
                fprintf(stderr, "attention_kernels: --reps takes 1..10000, not %s\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--case") && i + 1 < argc && n_only < N_CASES) {
            only[n_only++] = argv[++i];
        } else {
            fprintf(stderr, "usage: attention_kernels [--reps N] [--case NAME]...\ncases:");
            for (int c = 0; c < N_CASES; c++) fprintf(stderr, " %s", CASES[c].name);
            fprintf(stderr, "\n");
            return 2;
        }
    }
    for (int j = 0; j < n_only; j++) {
        int found = 0;
        for (int c = 0; c < N_CASES; c++) found |= !strcmp(only[j], CASES[c].name);
        if (!found) {
            fprintf(stderr, "attention_kernels: no case named %s\n", only[j]);
            return 2;
        }
    }
    cudaStream_t s;
    cuda_check(cudaStreamCreate(&s), "cudaStreamCreate");
    void *flush = dev_alloc(FLUSH_BYTES, "L2 flush buffer");
    struct cudaDeviceProp prop;
    cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    printf("device: %s, bf16, median of %d runs, L2 flushed before each\n", prop.name, reps);
    tg_cudnn_attention *dnn = NULL;
    char why[256];
    tg_err err = {0};
    if (tg_cudnn_attention_open(&dnn, why, sizeof why, &err)) {
        fprintf(stderr, "attention_kernels: %s\n", err.msg);
        return 1;
    }
    char line[160];
    tg_cudnn_attention_describe(dnn, line, sizeof line);
    printf("cuDNN: %s\n", dnn ? line : why);
    double tf[N_CASES][4];
    int ran[N_CASES] = {0};
    for (int c = 0; c < N_CASES; c++) {
        int want = n_only == 0;
        for (int j = 0; j < n_only; j++) want |= !strcmp(only[j], CASES[c].name);
        if (!want) continue;
        run_case(&CASES[c], reps, flush, s, dnn, tf[c]);
        ran[c] = 1;
    }
    printf("\n| case | B | H | T | Dh | causal | dropout | fwd TFLOP/s | bwd TFLOP/s | cuDNN fwd | cuDNN bwd |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int c = 0; c < N_CASES; c++)
        if (ran[c])
            printf("| %s | %d | %d | %d | %d | %s | %.1f | %.1f | %.1f | %.1f | %.1f |\n", CASES[c].name, CASES[c].b,
                   CASES[c].h, CASES[c].t, CASES[c].dh, CASES[c].causal ? "yes" : "no", CASES[c].p, tf[c][0], tf[c][1],
                   tf[c][2], tf[c][3]);
    tg_cudnn_attention_close(dnn);
    cudaFree(flush);
    cudaStreamDestroy(s);
    return 0;
}
