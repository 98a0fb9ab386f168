/* The shard writer (datasets/shard_writer.c) where folders get in its way: a set written
 * straight under the root folder (its temporary folder beside it, "/.NAME.tmp-..."); a tree
 * with an entry that cannot be removed; and, as an unprivileged user (a child process that
 * becomes user 65534 when the suite runs as root), a parent folder that forbids the final
 * rename or swap, an output folder that cannot be listed, and a parent that cannot be read
 * (its sync is skipped, the set still goes in). Also a model config without read permission
 * (models/model_config.c), which needs the same unprivileged user. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/coverage_flush.h"
#include "datasets/shard_writer.h"
#include "models/model_config.h"
#include "tests/harness.h"

static char *const k_labels[] = {"neg", "pos"};

static const tg_shard_set_desc k_desc = {.task = TG_SHARD_CLASSIFY, .seq = 4, .n_labels = 2, .labels = k_labels,
                                         .tokenizer_identity = 5, .tokenizer_family = "wordpiece", .vocab_size = 50};

/* Opens a writer at out and adds two records; NULL (err filled) on failure. */
static tg_shard_writer *open_with_records(const char *out, tg_err *err) {
    tg_shard_writer *w;
    if (tg_shard_writer_open(out, &k_desc, &w, err)) return NULL;
    int32_t ids[2] = {3, 4};
    for (int i = 0; i < 2; i++) {
        const tg_shard_record r = {.len = 2, .input_ids = ids, .label = i};
        if (tg_shard_writer_add(w, TG_SPLIT_TRAIN, &r, err)) {
            tg_shard_writer_abort(w);
            return NULL;
        }
    }
    return w;
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

TG_TEST(test_shard_writer_set_under_the_root_folder) {
    char out[64], manifest[96], prefix[96];
    snprintf(out, sizeof out, "/tg-shard-root-%ld", (long)getpid());
    snprintf(manifest, sizeof manifest, "%s/manifest.json", out);
    snprintf(prefix, sizeof prefix, "/.tg-shard-root-%ld.tmp-", (long)getpid());
    tg_err err = {{0}};
    tg_shard_writer *w = open_with_records(out, &err);
    REQUIRE(w != NULL, "%s", err.msg);
    CHECK(!strncmp(tg_shard_writer_folder(w), prefix, strlen(prefix)), "temporary folder '%s', want '%s...'",
          tg_shard_writer_folder(w), prefix);
    CHECK(tg_shard_writer_commit(w, &err) == 0, "commit: %s", err.msg);
    CHECK(access(manifest, F_OK) == 0, "%s is there", manifest);
    CHECK(tg_shard_remove_tree(out) == 0 && !is_dir(out), "%s removed", out);
}

TG_TEST(test_shard_remove_tree_stops_at_an_entry_it_cannot_remove) {
    /* /proc's entries refuse unlink: the walk reports the failure. */
    CHECK(tg_shard_remove_tree("/proc/self/fdinfo") == -1, "a tree with an entry that cannot be removed");
    CHECK(is_dir("/proc/self/fdinfo"), "still there");
}

/* The child's findings, one line each; the parent checks there are none. */
static char g_report[4096];

static void note(const char *fmt, ...) {
    size_t n = strlen(g_report);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_report + n, sizeof g_report - n, fmt, ap);
    va_end(ap);
    n = strlen(g_report);
    if (n + 1 < sizeof g_report) g_report[n] = '\n', g_report[n + 1] = 0;
}

static void expect_failure(int rc, const tg_err *err, const char *want, const char *what) {
    if (rc != -1 || strcmp(err->msg, want)) note("%s: rc %d '%s', want '%s'", what, rc, err->msg, want);
}

