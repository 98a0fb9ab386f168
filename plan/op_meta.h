/* What the plan knows of each op kind, generated from plan/ops.def: its name, slot
 * signatures and gradient contract, the rule that checks an op against its tensors, its
 * FLOPs and bytes, and a walk over its typed parameters (printing, the plan file). The
 * compiler checks every op it emits with tg_op_check; a loaded plan can be checked the same
 * way. */
#ifndef TUNEGRAPH_OP_META_H
#define TUNEGRAPH_OP_META_H

#include <stddef.h>
#include <stdint.h>

#include "plan/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Gradient contract of an output slot: overwritten (=) or accumulated into (+=). */
enum { TG_WRITE = 0, TG_ACCUMULATE = 1 };

typedef struct tg_op_info {
    const char *name;
    const char *inputs;   /* slot signatures, one character per slot (plan/ops.def) */
    const char *outputs;
    const char *contract; /* per output slot, '=' or '+' */
    int n_params;         /* parameters of its set (0: none) */
    int group;            /* tg_op_group: the kernel group its time counts in */
} tg_op_info;

/* The row of op kind `kind`, or NULL for a kind outside the enum. */
const tg_op_info *tg_op_info_of(int kind);
/* The kind whose name (tg_op_info.name, plan/ops.def) is `name`, or -1 when none is: how a
 * plan file's op kinds, stored by name, become this build's. */
int tg_op_kind_of_name(const char *name);
/* TG_WRITE or TG_ACCUMULATE for output slot `slot` of `kind` (TG_WRITE for unused slots). */
int tg_op_out_contract(int kind, int slot);

/* What an op is checked against: the tensor table and the plan's replica count. */
typedef struct tg_op_check_ctx {
    const tg_tensor *tensors;
    int32_t n_tensors;
    int32_t replicas;
} tg_op_check_ctx;

/* 0 when the op is consistent: its kind is known, every slot index is -1 or inside the
 * table, each slot is present, absent and of the dtype its signature says, and its shape
 * rule holds (element counts and parameters agree). Else -1 with what is wrong in
 * why[0..why_len) ("in[2]: bias != N"). */
int tg_op_check(const tg_op_check_ctx *c, const tg_op *op, char *why, size_t why_len);

/* REDUCE_SCATTER's parts (plan/ops.def): of n elements viewed from element `first` of a
 * buffer cut in slices of `slice` elements, replica r's are [*lo, *lo + *len) of the view
 * (*len 0 where its slice misses the view). */
void tg_slice_part(int64_t n, int64_t first, int64_t slice, int replica, int64_t *lo, int64_t *len);

/* Floating-point operations of one execution. */
double tg_op_flops(const tg_op *op);
/* Bytes an op reads and writes (each tensor once), for the plan's bytes per step. */
double tg_op_bytes(const tg_tensor *tensors, const tg_op *op);

/* Calls the visitor on each parameter of the op kind's set, in ops.def order, with its
 * display name and a pointer into `params`. */
typedef struct tg_param_visitor {
    void *ctx;
    void (*i64)(void *ctx, const char *display, int64_t *value);
    void (*f32)(void *ctx, const char *display, float *value);
} tg_param_visitor;
void tg_op_params_visit(int kind, tg_op_params *params, const tg_param_visitor *v);

#ifdef __cplusplus
}
#endif
#endif
