#include "runtime/deferred_update.h"
#include "base/alloc.h"
#include "plan/grad_hold.h"
#include "plan/op_meta.h"

#include <stdlib.h>
#include <string.h>

int64_t tg_deferred_update_min_chunk(int64_t n) {
    int64_t min_chunk = n / 16 > 4096 ? n / 16 : 4096;
    return min_chunk > (1 << 21) ? (1 << 21) : min_chunk;
}

/* The plan's update op and, with ZeRO-1, the gathers after it (plan/grad_hold.h) into u;
 * -1 where the schedule does not end so. */
static int find_update(const tg_plan *p, tg_deferred_update *u) {
    const int o = tg_update_op_deferrable(p, u->gather_op, &u->n_gathers);
    if (o >= 0 && u->n_gathers) {
        u->zero_slice = p->ops[o].p.adamw.zero_slice;
        u->replicas = p->train.replicas;
        u->gather_end = u->zero_slice * p->train.replicas;
    }
    return o;
}

int tg_deferred_update_plan(const tg_plan *p, int64_t min_chunk, tg_deferred_update *u, tg_err *err) {
    memset(u, 0, sizeof *u);
    const int f0 = p->phase_begin[TG_PHASE_FORWARD], f1 = p->phase_begin[TG_PHASE_FORWARD + 1];
    if (p->n_ops < 1 || f1 < f0) return 0;
    const int update = find_update(p, u);
    if (update < 0) {
        memset(u, 0, sizeof *u);
        return 0;
    }
    int64_t *need = tg_calloc((size_t)(f1 - f0) + 1, sizeof *need);
    if (!need) {
        memset(u, 0, sizeof *u);
        return tg_fail(err, "out of memory planning the deferred optimizer update");
    }
    /* need[j]: the parameter prefix forward op j reads (and, with the gradients in the
     * activation pool, the gradients it overwrites), whole vectors (plan/grad_hold.h); the
     * schedule as far as the update, the ZeRO-1 gathers after it being the update's. */
    const uint64_t shared = p->grads_share_activations ? p->pool_bytes[TG_POOL_GRADS] : 0;
    if (!tg_update_read_prefix(p->tensors, p->ops, update + 1, f0, f1, shared, need)) goto no;
    const int64_t n = p->ops[update].p.adamw.n;
    /* Chunk boundaries where the prefix grows, merged forward until each chunk holds at
     * least min_chunk elements; what the forward never reads joins the last chunk. */
    u->begin = tg_calloc((size_t)(f1 - f0) + 2, sizeof *u->begin);
    u->chunks_before = tg_calloc((size_t)(f1 - f0) + 1, sizeof *u->chunks_before);
    if (!u->begin || !u->chunks_before) {
        free(need);
        tg_deferred_update_free(u);
        return tg_fail(err, "out of memory planning the deferred optimizer update");
    }
    u->adamw_op = update;
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
    memset(u, 0, sizeof *u);
    return 0;
}

void tg_deferred_update_free(tg_deferred_update *u) {
    free(u->begin);
    free(u->chunks_before);
    memset(u, 0, sizeof *u);
}

void tg_deferred_update_own(const tg_deferred_update *u, int k, int replica, int64_t *lo, int64_t *hi) {
    *lo = u->begin[k], *hi = u->begin[k + 1];
    if (u->zero_slice <= 0) return;
    int64_t at, len;
    tg_slice_part(*hi - *lo, *lo, u->zero_slice, replica, &at, &len);
    *lo += at, *hi = *lo + len;
}

int tg_deferred_update_share(const tg_deferred_update *u, int k, tg_deferred_share *out) {
    if (u->zero_slice <= 0) return 0;
    const int64_t a = u->begin[k], b = k == u->n_chunks - 1 ? u->gather_end : u->begin[k + 1];
    int n = 0;
    for (int r = 0; r < u->replicas; r++) {
        int64_t at, len;
        tg_slice_part(b - a, a, u->zero_slice, r, &at, &len);
        if (len > 0) out[n++] = (tg_deferred_share){r, a + at, a + at + len};
    }
    return n;
}
