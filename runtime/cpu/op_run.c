/* Running one op on the CPU reference: the kind -> kernel table (generated from
 * plan/ops.def, so every kind has its row) and, for ops with bf16 or fp16 slots, widening to
 * fp32, running the fp32 kernel and rounding back. */
#include <stdlib.h>
#include "base/alloc.h"

#include "runtime/cpu/cpu_kernels.h"
#include "runtime/half_convert.h"

typedef void (*tg_cpu_kernel_fn)(const tg_cpu_op_args *a);

static const tg_cpu_kernel_fn cpu_kernels[TG_OP_COUNT] = {
#define TG_OP(KIND, name, set, inputs, outputs, contract, rule, flops, group) [TG_OP_##KIND] = tg_cpu_kernel_##name,
#include "plan/ops.def"
};

int tg_cpu_op_has_kernel(int kind) { return kind >= 0 && kind < TG_OP_COUNT && cpu_kernels[kind] != NULL; } /* GCOVR_EXCL_BR_LINE: the table is generated from plan/ops.def with tg_cpu_kernel_<name> for every kind, each declared in cpu_kernels.h (a missing one fails to link) */

void tg_cpu_op_run(const tg_cpu_op_args *a) {
    /* The executor validates kinds; direct callers with a bad kind get nothing run. */
    if (tg_cpu_op_has_kernel(a->op->kind)) cpu_kernels[a->op->kind](a);
}

/* bf16 and fp16 slots: widen, run the fp32 kernel, round back. */
int tg_cpu_op_run_any(const tg_cpu_op_args *a) {
    /* The gather only moves bits: it runs on the stored values, so that no rank can fail
     * to widen and leave the others waiting in the collective. */
    if (a->op->kind == TG_OP_ALL_GATHER) {
        tg_cpu_op_run(a);
        return 0;
    }
    int any = 0;
    for (int s = 0; s < TG_OP_MAX_IN; s++) any |= a->in[s] && tg_dtype_is_half(a->in_dtype[s]);
    for (int s = 0; s < TG_OP_MAX_OUT; s++) any |= a->out[s] && tg_dtype_is_half(a->out_dtype[s]);
    if (!any) {
        tg_cpu_op_run(a);
        return 0;
    }
    tg_cpu_op_args w = *a;
    float *wide_in[TG_OP_MAX_IN] = {0}, *wide_out[TG_OP_MAX_OUT] = {0};
    int rc = 0;
    for (int s = 0; s < TG_OP_MAX_IN && !rc; s++) {
        if (!a->in[s] || !tg_dtype_is_half(a->in_dtype[s])) continue;
        if (!(wide_in[s] = tg_malloc(sizeof(float) * (size_t)a->in_numel[s]))) rc = -1;
        else tg_half_widen(a->in_dtype[s], wide_in[s], a->in[s], a->in_numel[s]), w.in[s] = wide_in[s];
    }
    for (int s = 0; s < TG_OP_MAX_OUT && !rc; s++) {
        if (!a->out[s] || !tg_dtype_is_half(a->out_dtype[s])) continue;
        /* An output that is also an input shares its widened copy. */
        for (int k = 0; k < TG_OP_MAX_IN; k++)
            if (a->in[k] == a->out[s] && wide_in[k]) w.out[s] = wide_in[k]; /* GCOVR_EXCL_BR_LINE: plan/validate.c refuses two tensors in one place while both live, so a slot sharing the output's buffer is that tensor, half and widened above */
        if (w.out[s] != a->out[s]) continue;
        /* Existing contents are widened too, for outputs the op accumulates into. */
        if (!(wide_out[s] = tg_malloc(sizeof(float) * (size_t)a->out_numel[s]))) rc = -1;
        else tg_half_widen(a->out_dtype[s], wide_out[s], a->out[s], a->out_numel[s]), w.out[s] = wide_out[s];
    }
    if (!rc) {
        tg_cpu_op_run(&w);
        for (int s = 0; s < TG_OP_MAX_OUT; s++)
            if (a->out[s] && tg_dtype_is_half(a->out_dtype[s]))
                tg_half_narrow(a->out_dtype[s], a->out[s], w.out[s], a->out_numel[s]);
    }
    for (int s = 0; s < TG_OP_MAX_IN; s++) free(wide_in[s]);
    for (int s = 0; s < TG_OP_MAX_OUT; s++) free(wide_out[s]);
    return rc;
}
