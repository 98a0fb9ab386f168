/* The rank a launcher gave the process (runtime/launch_env.h): torchrun's, mpirun's and
 * srun's variables, which wins where several are set, the rendezvous address (Slurm's
 * first host), and the refusals naming the variable; Slurm node lists' first hosts. */
#include <stdio.h>
#include <string.h>

#include "runtime/launch_env.h"
#include "tests/harness.h"

/* An environment of "NAME=value" strings, NULL-terminated. */
static const char *lookup(const char *name, void *ctx) {
    const size_t n = strlen(name);
    for (const char *const *e = ctx; *e; e++)
        if (!strncmp(*e, name, n) && (*e)[n] == '=') return *e + n + 1;
    return NULL;
}

TG_TEST(test_launch_env_launchers) {
    static const char *none[] = {"HOME=/root", "WORLD_SIZE=4", "SLURM_NTASKS=8", NULL};
    static const char *torchrun[] = {"RANK=5", "WORLD_SIZE=8", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=4",
                                     "MASTER_ADDR=node-a", "MASTER_PORT=29500",
                                     /* inside a Slurm allocation: torchrun's win */
                                     "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_LOCALID=0", NULL};
    static const char *mpirun[] = {"OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=1",
                                   "OMPI_COMM_WORLD_LOCAL_SIZE=2", NULL};
    static const char *srun[] = {"SLURM_PROCID=6", "SLURM_NTASKS=16", "SLURM_LOCALID=2",
                                 "SLURM_JOB_NODELIST=gpu-a[07-09,12],gpu-b3", NULL};
    static const char *srun_master[] = {"SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_LOCALID=0",
                                        "SLURM_NODELIST=n[1-2]", "MASTER_ADDR=10.0.0.5", "MASTER_PORT=6000", NULL};
    static const struct {
        const char **env;
        int launcher, rank, world, local, local_size, port;
        const char *addr;
    } cases[] = {
        {none, TG_LAUNCHER_NONE, 0, 1, 0, 0, 0, ""},
        {torchrun, TG_LAUNCHER_TORCHRUN, 5, 8, 1, 4, 29500, "node-a"},
        {mpirun, TG_LAUNCHER_OPENMPI, 3, 4, 1, 2, 0, ""},
        {srun, TG_LAUNCHER_SLURM, 6, 16, 2, 0, 0, "gpu-a07"},
        {srun_master, TG_LAUNCHER_SLURM, 0, 1, 0, 0, 6000, "10.0.0.5"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        tg_rank_env r;
        tg_err err = {{0}};
        if (!CHECK(tg_rank_env_read(&r, lookup, (void *)cases[k].env, &err) == 0, "case %zu: %s", k, err.msg)) continue;
        CHECK(r.launcher == cases[k].launcher && r.rank == cases[k].rank && r.world_size == cases[k].world &&
                  r.local_rank == cases[k].local && r.local_size == cases[k].local_size &&
                  r.master_port == cases[k].port && !strcmp(r.master_addr, cases[k].addr),
              "case %zu: %s rank %d of %d, local %d of %d, %s:%d", k, tg_launcher_name(r.launcher), r.rank,
              r.world_size, r.local_rank, r.local_size, r.master_addr, r.master_port);
    }
    CHECK(!strcmp(tg_launcher_name(TG_LAUNCHER_SLURM), "srun") && !strcmp(tg_launcher_name(-1), "?") &&
              !strcmp(tg_launcher_name(TG_LAUNCHER_COUNT), "?"),
          "names");
}

TG_TEST(test_launch_env_refusals) {
    static const char *no_size[] = {"RANK=0", "LOCAL_RANK=0", NULL};
    static const char *rank_past[] = {"RANK=4", "WORLD_SIZE=4", "LOCAL_RANK=0", NULL};
    static const char *local_past[] = {"RANK=1", "WORLD_SIZE=4", "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2", NULL};
    static const char *sign[] = {"OMPI_COMM_WORLD_RANK=+1", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_RANK=0", NULL};
    static const char *blank[] = {"SLURM_PROCID=1 ", "SLURM_NTASKS=2", "SLURM_LOCALID=0", NULL};
    static const char *huge[] = {"RANK=0", "WORLD_SIZE=99999999999999999999", "LOCAL_RANK=0", NULL};
    static const char *port[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "MASTER_PORT=65536", NULL};
    static const char *addr[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "MASTER_ADDR=", NULL};
    static const char *nodes[] = {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_LOCALID=0", "SLURM_JOB_NODELIST=gpu[3-1]", NULL};
    static const struct {
        const char **env;
        const char *want;
    } cases[] = {
        {no_size, "reading the rank torchrun gave this process: environment variable WORLD_SIZE is not set, but RANK is"},
        {rank_past, "environment variable RANK='4': want a whole number from 0 to 3"},
        {local_past, "environment variable LOCAL_RANK='2': want a whole number from 0 to 1"},
        {sign, "reading the rank mpirun gave this process: environment variable OMPI_COMM_WORLD_RANK='+1'"},
        {blank, "environment variable SLURM_PROCID='1 ': want a whole number from 0 to 1"},
        {huge, "environment variable WORLD_SIZE='99999999999999999999': want a whole number from 1 to 65536"},
        {port, "reading the rank's rendezvous: environment variable MASTER_PORT='65536': want a whole number from 1 to 65535"},
        {addr, "environment variable MASTER_ADDR='': want a host name or address of 1 to 255 bytes"},
        {nodes, "finding the first host of the Slurm job (SLURM_JOB_NODELIST): Slurm node list 'gpu[3-1]'"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        tg_rank_env r;
        tg_err err = {{0}};
        CHECK(tg_rank_env_read(&r, lookup, (void *)cases[k].env, &err) == -1 && strstr(err.msg, cases[k].want),
              "case %zu: '%s', want '%s'", k, err.msg, cases[k].want);
    }
}

TG_TEST(test_launch_env_slurm_first_host) {
    static const struct {
        const char *list, *want; /* want NULL: refused */
    } cases[] = {
        {"node1", "node1"},
        {"node1,node2", "node1"},
        {"gpu[01-04,07]", "gpu01"},
        {"gpu[07-09,12],cpu3", "gpu07"},
        {"rack[2-3]-n[005-010]-ib", "rack2-n005-ib"},
        {"a[9],b[1-2]", "a9"},
        {"10.1.2.3", "10.1.2.3"},
        {"", NULL},
        {",node1", NULL},
        {"node1,", NULL},
        {"node1,,node2", NULL},
        {"gpu[", NULL},
        {"gpu[1-2", NULL},
        {"gpu[1-[2]]", NULL},
        {"gpu[]", NULL},
        {"gpu[1,]", NULL},
        {"gpu[,1]", NULL},
        {"gpu[4-2]", NULL},
        {"gpu[1-]", NULL},
        {"gpu[a]", NULL},
        {"gpu]1", NULL},
        {"gpu 1", NULL},
        {"ok,bad[2-1]", NULL},
        {"ok,bad[", NULL},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char host[TG_LAUNCH_HOST_MAX];
        tg_err err = {{0}};
        const int rc = tg_slurm_first_host(cases[k].list, host, sizeof host, &err);
        if (cases[k].want)
            CHECK(rc == 0 && !strcmp(host, cases[k].want), "'%s': rc %d host '%s' (%s), want '%s'", cases[k].list, rc,
                  host, err.msg, cases[k].want);
        else
            CHECK(rc == -1 && !host[0] && strstr(err.msg, "Slurm node list '") && strstr(err.msg, cases[k].list),
                  "'%s': rc %d host '%s' err '%s'", cases[k].list, rc, host, err.msg);
    }
    /* A first host past the buffer: refused, the buffer left empty. */
    char small[8];
    tg_err err = {{0}};
    CHECK(tg_slurm_first_host("node[0000001]", small, sizeof small, &err) == -1 && !small[0] &&
              strstr(err.msg, "longer than 7 bytes"),
          "long host: '%s' %s", small, err.msg);
    CHECK(tg_slurm_first_host("node[001]", small, sizeof small, &err) == 0 && !strcmp(small, "node001"), "7 bytes: '%s'",
          small);
}
