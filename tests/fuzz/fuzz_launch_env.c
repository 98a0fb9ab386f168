/* libFuzzer target: the rank a launcher gave the process (runtime/launch_env.c). The input
 * is an environment: NUL-separated "NAME=value" entries; its first entry is also read as a
 * Slurm node list. What is accepted holds a rank inside its world, a local rank inside its
 * machine's count and a rendezvous host that fits; what is refused says why. */
#include <string.h>

#include "runtime/launch_env.h"
#include "tests/fuzz/fuzz_input.h"

typedef struct fuzz_env {
    const char *entries[64];
    int n;
} fuzz_env;

static const char *lookup(const char *name, void *ctx) {
    const fuzz_env *e = ctx;
    const size_t n = strlen(name);
    for (int k = 0; k < e->n; k++)
        if (!strncmp(e->entries[k], name, n) && e->entries[k][n] == '=') return e->entries[k] + n + 1;
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    fuzz_env env = {.n = 0};
    for (size_t at = 0; at < size && env.n < 64; at += strlen(text + at) + 1) env.entries[env.n++] = text + at;
    if (env.n == 0) env.entries[env.n++] = text;

    char host[TG_LAUNCH_HOST_MAX];
    tg_err err = {{0}};
    if (tg_slurm_first_host(env.entries[0], host, sizeof host, &err)) {
        FUZZ_ASSERT(!host[0] && !strncmp(err.msg, "Slurm node list '", 17), "refusal: %s", err.msg);
    } else {
        FUZZ_ASSERT(host[0] && strlen(host) < sizeof host && !strchr(host, '[') && !strchr(host, ']') &&
                        !strchr(host, ','),
                    "host '%s' of '%s'", host, env.entries[0]);
    }

    tg_rank_env r;
    memset(&err, 0, sizeof err);
    if (tg_rank_env_read(&r, lookup, &env, &err)) {
        FUZZ_ASSERT(err.msg[0], "a refusal without a reason");
    } else {
        FUZZ_ASSERT(r.launcher >= TG_LAUNCHER_NONE && r.launcher < TG_LAUNCHER_COUNT, "launcher %d", r.launcher);
        FUZZ_ASSERT(r.world_size >= 1 && r.world_size <= TG_LAUNCH_MAX_RANKS && r.rank >= 0 && r.rank < r.world_size,
                    "rank %d of %d", r.rank, r.world_size);
        FUZZ_ASSERT(r.local_size >= 0 && r.local_size <= r.world_size && r.local_rank >= 0 &&
                        r.local_rank < (r.local_size ? r.local_size : r.world_size),
                    "local rank %d of %d", r.local_rank, r.local_size);
        FUZZ_ASSERT(r.master_port >= 0 && r.master_port <= 65535 && strlen(r.master_addr) < sizeof r.master_addr,
                    "rendezvous %s:%d", r.master_addr, r.master_port);
        FUZZ_ASSERT(r.launcher != TG_LAUNCHER_NONE || (r.world_size == 1 && r.rank == 0 && !r.master_addr[0]),
                    "no launcher yet rank %d of %d", r.rank, r.world_size);
    }
    free(text);
    return 0;
}