/* Runs as the unprivileged user, in folder d (mode 0777). */
static void unprivileged_cases(const char *d) {
    char p[600], out[700], fresh[700], locked[700], file[800], want[1200];
    tg_err err = {{0}};
    snprintf(p, sizeof p, "%s/p", d);
    if (mkdir(p, 0755) != 0) return note("mkdir %s: %s", p, strerror(errno));

    /* A set to swap out, then a parent that forbids the swap. */
    snprintf(out, sizeof out, "%s/out", p);
    tg_shard_writer *w = open_with_records(out, &err);
    if (!w || tg_shard_writer_commit(w, &err)) return note("first set: %s", err.msg);
    if (!(w = open_with_records(out, &err))) return note("second writer: %s", err.msg);
    chmod(p, 0555);
    snprintf(want, sizeof want, "%s: cannot swap the new set for the old one: %s", out, strerror(EACCES));
    expect_failure(tg_shard_writer_commit(w, &err), &err, want, "swap under a read-only parent");
    /* A new set, the rename forbidden the same way. */
    chmod(p, 0755);
    snprintf(fresh, sizeof fresh, "%s/fresh", p);
    if (!(w = open_with_records(fresh, &err))) return note("third writer: %s", err.msg);
    chmod(p, 0555);
    snprintf(want, sizeof want, "%s: cannot move the new set into place: %s", fresh, strerror(EACCES));
    expect_failure(tg_shard_writer_commit(w, &err), &err, want, "rename under a read-only parent");
    if (access(fresh, F_OK) == 0) note("%s exists after the refused rename", fresh);
    chmod(p, 0755);

    /* An output folder that cannot be listed is no empty folder to write into. */
    snprintf(locked, sizeof locked, "%s/locked", p);
    snprintf(file, sizeof file, "%s/keep.txt", locked);
    if (mkdir(locked, 0755) || tg_test_write_file(file, "x\n") || chmod(locked, 0)) return note("setup %s", locked);
    w = NULL;
    snprintf(want, sizeof want,
             "%s: exists and is not a shard set (it would be replaced; remove it or choose another name)", locked);
    expect_failure(tg_shard_writer_open(locked, &k_desc, &w, &err), &err, want, "an unlistable output folder");
    if (w) tg_shard_writer_abort(w);
    chmod(locked, 0755);

    /* A parent without read permission: its sync cannot open it, the set still goes in. */
    char hidden[700], set[800], manifest[900];
    snprintf(hidden, sizeof hidden, "%s/hidden", p);
    snprintf(set, sizeof set, "%s/set", hidden);
    snprintf(manifest, sizeof manifest, "%s/manifest.json", set);
    if (mkdir(hidden, 0311)) return note("mkdir %s", hidden);
    if (!(w = open_with_records(set, &err)) || tg_shard_writer_commit(w, &err))
        note("a set under a parent that cannot be read: %s", err.msg);
    else if (access(manifest, R_OK) != 0)
        note("%s is missing", manifest);

    /* A model folder whose config.json may not be read. */
    char model[700], config[800];
    snprintf(model, sizeof model, "%s/model", p);
    snprintf(config, sizeof config, "%s/config.json", model);
    if (mkdir(model, 0755) || tg_test_write_file(config, "{}\n") || chmod(config, 0)) return note("setup %s", config);
    tg_model_config cfg;
    snprintf(want, sizeof want, "model '%s': %s: cannot be read: %s", model, config, strerror(EACCES));
    expect_failure(tg_model_config_load(model, &cfg, &err), &err, want, "an unreadable config.json");
}

TG_TEST(test_shard_writer_folders_an_unprivileged_user_may_not_change) {
    char d[] = "/tmp/tg_shard_perm_XXXXXX";
    REQUIRE(mkdtemp(d) && chmod(d, 0777) == 0, "mkdtemp");
    int fds[2];
    REQUIRE(pipe(fds) == 0, "pipe");
    const pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        /* The saved ids stay root's, to take back for writing gcov's counts (owned by root). */
        const int was_root = geteuid() == 0;
        if (was_root && (setresgid(65534, 65534, 0) || setresuid(65534, 65534, 0))) _exit(2);
        unprivileged_cases(d);
        const ssize_t n = write(fds[1], g_report, strlen(g_report));
        if (was_root && (setresuid(0, 0, 0) || setresgid(0, 0, 0))) _exit(3);
        tg_coverage_flush(); /* _exit skips gcov's writer */
        _exit(n >= 0 ? 0 : 1);
    }
    close(fds[1]);
    char report[sizeof g_report + 1] = "";
    size_t len = 0;
    ssize_t n;
    while (len < sizeof report - 1 && (n = read(fds[0], report + len, sizeof report - 1 - len)) > 0) len += (size_t)n;
    report[len] = 0;
    close(fds[0]);
    int st = -1;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child: status %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    CHECK(report[0] == 0, "as user 65534:\n%s", report);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "chmod -R u+rwx %s && rm -rf %s", d, d);
    CHECK(system(cmd) == 0, "%s", cmd);
}
