/* The closed set of operations a plan may contain: the op kinds and their typed parameters,
 * generated from the one list in plan/ops.def (which documents every op's slots and
 * parameters). Each table indexed by the kind is generated from that list too, so an op
 * cannot be added without a row everywhere it needs one. */
#ifndef TUNEGRAPH_OPS_H
#define TUNEGRAPH_OPS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TG_OP_MAX_IN 8
#define TG_OP_MAX_OUT 4
/* GRAD_NORM and GRAD_SQUARES sum squares by blocks of this many gradient elements (ZeRO-1's
 * slices are whole blocks, so a replica's shard of the norm is whole blocks too). */
#define TG_NORM_BLOCK 4096

/* The kernel groups a profile adds op time into: each op's is its plan/ops.def row's. */
typedef enum tg_op_group {
    TG_GROUP_MATMUL,
    TG_GROUP_ATTENTION,
    TG_GROUP_NORM,      /* normalisation and elementwise */
    TG_GROUP_EMBEDDING,
    TG_GROUP_LOSS,
    TG_GROUP_OPTIMIZER,
    TG_GROUP_MEMORY,    /* copies and fills */
    TG_GROUP_COMM,      /* communication between replicas */
    TG_GROUP_COUNT
} tg_op_group;

typedef enum tg_op_kind {
#define TG_OP(KIND, name, set, inputs, outputs, contract, rule, flops, group) TG_OP_##KIND,
#include "plan/ops.def"
    TG_OP_COUNT
} tg_op_kind;

/* One struct per parameter set: tg_matmul_params, tg_layernorm_params, ... */
#define TG_I(field, display) int64_t field;
#define TG_F(field, display) float field;
#define TG_PARAMS(set, fields) typedef struct tg_##set##_params { fields } tg_##set##_params;
#include "plan/ops.def"
#undef TG_I
#undef TG_F

/* An op's parameters: the member named by its row's set (none: no member is used). */
typedef union tg_op_params {
#define TG_PARAMS(set, fields) tg_##set##_params set;
#include "plan/ops.def"
} tg_op_params;

/* One scheduled operation: reads in[0..] and writes out[0..] (tensor indices; unused slots
 * hold -1), with the parameters of its kind. */
typedef struct tg_op {
    int32_t kind;            /* tg_op_kind */
    int32_t phase;           /* tg_phase */
    int32_t in[TG_OP_MAX_IN];
    int32_t out[TG_OP_MAX_OUT];
    tg_op_params p;
} tg_op;


/* tg_gelu_params.form */
enum { TG_GELU_ERF = 0, TG_GELU_TANH = 1 };
/* TG_OP_MATMUL's activation epilogue (tg_matmul_params.activation). */
enum { TG_MATMUL_ACT_NONE = 0, TG_MATMUL_ACT_GELU = 1, TG_MATMUL_ACT_GELU_BWD = 2 };
/* tg_schedule_params.form: the learning-rate schedule after the warm-up (kernels/lr_schedule.h). */
enum { TG_LR_LINEAR = 0, TG_LR_COSINE = 1, TG_LR_CONSTANT = 2, TG_LR_SCHEDULE_COUNT };
/* An optimizer's update op (ADAMW or ADAN): they share slots and their parameters' common
 * leading fields (n, zero_slice, beta1, beta2, eps, weight_decay, max_grad_norm), which
 * op->p.adamw reads for either. */
static inline int tg_op_is_update(int kind) { return kind == TG_OP_ADAMW || kind == TG_OP_ADAN; }
/* The sums of gradients over the replicas: ALL_REDUCE, or ZeRO-1's REDUCE_SCATTER. */
static inline int tg_op_is_sum(int kind) { return kind == TG_OP_ALL_REDUCE || kind == TG_OP_REDUCE_SCATTER; }
#ifndef __cplusplus
#include <stddef.h>
_Static_assert(offsetof(tg_adan_params, max_grad_norm) == offsetof(tg_adamw_params, max_grad_norm) &&
                   offsetof(tg_adan_params, zero_slice) == offsetof(tg_adamw_params, zero_slice),
               "ADAN's parameters must begin with ADAMW's");
#endif
/* tg_select_params.mode */
enum { TG_SELECT_FIRST = 0, TG_SELECT_LAST_NON_PAD = 1 };

/* The label value that excludes a row from the loss (HF / torch ignore_index). */
#define TG_IGNORE_INDEX (-100)
/* In an LM batch handed to a training step: a row whose first label is this has the rest
 * of its labels derived by the step from its ids and mask (labels[t] = ids[t + 1] while
 * token t + 1 is real, else TG_IGNORE_INDEX), so the host need not write them. */
#define TG_LABELS_FROM_IDS (-2147483647 - 1)
/* A question-answering batch's answer position that counts for nothing: SPAN_LOSS ignores
 * any position at T or past it, as HF does; padding rows of a batch carry this one. */
#define TG_SPAN_NONE 2147483647

#ifdef __cplusplus
}
#endif
#endif
