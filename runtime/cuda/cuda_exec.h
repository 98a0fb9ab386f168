/* The CUDA executor: pools allocated once with cudaMalloc, the schedule launched op by op
 * on one stream or captured once into a CUDA graph and replayed. Its functions are spread
 * over runtime/cuda/ by concern (runtime/cuda/cuda_exec_internal.h lists the files). */
#ifndef TUNEGRAPH_CUDA_EXEC_H
#define TUNEGRAPH_CUDA_EXEC_H

#include <stdint.h>

#include "kernels/cuda_ops.h"
#include "runtime/deferred_update.h"
#include "runtime/executor.h"
#include "base/error.h"
#include "plan/plan.h"

/* Training steps the trainer starts together where it can: one graph launch for all four
 * costs the host about two and a half single launches (docs/perf-notes.md). */
#define TG_CUDA_STEP_GROUP 4

/* What one length bucket of the plan (tg_plan_bucket) has of its own: its plan, the graphs
 * captured from it (each bakes in the bucket's shapes and activation offsets), its deferred
 * update's chunks, where its batches' label rows lie, and whether its GEMM shapes have been
 * tuned. Everything else of the executor serves every bucket. */
typedef struct tg_cuda_bucket {
    const tg_plan *plan;
    void *graph_exec[2];           /* cudaGraphExec_t: [0] train step, [1] eval forward */
    void *step_graph;              /* cudaGraphExec_t of the pipelined train step */
    void *group_graph;             /* cudaGraphExec_t of group_steps of them in a row (0: none yet) */
    int group_steps;
    /* LM plans: where a batch's label rows are derived from; none (rows 0) in a plan with
     * several buckets, whose next batch is fetched before its bucket is known. */
    tg_lm_label_rows label_rows;
    tg_deferred_update defer;      /* planned when the executor's defer_on */
    int gemm_tuned;                /* the GEMM tuning pass has run for its shapes */
} tg_cuda_bucket;

typedef struct tg_cuda_exec {
    const tg_plan *plan;           /* the selected bucket's plan (cur->plan) */
    tg_cuda_bucket bucket[TG_MAX_BUCKETS];
    int n_buckets;                 /* 1 for a plan without buckets */
    tg_cuda_bucket *cur;           /* the selected bucket: what runs next */
    int device;
    uint8_t *pool[TG_POOL_COUNT];  /* device memory, one set for every bucket */
    tg_cuda_ctx ctx;
    tg_param_segment *segments_dev;
    /* Step pipeline (kernels/cuda_ops.h): two device staging slots for batches; the
     * host's control block and the step report in mapped pinned memory. Handing over a
     * batch that the previous step already fetched, launching the graph and waiting by
     * polling the report take no other CUDA call. */
    uint8_t *staging;              /* device: 2 slots of staging_stride bytes */
    size_t staging_stride;
    long long *seq_dev;            /* device: steps finished (the slot selector) */
    /* grad_accumulation (micro_steps > 1): a staging slot holds a step's window of
     * micro-batch images back to back, and loss_window (device) the sum of its micro-steps'
     * losses, which the step reports. */
    int micro_steps;
    float *loss_window;
    cudaStream_t side_stream;      /* the fetch branch beside the forward */
    cudaEvent_t fork, join;
    tg_step_ctrl *ctrl;            /* mapped pinned */
    tg_step_report *report;        /* mapped pinned */
    long long steps_started;       /* steps launched (*seq_dev once they have all finished) */
    long long steps_waited;        /* steps whose record was handed out */
    const void *staged;            /* host image already in slot steps_started & 1, or NULL */
    /* Host images known to be readable by the fetch kernel: as many as a step ring's worth
     * of staging buffers, so a trainer cycling through its ring never asks again. */
    const void *checked_images[TG_STEP_RING];
    int n_checked;
    double launch_s[TG_STEP_RING]; /* wall clock at each queued step's launch */
    /* GPU durations of the last steps waited for (step_gpu_count of them so far, in a ring):
     * the least of them is what a wait expects each step in flight to take. */
    double step_gpu_recent[8];
    long long step_gpu_count;
    unsigned long long last_end_stamp; /* its optimizer-end stamp, for the step period */
    double clock_offset_s;         /* wall clock minus GPU timer, least seen (valid when set) */
    double wait_margin_s;          /* how long before the expected end a wait wakes */
    int clock_offset_set;
    int device_graph;              /* the last captured graph was instantiated for device launch */
    int step_device_graph;         /* the last captured step graph was (and its group graph) */
    /* The deferred update (runtime/deferred_update.h), on for training steps unless a
     * bucket's plan does not allow it or TUNEGRAPH_DEFERRED_UPDATE=0: a step ends after its
     * gradient norm, and its AdamW runs in chunks (cur->defer's) on update_stream beside the
     * next step's forward, gated by *update_due (set by a step's end, cleared once the update
     * has been applied outside a step). update_pending: a step ended with its update not yet
     * run; every other use of the executor applies it first (tg_cuda_finish_update). The
     * update covers every parameter whatever the chunks, and the buckets share the
     * parameters, gradients and AdamW state, so any bucket's step applies another's. */
    int defer_on;
    /* Data parallelism: a training step sums each gradient bucket (its ALL_REDUCE) on
     * comm_stream as soon as the backward has written it, beside the rest of the
     * backward; the optimizer phase waits for the last sum (so its time shows the
     * communication the backward did not hide). */
    cudaStream_t comm_stream;
    cudaEvent_t comm_fork, comm_done;
    int comm_buckets;              /* the sums in a step's backward (every bucket plan's alike) */
    /* Data parallelism: how long a wait for a step may go without it ending before the
     * replica gives up (TUNEGRAPH_STEP_TIMEOUT_S: runtime/step_timeout.h). */
    double step_timeout_s;
    int update_pending;
    int *update_due;               /* device */
    cudaStream_t update_stream;
    cudaEvent_t update_fork;
    cudaEvent_t *chunk_done;       /* one per chunk, as many as the bucket with the most has */
    int n_chunk_events;
    /* Host CPU seconds (this thread) inside the step calls, by part, when
     * TUNEGRAPH_HOST_TRACE is set: batch hand-over, graph launch, wait, read-back;
     * printed to stderr when the executor is freed. */
    int host_trace;
    double host_cpu_s[4];
    double host_launch_wall_s;
    int64_t host_wakeups;
    int64_t host_steps;
} tg_cuda_exec;

