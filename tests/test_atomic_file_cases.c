/* base/atomic_file.c case by case: what a write replaces and keeps (mode, links), devices
 * written in place, temporary names (shortened, retried past ones that exist, given up
 * after 100), the registry full, each failing step of a commit named in its message, the
 * temporary files removed by tg_atomic_remove_temps, and allocations failing. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/atomic_file.h"
#include "tests/harness.h"

static const char *in_dir(const char *dir, const char *name) {
    static char buf[8][PATH_MAX];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

/* The names in dir starting with `prefix` (up to 4 kept in names); how many. */
static int count_named(const char *dir, const char *prefix, char names[][NAME_MAX + 1]) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (!strncmp(e->d_name, prefix, strlen(prefix))) {
            if (names && n < 4) snprintf(names[n], NAME_MAX + 1, "%s", e->d_name);
            n++;
        }
    closedir(d);
    return n;
}

static int write_text(const char *path, const char *text, tg_err *err) {
    const tg_chunk chunks[3] = {{text, strlen(text)}, {"", 0}, {"\n", 1}};
    return tg_write_file_atomic(path, chunks, 3, "plan", err);
}

TG_TEST(test_atomic_file_replaces_keeping_mode_and_links) {
    const char *dir = tg_test_tmpdir();
    tg_err err = {{0}};
    const char *target = in_dir(dir, "target");
    REQUIRE(write_text(target, "one", &err) == 0, "%s", err.msg);
    REQUIRE(chmod(target, 0600) == 0, "chmod");
    REQUIRE(write_text(target, "two", &err) == 0, "%s", err.msg);
    struct stat st;
    CHECK(stat(target, &st) == 0 && (st.st_mode & 07777) == 0600, "mode %o after the replacement, want 600",
          st.st_mode & 07777);
    /* Every permission bit is kept, whatever the umask. */
    static const mode_t modes[] = {0755, 0741, 0704, 0};
    for (int m = 0; m < 4; m++) {
        REQUIRE(chmod(target, modes[m]) == 0, "chmod %o", modes[m]);
        const mode_t mask = umask(077);
        const int rc = write_text(target, "two", &err);
        umask(mask);
        CHECK(rc == 0 && stat(target, &st) == 0 && (st.st_mode & 07777) == modes[m],
              "mode %o after the replacement, want %o: %s", st.st_mode & 07777, modes[m], rc ? err.msg : "");
    }
    REQUIRE(chmod(target, 0600) == 0, "chmod");
    char *text = tg_test_read_file(target, NULL);
    CHECK(text && !strcmp(text, "two\n"), "contents '%s'", text ? text : "(none)");
    free(text);
    /* Through a link: the target is replaced, the link stays. */
    const char *link = in_dir(dir, "link");
    REQUIRE(symlink("target", link) == 0, "symlink");
    REQUIRE(write_text(link, "three", &err) == 0, "%s", err.msg);
    CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode), "the link was replaced by a file");
    text = tg_test_read_file(target, NULL);
    CHECK(text && !strcmp(text, "three\n"), "target '%s'", text ? text : "(none)");
    free(text);
    CHECK(count_named(dir, "target.tmp.", NULL) == 0, "temporary files left");
    /* A stream on the file: the same one each time. */
    tg_atomic_file *f;
    REQUIRE(tg_atomic_begin(target, "plan", &f, &err) == 0, "%s", err.msg);
    FILE *s = tg_atomic_stream(f);
    CHECK(s && tg_atomic_stream(f) == s && tg_atomic_fd(f) == fileno(s), "stream");
    fputs("four", s);
    CHECK(count_named(dir, "target.tmp.", NULL) == 1, "no temporary file while writing");
    REQUIRE(tg_atomic_commit(f, &err) == 0, "%s", err.msg);
    text = tg_test_read_file(target, NULL);
    CHECK(text && !strcmp(text, "four"), "streamed '%s'", text ? text : "(none)");
    free(text);
    /* Discarded: the target as it was, no temporary file. */
    REQUIRE(tg_atomic_begin(target, "plan", &f, &err) == 0, "%s", err.msg);
    fputs("five", tg_atomic_stream(f));
    tg_atomic_discard(f);
    text = tg_test_read_file(target, NULL);
    CHECK(text && !strcmp(text, "four") && count_named(dir, "target.tmp.", NULL) == 0, "after a discard: '%s'",
          text ? text : "(none)");
    free(text);
}

