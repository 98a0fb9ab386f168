#include "runtime/deferred_update.h"
#include "base/alloc.h"

#include <stdlib.h>
#include <string.h>

static int overlaps(const tg_tensor *a, const tg_tensor *b) {
    return a->pool == b->pool && a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes;
}

/* Whether tensor t overlaps any input (writes 0) or output (writes 1) of op. */
static int touches(const tg_plan *p, const tg_op *op, int t, int writes) {
    const int n = writes ? TG_OP_MAX_OUT : TG_OP_MAX_IN;
    const int32_t *slots = writes ? op->out : op->in;
    for (int s = 0; s < n; s++)
        if (slots[s] >= 0 && overlaps(&p->tensors[t], &p->tensors[slots[s]])) return 1;
    return 0;
}

static int64_t round_up4(int64_t v) { return (v + 3) / 4 * 4; }

int tg_deferred_update_plan(const tg_plan *p, int64_t min_chunk, tg_deferred_update *u, tg_err *err) {
    memset(u, 0, sizeof *u);
    const int f0 = p->phase_begin[TG_PHASE_FORWARD], f1 = p->phase_begin[TG_PHASE_FORWARD + 1];
    const int last = p->n_ops - 1;
    if (last < 0 || !tg_op_is_update(p->ops[last].kind)) return 0;
    for (int o = 0; o < last; o++)
        if (tg_op_is_update(p->ops[o].kind)) return 0;
    const tg_op *adam = &p->ops[last];
    const int64_t n = adam->p.adamw.n;
    if (n <= 0) return 0;
    int64_t *need = tg_calloc((size_t)(f1 - f0) + 1, sizeof *need);
    if (!need) return tg_fail(err, "out of memory planning the deferred optimizer update");
    /* need[j]: the parameter prefix forward op j reads, rounded to whole vectors. A forward
     * op that writes what the update reads or writes, or reads optimizer state, cannot
     * run beside it. */
    int64_t prefix = 0;
    for (int o = f0; o < f1; o++) {
        const tg_op *op = &p->ops[o];
        for (int s = 0; s < TG_OP_MAX_OUT; s++)
            if (op->out[s] >= 0 && (touches(p, adam, op->out[s], 0) || touches(p, adam, op->out[s], 1))) goto no;
        for (int s = 0; s < TG_OP_MAX_IN; s++) {
            const int t = op->in[s];
            if (t < 0 || !touches(p, adam, t, 1)) continue;
            const tg_tensor *x = &p->tensors[t];
            if (x->pool != TG_POOL_PARAMS && x->pool != TG_POOL_PARAMS_BF16) goto no;
            const int64_t size = tg_dtype_size(x->dtype);
            int64_t end = round_up4((int64_t)(x->offset + x->bytes + (uint64_t)size - 1) / size);
            if (end > n) end = n;
            if (end > prefix) prefix = end;
        }
        need[o - f0] = prefix;
    }
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