/* Allocates pools (zeroed), the cuBLASLt handle and workspace (the scratch sized for every
 * bucket's ops), the AdamW segment table, on GPU `device` (made the calling thread's
 * current device), as one data-parallel replica joined to the others by the NCCL
 * communicator `nccl_comm` (or NULL: one replica). Opens on the plan's last bucket (the
 * plan itself). Every later call on this executor must come from the same thread. */
int tg_cuda_exec_init_on(tg_cuda_exec *x, const tg_plan *plan, uint64_t seed, int device, void *nccl_comm,
                         tg_err *err);
void tg_cuda_exec_free(tg_cuda_exec *x);

/* Makes bucket k the one that runs next (executor.h's select_bucket): steps of another
 * bucket in flight finish as they were started, on the same stream. */
int tg_cuda_exec_select_bucket(tg_cuda_exec *x, int bucket, tg_err *err);

void *tg_cuda_tensor(const tg_cuda_exec *x, int tensor);

/* Launches ops [first, last) on the executor's stream (no capture), after any pending
 * deferred update. */
int tg_cuda_exec_range(tg_cuda_exec *x, int first, int last, int training, tg_err *err);
int tg_cuda_exec_phases(tg_cuda_exec *x, int first_phase, int last_phase, int training, tg_err *err);

/* Captures phases [first, last] into graph slot `slot` once; replays it after. */
int tg_cuda_exec_graph(tg_cuda_exec *x, int slot, int first_phase, int last_phase, int training, tg_err *err);

/* Starts `steps` training steps behind any still in flight (at most TG_STEP_RING - 1 in
 * all): step j on batches[j], a pinned host image of the inputs pool (with
 * grad_accumulation, micro_steps images back to back, whose micro-steps the step runs in
 * turn before its optimizer phase); batches[steps] (or
 * NULL) is the image of the step after the last, already filled. Each step fetches the
 * batch after its own into the other staging slot on a branch beside its forward, so a
 * later start whose first batch is this one's batches[steps] uploads nothing; any other
 * first batch is uploaded first. Every image must stay unchanged until its step has been
 * waited for, and is laid out for the bucket selected when its step starts (a fetch copies
 * the whole inputs pool, the same size in every bucket). LM label rows marked
 * TG_LABELS_FROM_IDS are derived on the device (plans without buckets). With
 * use_graph the whole of each step (batch in place, forward, backward, optimizer,
 * statistics) is replayed from a captured graph: a start of as many steps as the first
 * start of several asked for is one launch of a graph holding them all (captured then),
 * any other start one launch per step. With the deferred update on, a step's AdamW runs
 * at the start of the next step, beside its forward (or before anything else next uses
 * the executor), so the forward phase's time includes the previous step's update. */
int tg_cuda_step_start(tg_cuda_exec *x, const void *const *batches, int steps, int use_graph, tg_err *err);
/* Waits for the oldest step in flight (up to TG_STEP_RING - 1 may be) by polling the mapped
 * report, and fills its result (phase times and the period on the GPU clock). With several steps queued it
 * sleeps until all but one should have ended, so the host wakes once for several steps
 * while the GPU never runs dry; with one, until shortly before it should end. */
int tg_cuda_step_wait(tg_cuda_exec *x, tg_step_result *result, tg_err *err);

/* Times every op of the schedule (forward, backward, optimizer) on the current inputs,
 * launched one by one between events, averaged over `repeats` runs: op_ms[op index]. The
 * runs update the weights like training steps do. */
int tg_cuda_profile(tg_cuda_exec *x, int repeats, double *op_ms, tg_err *err);

/* Applies a deferred update still pending (in stream order, after the steps in flight);
 * the functions here that run ops or move tensors call it first. */
int tg_cuda_finish_update(tg_cuda_exec *x, tg_err *err);

/* Host <-> device copies of a whole tensor, synchronous (tests, weights, results). */
int tg_cuda_upload(tg_cuda_exec *x, int tensor, const void *host, tg_err *err);
int tg_cuda_download(tg_cuda_exec *x, int tensor, void *host, tg_err *err);
int tg_cuda_sync(tg_cuda_exec *x, tg_err *err);

#endif