TG_TEST(test_atomic_file_devices_written_in_place) {
    tg_err err = {{0}};
    CHECK(write_text("/dev/null", "nothing", &err) == 0, "/dev/null: %s", err.msg);
    /* /dev/full refuses every write: the step and the reason are named. */
    CHECK(write_text("/dev/full", "x", &err) == -1 &&
              strstr(err.msg, "/dev/full: cannot write the plan (write: No space left on device)"),
          "/dev/full: %s", err.msg);
    tg_atomic_file *f;
    REQUIRE(tg_atomic_begin("/dev/full", "metrics", &f, &err) == 0, "%s", err.msg);
    fputs("buffered", tg_atomic_stream(f));
    CHECK(tg_atomic_commit(f, &err) == -1 &&
              strstr(err.msg, "/dev/full: cannot write the metrics (write: No space left on device)"),
          "stream on /dev/full: %s", err.msg);
    REQUIRE(tg_atomic_begin("/dev/null", "metrics", &f, &err) == 0, "%s", err.msg);
    tg_atomic_discard(f);
}

TG_TEST(test_atomic_file_begin_refusals) {
    const char *dir = tg_test_tmpdir();
    tg_err err = {{0}};
    tg_atomic_file *f = (tg_atomic_file *)&f;
    const char *missing = in_dir(dir, "nowhere/x");
    char want[PATH_MAX + 100];
    snprintf(want, sizeof want, "%s: cannot create the plan: No such file or directory", missing);
    CHECK(tg_atomic_begin(missing, "plan", &f, &err) == -1 && f == NULL && strstr(err.msg, want), "missing folder: %s",
          err.msg);
    snprintf(want, sizeof want, "%s/: cannot create the plan: Is a directory", dir);
    CHECK(tg_atomic_begin(in_dir(dir, ""), "plan", &f, &err) == -1 && strstr(err.msg, want), "a folder: %s", err.msg);
    /* Each allocation failing in turn: out of memory, whichever it is. */
    const char *target = in_dir(dir, "t");
    int failures = 0;
    for (long k = 0; k < 32; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = tg_atomic_begin(target, "plan", &f, &err);
        tg_alloc_fail_after(-1);
        if (rc == 0) {
            tg_atomic_discard(f);
            break;
        }
        failures++;
        CHECK(f == NULL && (strstr(err.msg, ": out of memory") || strstr(err.msg, strerror(ENOMEM))),
              "allocation %ld: %s", k, err.msg);
    }
    CHECK(failures >= 3, "%d allocations failed", failures);
    CHECK(count_named(dir, "t.tmp.", NULL) == 0, "temporary files left");
    /* A read-only folder, where the system has one (root writes anywhere else). */
    if (access("/proc/sys", W_OK) != 0) {
        memset(&err, 0, sizeof err);
        CHECK(tg_atomic_begin("/proc/sys/tg-new", "plan", &f, &err) == -1 &&
                  strstr(err.msg, "/proc/sys/tg-new: cannot create the plan: "),
              "read-only folder: %s", err.msg);
    }
}

TG_TEST(test_atomic_file_temporary_names) {
    const char *dir = tg_test_tmpdir();
    tg_err err = {{0}};
    /* A name of NAME_MAX bytes: its temporary name is cut to NAME_MAX too. */
    char name[NAME_MAX + 1];
    memset(name, 'n', NAME_MAX);
    name[NAME_MAX] = 0;
    tg_atomic_file *f;
    REQUIRE(tg_atomic_begin(in_dir(dir, name), "plan", &f, &err) == 0, "%s", err.msg);
    char names[4][NAME_MAX + 1];
    char prefix[64];
    snprintf(prefix, sizeof prefix, "nnnnnnnn");
    int n = count_named(dir, prefix, names);
    char suffix[64];
    snprintf(suffix, sizeof suffix, ".tmp.%ld.", (long)getpid());
    CHECK(n == 1 && strlen(names[0]) == NAME_MAX && strstr(names[0], suffix), "temporary name '%s' (%zu bytes)",
          n == 1 ? names[0] : "?", n == 1 ? strlen(names[0]) : 0);
    tg_atomic_discard(f);
    /* The serial of the next temporary name: the one just used, plus one. */
    REQUIRE(tg_atomic_begin(in_dir(dir, "p"), "plan", &f, &err) == 0, "%s", err.msg);
    REQUIRE(count_named(dir, "p.tmp.", names) == 1, "one temporary file");
    unsigned serial = 0;
    REQUIRE(sscanf(names[0] + strlen("p") + strlen(suffix), "%u", &serial) == 1, "serial of %s", names[0]);
    tg_atomic_discard(f);
    /* The next two names exist already (left by an earlier process of the same id): the
     * third is taken, and the two stay as they were. */
    for (unsigned s = serial + 1; s <= serial + 2; s++) {
        char taken[64];
        snprintf(taken, sizeof taken, "p%s%u", suffix, s);
        REQUIRE(tg_test_write_file(in_dir(dir, taken), "old") == 0, "write %s", taken);
    }
    REQUIRE(write_text(in_dir(dir, "p"), "new", &err) == 0, "past two taken names: %s", err.msg);
    CHECK(count_named(dir, "p.tmp.", NULL) == 2, "the taken names were touched");
    /* All 100 attempts taken: refused. */
    REQUIRE(tg_atomic_begin(in_dir(dir, "q"), "plan", &f, &err) == 0, "%s", err.msg);
    REQUIRE(count_named(dir, "q.tmp.", names) == 1, "one temporary file");
    REQUIRE(sscanf(names[0] + strlen("q") + strlen(suffix), "%u", &serial) == 1, "serial of %s", names[0]);
    tg_atomic_discard(f);
    for (unsigned s = serial + 1; s <= serial + 100; s++) {
        char taken[64];
        snprintf(taken, sizeof taken, "q%s%u", suffix, s);
        REQUIRE(tg_test_write_file(in_dir(dir, taken), "") == 0, "write %s", taken);
    }
    char want[PATH_MAX + 80];
    snprintf(want, sizeof want, "%s: cannot create the plan: File exists", in_dir(dir, "q"));
    CHECK(tg_atomic_begin(in_dir(dir, "q"), "plan", &f, &err) == -1 && strstr(err.msg, want), "100 taken: %s",
          err.msg);
}

