/* Waiting for the CUDA executor's training steps: by polling the step report in mapped host
 * memory, sleeping until shortly before each step should end (judged from the GPU's own
 * step times and the wall clock's offset to its timer), so the host wakes rarely and the
 * GPU never runs dry; then the step's statistics. */
#include <errno.h>
#include <nccl.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "runtime/cuda/cuda_exec_internal.h"

static void sleep_until_s(double t) {
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* What a step in flight is expected to take on the GPU: the least of the recent steps'
 * durations, 0 before the first. Not the last one's: with data-parallel replicas a step's
 * duration includes its waits for the other GPUs, and a wait judged by a step that waited
 * sleeps too long, leaves its GPU without work, and so lengthens the other replicas' next
 * steps in turn: the sleeps grew step by step until the replicas stood still. The least
 * errs the other way, which costs a few more looks at the report. */
static double expected_step_s(const tg_cuda_exec *x) {
    const int n = x->step_gpu_count < 8 ? (int)x->step_gpu_count : 8;
    double least = 0;
    for (int k = 0; k < n; k++)
        if (k == 0 || x->step_gpu_recent[k] < least) least = x->step_gpu_recent[k];
    return least;
}

/* The wall-clock time step `target` should end: from the end of the last finished step
 * (its GPU stamp on the wall clock), each later step takes the expected GPU time,
 * starting no earlier than its launch. 0 when there is nothing to judge by yet. */
static double expected_end_s(tg_cuda_exec *x, long long target) {
    const double step_s = expected_step_s(x);
    if (step_s <= 0 || !x->clock_offset_set) return 0;
    long long finished = (long long)x->report->done - 1; /* its record is intact: not yet waited for, or the last */
    unsigned long long stamp = x->last_end_stamp;
    if (finished >= x->steps_waited) stamp = x->report->step[finished % TG_STEP_RING].stamps[4];
    else finished = x->steps_waited - 1;
    double end = (double)stamp / 1e9 + x->clock_offset_s;
    for (long long k = finished + 1; k <= target; k++) {
        double launch = x->launch_s[k % TG_STEP_RING];
        end = (end > launch ? end : launch) + step_s;
    }
    return end;
}

/* A sample of the wall clock against the GPU timer, from the step that ended last: seen
 * now, it ended at or before now, so the least sample is the closest. */
static void sample_clock_offset(tg_cuda_exec *x) {
    long long finished = (long long)x->report->done - 1;
    if (finished < x->steps_waited) return;
    double sample = tg_wall_s() - (double)x->report->step[finished % TG_STEP_RING].stamps[4] / 1e9;
    if (!x->clock_offset_set || sample < x->clock_offset_s) x->clock_offset_s = sample, x->clock_offset_set = 1;
}

/* The data-parallel watchdog's verdict: 0 while the wait that began at `began` is within
 * the step timeout and the communicator reports no error, else -1 with a message naming
 * this replica. */
static int replicas_alive(tg_cuda_exec *x, unsigned long long want, double began, double now, tg_err *err) {
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError((ncclComm_t)x->ctx.nccl_comm, &async) != ncclSuccess || async != ncclSuccess)
        return tg_fail(err, "replica %d (GPU %d): the NCCL communicator failed during step %llu: %s", x->ctx.rank,
                       x->device, want, ncclGetErrorString(async));
    if (now - began <= x->step_timeout_s) return 0;
    return tg_fail(err, "replica %d (GPU %d): step %llu has not ended after %.1f s (TUNEGRAPH_STEP_TIMEOUT_S): another "
                        "replica stopped, or the GPUs wait on each other; giving up",
                   x->ctx.rank, x->device, want, now - began);
}

