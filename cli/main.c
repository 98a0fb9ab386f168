/* tunegraph command line: compile, inspect, run (the metrics file's lines are cli/metrics.c,
 * the --profile report cli/profile.c). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "api/front.h"
#include "base/alloc.h"
#include "base/atomic_file.h"
#include "base/coverage_flush.h"
#include "base/output_paths.h"
#include "cli/artifact.h"
#include "cli/checkpoints.h"
#include "cli/compare.h"
#include "cli/cost.h"
#include "cli/usage.h"
#include "cli/data_convert.h"
#include "cli/export.h"
#include "cli/metrics.h"
#include "cli/plot.h"
#include "cli/progress.h"
#include "runtime/nvtx.h"
#include "cli/sweep.h"
#include "runtime/gpu_peak.h"
#include "runtime/nvml_energy.h"
#include "cli/profile.h"
#include "cli/tokenize.h"
#include "plan/inspect.h"
#include "base/clock.h"
#include "runtime/comm.h"
#include "runtime/executor.h"
#include "plan/plan_file.h"
#include "plan/memory_estimate.h"
#include "cli/launch.h"
#include "runtime/launch_env.h"
#include "runtime/preflight.h"
#include "runtime/step_timeout.h"
#include "runtime/thread_cpu.h"
#include "runtime/trainer.h"
#include "base/version.h"

_Static_assert(TG_TRAINER_STAGING_MAX - 2 == 14, "the --in-flight and TUNEGRAPH_STEP_GROUP messages name the limit");

#define MAX_SETS 64
#define MAX_THREADS 1024

/* A run that writes checkpoints stops on the first SIGINT or SIGTERM at a step every
 * replica can reach, writes a checkpoint there and then ends by the signal
 * (g_defer_stop: such a run is under way; g_stop_signal: the signal received). */
static volatile sig_atomic_t g_defer_stop, g_stop_signal;

static const char usage[] =
    "usage:\n"
    "  tunegraph compile JOB [-o PLAN] [--set key=value]...\n"
    "  tunegraph inspect PLAN [--json]\n"
    "  tunegraph inspect PLAN|JOB --predict [--gpu h100|h200|cpu|auto] [--threads N] [--calibration FILE]\n"
    "                [--top N] [--set key=value]...\n"
    "  tunegraph calibrate [--device cpu|cuda] [--threads N] [--repeats N] [-o FILE]\n"
    "  tunegraph run PLAN|JOB [--set key=value]... [--metrics FILE.jsonl] [--device cpu|cuda]\n"
    "                [--threads N] [--save FILE.safetensors] [--profile] [--in-flight N]\n"
    "                [--save-dir DIR [--labels a,b,...] [--tokenizer PATH] [--dtype fp32|bf16] [--force]]\n"
    "                [--checkpoint-dir DIR] [--resume DIR|FILE.tgckpt] [--artifact DIR] [--nproc N]\n"
    "  tunegraph data convert INPUT... -o OUTDIR --tokenizer PATH [options]  (tunegraph data help)\n"
    "  tunegraph data dump SET [-o FILE.jsonl]\n"
    "  tunegraph tokenize --tokenizer PATH [--pair] [--max-len N] [--no-special] [--offsets]\n"
    "  tunegraph export PLAN|JOB --weights FILE.safetensors -o OUTDIR [--tokenizer PATH] [--labels a,b,...]\n"
    "                [--dtype fp32|bf16] [--force] [--set key=value]...\n"
    "  tunegraph predict PLAN|JOB -o LOGITS.jsonl [--weights FILE.safetensors] [--data FILE.jsonl]\n"
    "                [--device cpu|cuda] [--threads N] [--init-missing] [--set key=value]...\n"
    "  tunegraph plot METRICS.jsonl -o DIR\n"
    "  tunegraph sweep JOB --grid key=v1,v2,... [--grid ...]... -o DIR [--weights throughput=W,memory=W,energy=W,cost=W]\n"
    "                [--steps N] [--warmup N] [--device cpu|cuda] [--threads N] [--set key=value]... [--artifact DIR]\n"
    "  tunegraph compare A B   (two artifact folders, metrics files or sweep results)\n"
    "  tunegraph version\n"
    "Job files are `key = value` text; see README.md for the keys.\n";


static int die(const tg_err *err) {
    fprintf(stderr, "tunegraph: %s\n", err->msg);
    return 1;
}

static int usage_error(const char *fmt, const char *arg) {
    return cli_usage_error(NULL, usage, fmt, arg);
}

/* A whole number in [lo, hi] written as all of `text` in decimal: "", "abc", "4x", " 4" and
 * numbers out of range are refused. 0, or -1. */
static int parse_whole(const char *text, long lo, long hi, int *out) {
    if (!text[0] || isspace((unsigned char)text[0])) return -1; /* strtol would skip blanks */
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

/* Options shared by the subcommands; each one accepts the subset it documents. */
typedef struct cli_args {
    const char *input;
    const char *output;
    const char *metrics;
    const char *device;
    const char *save;
    const char *resume;         /* a checkpoint folder or file */
    const char *checkpoint_dir;
    int json;
    int profile;
    int threads;
    int in_flight;          /* 0: the default */
    int nproc;              /* run --nproc: rank processes to start (0: none) */
    const char *sets[MAX_SETS];
    int n_sets;
} cli_args;

/* Whether `option` is one of the space-separated words of `allowed`. */
static int option_allowed(const char *allowed, const char *option) {
    const size_t n = strlen(option);
    for (const char *w = allowed; *w; w += strcspn(w, " "), w += *w == ' ') {
        const size_t len = strcspn(w, " ");
        if (len == n && !strncmp(w, option, n)) return 1;
    }
    return 0;
}

static int parse_args(int argc, char **argv, cli_args *a, const char *allowed) {
    memset(a, 0, sizeof *a);
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        int takes_value = !strcmp(s, "-o") || !strcmp(s, "--set") || !strcmp(s, "--metrics") ||
                          !strcmp(s, "--device") || !strcmp(s, "--threads") || !strcmp(s, "--save") ||
                          !strcmp(s, "--in-flight") || !strcmp(s, "--resume") || !strcmp(s, "--checkpoint-dir") ||
                          !strcmp(s, "--nproc");
        if (s[0] == '-' && s[1]) {
            if (!option_allowed(allowed, s)) return usage_error("unknown option %s", s);
            if (takes_value && i + 1 >= argc) return usage_error("%s needs a value", s);
        }
        if (!strcmp(s, "-o")) a->output = argv[++i];
        else if (!strcmp(s, "--set")) {
            if (a->n_sets == MAX_SETS) return usage_error("too many --set options (%s)", "64 at most");
            if (!strchr(argv[i + 1], '=')) return usage_error("--set needs key=value, got '%s'", argv[i + 1]);
            a->sets[a->n_sets++] = argv[++i];
        } else if (!strcmp(s, "--metrics")) a->metrics = argv[++i];
        else if (!strcmp(s, "--device")) a->device = argv[++i];
        else if (!strcmp(s, "--save")) a->save = argv[++i];
        else if (!strcmp(s, "--resume")) a->resume = argv[++i];
        else if (!strcmp(s, "--checkpoint-dir")) a->checkpoint_dir = argv[++i];
        else if (!strcmp(s, "--threads")) {
            if (parse_whole(argv[++i], 0, MAX_THREADS, &a->threads))
                return usage_error("--threads needs a whole number from 0 to 1024 (0: one per core), got '%s'", argv[i]);
        } else if (!strcmp(s, "--in-flight")) {
            if (parse_whole(argv[++i], 1, TG_TRAINER_STAGING_MAX - 2, &a->in_flight))
                return usage_error("--in-flight needs a whole number from 1 to 14, got '%s'", argv[i]);
        } else if (!strcmp(s, "--nproc")) {
            if (parse_whole(argv[++i], 1, TG_MAX_DATA_PARALLEL, &a->nproc))
                return usage_error("--nproc needs a whole number from 1 to 64 (rank processes, one per GPU), got '%s'",
                                   argv[i]);
        }
        else if (!strcmp(s, "--json")) a->json = 1;
        else if (!strcmp(s, "--profile")) a->profile = 1;
        else if (s[0] == '-' && s[1]) return usage_error("unknown option %s", s); /* GCOVR_EXCL_BR_LINE: option_allowed refused every option not handled above */
        else if (a->input) return usage_error("unexpected argument %s", s);
        else a->input = s;
    }
    if (!a->input) return usage_error("%s", "missing input file");
    return 0;
}

/* The job's name with its extension replaced by .tgp (malloc'd; NULL when out of memory). */
static char *default_plan_path(const char *job) {
    const char *slash = strrchr(job, '/');
    const char *dot = strrchr(job, '.');
    size_t stem = dot && (!slash || dot > slash) ? (size_t)(dot - job) : strlen(job);
    char *path;
    return tg_asprintf(&path, "%.*s.tgp", (int)stem, job) < 0 ? NULL : path;
}