TG_TEST(test_atomic_file_registry_full_and_removed) {
    const char *dir = tg_test_tmpdir();
    tg_err err = {{0}};
    enum { MAX_OPEN = 300 };
    static tg_atomic_file *open_files[MAX_OPEN];
    int n = 0;
    for (; n < MAX_OPEN; n++) {
        char name[32];
        snprintf(name, sizeof name, "f%03d", n);
        memset(&err, 0, sizeof err);
        if (tg_atomic_begin(in_dir(dir, name), "plan", &open_files[n], &err)) break;
    }
    CHECK(n >= 200 && n < MAX_OPEN && strstr(err.msg, "cannot create the plan: too many files being written at once"),
          "%d files at once, then: %s", n, err.msg);
    for (int i = 0; i < n; i++) tg_atomic_discard(open_files[i]);
    CHECK(count_named(dir, "f", NULL) == 0, "files left after the discards");
    /* tg_atomic_remove_temps removes the temporary file of a write in progress, whose
     * commit then fails at the rename; the target never appears. */
    tg_atomic_file *f;
    REQUIRE(tg_atomic_begin(in_dir(dir, "cut"), "metrics", &f, &err) == 0, "%s", err.msg);
    CHECK(count_named(dir, "cut.tmp.", NULL) == 1, "no temporary file");
    tg_atomic_remove_temps();
    CHECK(count_named(dir, "cut", NULL) == 0, "the temporary file stayed");
    CHECK(tg_atomic_commit(f, &err) == -1 && strstr(err.msg, "cannot write the metrics (rename: No such file or directory)"),
          "commit after the removal: %s", err.msg);
    CHECK(count_named(dir, "cut", NULL) == 0, "a file appeared");
    /* A rename over a folder that took the target's name meanwhile: refused, the temporary
     * file removed. */
    REQUIRE(tg_atomic_begin(in_dir(dir, "becomes_dir"), "plan", &f, &err) == 0, "%s", err.msg);
    REQUIRE(mkdir(in_dir(dir, "becomes_dir"), 0755) == 0 && tg_test_write_file(in_dir(dir, "becomes_dir/x"), "") == 0,
            "mkdir");
    CHECK(tg_atomic_commit(f, &err) == -1 && strstr(err.msg, "cannot write the plan (rename: "), "rename over a folder: %s",
          err.msg);
    CHECK(count_named(dir, "becomes_dir.tmp.", NULL) == 0, "the temporary file stayed");
    /* A folder named without its slash: begun (nothing replaced), refused at the rename. */
    REQUIRE(mkdir(in_dir(dir, "a_dir"), 0755) == 0, "mkdir");
    REQUIRE(tg_atomic_begin(in_dir(dir, "a_dir"), "plan", &f, &err) == 0, "%s", err.msg);
    CHECK(tg_atomic_commit(f, &err) == -1 && strstr(err.msg, "cannot write the plan (rename: Is a directory)"),
          "rename over an empty folder: %s", err.msg);
    CHECK(count_named(dir, "a_dir.tmp.", NULL) == 0, "the temporary file stayed");
}

TG_TEST(test_atomic_file_device_that_cannot_open) {
    /* Without a controlling terminal /dev/tty exists but does not open (ENXIO). */
    FILE *probe = fopen("/dev/tty", "w");
    if (probe) {
        fclose(probe);
        return; /* a terminal: nothing to refuse */
    }
    const int why = errno;
    tg_err err = {{0}};
    tg_atomic_file *f;
    char want[160];
    snprintf(want, sizeof want, "/dev/tty: cannot create the log: %s", strerror(why));
    CHECK(tg_atomic_begin("/dev/tty", "log", &f, &err) == -1 && strstr(err.msg, want), "%s", err.msg);
}
