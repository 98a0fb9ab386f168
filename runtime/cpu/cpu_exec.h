/* The CPU fp32 reference executor: runs any plan, op by op, in schedule order. It is the
 * oracle the CUDA kernels are tested against. */
#ifndef TUNEGRAPH_CPU_EXEC_H
#define TUNEGRAPH_CPU_EXEC_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "runtime/comm.h"
#include "base/error.h"
#include "plan/plan.h"

typedef struct tg_threadpool tg_threadpool;

typedef struct tg_cpu_exec {
    const tg_plan *plan;
    uint8_t *pool[TG_POOL_COUNT];  /* 64-byte aligned, zero-filled at init */
    uint64_t seed;                 /* dropout stream seed (the run's seed) */
    int training;                  /* 0: dropout is the identity (eval) */
    tg_threadpool *threads;
    tg_cpu_comm_group *comm;       /* data-parallel replicas (ALL_REDUCE), or NULL: one */
    int rank;
} tg_cpu_exec;

/* Allocates every pool of the plan. threads <= 0: one per online core. */
int tg_cpu_exec_init(tg_cpu_exec *x, const tg_plan *plan, int threads, tg_err *err);
void tg_cpu_exec_free(tg_cpu_exec *x);

/* Runs ops [first, last) of the schedule. */
int tg_cpu_exec_range(tg_cpu_exec *x, int first, int last, tg_err *err);
/* Runs every op of phases [first_phase, last_phase]. */
int tg_cpu_exec_phases(tg_cpu_exec *x, int first_phase, int last_phase, tg_err *err);

/* Address of a tensor's storage. */
void *tg_cpu_tensor(const tg_cpu_exec *x, int tensor);

/* Runs one op given explicit buffers: ins/outs are indexed like op->in/op->out.
 * Used by the executor and by op-level tests that build ops without a plan. */
typedef struct tg_cpu_op_args {
    const tg_op *op;
    void *in[TG_OP_MAX_IN];
    void *out[TG_OP_MAX_OUT];
    int64_t out_numel[TG_OP_MAX_OUT];   /* element count of each output (for ZERO/FILL) */
    int64_t in_numel[TG_OP_MAX_IN];
    int8_t in_dtype[TG_OP_MAX_IN];      /* tg_dtype of each slot; TG_F32 where unused */
    int8_t out_dtype[TG_OP_MAX_OUT];
    uint64_t seed;
    int training;
    const tg_plan *plan;                /* ADAMW walks the plan's parameter table */
    tg_threadpool *threads;             /* may be NULL: run on the calling thread */
    tg_cpu_comm_group *comm;            /* ALL_REDUCE's replicas, or NULL (one) */
    int rank;                           /* this replica's index in comm */
    /* Set by a kernel whose scratch memory could not be allocated (on any thread of the
     * op): the executor then fails the op with out of memory. NULL (a direct caller): the
     * kernel aborts instead. */
    atomic_int *out_of_memory;
} tg_cpu_op_args;

/* Called by a kernel (or one of its ranges) whose scratch allocation failed, which then
 * returns without computing: see tg_cpu_op_args.out_of_memory. */
static inline void tg_cpu_op_out_of_memory(const tg_cpu_op_args *a) {
    if (!a->out_of_memory) abort();
    atomic_store(a->out_of_memory, 1);
}

void tg_cpu_op_run(const tg_cpu_op_args *a);
/* 1 when op kind `kind` has a CPU reference kernel: every kind of plan/ops.def (the
 * table is generated from it), 0 outside the enum. */
int tg_cpu_op_has_kernel(int kind);

/* As tg_cpu_op_run, for ops with bf16 slots too: bf16 inputs are widened to fp32, the
 * fp32 kernel runs, and bf16 outputs are rounded back to nearest even, which is what a
 * bf16 kernel computing in fp32 does. Returns -1 only when out of memory. */
int tg_cpu_op_run_any(const tg_cpu_op_args *a);

#endif
