#include "cli/launch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
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

char *launch_self_path(const char *link, tg_err *err) {
    char *exe = realpath(link, NULL); /* sized by the path itself */
    if (!exe) tg_fail(err, "cannot find this program's file (%s): %s", link, strerror(errno));
    return exe;
}

/* The signals that came to stop the supervisor, to pass on to the ranks: the last one and
 * how many came. The ranks run in a process group of their own (leave_terminal_group), so
 * whatever signals the supervisor's group (the terminal's ^C, timeout(1), a job control
 * kill) reaches them once, through the supervisor. */
static volatile sig_atomic_t g_forward, g_signals;

static void on_stop(int sig) {
    g_forward = sig;
    g_signals++;
}

/* SIGINT and SIGTERM to on_stop (the old actions into old[0], old[1]), none come yet. */
static void catch_stops(struct sigaction old[2]) {
    struct sigaction sa = {.sa_handler = on_stop};
    sigemptyset(&sa.sa_mask);
    g_forward = 0, g_signals = 0;
    sigaction(SIGINT, &sa, &old[0]);
    sigaction(SIGTERM, &sa, &old[1]);
}

static void restore_stops(const struct sigaction old[2]) {
    sigaction(SIGINT, &old[0], NULL);
    sigaction(SIGTERM, &old[1], NULL);
}

int launch_stopped_by(void) { return g_signals ? g_forward : 0; }

/* How a rank ended, for the message. */
static void describe_end(int status, char *out, size_t cap) {
    if (WIFSIGNALED(status)) snprintf(out, cap, "was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else snprintf(out, cap, "exited with status %d", WEXITSTATUS(status));
}

/* In a rank (or mpirun) just forked by `supervisor`: out of the supervisor's process group,
 * so that a signal to the group reaches the ranks only as the supervisor passes it on (a
 * rank signalled twice stops at once, without its checkpoint); and ended by SIGTERM if the
 * supervisor dies, so that no rank outlives it. */
static void leave_terminal_group(pid_t supervisor) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != supervisor) _exit(1); /* it died before the line above */
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
    struct sigaction old[2];
    catch_stops(old);
    fflush(stdout);
    fflush(stderr);
    int started = 0, status = 0;
    const pid_t self = getpid();
    for (int r = 0; r < nproc; r++) {
        pid_t p = fork();
        if (p == 0) {
            char v[32];
            signal(SIGINT, SIG_DFL), signal(SIGTERM, SIG_DFL);
            leave_terminal_group(self);
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
        /* A stop passed on: the ranks stop (at a checkpoint, where the run writes them),
         * however long that takes; a second signal ends them at once. */
        for (; forwarded < g_signals; forwarded++) signal_live(pid, live, nproc, g_forward);
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            int r = 0;
            while (r < nproc && pid[r] != p) r++;
            if (r == nproc) continue; /* not a rank */
            live[r] = 0, alive--;
            const int as_asked = forwarded && WIFSIGNALED(st) && WTERMSIG(st) == g_forward;
            if ((!WIFEXITED(st) || WEXITSTATUS(st)) && !failed && !as_asked) {
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
    restore_stops(old);
    free(pid), free(live);
    if (failed) return 1;
    return forwarded ? 128 + g_forward : 0;
}

int launch_mpirun(char *const argv[], int nproc) {
    int report[2]; /* the child's errno when the exec fails; closed by a successful one */
    if (pipe2(report, O_CLOEXEC)) {
        fprintf(stderr, "tunegraph: cannot start mpirun for --nproc %d: %s\n", nproc, strerror(errno));
        return 1;
    }
    struct sigaction old[2];
    catch_stops(old);
    fflush(stdout);
    fflush(stderr);
    const pid_t self = getpid();
    const pid_t p = fork();
    if (p == 0) {
        close(report[0]);
        signal(SIGINT, SIG_DFL), signal(SIGTERM, SIG_DFL);
        /* mpirun ends the job at once on a SIGINT or SIGTERM of its own, so the terminal's
         * reach the supervisor alone, which passes them on as signals mpirun forwards. */
        leave_terminal_group(self);
        execvp(argv[0], argv);
        const int e = errno;
        (void)!write(report[1], &e, sizeof e);
        _exit(127);
    }
    close(report[1]);
    int e = 0;
    ssize_t got = 0;
    if (p > 0)
        while ((got = read(report[0], &e, sizeof e)) < 0 && errno == EINTR) continue;
    else
        e = errno, got = sizeof e;
    close(report[0]);
    if (got == sizeof e) {
        if (p > 0) waitpid(p, NULL, 0);
        restore_stops(old);
        const char *path = getenv("PATH");
        fprintf(stderr, "tunegraph: --nproc %d --device cpu runs the ranks under mpirun, which cannot be run: %s (PATH "
                        "%s; Open MPI's openmpi-bin has it)\n",
                nproc, strerror(e), path ? path : "unset");
        return 1;
    }
    int st = 0, passed = 0;
    for (;;) {
        for (; passed < g_signals; passed++) kill(p, g_forward == SIGINT ? SIGUSR2 : SIGUSR1);
        const pid_t w = waitpid(p, &st, WNOHANG);
        if (w == p || (w < 0 && errno != EINTR)) break;
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    }
    restore_stops(old);
    if (passed) return 128 + g_forward;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
