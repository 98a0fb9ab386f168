/* One process per rank. `tunegraph run JOB --nproc N` starts N rank processes of itself on
 * this machine, as torchrun --nproc-per-node does, and supervises them: one that fails,
 * dies or is killed stops the others. A process started as a rank (by --nproc, torchrun,
 * srun or mpirun: runtime/launch_env.h) runs one replica of the job's data parallelism
 * and, once its communicator is up, checks with the other ranks that they all run the
 * same plan on the same data. */
#ifndef TUNEGRAPH_CLI_LAUNCH_H
#define TUNEGRAPH_CLI_LAUNCH_H

#include <stdint.h>

#include "base/error.h"
#include "runtime/launch_env.h"

/* What every rank of a world must agree on before its first step. */
typedef struct rank_identity {
    uint64_t plan_fingerprint;
    uint64_t data_hash; /* of the training examples (tg_trainer_data_hash) */
    int32_t world;      /* the world size the rank was started in */
    int32_t examples;   /* training examples */
} rank_identity;

/* 0 when every rank's identity (all[0 .. world)) is rank 0's, else -1 with a message naming
 * the ranks that differ and what differs (the first field that does, for each). */
int rank_identities_agree(const rank_identity *all, int world, tg_err *err);

/* The GPU a rank runs on: its local rank among `visible` GPUs, or GPU 0 where the
 * launcher gave each process one GPU (one visible). 0, or -1 naming the rank. */
int rank_gpu(const tg_rank_env *env, int visible, int *gpu, tg_err *err);

/* A free TCP port on the loopback interface (for NCCL's bootstrap); 0 when none can be
 * had. */
int launch_free_port(void);

/* Starts `nproc` processes of `exe` with `argv` (argv[0] first, NULL-terminated), rank r
 * with RANK=r, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1,
 * MASTER_PORT and NCCL_COMM_ID (a free port) set, and waits for them. When one exits
 * non-zero or by a signal, the message names its rank and cause, the others get SIGTERM
 * and, after grace_s, SIGKILL. A SIGINT or SIGTERM to the supervisor goes to every rank
 * (not again where the terminal sent it to them too), which then stop as they do (at a
 * checkpoint, where the run writes them), however long it takes; ranks ending by it are
 * no failure, and a second signal is passed on too. Returns the exit status for the
 * supervisor: 0 when every rank ended with 0, 1 when one failed, else 128 + the signal
 * that stopped the supervisor. */
int launch_ranks(const char *exe, char *const argv[], int nproc, double grace_s);

/* Runs mpirun (argv[0], found on PATH) with `argv` for --nproc N CPU ranks, in a process
 * group of its own, and waits for it. A SIGINT or SIGTERM to the supervisor goes to the
 * ranks as SIGUSR2 or SIGUSR1, which mpirun forwards (its own SIGINT and SIGTERM end the
 * job at once) and a rank takes as the signal it stands for (cli/main.c). Returns mpirun's
 * exit status (128 + its signal), 128 + the signal that stopped the supervisor, or 1 when
 * mpirun cannot be run, saying why and where it was looked for. */
int launch_mpirun(char *const argv[], int nproc);

/* The signal launch_ranks or launch_mpirun last passed on to the ranks (0: none). */
int launch_stopped_by(void);

/* realpath(link) (this program's file from "/proc/self/exe"), malloc'd; NULL with a
 * message naming the link and the cause when it cannot be resolved. */
char *launch_self_path(const char *link, tg_err *err);

/* argv (NULL-terminated) without "--nproc N" (every occurrence); NULL when out of memory.
 * Free the array only (the strings are argv's). */
char **launch_argv_without_nproc(int argc, char *const argv[]);

#endif
