/* The run command's checkpoints (runtime/checkpoint.h): the folder they go to, the steps
 * they are written at, and how data-parallel replicas, each training in a thread of its
 * own, agree on the step a SIGINT or SIGTERM stops the run at and hand replica 0 their
 * parts of a checkpoint. */
#ifndef TUNEGRAPH_CLI_CHECKPOINTS_H
#define TUNEGRAPH_CLI_CHECKPOINTS_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>

#include "runtime/checkpoint.h"
#include "runtime/trainer.h"

/* all[r * bytes ..] = rank r's `mine`, on every rank of a launched world: 0, or -1. */
typedef int (*run_checkpoints_gather)(void *ctx, const void *mine, void *all, size_t bytes, tg_err *err);

typedef struct run_checkpoints {
    const char *dir;        /* the folder they go to */
    int every;              /* the plan's checkpoint_every (0: only on a signal) */
    int keep;               /* the plan's keep_checkpoints */
    int replicas;
    int parts;              /* the replicas hand replica 0 parts of their own (ZeRO-1 slices) */
    const volatile sig_atomic_t *stop_signal; /* nonzero once a stop is requested */
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int64_t reserved;       /* the most steps a replica has started or is starting */
    int64_t stop_at;        /* the step every replica stops at; -1 until a stop is requested */
    tg_checkpoint part[TG_MAX_DATA_PARALLEL];
    int32_t part_step[TG_MAX_DATA_PARALLEL]; /* the step of the part handed over; -1: none */
    run_checkpoints_gather gather;           /* rank processes: parts travel through it */
    void *gather_ctx;
    int agree_every;        /* rank processes: the steps between their agreements on a stop */
    int stop_with;          /* rank processes: the signal of the stop agreed on (0: none) */
} run_checkpoints;

/* Rank processes of a launched world (cli/launch.h) hand their parts to rank 0 through
 * their communicator instead: every rank calls it at every checkpoint step. They agree on
 * the step a stop request stops them at through it too, every `agree_every` steps
 * (run_checkpoints_world_stop). */
void run_checkpoints_use_world(run_checkpoints *c, run_checkpoints_gather gather, void *ctx, int agree_every);
/* Rank processes, every rank at the same steps with no step in flight: at a multiple of
 * agree_every and at the run's end (`step` of `total`), gathers every rank's stop request
 * (*stop_signal); when any rank has one, the run stops at this step on every rank
 * (run_checkpoints_stop_step), and stop_with is the first such rank's signal. A rank's own
 * request never chooses a stop step alone: the ranks would each choose their own. 0, or -1
 * when the gather failed. */
int run_checkpoints_world_stop(run_checkpoints *c, int64_t step, int64_t total, tg_err *err);

/* Checkpoints into `dir` for a run of `plan` starting at start_step (0, or the step
 * resumed from); a stop is requested once *stop_signal is nonzero. */
void run_checkpoints_init(run_checkpoints *c, const char *dir, const tg_plan *plan, int32_t start_step,
                          const volatile sig_atomic_t *stop_signal);
void run_checkpoints_free(run_checkpoints *c);

/* The trainers' tg_launch_gate (ctx: the run_checkpoints): steps are reserved as they are
 * started, and once a stop is requested, the stop step is the most any replica reserved,
 * which every replica can still reach. */
int64_t run_checkpoints_gate(void *ctx, int64_t launched, int64_t steps);
/* The step the run stops at, chosen now if a stop has just been requested; -1 while none
 * is. */
int64_t run_checkpoints_stop_step(run_checkpoints *c);
/* Whether the run writes a checkpoint after `step` steps (a multiple of checkpoint_every). */
int run_checkpoints_due(const run_checkpoints *c, int32_t step);

/* A replica other than 0: hands replica 0 its part of the checkpoint at its current step
 * (nothing without ZeRO-1), waiting while its previous part is still unclaimed; a rank
 * process gathers it to rank 0 (which must be writing that step's checkpoint). */
int run_checkpoints_hand_over(run_checkpoints *c, tg_trainer *t, tg_err *err);
/* Replica 0: the checkpoint at its current step, with the other replicas' parts (waited
 * for), written into the folder; its path into *path (malloc'd). */
int run_checkpoints_write(run_checkpoints *c, tg_trainer *t, char **path, tg_err *err);

#endif
