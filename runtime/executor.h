/* One interface over the executors (CPU reference, CUDA), so the trainer, the CLI and the
 * tests run a plan the same way on either. */
#ifndef TUNEGRAPH_EXECUTOR_H
#define TUNEGRAPH_EXECUTOR_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "plan/plan.h"

typedef enum tg_device { TG_DEVICE_CPU = 0, TG_DEVICE_CUDA } tg_device;

/* What a training step reports back to the host. */
/* The most gradient buckets a step's timeline tells apart (tg_step_result). */
#define TG_COMM_TIMELINE_MAX 32

typedef struct tg_step_result {
    float loss;
    float lr;          /* the learning rate the step used */
    float grad_norm;   /* before clipping */
    float loss_scale;  /* fp16 plans: the dynamic loss scale after the step; 0 in others */
    /* ms of the step's phases: batch in place, forward, backward, optimizer (device time
     * where the executor measures it). */
    float phase_ms[4];
    /* ms from the end of the step waited for before this one to this one's end, on the
     * device's clock; -1 where unknown (the first step, or an executor without one). */
    float period_ms;
    /* Data parallelism (CUDA): the step's gradient-bucket sums, bucket j's begin and end in
     * ms from the end of the backward (negative: beside it); buckets from
     * TG_COMM_TIMELINE_MAX - 1 on share the last entry. comm_buckets 0: none measured. */
    int comm_buckets;
    float comm_begin_ms[TG_COMM_TIMELINE_MAX], comm_end_ms[TG_COMM_TIMELINE_MAX];
} tg_step_result;

/* Micro-steps per training step: the plan's grad_accumulation (1 without). A training
 * step's host image then holds that many images of the inputs pool back to back, one per
 * micro-batch; the step runs forward and backward on each in turn (the gradients adding
 * up), then the optimizer phase once, and reports the sum of the micro-steps' losses
 * (each already divided by the window's count, io.loss_norm: the window's mean). */
static inline int tg_executor_micro_steps(const tg_plan *plan) {
    return plan->train.grad_accumulation > 1 ? plan->train.grad_accumulation : 1;
}

/* The dropout seed of micro-step `micro` of a step: the executor's own for the first, so
 * that a plan without accumulation draws what it always drew; another stream for each
 * later one, so that the micro-batches of one window do not share their masks. */
static inline uint64_t tg_micro_step_seed(uint64_t seed, int micro) {
    return seed + (uint64_t)micro * 0xD1B54A32D192ED03ull;
}

typedef struct tg_executor_vtbl {
    const char *name;
    /* Runs phases [first, last]; training 0 turns dropout off. */
    int (*run)(void *impl, int first_phase, int last_phase, int training, tg_err *err);
    /* Copies a whole tensor between host memory and the executor. */
    int (*write)(void *impl, int tensor, const void *host, tg_err *err);
    int (*read)(void *impl, int tensor, void *host, tg_err *err);
    /* Host memory for input staging: page-locked on CUDA, so uploads run asynchronously. */
    void *(*host_alloc)(void *impl, size_t bytes);
    void (*host_free)(void *impl, void *p);
    /* Starts `steps` training steps (forward, backward, optimizer), in order: step j on
     * batches[j], a host image of the whole inputs pool from host_alloc (with
     * grad_accumulation, tg_executor_micro_steps such images back to back). batches[steps]
     * (or NULL) is the image of the step after the last, already filled. Every image must
     * stay unchanged until its steps have been waited for. On CUDA a start replays captured
     * graphs (a start of step_group steps launches one graph holding them all; other starts
     * one graph per step), each step fetching its following batch on a branch beside its
     * forward, so a later start whose first
     * batch is the last one's batches[steps] uploads nothing, and the host is free to
     * prepare the batch after that meanwhile. LM label rows whose first label is
     * TG_LABELS_FROM_IDS are derived from the row's ids and mask where lm_label_rows says
     * so (datasets/dataset.h). */
    int (*step_start)(void *impl, const void *const *batches, int steps, tg_err *err);
    /* Waits for the oldest step in flight and fills its statistics. */
    int (*step_wait)(void *impl, tg_step_result *result, tg_err *err);
    /* Times each op of the schedule, run one by one (a full training step each repeat, on
     * the inputs already uploaded): op_ms[op index], mean over repeats. */
    int (*profile)(void *impl, int repeats, double *op_ms, tg_err *err);
    void (*close)(void *impl);
    /* Makes bucket k of the plan (tg_plan_bucket; 0 .. train.n_buckets - 1) the one that
     * run, step_start and profile run, and that read and write place tensors by (a bucket
     * plan's tensors are the plan's, index for index). Steps of another bucket may still be
     * in flight: they finish as started, and step_wait hands out every step in order
     * whatever its bucket. An executor opens on the last bucket (the plan itself). On CUDA
     * each bucket has its own captured graphs (captured on the bucket's first use, after a
     * GEMM tuning pass of its shapes), all on the one set of pools. */
    int (*select_bucket)(void *impl, int bucket, tg_err *err);
    /* Steps that may be started before the oldest is waited for (1: one at a time). */
    int max_in_flight;
    /* Steps one start runs most cheaply together (1: starting several gains nothing). */
    int step_group;
    /* step_start derives the labels of LM rows marked TG_LABELS_FROM_IDS itself. Never for
     * a plan with length buckets (the CUDA executor opens those with a table saying 0): a
     * step fetches the next batch before the host selects its bucket, so it cannot know
     * where that batch's labels lie; every label is written by the host. */
    int lm_label_rows;
} tg_executor_vtbl;

