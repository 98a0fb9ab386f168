/* CPU reference: EMBEDDING and its backward. */
#include <string.h>

#include "runtime/cpu/cpu_kernels.h"

void tg_cpu_kernel_embedding(const tg_cpu_op_args *a) {
    const tg_embedding_params *ep = &a->op->p.embedding;
    int64_t N = ep->n, V = ep->vocab, D = ep->dim;
    const int32_t *ids = CI32(a->in[0]);
    const float *table = CF32(a->in[1]);
    float *y = F32(a->out[0]);
    for (int64_t n = 0; n < N; n++) {
        int32_t id = ids[n];
        if (id >= 0 && id < V) /* out-of-range ids read as a zero row instead of faulting */
            memcpy(y + n * D, table + (int64_t)id * D, (size_t)D * 4);
        else
            memset(y + n * D, 0, (size_t)D * 4);
    }
}

/* Each chunk owns a range of table rows and scans the ids in order, so every row's sum
 * has a fixed order whatever the thread count. */
static void embedding_bwd_range(void *p, int64_t vb, int64_t ve) {
    const tg_cpu_op_args *a = p;
    const tg_embedding_params *ep = &a->op->p.embedding;
    int64_t N = ep->n, D = ep->dim, pad = ep->padding_idx;
    const int32_t *ids = CI32(a->in[0]);
    const float *dy = CF32(a->in[1]);
    float *dt = F32(a->out[0]);
    for (int64_t n = 0; n < N; n++) {
        int64_t id = ids[n];
        if (id < vb || id >= ve || id == pad) continue; /* nn.Embedding(padding_idx) */
        float *row = dt + id * D;
        const float *g = dy + n * D;
        for (int64_t d = 0; d < D; d++) row[d] += g[d];
    }
}

void tg_cpu_kernel_embedding_bwd(const tg_cpu_op_args *a) {
    tg_parallel_for(a->threads, a->op->p.embedding.vocab, embedding_bwd_range, (void *)a);
}
