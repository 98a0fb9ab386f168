/* The graph under construction: a growing tensor table and op list that the model
 * builders, autodiff and the optimizer pass append to, and the memory planner turns
 * into a plan. */
#ifndef TUNEGRAPH_GRAPH_H
#define TUNEGRAPH_GRAPH_H

#include <stdint.h>

#include "base/error.h"
#include "compiler/job.h"
#include "plan/plan.h"

typedef struct tg_graph {
    tg_tensor *tensors;
    int n_tensors, cap_tensors;
    tg_op *ops;
    int n_ops, cap_ops;
    int *grad;          /* per tensor: its gradient during autodiff, -1 if none yet */
    char *needs_grad;   /* per tensor: depends on a trainable parameter */
    int *grad_holders;  /* per tensor: how many tensors have it as their gradient (grad) */
    int phase;          /* phase of ops being appended */
    /* Indexes the backward rules read instead of scanning every op per op (built by
     * tg_backward_index; tensors from n_indexed_tensors on are neither read nor made by a
     * forward op). */
    int n_indexed_tensors;
    int *forward_reads;   /* per tensor: input slots of forward ops that read it */
    int *gelu_producer;   /* per tensor: the first forward MATMUL with the GELU epilogue making it (out0), or -1 */
    /* Per tensor, over the output slots of ops[0, ops_indexed): how many write it, and the
     * last one as op * TG_OP_MAX_OUT + slot; caught up with appended ops when read. */
    int *writes, *last_write;
    int writes_cap, ops_indexed;
    int failed;         /* first error is kept in err */
    tg_err *err;
    const tg_model_config *cfg;
    const tg_job *job;
    tg_plan_io io;
    int dropout_key;    /* next dropout stream key */
    /* Data parallelism: gradient elements below it are not summed by the buckets (a table
     * whose gradient each replica scatters from every replica's rows: tg_gather_embedding_grads). */
    int64_t grads_summed_from;
    /* The job's freeze patterns (tg_job_freeze_patterns) and how many parameters each matched. */
    int n_freeze;
    char freeze[TG_JOB_FREEZE_MAX][TG_NAME_MAX];
    int freeze_hits[TG_JOB_FREEZE_MAX];
    /* LoRA: every parameter the builder makes is frozen (the base weights) but while
     * `adapter` is set (the low-rank pairs, a classification head). */
    int base_frozen, adapter;
    /* LoRA: per name of lora_targets (in order, the first 64), how many modules it adapted. */
    int lora_hits[64];
    /* LoRA: per name of lora_modules_to_save (in order, the first 64), how many parameters
     * it kept trainable. */
    int save_hits[64];
} tg_graph;

void tg_graph_init(tg_graph *g, const tg_model_config *cfg, const tg_job *job, tg_err *err);
void tg_graph_free(tg_graph *g);

/* Adds a tensor; shape is given as ndim dims, each positive, of at most TG_MAX_POOL_BYTES
 * in all (refused naming the tensor and the fields that size its pool). Returns its index,
 * or -1 after any failure of the graph. */
int tg_graph_tensor(tg_graph *g, const char *name, int dtype, int pool, int ndim, const int64_t *shape);
/* Shorthands for fp32 activations of 1..4 dims. */
int tg_act(tg_graph *g, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3);
/* A parameter with its HF name, init rule and decay flag: trainable (params pool), or frozen
 * (TG_TENSOR_FROZEN, frozen pool) when the name matches one of the job's freeze patterns. */
int tg_param(tg_graph *g, const char *name, int ndim, int64_t d0, int64_t d1, int init, int no_decay);
/* The same of any shape (up to TG_MAX_DIMS dims): a convolution's weight [out, in, k, k]. */
int tg_param_shaped(tg_graph *g, const char *name, int ndim, const int64_t *shape, int init, int no_decay);
/* With LoRA: whether some name of the job's lora_modules_to_save names the module at
 * `path` or a module holding it (an ancestor), as lora_targets name modules: the whole
 * path or its tail after a dot. Counts the names that do (g->save_hits). */
int tg_graph_saves_module(tg_graph *g, const char *path);
/* A buffer with its HF name (TG_TENSOR_BUFFER, buffers pool), of plan dtype `dtype`;
 * persistent: Hugging Face saves and loads it (else never saved, and ignored in checkpoints). */
int tg_buffer(tg_graph *g, const char *name, int dtype, int ndim, int64_t d0, int64_t d1, int init, int persistent);
/* Fails the compilation with a job error: "<where key was set>: key '<key>': <message>". */
int tg_graph_job_fail(tg_graph *g, int key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Fails naming every freeze pattern that matched no parameter; 0 when each matched one. */
int tg_graph_check_freeze(tg_graph *g);

/* A packed group: the parameters members[0..n) (in tensor order, one dtype, one class) laid
 * out back to back, seen as one parameter view `name` of the given shape (its gradient and
 * bf16 copy views follow), of the members' class and pool. Ops read the view; the members
 * keep their own names, init, decay flags and optimizer state. A freeze that takes some
 * members and not the others is a job error. Returns the view's index. */
int tg_param_pack(tg_graph *g, const char *name, const int *members, int n, int ndim, int64_t d0, int64_t d1);

/* Appends an op in the current phase. ins/outs are -1 terminated or padded; tg_op_check
 * (plan/op_meta.h) checks the slots and the tensors against the parameters. Returns the
 * op index. */
typedef struct tg_op_spec {
    int kind;
    int in[TG_OP_MAX_IN];
    int out[TG_OP_MAX_OUT];
    tg_op_params p; /* the member of the kind's parameter set */
} tg_op_spec;
int tg_graph_op(tg_graph *g, const tg_op_spec *spec);

/* Fails the compilation for want of memory (an allocation failed; not a builder bug):
 * "out of memory compiling model '<source>' (at <n> tensors and <m> ops)". */
int tg_graph_out_of_memory(tg_graph *g);

/* Fails the compilation with a size past a limit (compiler/limits.h): "<where key was set>:
 * key '<key>': <message>", or the message alone for a graph without a job. */
int tg_graph_size_fail(tg_graph *g, int key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Records an internal error once (a builder bug, not a user error). */
int tg_graph_fail(tg_graph *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
