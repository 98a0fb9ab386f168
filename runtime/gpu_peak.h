/* The dense matrix-product peak of the GPUs the tool knows, for model FLOP utilisation
 * (MFU): the vendor's datasheet figure without sparsity, by the CUDA device name. */
#ifndef TUNEGRAPH_GPU_PEAK_H
#define TUNEGRAPH_GPU_PEAK_H

/* TFLOP/s of `precision`'s products (tg_precision: bf16 and fp16 on the tensor cores; fp32
 * as TF32 when allow_tf32, else the CUDA cores) on the GPU named `name`; 0 when unknown. */
double tg_gpu_dense_peak_tflops(const char *name, int precision, int allow_tf32);

#endif