static int wait_for_report(tg_cuda_exec *x, unsigned long long want, long long target, tg_err *err) {
    volatile const unsigned long long *done = &x->report->done;
    if (*done >= want) return 0;
    int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0), rc = 0, slept = 0, polls = 0;
    if (slack > 1000) prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    /* With replicas a step also waits for the other GPUs, so the wait is watched: it looks
     * at the communicator and the clock (never a blocking synchronisation, which a replica
     * that stopped would never end). */
    const int watched = x->ctx.nccl_comm != NULL;
    const double began = tg_wall_s();
    double now = began, queried = now, interval = WAIT_POLL_S, wake_at = expected_end_s(x, target);
    if (watched && wake_at > began + x->step_timeout_s) wake_at = began + x->step_timeout_s;
    if (wake_at - x->wait_margin_s > now + WAIT_POLL_S)
        sleep_until_s(wake_at - x->wait_margin_s), x->host_wakeups++, slept = 1;
    /* The sleep overshot when the step it aimed at had already ended at the first look. */
    const int overshot = slept && *done >= (unsigned long long)target + 1;
    for (; *done < want; polls++) {
        if (polls >= WAIT_POLLS) {
            if (!watched && x->steps_started - x->steps_waited == 1) {
                cudaError_t e = cudaStreamSynchronize(x->ctx.stream);
                if (e != cudaSuccess) rc = tg_cuda_fail(err, "the training step", e);
                break;
            }
            interval = interval * 2 < WAIT_POLL_MAX_S ? interval * 2 : WAIT_POLL_MAX_S;
        }
        now = tg_wall_s();
        sleep_until_s(now + interval);
        x->host_wakeups++;
        if (*done >= want || now - queried < WAIT_QUERY_S) continue;
        queried = now;
        if (watched && replicas_alive(x, want, began, now, err)) {
            rc = -1;
            break;
        }
        cudaError_t e = cudaStreamQuery(x->ctx.stream);
        if (e != cudaErrorNotReady && e != cudaSuccess) {
            rc = tg_cuda_fail(err, "the training step", e);
            break;
        }
        if (e == cudaSuccess) break; /* everything queued has run: checked below */
    }
    if (slack > 1000) prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
    if (!rc && *done < want)
        return tg_fail(err, "the training step ended without publishing its statistics (step %llu, report says %llu)",
                       want, *done);
    /* A clock sample from every wait; the margin widens when the sleep overshot and
     * narrows when it took many looks, so the wake-up tracks the estimate's error. */
    sample_clock_offset(x);
    if (overshot) x->wait_margin_s = x->wait_margin_s * 2 < 1e-3 ? x->wait_margin_s * 2 : 1e-3;
    else if (polls > 4) x->wait_margin_s = x->wait_margin_s / 2 > WAIT_MARGIN_S ? x->wait_margin_s / 2 : WAIT_MARGIN_S;
    return rc;
}

_Static_assert(TG_COMM_TIMELINE_MAX == TG_COMM_STAMP_MAX, "one entry of the timeline per pair of stamps");

/* The gradient sums' stamps as ms from the backward's end (its stamp, on the main stream
 * before it waits for the sums). */
static void read_comm_timeline(const volatile tg_step_record *r, int buckets, tg_step_result *result) {
    const int n = buckets < TG_COMM_STAMP_MAX ? buckets : TG_COMM_STAMP_MAX;
    const unsigned long long backward_end = r->stamps[3];
    result->comm_buckets = n;
    for (int j = 0; j < n; j++) {
        result->comm_begin_ms[j] = (float)((double)(long long)(r->stamps[TG_STAMP_COMM + 2 * j] - backward_end) / 1e6);
        result->comm_end_ms[j] = (float)((double)(long long)(r->stamps[TG_STAMP_COMM + 2 * j + 1] - backward_end) / 1e6);
    }
}

int tg_cuda_step_wait(tg_cuda_exec *x, tg_step_result *result, tg_err *err) {
    long long pending = x->steps_started - x->steps_waited;
    if (pending <= 0) return tg_fail(err, "no training step is in flight");
    double t0 = x->host_trace ? tg_thread_cpu_s() : 0;
    /* With several steps queued, sleep until all but the last should have ended. */
    long long target = x->steps_waited + (pending > 1 ? pending - 2 : 0);
    if (wait_for_report(x, (unsigned long long)x->steps_waited + 1, target, err)) return -1;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    tg_cuda_host_trace(x, 2, &t0);
    const volatile tg_step_record *r = &x->report->step[x->steps_waited % TG_STEP_RING];
    result->loss = r->loss, result->lr = r->lr, result->grad_norm = r->grad_norm;
    result->loss_scale = r->loss_scale; /* fp16 plans: after the step's LOSS_SCALE_UPDATE; else 0 */
    for (int k = 0; k < 4; k++) result->phase_ms[k] = (float)((double)(r->stamps[k + 1] - r->stamps[k]) / 1e6);
    result->period_ms = x->last_end_stamp ? (float)((double)(r->stamps[4] - x->last_end_stamp) / 1e6) : -1.0f;
    read_comm_timeline(r, x->comm_buckets, result);
    /* Later waits judge by the GPU's own duration of this step, not by when the host
     * happened to look: a late look would otherwise make every later sleep longer. */
    x->step_gpu_recent[x->step_gpu_count++ % 8] = (double)(r->stamps[4] - r->stamps[0]) / 1e9;
    x->last_end_stamp = r->stamps[4];
    x->steps_waited++;
    tg_cuda_host_trace(x, 3, &t0);
    /* The first step captures the graph: left out of the trace. */
    if (++x->host_steps == 1)
        memset(x->host_cpu_s, 0, sizeof x->host_cpu_s), x->host_launch_wall_s = 0, x->host_wakeups = 0;
    return 0;
}
