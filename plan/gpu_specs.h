/* The GPUs the tool knows: the vendor's datasheet figures, by the CUDA device name. One
 * table serves model FLOP utilisation (runtime/gpu_peak.h: the dense product peaks) and
 * the cost model (plan/cost_model.h: the peaks, memory and link bandwidths). */
#ifndef TUNEGRAPH_GPU_SPECS_H
#define TUNEGRAPH_GPU_SPECS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tg_gpu_spec {
    const char *match;          /* a part of the CUDA device name */
    const char *key;            /* the cost model's name for it (`inspect --predict --gpu KEY`) */
    double half, tf32, fp32;    /* dense TFLOP/s: bf16/fp16, TF32 and FP32 (no sparsity) */
    double mem_gbps;            /* device memory bandwidth, GB/s */
    double link_gbps;           /* one direction of the link between GPUs (NVLink or PCIe), GB/s */
} tg_gpu_spec;

/* The row whose match is a part of the CUDA device name `name` (the more specific rows
 * first: an H100 PCIe is not an SXM H100); NULL when none is, or name is NULL. */
const tg_gpu_spec *tg_gpu_spec_by_name(const char *name);
/* The row whose key is `key`; NULL when none is. */
const tg_gpu_spec *tg_gpu_spec_by_key(const char *key);
/* The row at index k (0 ..), NULL past the last: every key, for messages. */
const tg_gpu_spec *tg_gpu_spec_at(int k);
/* Dense TFLOP/s of `precision`'s products (tg_precision: bf16 and fp16 on the tensor cores;
 * fp32 as TF32 when allow_tf32, else the CUDA cores). */
double tg_gpu_spec_peak_tflops(const tg_gpu_spec *s, int precision, int allow_tf32);

#ifdef __cplusplus
}
#endif
#endif
