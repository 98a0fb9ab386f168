#include "runtime/deferred_update.h"
#include "base/alloc.h"
#include "plan/grad_hold.h"

#include <stdlib.h>
#include <string.h>

int tg_deferred_update_plan(const tg_plan *p, int64_t min_chunk, tg_deferred_update *u, tg_err *err) {
    memset(u, 0, sizeof *u);
    const int f0 = p->phase_begin[TG_PHASE_FORWARD], f1 = p->phase_begin[TG_PHASE_FORWARD + 1];
    if (p->n_ops < 1 || f1 < f0) return 0;
    int64_t *need = tg_calloc((size_t)(f1 - f0) + 1, sizeof *need);
    if (!need) return tg_fail(err, "out of memory planning the deferred optimizer update");
    /* need[j]: the parameter prefix forward op j reads (and, with the gradients in the
     * activation pool, the gradients it overwrites), whole vectors (plan/grad_hold.h). */
    const uint64_t shared = p->grads_share_activations ? p->pool_bytes[TG_POOL_GRADS] : 0;
    if (!tg_update_read_prefix(p->tensors, p->ops, p->n_ops, f0, f1, shared, need)) goto no;
    const int last = p->n_ops - 1;
    const int64_t n = p->ops[last].p.adamw.n;
    /* Chunk boundaries where the prefix grows, merged forward until each chunk holds at
     * least min_chunk elements; what the forward never reads joins the last chunk. */
    u->begin = tg_calloc((size_t)(f1 - f0) + 2, sizeof *u->begin);
    u->chunks_before = tg_calloc((size_t)(f1 - f0) + 1, sizeof *u->chunks_before);
    if (!u->begin || !u->chunks_before) {
        free(need);
        tg_deferred_update_free(u);
        return tg_fail(err, "out of memory planning the deferred optimizer update");
    }
    u->adamw_op = last;
    u->n_forward = f1 - f0;
    int k = 0; /* chunks closed so far; begin[k] is the open chunk's start */
    for (int j = 0; j < f1 - f0; j++) {
        if (need[j] > u->begin[k]) {
            int64_t end = need[j];
            for (int j2 = j + 1; end - u->begin[k] < min_chunk && j2 < f1 - f0; j2++) end = need[j2];
            if (end - u->begin[k] < min_chunk || n - end < min_chunk) end = n;
            u->begin[++k] = end;
        }
        u->chunks_before[j] = k;
    }
    if (u->begin[k] < n) u->begin[++k] = n;
    u->n_chunks = k;
    free(need);
    return 1;
no:
    free(need);
    return 0;
}

void tg_deferred_update_free(tg_deferred_update *u) {
    free(u->begin);
    free(u->chunks_before);
    memset(u, 0, sizeof *u);
}