/* Where `run --profile --metrics PATH` writes the profile's chart: beside the metrics file,
 * PATH with its .jsonl (if any) replaced by .profile.svg (malloc'd; NULL when out of memory). */
static char *profile_svg_path(const char *metrics) {
    const size_t n = strlen(metrics), stem = n > 6 && !strcmp(metrics + n - 6, ".jsonl") ? n - 6 : n;
    char *path;
    return tg_asprintf(&path, "%.*s.profile.svg", (int)stem, metrics) < 0 ? NULL : path;
}

/* Refuses a command's outputs that would overwrite its input file (the job or plan named
 * on the command line), a file the plan reads (model config and weights, training and
 * eval data) or one another, or that cannot be written (base/output_paths.h). */
static int check_outputs(const tg_named_path *outputs, int n_outputs, const char *input, const char *input_what,
                         const tg_plan *plan, tg_err *err) {
    tg_named_path inputs[1 + TG_PLAN_INPUTS] = {{input, input_what}};
    char *config_path;
    if (tg_front_plan_inputs(plan, inputs + 1, &config_path, err)) return -1;
    int rc = tg_outputs_check(outputs, n_outputs, inputs, 1 + TG_PLAN_INPUTS, err);
    free(config_path);
    return rc;
}

/* Whether `path` is the file standard output writes to (-o /dev/stdout). */
static int is_stdout(const char *path) {
    struct stat a, b;
    return fstat(STDOUT_FILENO, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino; /* GCOVR_EXCL_BR_LINE: stat(path) finds the plan tg_plan_write has just put there */
}

static int cmd_compile(int argc, char **argv) {
    cli_args a;
    int rc = parse_args(argc, argv, &a, "-o --set");
    if (rc) return rc;
    tg_err err = {{0}};
    double t0 = tg_wall_s();
    tg_plan plan;
    tg_nvtx_push("compile");
    const int failed = tg_front_compile_file(a.input, a.sets, a.n_sets, &plan, &err);
    tg_nvtx_pop();
    if (failed) return die(&err);
    double compile_s = tg_wall_s() - t0;
    char *path = a.output ? tg_strdup(a.output) : default_plan_path(a.input);
    const tg_named_path output = {path, a.output ? "plan (-o)" : "plan"};
    rc = path ? check_outputs(&output, 1, a.input, "job file", &plan, &err) : tg_fail(&err, "out of memory for the plan path");
    if (!rc) rc = tg_plan_write(&plan, path, &err);
    if (!rc) /* beside the plan when that goes to standard output */
        fprintf(is_stdout(path) ? stderr : stdout,
                "compiled %s -> %s: %d ops, %d tensors, planned peak %.1f MiB, %.2f GFLOP/step (%.0f ms)\n", a.input,
                path, plan.n_ops, plan.n_tensors, plan.peak_bytes / 1048576.0, plan.flops_per_step / 1e9,
                compile_s * 1e3);
    free(path);
    tg_plan_free(&plan);
    return rc ? die(&err) : 0;
}

static int cmd_inspect(int argc, char **argv) {
    if (cost_wants_predict(argc, argv)) return cmd_inspect_predict(argc, argv);
    cli_args a;
    int rc = parse_args(argc, argv, &a, "--json");
    if (rc) return rc;
    tg_err err = {{0}};
    tg_plan plan;
    if (tg_plan_read(a.input, &plan, &err)) return die(&err);
    rc = tg_plan_inspect(&plan, stdout, a.json, &err);
    tg_plan_free(&plan);
    return rc ? die(&err) : 0;
}

/* Whether environment variable `name` is set to "0" (a switch turned off). */
static int env_is_zero(const char *name) {
    const char *v = getenv(name);
    return v && !strcmp(v, "0");
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median step time, leaving out the first step (capture, algorithm choice). */
static double median_after_first(double *ms, int n) {
    if (n <= 1) return n ? ms[0] : 0;
    qsort(ms + 1, (size_t)(n - 1), sizeof *ms, cmp_double);
    return ms[1 + (n - 1) / 2];
}

/* CPU seconds spent over the steps after the first, as microseconds per such step (0 when
 * only one step ran): the first step's capture and algorithm choice are not a step's cost. */
static double us_per_later_step(double cpu_s, int32_t ran) {
    return ran > 1 ? cpu_s / (double)(ran - 1) * 1e6 : 0;
}

/* Rank processes agree on whether a stop was requested every this many steps (and at the
 * end), through a gather of each rank's request, 4 bytes (run_checkpoints_world_stop);
 * the trainer has no step in flight there. On the CPU every step: such a gather of 2 ranks
 * under MPI took 0.3 ms (median, back to back, 2 cores), and 2 ranks training tiny-bert
 * (batch 4, seq 16) had a median step of 11.9 ms agreeing every step against 12.1 ms not
 * agreeing: no cost above the noise. On CUDA every 14 steps (the in-flight depth): the
 * steps queued on the GPU drain there, which every step would undo what --in-flight
 * gains. */
static int world_agree_every(tg_device device) {
    return device == TG_DEVICE_CUDA ? TG_TRAINER_STAGING_MAX - 2 : 1; /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
}

/* A launched world's communicator in this process (NULL: none), its device and this
 * process's rank. */
static void *g_world_comm;
static tg_device g_world_device;
static int g_world_rank;

/* all[r * bytes ..] = rank r's `mine` over the world's communicator (run_checkpoints_gather). */
static int world_gather(void *ctx, const void *mine, void *all, size_t bytes, tg_err *err) {
    if (g_world_device == TG_DEVICE_CUDA) /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
        return tg_cuda_comm_all_gather_bytes(g_world_comm, mine, all, bytes, err);
    memcpy((uint8_t *)all + (size_t)g_world_rank * bytes, mine, bytes);
    if (tg_cpu_all_gather(g_world_comm, g_world_rank, all, (int64_t)bytes, 1))
        return tg_fail(err, "rank %d: a gather over the ranks failed", g_world_rank);
    return 0;
}

/* Right after its trainer opened (communicator up, data read), before the first step: every
 * rank of a launched world gathers the others' plan fingerprint, world size and training
 * data, and refuses to train where any differs from rank 0's. */
static int world_agrees(tg_trainer *tr, int world, tg_err *err) {
    rank_identity *all = tg_calloc((size_t)world, sizeof *all);
    if (!all) return tg_fail(err, "out of memory");
    rank_identity mine;
    memset(&mine, 0, sizeof mine); /* the padding travels too */
    mine.plan_fingerprint = tr->plan->fingerprint, mine.data_hash = tg_trainer_data_hash(tr);
    mine.world = world, mine.examples = tr->has_train ? tr->train.n : 0;
    int rc = world_gather(NULL, &mine, all, sizeof mine, err);
    if (!rc) rc = rank_identities_agree(all, world, err);
    free(all);
    return rc;
}

static volatile int g_world_aborted;

static void *abort_world_comm_thread(void *arg) {
    tg_cuda_comm_abort(g_world_comm);
    g_world_aborted = 1;
    return NULL;
}

/* Aborts the world's NCCL communicator before the process ends, giving it a second: an
 * abort can itself wait on a peer that no longer answers (stopped by SIGSTOP: 10 s and
 * more, measured), and the exit must not. */
static void abort_world_comm(void) {
    pthread_t t;
    if (pthread_create(&t, NULL, abort_world_comm_thread, NULL)) return;
    pthread_detach(t);
    for (int k = 0; k < 100 && !g_world_aborted; k++) nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
}

/* Data parallelism: replica 0 is the run the CLI reports on; the others train beside it
 * in threads of their own, on their rows of each global batch, taking part in every
 * collective (the steps' gradient sums, and the profile's steps when asked). Replica 0
 * alone evaluates and saves, which need no collective. A replica that fails ends the
 * process: the others would wait for it forever. */
typedef struct replica_run {
    const tg_plan *plan;
    int world; /* > 1: a rank process of a launched world, which checks its peers run the same job */
    tg_trainer_options opts;
    int profile;
    metrics_file *metrics; /* the run's, NULL without --metrics */
    run_checkpoints *ckpts; /* NULL: no checkpoints */
    const tg_checkpoint *resume; /* the checkpoint resumed from, or NULL */
    const char *resume_path;
    pthread_t thread;
    int stopped; /* set by run_replica: a rank process that stopped with the others */
} replica_run;

/* Ends a run that failed, from replica `replica`'s thread: the metrics file gets the error
 * and goes into place with the lines written so far. With replica threads running the
 * process ends here, whichever thread failed: returning would free what the others use,
 * and they would wait for the failed one forever; the temporary files of what is still
 * being written (a save under way) are removed first. The first thread to fail ends the
 * metrics; a second finds them ended. */
static int end_failed_run(metrics_file *metrics, int replicas, int replica, const tg_err *err) {
    if (replica > 0) fprintf(stderr, "tunegraph: %s %d: %s\n", g_world_comm ? "rank" : "replica", replica, err->msg);
    else die(err);
    tg_err metrics_err;
    if (metrics && metrics_file_end(metrics, err->msg, replicas > 1 ? replica : -1, &metrics_err))
        fprintf(stderr, "tunegraph: %s\n", metrics_err.msg);
    if (replicas > 1) {
        tg_atomic_remove_temps();
        /* A rank process leaves its peers no collective to wait in: they stop at once
         * (NCCL) instead of after their watchdog's timeout. */
        if (g_world_comm && g_world_device == TG_DEVICE_CUDA) abort_world_comm(); /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
        fflush(stdout);
        fflush(stderr);
        tg_coverage_flush();
        _exit(1);
    }
    return 1;
}

/* Whether the run stops before its next step: a stop was requested and every step up to
 * the stop step is taken. Rank processes agree on it first (at their agreement steps and
 * at the end: run_checkpoints_world_stop); -1 when that fails. */
static int stopping(run_checkpoints *ckpts, const tg_trainer *tr, tg_err *err) {
    if (!ckpts) return 0;
    if (ckpts->gather && run_checkpoints_world_stop(ckpts, tr->steps_done, tr->total_steps, err)) return -1;
    const int64_t stop = run_checkpoints_stop_step(ckpts);
    return stop >= 0 && tr->steps_done >= stop;
}

/* Rank processes that stopped together: the signal they stop by (the first rank's to get
 * one), which this process then ends by too. */
static int world_stop_signal(const run_checkpoints *ckpts) {
    if (!g_stop_signal) g_stop_signal = ckpts->stop_with;
    return g_stop_signal;
}

static void *run_replica(void *arg) {
    replica_run *r = arg;
    tg_err err = {{0}};
    tg_trainer tr;
    int rc = tg_trainer_open(&tr, r->plan, &r->opts, &err);
    if (!rc && r->world > 1) rc = world_agrees(&tr, r->world, &err);
    if (!rc && r->resume) rc = tg_trainer_restore(&tr, r->resume, r->resume_path, &err);
    /* Replica 0 writes the checkpoints; this one hands over its part of each (ZeRO-1). */
    int32_t handed = r->resume ? tr.steps_done : -1;
    int stopped = 0;
    while (!rc && tr.steps_done < tr.total_steps) {
        if ((stopped = stopping(r->ckpts, &tr, &err))) break;
        tg_step_stats s;
        rc = tg_trainer_step(&tr, &s, &err);
        if (!rc && r->ckpts && run_checkpoints_due(r->ckpts, tr.steps_done))
            rc = run_checkpoints_hand_over(r->ckpts, &tr, &err), handed = tr.steps_done;
    }
    if (stopped < 0) rc = -1;
    /* A rank process agrees on a stop at the end too, as rank 0 does. */
    if (!rc && r->world > 1 && !stopped && (stopped = stopping(r->ckpts, &tr, &err)) < 0) rc = -1;
    /* At a stop, and at the end, which a stop requested late may still checkpoint (a rank
     * process: at a stop only, all ranks alike; rank 0 takes its part at checkpoint steps
     * otherwise). */
    if (!rc && r->ckpts && (!r->ckpts->gather || stopped) && handed != tr.steps_done)
        rc = run_checkpoints_hand_over(r->ckpts, &tr, &err);
    r->stopped = !rc && stopped;
    if (!rc && r->profile && !stopped) {
        double *ms = calloc((size_t)r->plan->n_ops, sizeof *ms);
        rc = ms ? tg_trainer_profile(&tr, PROFILE_REPEATS, ms, &err) : tg_fail(&err, "out of memory"); /* GCOVR_EXCL_BR_LINE: libc's calloc in a replica thread of the CLI process, which no allocation hook reaches */
        free(ms);
    }
    if (!rc) rc = tg_trainer_read(&tr, r->plan->io.loss, &(float){0}, &err); /* its last step has ended */
    if (rc) end_failed_run(r->metrics, r->plan->train.replicas, r->opts.rank, &err); /* does not return with more than one replica */
    tg_trainer_close(&tr);
    return NULL;
}

/* The communicator(s) for `replicas` replicas on `device`: one CPU group shared by all,
 * or one NCCL communicator per GPU. */
static int open_comms(tg_device device, int replicas, void **comms, tg_cpu_comm_group **group, tg_err *err) {
    if (device == TG_DEVICE_CPU) { /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
        if (tg_cpu_comm_group_create(group, replicas, err)) return -1;
        for (int r = 0; r < replicas; r++) comms[r] = *group;
        return 0;
    }
    return tg_cuda_comms_create(comms, replicas, err);
}

/* This rank's communicator in a launched world: MPI's world for CPU ranks, NCCL met through
 * its own bootstrap for GPU ranks. */
static int open_world_comm(tg_device device, const tg_rank_env *env, int gpu, void **comm, tg_err *err) {
    *comm = NULL;
    if (device == TG_DEVICE_CPU) { /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
        double timeout;
        tg_cpu_comm_group *g = NULL;
        if (tg_step_timeout_s(&timeout, err) || tg_cpu_comm_group_create_mpi(&g, env->rank, env->world_size, timeout, err))
            return -1;
        *comm = g;
        return 0;
    }
    return tg_cuda_comm_create_rank(comm, env->rank, env->world_size, gpu, env->master_addr, env->master_port, err);
}

static void close_world_comm(tg_device device, void *comm) {
    if (device == TG_DEVICE_CPU) tg_cpu_comm_group_destroy(comm); /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
    else tg_cuda_comms_destroy(&comm, 1);
}

/* Rank processes ending at a stop: none leaves before rank 0 has written the checkpoint
 * (mpirun would end the job, rank 0 with it). Closes an MPI group (mpirun wants every rank
 * to finalize); an NCCL communicator is left to the process's end, which follows at once:
 * destroying it waits for the peers, which may have ended already (a stop on 2 H100s hung
 * there). */
static int world_leave(tg_device device, tg_err *err) {
    int32_t none = 0, all[TG_MAX_DATA_PARALLEL];
    const int rc = world_gather(NULL, &none, all, sizeof none, err);
    if (device == TG_DEVICE_CPU) { /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
        close_world_comm(device, g_world_comm);
        g_world_comm = NULL;
    }
    return rc;
}

/* run's command line as given (the export options in), for the ranks --nproc starts. */
static int g_run_argc;
static char **g_run_argv;

/* run --nproc N: N rank processes of this program with the same command line, less
 * --nproc. GPU ranks are started and supervised here (cli/launch.c); CPU ranks meet
 * through MPI, so mpirun starts them (and ends them all when one fails). */
static int start_ranks(int nproc, tg_device device) {
    if (device == TG_DEVICE_CUDA && tg_cuda_device_count() < nproc) { /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
        fprintf(stderr, "tunegraph: --nproc %d starts a rank process per GPU, and %d GPU%s visible\n", nproc,
                tg_cuda_device_count(), tg_cuda_device_count() == 1 ? " is" : "s are");
        return 1;
    }
    if (device == TG_DEVICE_CPU && !tg_cpu_comm_mpi_built()) {
        fprintf(stderr, "tunegraph: --nproc %d --device cpu runs the ranks under MPI, which this build lacks (install "
                        "libopenmpi-dev and openmpi-bin, then rebuild); --set data_parallel=%d runs the replicas as "
                        "threads of one process\n",
                nproc, nproc);
        return 1;
    }
    tg_err err;
    char *exe = launch_self_path("/proc/self/exe", &err);
    if (!exe) return die(&err);
    char **rest = launch_argv_without_nproc(g_run_argc, g_run_argv);
    char **argv = rest ? tg_calloc((size_t)g_run_argc + 16, sizeof *argv) : NULL;
    if (!argv) {
        free(rest), free(exe);
        fprintf(stderr, "tunegraph: out of memory\n");
        return 1;
    }
    char count[16];
    snprintf(count, sizeof count, "%d", nproc);
    int k = 0;
    if (device == TG_DEVICE_CPU) { /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
        argv[k++] = "mpirun", argv[k++] = "-np", argv[k++] = count;
        /* Ranks may outnumber the cores (tests, small machines), and each sets its own threads. */
        argv[k++] = "--oversubscribe", argv[k++] = "--bind-to", argv[k++] = "none";
        argv[k++] = "--stdin", argv[k++] = "none"; /* it runs out of the terminal's process group */
        if (geteuid() == 0) argv[k++] = "--allow-run-as-root";
    }
    argv[k++] = exe, argv[k++] = "run";
    for (int i = 0; rest[i]; i++) argv[k++] = rest[i];
    argv[k] = NULL;
    free(rest);
    const int rc = device == TG_DEVICE_CPU ? launch_mpirun(argv, nproc) : launch_ranks(exe, argv, nproc, 10.0); /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
    free(argv), free(exe);
    /* Stopped by a signal passed on to the ranks: each has ended (where the run writes
     * checkpoints, at one step of all, rank 0 writing the checkpoint there); so does this
     * process, by the signal. */
    const int sig = launch_stopped_by();
    if (!sig) return rc;
    fprintf(stderr, "tunegraph: %s: the %d ranks stopped and have ended%s\n", sig == SIGINT ? "SIGINT" : "SIGTERM", nproc,
            rc == 128 + sig ? "" : " (not all of them as asked: see above)");
    fflush(stdout);
    fflush(stderr);
    signal(sig, SIG_DFL);
    tg_coverage_flush();
    raise(sig);
    return rc;
}

/* The run's checkpoints: the folder they go to (--checkpoint-dir, else the job's
 * checkpoint_dir, else the folder of the checkpoint resumed from) and the checkpoint
 * resumed from (--resume), read before anything else. */
typedef struct run_resume {
    char *dir;          /* NULL: the run writes none */
    char *path;         /* NULL: a fresh run */
    tg_checkpoint ck;
} run_resume;

static void run_resume_free(run_resume *r) {
    free(r->dir);
    free(r->path);
    tg_checkpoint_free(&r->ck);
}

/* The folder a file's path names it in ("/" for "/f", "." for a bare name); NULL when out
 * of memory. */
static char *folder_of(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? tg_strndup(path, slash == path ? 1 : (size_t)(slash - path)) : tg_strdup(".");
}

static int setup_checkpoints(const cli_args *a, const tg_plan *plan, run_resume *r, tg_err *err) {
    memset(r, 0, sizeof *r);
    if (a->resume && (tg_checkpoint_locate(a->resume, &r->path, err) || tg_checkpoint_read(r->path, &r->ck, err)))
        return -1;
    if (a->checkpoint_dir) r->dir = tg_strdup(a->checkpoint_dir);
    else if (plan->run.checkpoint_dir[0]) r->dir = tg_strdup(plan->run.checkpoint_dir);
    else if (r->path) /* the folder of the checkpoint resumed from */
        r->dir = folder_of(r->path);
    if ((a->checkpoint_dir || plan->run.checkpoint_dir[0] || r->path) && !r->dir) return tg_fail(err, "out of memory");
    if (plan->run.checkpoint_every > 0 && !r->dir)
        return tg_fail(err, "%s: key 'checkpoint_every' (%d) needs a folder for the checkpoints: key 'checkpoint_dir' "
                            "or --checkpoint-dir",
                       a->input, plan->run.checkpoint_every);
    if (!r->dir) return 0;
    int32_t newest;
    if (tg_checkpoint_dir_prepare(r->dir, err)) return -1;
    if (tg_checkpoint_dir_newest(r->dir, &newest))
        return tg_fail(err, "%s: cannot list the checkpoint folder: %s", r->dir, strerror(errno));
    /* One folder, one line of training: checkpoints of this run beside later or other ones
     * would be pruned and resumed from by step number as if they were one run. */
    if (!r->path && newest >= 0)
        return tg_fail(err, "%s: the checkpoint folder already holds checkpoints (the newest step-%06d%s): resume "
                            "from them with --resume %s, or give another folder",
                       r->dir, newest, TG_CHECKPOINT_EXT, r->dir);
    if (r->path && newest > r->ck.state.step)
        return tg_fail(err, "%s: the checkpoint folder holds step-%06d%s, past step %d resumed from: give "
                            "--checkpoint-dir another folder for this run's checkpoints",
                       r->dir, newest, TG_CHECKPOINT_EXT, r->ck.state.step);
    return 0;
}

/* Writes the checkpoint at the trainer's step; its path replaces *last. */
static int write_checkpoint(run_checkpoints *ckpts, tg_trainer *tr, int tty, char **last, tg_err *err) {
    char *path;
    double t0 = tg_wall_s();
    tg_nvtx_pushf("checkpoint write (step %d)", tr->steps_done);
    const int failed = run_checkpoints_write(ckpts, tr, &path, err);
    tg_nvtx_pop();
    if (failed) return -1;
    fprintf(stderr, "%scheckpoint %s (%.2f s)\n", tty ? "\n" : "", path, tg_wall_s() - t0);
    free(*last);
    *last = path;
    return 0;
}

static int run_plan(int argc, char **argv, const run_export *ex) {
    cli_args a;
    int rc = parse_args(argc, argv, &a,
                        "--set --metrics --device --threads --save --profile --in-flight --resume --checkpoint-dir "
                        "--nproc");
    if (rc) return rc;
    if (a.device && strcmp(a.device, "cpu") && strcmp(a.device, "cuda"))
        return usage_error("--device must be cpu or cuda, got '%s'", a.device);
    const char *step_group = getenv("TUNEGRAPH_STEP_GROUP");
    int step_group_n = 0; /* 0: what the executor does best */
    if (step_group && parse_whole(step_group, 0, TG_TRAINER_STAGING_MAX - 2, &step_group_n))
        return usage_error("TUNEGRAPH_STEP_GROUP needs a whole number from 0 to 14 (0: the executor's choice), got "
                           "'%s'",
                           step_group);
    tg_err err = {{0}};
    /* Started as one of several ranks by a launcher (--nproc, torchrun, srun, mpirun): this
     * process runs replica `rank` of a world of data-parallel replicas, one per process. */
    tg_rank_env launch;
    if (tg_rank_env_read(&launch, NULL, NULL, &err)) return die(&err);
    const int world = launch.world_size > 1 ? launch.world_size : 1;
    tg_device device = a.device ? (tg_device)tg_device_parse(a.device) : tg_default_device();
    if (a.nproc > 1 && world > 1) {
        tg_fail(&err, "--nproc starts the rank processes itself, and this process is already rank %d of %d (started by "
                      "%s): leave --nproc out",
                launch.rank, world, tg_launcher_name(launch.launcher));
        return die(&err);
    }
    if (a.nproc > 1) return start_ranks(a.nproc, device);
    if (world > 1 && device == TG_DEVICE_CPU && launch.launcher == TG_LAUNCHER_TORCHRUN) {
        tg_fail(&err, "started as rank %d of %d by torchrun on the CPU: CPU ranks meet through MPI, so start them "
                      "with mpirun -np %d (or run --nproc %d --device cpu); torchrun starts GPU ranks (--device cuda)",
                launch.rank, world, world, world);
        return die(&err);
    }
    int world_gpu = 0;
    if (world > 1 && device == TG_DEVICE_CUDA && rank_gpu(&launch, tg_cuda_device_count(), &world_gpu, &err)) /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
        return die(&err);
    double t_start = tg_wall_s();
    tg_plan plan;
    const int from_plan = tg_plan_file_sniff(a.input);
    if (from_plan) {
        tg_nvtx_push("plan load");
        const int unread = tg_plan_read(a.input, &plan, &err);
        tg_nvtx_pop();
        if (unread) return die(&err);
        if (tg_front_set_run(&plan, a.sets, a.n_sets, a.input, &err)) {
            tg_plan_free(&plan);
            return die(&err);
        }
    } else {
        /* On a GPU, recompute = auto without a memory_limit plans for the memory GPU 0 has
         * free (the replicas' GPUs are alike); where that cannot be read, the preflight
         * names the problem once the trainer opens. */
        uint64_t available = 0;
        char source[64];
        tg_err ignored;
        if (device == TG_DEVICE_CUDA && tg_device_free_memory(TG_DEVICE_CUDA, world_gpu, &available, source, sizeof source, &ignored)) /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
            available = 0;
        /* A world's size is its replica count: the job's data_parallel gives way to it, and
         * a --set that names another is refused. */
        char world_set[48];
        if (world > 1) {
            for (int k = 0; k < a.n_sets; k++)
                if (!strncmp(a.sets[k], "data_parallel=", 14) && atoi(a.sets[k] + 14) != world) {
                    tg_fail(&err, "--set %s, and %s started %d ranks (one replica each): set data_parallel to %d, or "
                                  "leave it out",
                            a.sets[k], tg_launcher_name(launch.launcher), world, world);
                    return die(&err);
                }
            if (a.n_sets == MAX_SETS) return usage_error("too many --set options (%s)", "64 at most");
            snprintf(world_set, sizeof world_set, "data_parallel=%d", world);
            a.sets[a.n_sets++] = world_set;
        }
        tg_nvtx_push("compile");
        const int failed = tg_front_compile_file_for(a.input, a.sets, a.n_sets, available, &plan, &err);
        tg_nvtx_pop();
        if (world > 1) a.sets[--a.n_sets] = NULL;
        if (failed) return die(&err);
        if (available && plan.peak_bytes_without_recompute) { /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
            char need[32], without[32], has[32];
            fprintf(stderr, "tunegraph: recompute: planned peak %s, %s without recomputing; %s %s (inspect shows what is recomputed)\n",
                    tg_mem_format_bytes(plan.peak_bytes, need, sizeof need),
                    tg_mem_format_bytes(plan.peak_bytes_without_recompute, without, sizeof without),
                    tg_mem_format_bytes(available, has, sizeof has), source);
        }
    }
    if (world > 1 && plan.train.replicas != world) {
        tg_fail(&err, "%s: the plan trains %d data-parallel replicas, and %s started %d ranks (one replica each): set "
                      "data_parallel to %d, or leave it out",
                a.input, plan.train.replicas, tg_launcher_name(launch.launcher), world, world);
        tg_plan_free(&plan);
        return die(&err);
    }
    /* Before the weights and data are read: an output that cannot be written, or would
     * overwrite an input, is refused now rather than after the training. */
    tg_named_path outputs[3];
    int n_outputs = 0;
    char *profile_svg = a.profile && a.metrics ? profile_svg_path(a.metrics) : NULL;
    if (a.metrics) outputs[n_outputs++] = (tg_named_path){a.metrics, "metrics (--metrics)"};
    if (a.save) outputs[n_outputs++] = (tg_named_path){a.save, "weights (--save)"};
    if (profile_svg) outputs[n_outputs++] = (tg_named_path){profile_svg, "profile chart (--profile)"};
    const int outputs_refused =
        (a.profile && a.metrics && !profile_svg && tg_fail(&err, "out of memory")) ||
        check_outputs(outputs, n_outputs, a.input, from_plan ? "plan file" : "job file", &plan, &err) ||
        (ex->save_dir && run_export_check(ex, &plan, a.input, from_plan ? "plan file" : "job file", outputs, n_outputs, &err));
    free(profile_svg);
    if (outputs_refused) {
        tg_plan_free(&plan);
        return die(&err);
    }
    run_resume resume;
    if (setup_checkpoints(&a, &plan, &resume, &err)) {
        run_resume_free(&resume);
        tg_plan_free(&plan);
        return die(&err);
    }
    /* The run takes every step of the schedule, so steps may queue up: the host then
     * wakes once for several of them and the GPU never waits for it. */
    tg_trainer_options opts = {.device = device, .threads = a.threads, .load_data = 1,
                               .max_in_flight = a.in_flight ? a.in_flight : TG_TRAINER_STAGING_MAX - 2,
                               .host_trace = getenv("TUNEGRAPH_HOST_TRACE") != NULL,
                               .step_group = step_group_n, .no_loader_thread = env_is_zero("TUNEGRAPH_LOADER_THREAD")};
    if (world > 1) {
        if (open_world_comm(device, &launch, world_gpu, &g_world_comm, &err)) {
            run_resume_free(&resume);
            tg_plan_free(&plan);
            return die(&err);
        }
        g_world_device = device, g_world_rank = launch.rank;
        opts.rank = launch.rank, opts.comm = g_world_comm;
        if (device == TG_DEVICE_CPU && a.threads <= 0) opts.threads = 1; /* the ranks of one machine share its cores */
        /* Ranks past 0 train beside it as replica threads do: rank 0 alone writes. */
        if (launch.rank > 0) {
            replica_run follower = {.plan = &plan, .world = world, .opts = opts, .profile = a.profile,
                                    .resume = resume.path ? &resume.ck : NULL, .resume_path = resume.path};
            follower.opts.host_trace = 0;
            run_checkpoints parts;
            if (resume.dir) { /* ZeRO-1: its slices go to rank 0 at each checkpoint; a stop is agreed on */
                run_checkpoints_init(&parts, resume.dir, &plan, resume.path ? resume.ck.state.step : 0, &g_stop_signal);
                run_checkpoints_use_world(&parts, world_gather, NULL, world_agree_every(device));
                follower.ckpts = &parts;
                follower.opts.drain_every = world_agree_every(device);
                g_defer_stop = 1;
            }
            run_replica(&follower); /* ends the process when it fails */
            const int sig = follower.stopped ? world_stop_signal(&parts) : 0;
            if (resume.dir) run_checkpoints_free(&parts);
            if (sig && world_leave(device, &err)) fprintf(stderr, "tunegraph: rank %d: %s\n", launch.rank, err.msg);
            if (!sig) close_world_comm(device, g_world_comm);
            run_resume_free(&resume);
            tg_plan_free(&plan);
            if (sig) { /* stopped with the others: ends by the signal, as rank 0 does */
                fflush(stdout);
                fflush(stderr);
                signal(sig, SIG_DFL);
                tg_coverage_flush();
                raise(sig);
            }
            return 0;
        }
    }
    /* From here on a failed run's metrics end with its error, whatever failed. */
    metrics_file *metrics = NULL;
    if (a.metrics && metrics_file_open(&metrics, a.metrics, &err)) {
        run_resume_free(&resume);
        tg_plan_free(&plan);
        return die(&err);
    }

    tg_trainer tr;
    run_checkpoints ckpts_state, *ckpts = NULL;
    if (resume.dir) {
        run_checkpoints_init(&ckpts_state, resume.dir, &plan, resume.path ? resume.ck.state.step : 0, &g_stop_signal);
        ckpts = &ckpts_state;
        /* A signal stops the run at a checkpoint, at a step every replica can reach: the
         * replica threads' launch gate picks one; rank processes agree on one (above). */
        if (world == 1) opts.launch_gate = run_checkpoints_gate, opts.gate_ctx = ckpts;
        else run_checkpoints_use_world(ckpts, world_gather, NULL, world_agree_every(device));
        if (world > 1) opts.drain_every = world_agree_every(device);
        g_defer_stop = 1;
    }
    const tg_checkpoint *resume_ck = resume.path ? &resume.ck : NULL;
    /* With checkpoints, SIGINT and SIGTERM go to this thread, which writes them: the threads
     * started until the trainer is open (replicas, workers, drivers) inherit them blocked. */
    sigset_t ending, unblocked;
    sigemptyset(&ending);
    sigaddset(&ending, SIGINT);
    sigaddset(&ending, SIGTERM);
    if (ckpts) pthread_sigmask(SIG_BLOCK, &ending, &unblocked);
    const int replicas = plan.train.replicas;
    void *comms[TG_MAX_DATA_PARALLEL] = {0};
    tg_cpu_comm_group *cpu_group = NULL;
    replica_run followers[TG_MAX_DATA_PARALLEL];
    if (replicas > 1 && world == 1) {
        if (device == TG_DEVICE_CPU && a.threads <= 0) opts.threads = 1; /* the replicas share the cores */
        if (open_comms(device, replicas, comms, &cpu_group, &err)) return end_failed_run(metrics, replicas, 0, &err);
        for (int r = 1; r < replicas; r++) {
            followers[r] = (replica_run){.plan = &plan, .opts = opts, .profile = a.profile, .metrics = metrics,
                                         .ckpts = ckpts, .resume = resume_ck, .resume_path = resume.path};
            followers[r].opts.rank = r, followers[r].opts.comm = comms[r], followers[r].opts.host_trace = 0;
            if (pthread_create(&followers[r].thread, NULL, run_replica, &followers[r])) {
                tg_fail(&err, "cannot start the thread of replica %d", r);
                return end_failed_run(metrics, replicas, 0, &err);
            }
        }
        opts.comm = comms[0];
    }
    int opened = tg_trainer_open(&tr, &plan, &opts, &err) == 0;
    if (ckpts) pthread_sigmask(SIG_SETMASK, &unblocked, NULL);
    if (!opened || (world > 1 && world_agrees(&tr, world, &err)) ||
        (resume_ck && tg_trainer_restore(&tr, resume_ck, resume.path, &err))) {
        rc = end_failed_run(metrics, replicas, 0, &err); /* returns with one replica only */
        if (opened) tg_trainer_close(&tr);
        if (ckpts) run_checkpoints_free(ckpts);
        run_resume_free(&resume);
        metrics_file_free(metrics);
        tg_plan_free(&plan);
        return rc;
    }
    const tg_plan_train *train = &plan.train;
    int tty = isatty(STDERR_FILENO);
    const char *device_name = device == TG_DEVICE_CUDA ? "cuda" : "cpu"; /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
    fprintf(stderr, "tunegraph: %s %s on %s: %d examples, batch %d x seq %d", tg_arch_name(plan.model.arch),
            tg_task_name(train->task), device_name, tr.train.n, train->batch, train->seq);
    if (train->n_buckets > 1) {
        fprintf(stderr, " (length buckets");
        for (int k = 0; k < train->n_buckets; k++) fprintf(stderr, "%s%d", k ? "," : " ", train->bucket_seq[k]);
        fputc(')', stderr);
    }
    if (train->grad_accumulation > 1) fprintf(stderr, ", %d micro-batches a step", train->grad_accumulation);
    if (replicas > 1) fprintf(stderr, " on each of %d data-parallel replicas%s", replicas, world > 1 ? " (a process each)" : "");
    /* Steps per epoch: windows of grad_accumulation batches, the last one short. */
    const int micro = train->grad_accumulation > 1 ? train->grad_accumulation : 1;
    fprintf(stderr, ", %d steps (%d per epoch, last batch: %s)", tr.total_steps, (tr.sampler.per_epoch + micro - 1) / micro,
            tg_last_batch_name(plan.run.last_batch));
    int n_class[TG_CLASS_COUNT] = {0};
    for (int i = 0; i < plan.n_tensors; i++)
        if (tg_tensor_is_value(&plan.tensors[i])) n_class[tg_tensor_class_of(&plan.tensors[i])]++;
    if (n_class[TG_CLASS_FROZEN])
        fprintf(stderr, ", %d parameters trainable, %d frozen", n_class[TG_CLASS_TRAINABLE], n_class[TG_CLASS_FROZEN]);
    if (tr.weights_loaded) {
        fprintf(stderr, ", %d tensors from %s (%d trainable, %d frozen, %d buffers; %d newly initialised%s%s",
                tr.weights.loaded, plan.model.weights, tr.weights.trainable, tr.weights.frozen, tr.weights.buffers,
                tr.weights.missing, tr.weights.missing ? ", first " : "", tr.weights.first_missing);
        if (tr.weights.ignored) fprintf(stderr, "; %d ignored as Hugging Face does", tr.weights.ignored);
        fputc(')', stderr);
    }
    fprintf(stderr, "\n");
    print_weights_report(stderr, &tr);
    fprintf(stderr, "tunegraph: ready in %.2f s (executor and pools %.2f s, weights %.2f s, data %.2f s)\n",
            tg_wall_s() - t_start, tr.open_ms[0] / 1e3, tr.open_ms[1] / 1e3, tr.open_ms[2] / 1e3);
    if (resume_ck) fprintf(stderr, "tunegraph: resumed from %s at step %d of %d\n", resume.path, tr.steps_done, tr.total_steps);

    /* The energy of the run's GPUs (one per replica) over the training steps, from NVML's
     * counters read at their start and end; why not, where it cannot be read. */
    tg_energy_meter energy_meter;
    tg_err energy_err = {{0}};
    double energy_start_j = 0, energy_end_j = 0;
    int energy_on = 0;
    if (device == TG_DEVICE_CUDA) /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
        energy_on = tg_energy_meter_open(&energy_meter, world > 1 ? (launch.local_size > 0 ? launch.local_size : 1) : replicas, &energy_err) == 0 &&
                    tg_energy_meter_read(&energy_meter, &energy_start_j, &energy_err) == 0;
    double warmup_s = tg_wall_s() - t_start, t_train = tg_wall_s(), first_loss = NAN, last_loss = NAN;
    double cpu_train = tg_process_cpu_s(), cpu_first_step = 0, thread_train = tg_thread_cpu_s(), thread_first_step = 0;
    int64_t tokens = 0, own_tokens = 0, own_slots = 0;
    double *step_times = tg_calloc((size_t)tr.total_steps + 1, sizeof *step_times);
    /* Data parallelism on CUDA: each step's gradient sums, busy and exposed ms. */
    double *comm_times = tg_calloc(2 * ((size_t)tr.total_steps + 1), sizeof *comm_times);
    double *exposed_times = comm_times ? comm_times + tr.total_steps + 1 : NULL;
    int comm_measured = 0;
    metrics_step_line *step_line = metrics ? metrics_step_line_new() : NULL;
    rc = step_times && comm_times && (!metrics || step_line) ? 0 : tg_fail(&err, "out of memory");
    /* TUNEGRAPH_HOST_TRACE: the loop thread's CPU time inside tg_trainer_step (batch fills
     * included) and outside it (metrics and progress), steps after the first. */
    double trace_step_s = 0, trace_rest_s = 0, trace_fill0 = 0, trace_t = 0;
    tg_thread_cpu threads_after_first; /* every thread's CPU time once the first step is back */
    int threads_ok = 0;
    /* ran: the steps this process takes (a resumed run starts past the checkpoint's). */
    int32_t ran = 0, checkpointed = resume_ck ? tr.steps_done : -1;
    int stopped = 0;
    char *last_checkpoint = resume.path ? strdup(resume.path) : NULL;
    for (; tr.steps_done < tr.total_steps && !rc; ran++) {
        if ((stopped = stopping(ckpts, &tr, &err))) {
            if (stopped < 0) rc = 1, stopped = 0;
            break;
        }
        const int32_t i = ran;
        tg_step_stats s;
        if (opts.host_trace) trace_t = tg_thread_cpu_s();
        if (tg_trainer_step(&tr, &s, &err)) {
            rc = 1;
            break;
        }
        if (opts.host_trace && i > 0) trace_step_s += tg_thread_cpu_s() - trace_t;
        if (i == 0) {
            first_loss = s.loss;
            threads_ok = tg_thread_cpu_snapshot(&threads_after_first) == 0; /* counted in the first step */
            cpu_first_step = tg_process_cpu_s() - cpu_train; /* capture and algorithm choice */
            thread_first_step = tg_thread_cpu_s() - thread_train;
            trace_fill0 = tr.fill_cpu_s;
        }
        if (opts.host_trace) trace_t = tg_thread_cpu_s();
        last_loss = s.loss;
        step_times[i] = s.step_ms;
        comm_times[i] = s.comm_ms, exposed_times[i] = s.comm_exposed_ms;
        comm_measured |= s.comm_ms >= 0;
        /* Replica 0's tokens stand for each replica's (equal for fixed-length rows). */
        tokens += s.tokens * replicas;
        own_tokens += s.tokens, own_slots += s.slots;
        double tok_s = s.tokens * replicas / (s.step_ms / 1e3);
        if (metrics) {
            FILE *f = metrics_file_lock(metrics);
            if (f && metrics_write_step(step_line, f, &s, tok_s)) /* GCOVR_EXCL_BR_LINE: f is NULL only once a failing replica ended the file, and that replica then ends the process */
                rc = tg_fail(&err, "%s: cannot write a line of the metrics file", a.metrics);
            metrics_file_unlock(metrics);
        }
        double elapsed = tg_wall_s() - t_train;
        char eta[32];
        cli_format_hms(elapsed / (i + 1) * (tr.total_steps - s.step), eta, sizeof eta);
        if (tty)
            fprintf(stderr, "\rstep %d/%d  loss %.4f  lr %.2e  %.0f tok/s  ETA %s   ", s.step, tr.total_steps,
                    s.loss, s.lr, tok_s, eta);
        else if (s.step % plan.run.log_every == 0 || s.step == tr.total_steps)
            fprintf(stderr, "step %d/%d loss %.4f lr %.2e %.0f tok/s ETA %s\n", s.step, tr.total_steps, s.loss,
                    s.lr, tok_s, eta);
        if (opts.host_trace && i > 0) trace_rest_s += tg_thread_cpu_s() - trace_t;
        if (!rc && ckpts && run_checkpoints_due(ckpts, tr.steps_done)) {
            if (write_checkpoint(ckpts, &tr, tty, &last_checkpoint, &err)) rc = 1;
            else checkpointed = tr.steps_done;
        }
    }
    /* A stop requested once the last step was taken checkpoints there (rank processes: the
     * ranks agree on that too). */
    if (!rc && ckpts && ckpts->gather && !stopped && (stopped = stopping(ckpts, &tr, &err)) < 0) rc = 1, stopped = 0;
    else if (!rc && ckpts && !ckpts->gather && g_stop_signal) stopped = 1;
    if (!rc && stopped && checkpointed != tr.steps_done && write_checkpoint(ckpts, &tr, tty, &last_checkpoint, &err))
        rc = 1;
    if (!rc && stopped) { /* ends the process by the signal */
        const int sig = world > 1 ? world_stop_signal(ckpts) : g_stop_signal;
        /* Sized by its paths (a checkpoint folder's may pass TG_PATH_MAX); the process ends
         * by the signal with it allocated. */
        char *full = NULL;
        if (asprintf(&full, "interrupted by %s after step %d of %d; checkpoint %s (resume with --resume %s)", /* GCOVR_EXCL_BR_LINE: asprintf fails only out of memory, and libc's is beyond the allocation hook */
                     sig == SIGINT ? "SIGINT" : "SIGTERM", tr.steps_done, tr.total_steps,
                     last_checkpoint ? last_checkpoint : "(none)", resume.dir) < 0) /* GCOVR_EXCL_BR_LINE: a stop always has a checkpoint: the one resumed from or one of this step (above) */
            full = NULL;
        const char *msg = full ? full : sig == SIGINT ? "interrupted by SIGINT" : "interrupted by SIGTERM"; /* GCOVR_EXCL_BR_LINE: full is NULL only when asprintf ran out of memory (above) */
        fprintf(stderr, "%stunegraph: %s\n", tty ? "\n" : "", msg);
        if (metrics && metrics_file_end(metrics, msg, -1, &err)) fprintf(stderr, "tunegraph: %s\n", err.msg);
        if (world > 1 && world_leave(device, &err)) fprintf(stderr, "tunegraph: %s\n", err.msg);
        fflush(stdout);
        fflush(stderr);
        signal(sig, SIG_DFL);
        tg_coverage_flush();
        raise(sig);
        _exit(128 + sig);
    }
    free(last_checkpoint);
    double train_s = tg_wall_s() - t_train;
    if (energy_on) /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
        energy_on = tg_energy_meter_read(&energy_meter, &energy_end_j, &energy_err) == 0;
    /* NVML's energy counters advance every few tens of milliseconds: a shorter run reads
     * none, which is no measurement (it would report 0 W and no tokens per joule). */
    if (energy_on && !(energy_end_j > energy_start_j)) { /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
        energy_on = 0;
        tg_fail(&energy_err, "the GPUs' energy counters did not advance over the %.3f s of training", tg_wall_s() - t_train);
    }
    if (device == TG_DEVICE_CUDA) tg_energy_meter_close(&energy_meter); /* GCOVR_EXCL_BR_LINE: as above */
    /* Host CPU per step after the first, metrics and progress output included: the whole
     * process, its training loop thread, and the CUDA driver's event thread, which burns
     * about 1 us per ms of wall time in any process with a CUDA context, idle or not
     * (docs/perf-notes.md), so is left out of what the run itself costs. */
    double host_cpu_us = us_per_later_step(tg_process_cpu_s() - cpu_train - cpu_first_step, ran);
    double loop_cpu_us = us_per_later_step(tg_thread_cpu_s() - thread_train - thread_first_step, ran);
    double driver_cpu_us = 0;
    tg_thread_cpu threads_now;
    if (threads_ok && ran > 1 && tg_thread_cpu_snapshot(&threads_now) == 0) { /* GCOVR_EXCL_BR_LINE: the snapshot failing here needs /proc/self/task unreadable after it was read at the first step: only descriptors run out in between, which no run does */
        driver_cpu_us = us_per_later_step(tg_thread_cpu_named(&threads_after_first, &threads_now, "cuda-EvtHandlr"), ran);
        if (opts.host_trace) {
            char buf[2048];
            tg_thread_cpu_report(&threads_after_first, &threads_now, ran - 1, buf, sizeof buf);
            fprintf(stderr, "thread trace (CPU us per step after the first, by thread): %s\n", buf);
        }
    }
    if (opts.host_trace && ran > 1) {
        double n = (ran - 1) / 1e6;
        fprintf(stderr, "loop trace (thread CPU us per step after the first): in tg_trainer_step %.1f (batch fills %.1f), "
                        "metrics and progress %.1f\n",
                trace_step_s / n, (tr.fill_cpu_s - trace_fill0) / n, trace_rest_s / n);
    }
    if (tty) fprintf(stderr, "\n");
    double median_step_ms = median_after_first(step_times, ran);
    free(step_times);
    const double median_comm_ms = comm_measured ? median_after_first(comm_times, ran) : -1;
    const double median_exposed_ms = comm_measured ? median_after_first(exposed_times, ran) : -1;
    free(comm_times);
    tg_eval_stats ev = {.accuracy = -1, .perplexity = -1, .macro_f1 = -1};
    int evaluated = 0;
    if (!rc && tr.has_eval) {
        if (tg_trainer_eval(&tr, &ev, &err)) rc = 1;
        else evaluated = 1;
    }
    if (!rc && a.save && tg_trainer_save(&tr, a.save, &err)) rc = 1;
    if (!rc && ex->save_dir && run_export_write(ex, &tr, &err)) rc = 1;
    /* Last: profiling runs more steps, which move the weights. */
    if (!rc && a.profile) {
        char *svg = a.metrics ? profile_svg_path(a.metrics) : NULL;
        if ((a.metrics && !svg && tg_fail(&err, "out of memory")) || report_profile(&tr, metrics, median_step_ms, svg, &err))
            rc = 1;
        free(svg);
    }
    if (!rc) {
        tg_memory_use mem;
        tg_trainer_memory(&tr, &mem);
        metrics_summary summary = {
            .steps = tr.steps_done, .skipped_steps = tr.skipped_steps, .first_loss = first_loss, .final_loss = last_loss, .train_s = train_s,
            .warmup_s = warmup_s, .tokens = tokens,
            .padding_fraction = own_slots ? 1.0 - (double)own_tokens / (double)own_slots : 0,
            .batch_wait_s = tr.batch_wait_s, .median_step_ms = median_step_ms, .host_cpu_us = host_cpu_us,
            .loop_cpu_us = loop_cpu_us, .driver_cpu_us = driver_cpu_us, .device = device_name,
            .replicas = replicas, .mem = &mem, .eval = evaluated ? &ev : NULL,
            .comm_ms = median_comm_ms, .comm_exposed_ms = median_exposed_ms};
        if (energy_on) { /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
            summary.energy_measured = 1;
            summary.energy = tg_energy_use_of(energy_end_j - energy_start_j, ran, tokens, train_s);
        }
        /* The price stands for each GPU's hour on CUDA, for the machine's on the CPU. */
        const int priced_units = device == TG_DEVICE_CUDA ? replicas : 1; /* GCOVR_EXCL_BR_LINE: as above */
        summary.cost_per_1m_tokens = tg_cost_per_1m_tokens(plan.run.gpu_hour_price, priced_units, tokens, train_s);
        /* Model FLOP utilisation of replica 0's GPU (GPU 0), each replica alike. */
        char gpu[256] = "";
        double peak = 0;
        if (device == TG_DEVICE_CUDA && median_step_ms > 0 && tg_cuda_device_name(0, gpu, sizeof gpu) == 0) /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
            peak = tg_gpu_dense_peak_tflops(gpu, plan.train.precision, plan.train.allow_tf32);
        if (peak > 0) { /* GCOVR_EXCL_BR_LINE: as above */
            summary.gpu = gpu;
            summary.model_tflops = plan.flops_per_step / (median_step_ms / 1e3) / 1e12;
            summary.mfu = summary.model_tflops / peak;
        }
        if (metrics) {
            FILE *f = metrics_file_lock(metrics);
            if (f && metrics_write_summary(f, &summary)) /* GCOVR_EXCL_BR_LINE: as for the step lines: an ended file means a failing replica is ending the process */
                rc = tg_fail(&err, "%s: cannot write the summary line of the metrics file", a.metrics);
            metrics_file_unlock(metrics);
        }
        fprintf(stderr,
                "trained %d steps in %.1f s: loss %.4f -> %.4f, %.0f tokens/s, median step %.3f ms, host CPU %.0f us/step "
                "(training loop thread %.0f us",
                ran, train_s, first_loss, last_loss, tokens / train_s, median_step_ms,
                host_cpu_us - driver_cpu_us, loop_cpu_us);
        if (driver_cpu_us > 0) /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor (no driver thread) */
            fprintf(stderr, "; besides, the CUDA driver's event thread %.0f us", driver_cpu_us);
        fprintf(stderr, ")\n");
        if (peak > 0) /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
            fprintf(stderr, "model FLOP utilisation: %.1f%% (%.1f of %.1f dense TFLOP/s on %s)\n", 100 * summary.mfu,
                    summary.model_tflops, peak, gpu);
        if (energy_on) /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
            fprintf(stderr, "energy: %.1f J on %d GPU%s over %d steps: %.4g J/step, %.4g J per 1k tokens, %.1f W average, "
                            "%.4g tokens/J\n",
                    summary.energy.joules, replicas, replicas > 1 ? "s" : "", ran, summary.energy.joules_per_step,
                    summary.energy.joules_per_1k_tokens, summary.energy.avg_power_w, summary.energy.tokens_per_joule);
        else if (device == TG_DEVICE_CUDA) /* GCOVR_EXCL_BR_LINE: as above */
            fprintf(stderr, "energy: not measured (%s)\n", energy_err.msg);
        if (summary.cost_per_1m_tokens > 0)
            fprintf(stderr, "cost: %.4g per 1M tokens (%g per %s hour x %d)\n", summary.cost_per_1m_tokens,
                    (double)plan.run.gpu_hour_price, device == TG_DEVICE_CUDA ? "GPU" : "machine", priced_units); /* GCOVR_EXCL_BR_LINE: as above */
        if (median_comm_ms >= 0)
            fprintf(stderr, "gradient sums: %d buckets, %.3f ms a step, %.3f ms of it after the backward (medians)\n",
                    tr.comm.buckets, median_comm_ms, median_exposed_ms);
        fprintf(stderr, "batches: %.1f%% of the token slots padding%s, waited for %.1f ms (%.2f%% of the training time)\n", /* GCOVR_EXCL_BR_LINE: train_s > 0: monotonic time from before the loop to after it */
                summary.padding_fraction * 100, plan.train.n_buckets > 1 ? " (with length buckets)" : "",
                tr.batch_wait_s * 1e3, train_s > 0 ? tr.batch_wait_s / train_s * 100 : 0);
        char planned_s[32], estimate_s[32], measured_s[32] = "not measurable here";
        if (mem.measured >= 0) tg_mem_format_bytes((uint64_t)mem.measured, measured_s, sizeof measured_s); /* GCOVR_EXCL_BR_LINE: -1 only when /proc/self/status has no VmRSS, the kernel's */
        fprintf(stderr, "peak memory on %s: measured %s (%s), planned %s (the pools; estimate %s)\n", /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
                device == TG_DEVICE_CUDA ? "the GPU" : "the CPU", measured_s,
                device == TG_DEVICE_CUDA ? "device memory taken beyond the CUDA context" : "resident set growth",
                tg_mem_format_bytes(mem.planned, planned_s, sizeof planned_s),
                tg_mem_format_bytes(mem.estimated, estimate_s, sizeof estimate_s));
        if (evaluated && metrics_eval_nothing_counted(&ev)) {
            fprintf(stderr, "eval on %d examples: %s, so no loss or %s\n", ev.examples,
                    metrics_eval_nothing_counted(&ev), ev.perplexity < 0 ? "accuracy" : "perplexity"); /* GCOVR_EXCL_BR_LINE: only token labels (lm, mlm) can leave nothing counted; classify and qa count every row, and an empty eval set is refused */
        } else if (evaluated) {
            fprintf(stderr, "eval on %d examples: loss %.4f", ev.examples, ev.loss);
            if (ev.accuracy >= 0) fprintf(stderr, ", accuracy %.4f, macro-F1 %.4f", ev.accuracy, ev.macro_f1);
            if (ev.perplexity >= 0) fprintf(stderr, ", perplexity %.3f", ev.perplexity);
            if (ev.questions > 0)
                fprintf(stderr, ", %lld questions: exact %.2f, F1 %.2f (HasAns %lld: exact %.2f, F1 %.2f; NoAns %lld: "
                                "exact %.2f, F1 %.2f)",
                        (long long)ev.questions, ev.exact, ev.f1, (long long)ev.has_ans_total, ev.has_ans_exact,
                        ev.has_ans_f1, (long long)ev.no_ans_total, ev.no_ans_exact, ev.no_ans_f1);
            fprintf(stderr, "\n");
        }
        if (a.save) fprintf(stderr, "saved %s\n", a.save);
        if (ex->save_dir) fprintf(stderr, "exported %s\n", ex->save_dir);
    }
    metrics_step_line_free(step_line);
    if (rc) {
        rc = end_failed_run(metrics, replicas, 0, &err); /* returns with one replica only */
        tg_trainer_close(&tr);
        if (ckpts) run_checkpoints_free(ckpts);
        run_resume_free(&resume);
        metrics_file_free(metrics);
        tg_plan_free(&plan);
        return rc;
    }
    tg_trainer_close(&tr);
    if (world > 1) close_world_comm(device, g_world_comm);
    for (int r = 1; r < replicas && world == 1; r++) pthread_join(followers[r].thread, NULL);
    if (cpu_group) tg_cpu_comm_group_destroy(cpu_group);
    else if (replicas > 1 && world == 1) tg_cuda_comms_destroy(comms, replicas); /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
    if (ckpts) run_checkpoints_free(ckpts);
    run_resume_free(&resume);
    /* Last, with every replica done: none can fail after the file is in place. */
    if (metrics && metrics_file_end(metrics, NULL, -1, &err)) rc = die(&err);
    metrics_file_free(metrics);
    tg_plan_free(&plan);
    /* A stop requested after the last step's checkpoint (during eval or the save) ends the
     * finished run by the signal all the same. */
    const int sig = g_stop_signal;
    if (sig) {
        fflush(stdout);
        fflush(stderr);
        signal(sig, SIG_DFL);
        tg_coverage_flush();
        raise(sig);
    }
    return rc;
}

/* run's --save-dir options come out of argv first (cli/export.c); the rest is run_plan's. */
static int cmd_run(int argc, char **argv) {
    run_export ex;
    /* The export options come out of argv in place; --nproc's ranks get them all. */
    char **given = tg_calloc((size_t)argc + 1, sizeof *given);
    if (!given) return fprintf(stderr, "tunegraph: out of memory\n"), 1;
    memcpy(given, argv, (size_t)argc * sizeof *given);
    g_run_argc = argc, g_run_argv = given;
    int rc = run_export_args(&argc, argv, &ex);
    if (!rc) rc = run_plan(argc, argv, &ex);
    run_export_free(&ex);
    free(given);
    g_run_argc = 0, g_run_argv = NULL;
    return rc;
}

/* SIGINT, SIGTERM, SIGHUP and SIGPIPE (a pipe read by --metrics or -o closed early) end the
 * process as they would, after removing the temporary files of the outputs being written
 * (each target is left as it was). Async-signal-safe calls only; SA_RESETHAND has restored
 * the default action, which the signal raised again takes once the handler returns.
 * Except the first SIGINT or SIGTERM of a run that writes checkpoints: it only asks the
 * run to stop (g_stop_signal), which then writes a checkpoint and ends by the signal; the
 * handler is set again, so a second signal ends the process at once. */
/* GCOVR_EXCL_BR_START: the handler runs in a process that then ends by the signal, before gcov
 * writes its counts (tests/test_values_cli.c and tests/test_checkpoint.c check it). */
static void on_ending_signal(int got) {
    /* A rank under mpirun: SIGUSR1 and SIGUSR2 stand for the SIGTERM and SIGINT that
     * `run --nproc` passes on through mpirun (cli/launch.c). */
    const int sig = got == SIGUSR1 ? SIGTERM : got == SIGUSR2 ? SIGINT : got;
    if (g_defer_stop && !g_stop_signal && (sig == SIGINT || sig == SIGTERM)) {
        g_stop_signal = sig;
        static const char note[] = "\ntunegraph: stopping after the steps in flight to write a checkpoint (signal "
                                   "again to stop at once)\n";
        (void)!write(STDERR_FILENO, note, sizeof note - 1);
        struct sigaction sa;
        if (sigaction(got, NULL, &sa) == 0) {
            sa.sa_handler = on_ending_signal;
            sa.sa_flags |= SA_RESETHAND;
            sigaction(got, &sa, NULL);
        }
        return;
    }
    tg_atomic_remove_temps();
    if (sig != got) signal(sig, SIG_DFL); /* SA_RESETHAND restored the default of `got` only */
    raise(sig);
}
/* GCOVR_EXCL_BR_STOP */

static void install_signal_handlers(void) {
    /* The last two only in a rank started by mpirun (see on_ending_signal). */
    static const int signals[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGUSR1, SIGUSR2};
    const size_t n = getenv("OMPI_COMM_WORLD_SIZE") ? 6 : 4;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_ending_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < n; i++) sigaddset(&sa.sa_mask, signals[i]);
    for (size_t i = 0; i < n; i++) {
        struct sigaction old;
        /* A signal the caller ignores (nohup, a background job) stays ignored. */
        if (sigaction(signals[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN) sigaction(signals[i], &sa, NULL); /* GCOVR_EXCL_BR_LINE: reading the action of a valid signal cannot fail */
    }
}

int main(int argc, char **argv) {
    install_signal_handlers();
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "compile")) return cmd_compile(argc - 2, argv + 2);
    if (!strcmp(cmd, "inspect")) return cmd_inspect(argc - 2, argv + 2);
    if (!strcmp(cmd, "run")) return artifact_run(argc - 2, argv + 2, cmd_run);
    if (!strcmp(cmd, "sweep")) return cmd_sweep(argc - 2, argv + 2, cmd_run);
    if (!strcmp(cmd, "compare")) return cmd_compare(argc - 2, argv + 2);
    if (!strcmp(cmd, "data")) return cmd_data(argc - 2, argv + 2);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc - 2, argv + 2);
    if (!strcmp(cmd, "export")) return cmd_export(argc - 2, argv + 2);
    if (!strcmp(cmd, "predict")) return cmd_predict(argc - 2, argv + 2);
    if (!strcmp(cmd, "plot")) return cmd_plot(argc - 2, argv + 2);
    if (!strcmp(cmd, "calibrate")) return cmd_calibrate(argc - 2, argv + 2);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        if (argc > 2) return usage_error("version takes no arguments (got '%s')", argv[2]);
        puts(TG_VERSION_STRING);
        return 0;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        fputs(usage, stdout);
        return 0;
    }
    return usage_error("unknown command '%s'", cmd);
}
