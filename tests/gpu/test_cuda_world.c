/* A rank process's NCCL communicator (runtime/cuda/executor_cuda.c), as a world of one on
 * GPU 0: met through NCCL's own bootstrap at NCCL_COMM_ID, or at the master's address with
 * the port after MASTER_PORT; the identity gather the ranks check each other with; and the
 * refusals (no address, a GPU the machine lacks). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/launch.h"
#include "runtime/executor.h"
#include "tests/harness.h"

static void gather_identity(void *comm) {
    rank_identity mine, all[1];
    memset(&mine, 0, sizeof mine);
    memset(all, 0xa5, sizeof all); /* poisoned: the gather must write it */
    mine.plan_fingerprint = 0x0123456789abcdefULL, mine.data_hash = 42, mine.world = 1, mine.examples = 7;
    tg_err err = {{0}};
    CHECK(tg_cuda_comm_all_gather_bytes(comm, &mine, all, sizeof mine, &err) == 0, "gather: %s", err.msg);
    CHECK(!memcmp(&all[0], &mine, sizeof mine), "the gathered identity differs from the rank's own");
    CHECK(rank_identities_agree(all, 1, &err) == 0, "%s", err.msg);
}

TG_TEST(test_gpu_world_of_one_bootstrap) {
    if (!tg_test_device()) return;
    tg_err err = {{0}};
    const int port = launch_free_port();
    REQUIRE(port > 1, "no free port");
    char id[64];
    snprintf(id, sizeof id, "127.0.0.1:%d", port);
    setenv("NCCL_COMM_ID", id, 1);
    void *comm = NULL;
    REQUIRE(tg_cuda_comm_create_rank(&comm, 0, 1, 0, NULL, 0, &err) == 0, "NCCL_COMM_ID %s: %s", id, err.msg);
    CHECK(tg_cuda_comm_device(comm) == 0 && tg_cuda_comm_rank(comm) == 0, "device %d, rank %d",
          tg_cuda_comm_device(comm), tg_cuda_comm_rank(comm));
    gather_identity(comm);
    tg_cuda_comms_destroy(&comm, 1);
    CHECK(comm == NULL, "destroyed communicator not cleared");

    /* The master's address: the port after MASTER_PORT, which NCCL_COMM_ID then names. */
    unsetenv("NCCL_COMM_ID");
    const int port2 = launch_free_port();
    REQUIRE(port2 > 1, "no free port");
    REQUIRE(tg_cuda_comm_create_rank(&comm, 0, 1, 0, "127.0.0.1", port2 - 1, &err) == 0, "MASTER_PORT %d: %s",
            port2 - 1, err.msg);
    char want[64];
    snprintf(want, sizeof want, "127.0.0.1:%d", port2);
    const char *set = getenv("NCCL_COMM_ID");
    CHECK(set && !strcmp(set, want), "NCCL_COMM_ID %s, want %s", set ? set : "(unset)", want);
    gather_identity(comm);
    tg_cuda_comms_destroy(&comm, 1);

    unsetenv("NCCL_COMM_ID");
    CHECK(tg_cuda_comm_create_rank(&comm, 0, 1, 0, NULL, 0, &err) == -1 && comm == NULL &&
              !strcmp(err.msg, "the launcher gave no MASTER_ADDR and MASTER_PORT for NCCL's bootstrap: set them (or "
                               "NCCL_COMM_ID=host:port, the same on every rank)"),
          "%s", err.msg);
    CHECK(tg_cuda_comm_create_rank(&comm, 0, 1, 0, "127.0.0.1", 65535, &err) == -1 &&
              strstr(err.msg, "MASTER_PORT 65535 leaves no port after it"),
          "%s", err.msg);
    const int count = tg_cuda_device_count();
    char gpus[96];
    snprintf(gpus, sizeof gpus, "rank 1 of 2: GPU %d asked for, %d visible", count, count);
    CHECK(tg_cuda_comm_create_rank(&comm, 1, 2, count, "127.0.0.1", port, &err) == -1 && !strcmp(err.msg, gpus),
          "%s", err.msg);
    unsetenv("NCCL_COMM_ID");
}
