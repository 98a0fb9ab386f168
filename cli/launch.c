#include "cli/launch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"

int rank_identities_agree(const rank_identity *all, int world, tg_err *err) {
    char list[512] = "";
    size_t used = 0;
    int differ = 0;
    for (int r = 1; r < world; r++) {
        const rank_identity *a = &all[0], *b = &all[r];
        char what[160];
        if (b->world != a->world)
            snprintf(what, sizeof what, "world size %d, rank 0's %d", (int)b->world, (int)a->world);
        else if (b->plan_fingerprint != a->plan_fingerprint)
            snprintf(what, sizeof what, "plan fingerprint %016" PRIx64 ", rank 0's %016" PRIx64, b->plan_fingerprint,
                     a->plan_fingerprint);
        else if (b->examples != a->examples)
            snprintf(what, sizeof what, "%d training examples, rank 0's %d", (int)b->examples, (int)a->examples);
        else if (b->data_hash != a->data_hash)
            snprintf(what, sizeof what, "training data xxh64 %016" PRIx64 ", rank 0's %016" PRIx64, b->data_hash,
                     a->data_hash);
        else
            continue;
        if (used < sizeof list) {
            int n = snprintf(list + used, sizeof list - used, "%srank %d: %s", differ ? "; " : "", r, what);
            used += n > 0 ? (size_t)n : 0;
        }
        differ++;
    }
    if (!differ) return 0;
    return tg_fail(err, "%d of %d ranks do not run rank 0's job (%s): every rank needs the same job, model, data and "
                        "tunegraph",
                   differ, world, list);
}

int rank_gpu(const tg_rank_env *env, int visible, int *gpu, tg_err *err) {
    *gpu = 0;
    if (visible < 1) return tg_fail(err, "rank %d of %d: no GPU visible", env->rank, env->world_size);
    if (visible == 1) return 0; /* the launcher gave each process its own (CUDA_VISIBLE_DEVICES) */
    if (env->local_rank >= visible)
        return tg_fail(err, "rank %d of %d: local rank %d but %d GPUs visible on this machine (one process per GPU)",
                       env->rank, env->world_size, env->local_rank, visible);
    *gpu = env->local_rank;
    return 0;
}

int launch_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = 0;
    if (!bind(fd, (struct sockaddr *)&a, sizeof a) && !getsockname(fd, (struct sockaddr *)&a, &len))
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

char **launch_argv_without_nproc(int argc, char *const argv[]) {
    char **out = tg_calloc((size_t)argc + 1, sizeof *out);
    if (!out) return NULL;
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--nproc")) {
            i++; /* and its value */
            continue;
        }
        out[n++] = argv[i];
    }
    out[n] = NULL;
    return out;
}

/* The signal that stopped the supervisor, forwarded to the ranks (0: none). */
static volatile sig_atomic_t g_forward;

static void on_stop(int sig) { g_forward = sig; }

/* How a rank ended, for the message. */
static void describe_end(int status, char *out, size_t cap) {
    if (WIFSIGNALED(status)) snprintf(out, cap, "was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else snprintf(out, cap, "exited with status %d", WEXITSTATUS(status));
}

static void signal_live(const pid_t *pid, const int *live, int n, int sig) {
    for (int r = 0; r < n; r++)
        if (live[r]) kill(pid[r], sig);
}

int launch_ranks(const char *exe, char *const argv[], int nproc, double grace_s) {
    pid_t *pid = tg_calloc((size_t)nproc, sizeof *pid);
    int *live = tg_calloc((size_t)nproc, sizeof *live);
    if (!pid || !live) {
        free(pid), free(live);
        fprintf(stderr, "tunegraph: out of memory starting %d ranks\n", nproc);
        return 1;
    }
    const int port = launch_free_port();
    if (!port) {
        free(pid), free(live);
        fprintf(stderr, "tunegraph: no free TCP port on 127.0.0.1 for the ranks' bootstrap: %s\n", strerror(errno));
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_stop}, old_int, old_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    fflush(stdout);
    fflush(stderr);
    int started = 0, status = 0;
    for (int r = 0; r < nproc; r++) {
        pid_t p = fork();
        if (p == 0) {
            char v[32];
            signal(SIGINT, SIG_DFL), signal(SIGTERM, SIG_DFL);
            snprintf(v, sizeof v, "%d", r), setenv("RANK", v, 1), setenv("LOCAL_RANK", v, 1);
            snprintf(v, sizeof v, "%d", nproc), setenv("WORLD_SIZE", v, 1), setenv("LOCAL_WORLD_SIZE", v, 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            snprintf(v, sizeof v, "%d", port), setenv("MASTER_PORT", v, 1);
            snprintf(v, sizeof v, "127.0.0.1:%d", port), setenv("NCCL_COMM_ID", v, 1);
            execv(exe, argv);
            fprintf(stderr, "tunegraph: rank %d: cannot run %s: %s\n", r, exe, strerror(errno));
            _exit(127);
        }
        if (p < 0) {
            fprintf(stderr, "tunegraph: cannot start rank %d of %d: %s\n", r, nproc, strerror(errno));
            status = 1;
            break;
        }
        pid[r] = p, live[r] = 1, started++;
    }
    int failed = status, forwarded = 0, killed = 0;
    double stop_since = status ? tg_wall_s() : -1;
    if (status) signal_live(pid, live, nproc, SIGTERM);
    for (int alive = started; alive > 0;) {
        if (g_forward && !forwarded) {
            signal_live(pid, live, nproc, g_forward);
            forwarded = 1;
            if (stop_since < 0) stop_since = tg_wall_s();
        }
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            int r = 0;
            while (r < nproc && pid[r] != p) r++;
            if (r == nproc) continue; /* not a rank */
            live[r] = 0, alive--;
            if ((!WIFEXITED(st) || WEXITSTATUS(st)) && !failed && !forwarded) {
                char how[96];
                describe_end(st, how, sizeof how);
                fprintf(stderr, "tunegraph: rank %d of %d (pid %d) %s; stopping the other ranks\n", r, nproc, (int)p,
                        how);
                failed = 1;
                stop_since = tg_wall_s();
                signal_live(pid, live, nproc, SIGTERM);
                signal_live(pid, live, nproc, SIGCONT); /* a stopped rank takes its SIGTERM now */
            }
            continue;
        }
        if (p < 0 && errno != EINTR) break; /* no children left */
        /* Ranks that outlive the grace (stopped by SIGSTOP, or stuck in a collective) are
         * killed: no rank process is left running. */
        if (stop_since >= 0 && !killed && tg_wall_s() - stop_since > grace_s) {
            for (int r = 0; r < nproc; r++)
                if (live[r])
                    fprintf(stderr, "tunegraph: rank %d (pid %d) still running %.1f s after the stop: killed\n", r,
                            (int)pid[r], grace_s);
            signal_live(pid, live, nproc, SIGKILL);
            killed = 1;
        }
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    free(pid), free(live);
    if (forwarded) return 128 + g_forward;
    return failed ? 1 : 0;
}