typedef struct tg_executor {
    const tg_plan *plan;
    const tg_executor_vtbl *vt;
    void *impl;
    tg_device device;
} tg_executor;

typedef struct tg_executor_options {
    tg_device device;
    int threads;       /* CPU: worker threads, <= 0 one per core */
    int use_graphs;    /* CUDA: capture the train step and the eval forward once, replay */
    uint64_t seed;     /* dropout stream seed */
    /* Plans with data_parallel > 1: this replica's rank, and the communicator joining the
     * replicas: a tg_cpu_comm_group (CPU) or one from tg_cuda_comms_create (CUDA, which
     * also runs the replica on GPU `rank`). Ignored for one replica. */
    int rank;
    void *comm;
} tg_executor_options;

/* Opens an executor for the plan with every pool zeroed, on its last length bucket (the
 * plan itself). A plan with buckets must hold them as plan.h says (counts and pool sizes
 * are checked here). */
int tg_executor_open(tg_executor *ex, const tg_plan *plan, const tg_executor_options *opts, tg_err *err);
void tg_executor_close(tg_executor *ex);

static inline int tg_executor_run(tg_executor *ex, int first, int last, int training, tg_err *err) {
    return ex->vt->run(ex->impl, first, last, training, err);
}
/* The plan's length buckets: train.n_buckets, or 1 for a plan without any. */
int tg_executor_bucket_count(const tg_plan *plan);
/* 0 when `bucket` is one of the plan's (0 .. tg_executor_bucket_count - 1), else -1 with a
 * message; every executor's select_bucket checks with it. */
int tg_executor_check_bucket(const tg_plan *plan, int bucket, tg_err *err);

static inline int tg_executor_select_bucket(tg_executor *ex, int bucket, tg_err *err) {
    return ex->vt->select_bucket(ex->impl, bucket, err);
}
static inline int tg_executor_write(tg_executor *ex, int tensor, const void *host, tg_err *err) {
    return ex->vt->write(ex->impl, tensor, host, err);
}
static inline int tg_executor_read(tg_executor *ex, int tensor, void *host, tg_err *err) {
    return ex->vt->read(ex->impl, tensor, host, err);
}

/* The CUDA side, defined by runtime/cuda/ in GPU builds and by runtime/cuda_absent.c
 * (which fails, or reports no devices) in CPU-only ones. */
int tg_executor_open_cuda(tg_executor *ex, const tg_plan *plan, const tg_executor_options *opts, tg_err *err);

/* Number of CUDA devices (0 in a CPU-only build). */
int tg_cuda_device_count(void);

/* Free and total memory of GPU `device`, which becomes the calling thread's current
 * device (its context is created if it was not yet): 0, or -1 with a message (always, in a
 * CPU-only build). */
int tg_cuda_memory_info(int device, uint64_t *free_bytes, uint64_t *total_bytes, tg_err *err);

/* GPU `device`'s name as the CUDA runtime gives it ("NVIDIA H100 80GB HBM3"): 0, or -1 (no
 * such device; always in a CPU-only build). */
int tg_cuda_device_name(int device, char *name, size_t len);

/* NCCL communicators for `ranks` replicas in this process, replica r on GPU r
 * (comms[r]). */
int tg_cuda_comms_create(void **comms, int ranks, tg_err *err);
void tg_cuda_comms_destroy(void **comms, int ranks);

/* The NCCL communicator of rank `rank` of a world of `ranks` processes started by a
 * launcher, on GPU `gpu` of this machine, met through NCCL's own bootstrap: NCCL_COMM_ID
 * when set (the same host:port on every rank), else master_addr with the port after
 * master_port; rank 0 hosts the root. Destroy it with tg_cuda_comms_destroy(&comm, 1). */
int tg_cuda_comm_create_rank(void **comm, int rank, int ranks, int gpu, const char *master_addr, int master_port,
                             tg_err *err);
/* all[r * bytes ..] = rank r's `mine`, for every rank of the communicator (blocking). */
int tg_cuda_comm_all_gather_bytes(void *comm, const void *mine, void *all, size_t bytes, tg_err *err);
/* The GPU and the rank of a communicator; -1 for none. */
int tg_cuda_comm_device(void *comm);
int tg_cuda_comm_rank(void *comm);
/* How many ranks the communicator joins (-1 where it cannot say). */
int tg_cuda_comm_ranks(void *comm);
/* Aborts a communicator whose peers stopped (ncclCommAbort): collectives still waiting on
 * them end, so the process can exit. */
void tg_cuda_comm_abort(void *comm);

/* "cpu"/"cuda" -> tg_device; -1 for anything else. */
int tg_device_parse(const char *name);
/* Whether this build includes the CUDA executor. */
int tg_cuda_built(void);
/* The CPU executor's worker threads (the cost model's CPU calibration depends on them); 0
 * for another executor. */
int tg_executor_cpu_threads(const tg_executor *ex);
/* CUDA when this build has it and a GPU is present, else the CPU. */
tg_device tg_default_device(void);

#endif
