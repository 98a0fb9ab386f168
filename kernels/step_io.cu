/* Step bookkeeping kernels: the graph nodes around the schedule of a captured training
 * step (kernels/cuda_ops.h describes the batch pipeline they form). They move a few
 * hundred kilobytes at most, so they are written for latency, not bandwidth. */
#include "kernels/cuda_common.cuh"

#define FETCH_THREADS 1024

__global__ void stamp_kernel(tg_step_report *report, int k, const long long *seq) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    report->step[*seq % TG_STEP_RING].stamps[k] = t;
}

/* Copies `bytes` from src to dst, 16 bytes per access where both are 16-byte aligned
 * (the staging slots and the inputs pool are 256-byte aligned; host images from
 * cudaHostAlloc are page aligned). */
static __device__ void copy_bytes(uint8_t *dst, const uint8_t *src, size_t bytes) {
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    size_t vecs = ((((uintptr_t)dst | (uintptr_t)src) & 15) == 0) ? bytes / 16 : 0;
    for (size_t i = tid; i < vecs; i += stride) ((uint4 *)dst)[i] = ((const uint4 *)src)[i];
    for (size_t i = vecs * 16 + tid; i < bytes; i += stride) dst[i] = src[i];
}

__global__ void take_batch_kernel(const uint8_t *staging, size_t stride, uint8_t *inputs, size_t bytes,
                                  const long long *seq) {
    copy_bytes(inputs, staging + (size_t)(*seq & 1) * stride, bytes);
}

/* By one block, after the image is in place: each row marked TG_LABELS_FROM_IDS gets
 * labels[t] = ids[t + 1] while token t + 1 is real (mask != 0), else TG_IGNORE_INDEX, as
 * the host's batch fill would have written (datasets/batch.c). The marks are read, a
 * chunk of rows at a time, before any of their labels is written over. */
static __device__ void derive_label_rows(uint8_t *image, tg_lm_label_rows r) {
    __shared__ unsigned char marked[FETCH_THREADS];
    const int32_t *ids = (const int32_t *)(image + r.ids);
    const float *mask = (const float *)(image + r.mask);
    int32_t *labels = (int32_t *)(image + r.labels);
    const size_t T = (size_t)r.seq;
    for (int r0 = 0; r0 < r.rows; r0 += FETCH_THREADS) {
        const int n = r.rows - r0 < FETCH_THREADS ? r.rows - r0 : FETCH_THREADS;
        __syncthreads(); /* the copy, or the last chunk's labels, are complete */
        for (int i = threadIdx.x; i < n; i += blockDim.x) marked[i] = labels[(size_t)(r0 + i) * T] == TG_LABELS_FROM_IDS;
        __syncthreads();
        for (size_t e = threadIdx.x; e < (size_t)n * T; e += blockDim.x) {
            const size_t b = e / T, t = e - b * T;
            if (!marked[b]) continue;
            const size_t k = (size_t)r0 * T + e;
            labels[k] = t + 1 < T && mask[k + 1] != 0.0f ? ids[k + 1] : TG_IGNORE_INDEX;
        }
    }
}

/* Reads the host image over the bus (one block, see tg_cuda_fetch_batch). */
__global__ void fetch_batch_kernel(const tg_step_ctrl *ctrl, uint8_t *staging, size_t stride, size_t bytes,
                                   const long long *seq, tg_lm_label_rows label_rows) {
    const uint8_t *src = (const uint8_t *)((volatile const tg_step_ctrl *)ctrl)->next_batch[*seq % TG_STEP_RING];
    if (!src) return;
    uint8_t *dst = staging + (size_t)((*seq + 1) & 1) * stride;
    copy_bytes(dst, src, bytes);
    derive_label_rows(dst, label_rows);
}

__global__ void label_rows_kernel(uint8_t *image, tg_lm_label_rows label_rows) { derive_label_rows(image, label_rows); }

/* The statistics first, then (after a system-wide fence) the count the host waits for,
 * so the host never reads a step's record before it is complete. */
__global__ void step_end_kernel(const float *loss, const float *lr, const float *norm, const float *loss_scale,
                                tg_step_report *report, long long *seq, int *update_due) {
    if (update_due) *update_due = 1;
    tg_step_record *r = &report->step[*seq % TG_STEP_RING];
    r->loss = *loss, r->lr = *lr, r->grad_norm = *norm;
    r->loss_scale = loss_scale ? *loss_scale : 0.0f;
    long long done = *seq + 1;
    __threadfence_system();
    *(volatile unsigned long long *)&report->done = (unsigned long long)done;
    *seq = done;
}

__global__ void loss_window_kernel(const float *loss, float *sum, int first) { *sum = first ? *loss : *sum + *loss; }

static int launched(void) { return cudaGetLastError() == cudaSuccess ? 0 : -1; }

static unsigned copy_blocks(size_t bytes) {
    size_t blocks = (bytes / 16 + 255) / 256;
    return (unsigned)(blocks < 1 ? 1 : blocks > 64 ? 64 : blocks);
}

__global__ void set_flag_kernel(int *flag, int value) { *flag = value; }

extern "C" int tg_cuda_set_flag(int *flag, int value, cudaStream_t s) {
    set_flag_kernel<<<1, 1, 0, s>>>(flag, value);
    return launched();
}

extern "C" int tg_cuda_stamp(tg_step_report *report, int k, const long long *seq, cudaStream_t s) {
    stamp_kernel<<<1, 1, 0, s>>>(report, k, seq);
    return launched();
}

extern "C" int tg_cuda_take_batch(const uint8_t *staging, size_t stride, uint8_t *inputs, size_t bytes,
                                  const long long *seq, cudaStream_t s) {
    take_batch_kernel<<<copy_blocks(bytes), 256, 0, s>>>(staging, stride, inputs, bytes, seq);
    return launched();
}

extern "C" int tg_cuda_fetch_batch(const tg_step_ctrl *ctrl, uint8_t *staging, size_t stride, size_t bytes,
                                   const long long *seq, tg_lm_label_rows label_rows, cudaStream_t s) {
    /* One block: reads of mapped host memory are slow whatever the grid (64 KB took 130 us
     * on 64 blocks, 32 us on one), and a single block leaves the other SMs to the forward
     * beside it. */
    fetch_batch_kernel<<<1, FETCH_THREADS, 0, s>>>(ctrl, staging, stride, bytes, seq, label_rows);
    return launched();
}

extern "C" int tg_cuda_derive_label_rows(uint8_t *image, tg_lm_label_rows label_rows, cudaStream_t s) {
    if (!label_rows.rows) return 0;
    label_rows_kernel<<<1, FETCH_THREADS, 0, s>>>(image, label_rows);
    return launched();
}

extern "C" int tg_cuda_loss_window(const float *loss, float *sum, int first, cudaStream_t s) {
    loss_window_kernel<<<1, 1, 0, s>>>(loss, sum, first);
    return launched();
}

extern "C" int tg_cuda_step_end(const float *loss, const float *lr, const float *norm, const float *loss_scale,
                                tg_step_report *report, long long *seq, int *update_due, cudaStream_t s) {
    step_end_kernel<<<1, 1, 0, s>>>(loss, lr, norm, loss_scale, report, seq, update_due);
    return launched();
}
