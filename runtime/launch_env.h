/* The rank a launcher gave this process, read from the environment it sets: torchrun
 * (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Open MPI's
 * mpirun (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE) and Slurm's srun
 * (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; MASTER_ADDR, else the first host of
 * SLURM_JOB_NODELIST or SLURM_NODELIST). torchrun's variables win where several launchers'
 * are set (torchrun inside a Slurm allocation), then Open MPI's, then Slurm's. A launcher
 * counts where its rank variable is set; then its others must be too, and a set missing
 * one, or holding a number out of range (0 <= rank < world size <= TG_LAUNCH_MAX_RANKS,
 * 0 <= local rank < local size), is refused naming the variable and its value. */
#ifndef TUNEGRAPH_LAUNCH_ENV_H
#define TUNEGRAPH_LAUNCH_ENV_H

#include <stddef.h>

#include "base/error.h"

#define TG_LAUNCH_MAX_RANKS 65536
#define TG_LAUNCH_HOST_MAX 256

typedef enum tg_launcher {
    TG_LAUNCHER_NONE = 0, /* no launcher's variables: one process, rank 0 of 1 */
    TG_LAUNCHER_TORCHRUN,
    TG_LAUNCHER_OPENMPI,
    TG_LAUNCHER_SLURM,
    TG_LAUNCHER_COUNT
} tg_launcher;

typedef struct tg_rank_env {
    int launcher;         /* tg_launcher */
    int rank, world_size; /* this process among all */
    int local_rank;       /* among the processes of its machine */
    int local_size;       /* processes on its machine; 0 where the launcher does not say */
    char master_addr[TG_LAUNCH_HOST_MAX]; /* "" where none is known */
    int master_port;                      /* 0 where none is known */
} tg_rank_env;

/* The value of environment variable `name`, or NULL; ctx is the caller's. */
typedef const char *(*tg_env_lookup)(const char *name, void *ctx);

/* Reads the rank from the variables `lookup` gives (NULL: the process environment). 0, or
 * -1 with the reason in err. */
int tg_rank_env_read(tg_rank_env *out, tg_env_lookup lookup, void *ctx, tg_err *err);

/* The first host of a Slurm node list ("gpu-a[07-09,12],gpu-b3" -> "gpu-a07"): the text up
 * to the first top-level comma with each bracketed range list replaced by its first number,
 * zero padding kept. 0, or -1 (err names the list) for a list Slurm would not write:
 * empty, an unclosed or nested bracket, an empty range, a range that is not digits-digits
 * with its start at most its end, or a host past TG_LAUNCH_HOST_MAX - 1 bytes. */
int tg_slurm_first_host(const char *nodelist, char *host, size_t cap, tg_err *err);

/* The launcher's name ("torchrun", "mpirun", "srun", "none"). */
const char *tg_launcher_name(int launcher);

#endif
