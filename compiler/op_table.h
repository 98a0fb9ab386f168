/* One row per op kind: the compiler's knowledge of each op. CPU forward kernels live in
 * runtime/cpu_ops.c, indexed by the same enum. */
#ifndef TUNEGRAPH_OP_TABLE_H
#define TUNEGRAPH_OP_TABLE_H

#include "compiler/graph.h"

/* Gradient contract of an output: overwritten (=) or accumulated into (+=). */
enum { TG_WRITE = 0, TG_ACCUMULATE = 1 };

typedef struct tg_op_row {
    /* Checks tensor element counts against the op's parameters (shape inference for
     * the builders, which compute the shapes, and a guard against their bugs). Returns
     * NULL when consistent, else what is wrong. */
    const char *(*check_shapes)(const tg_graph *g, const tg_op *op);
    /* Floating-point operations of one execution. */
    double (*flops)(const tg_op *op);
    /* Emits the backward ops of forward op `index`; NULL for ops that are not
     * differentiated (backward and optimizer ops). */
    void (*backward)(tg_graph *g, int index);
    /* Contract of each output slot. */
    int out_contract[TG_OP_MAX_OUT];
} tg_op_row;

const tg_op_row *tg_op_row_of(int kind);

/* Bytes an op reads and writes (each tensor once), for the plan's bytes per step. */
double tg_op_bytes(const tg_tensor *tensors, const tg_op *op);

#endif
