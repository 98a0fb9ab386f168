/* base/atomic_file.c when the stream's buffered lines cannot be written at commit (a file-size
 * limit of 0 with SIGXFSZ ignored: fflush fails with EFBIG), and when the target's folder
 * cannot be opened for lack of descriptors. The commit must fail naming the file, the kind
 * and the step, leave the target as it was and no temporary file; the begin must fail
 * naming the cause. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/atomic_file.h"
#include "tests/harness.h"

static int entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

TG_TEST(test_atomic_file_stream_flush_fails_at_commit) {
    char dir[700], path[800];
    snprintf(dir, sizeof dir, "%s/stream_flush", tg_test_tmpdir());
    REQUIRE(mkdir(dir, 0755) == 0, "%s", dir);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    REQUIRE(tg_test_write_file(path, "old\n") == 0, "%s", path);
    tg_err err = {{0}};
    tg_atomic_file *f = NULL;
    REQUIRE(tg_atomic_begin(path, "metrics", &f, &err) == 0, "%s", err.msg);
    FILE *s = tg_atomic_stream(f);
    REQUIRE(s != NULL, "stream");
    CHECK(fputs("{\"step\": 1}\n", s) >= 0, "the line goes into the stream's buffer");
    struct rlimit saved, lim;
    REQUIRE(getrlimit(RLIMIT_FSIZE, &saved) == 0, "getrlimit");
    void (*old)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = saved;
    lim.rlim_cur = 0;
    REQUIRE(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit");
    const int rc = tg_atomic_commit(f, &err);
    setrlimit(RLIMIT_FSIZE, &saved);
    signal(SIGXFSZ, old);
    char want[1000];
    snprintf(want, sizeof want, "%s: cannot write the metrics (write: %s)", path, strerror(EFBIG));
    CHECK(rc == -1 && !strcmp(err.msg, want), "rc %d, '%s'\n    want '%s'", rc, err.msg, want);
    char *text = tg_test_read_file(path, NULL);
    CHECK(text && !strcmp(text, "old\n"), "the target became '%.20s'", text ? text : "(none)");
    free(text);
    CHECK(entries(dir) == 1, "%d entries in the folder (the temporary file stays?)", entries(dir));
}

TG_TEST(test_atomic_file_folder_cannot_be_opened_without_descriptors) {
    char path[800];
    snprintf(path, sizeof path, "%s/no_descriptors.out", tg_test_tmpdir());
    struct rlimit saved;
    REQUIRE(getrlimit(RLIMIT_NOFILE, &saved) == 0, "getrlimit");
    /* Every descriptor below a low limit taken, so the folder's open is the one refused. */
    enum { LIMIT = 64 };
    struct rlimit lim = saved;
    lim.rlim_cur = LIMIT;
    int held[LIMIT], n_held = 0;
    tg_err err = {{0}};
    tg_atomic_file *f = NULL;
    REQUIRE(setrlimit(RLIMIT_NOFILE, &lim) == 0, "setrlimit");
    for (int fd; n_held < LIMIT && (fd = dup(0)) >= 0;) held[n_held++] = fd;
    const int rc = tg_atomic_begin(path, "report", &f, &err);
    for (int i = 0; i < n_held; i++) close(held[i]);
    setrlimit(RLIMIT_NOFILE, &saved);
    char want[1000];
    snprintf(want, sizeof want, "%s: cannot create the report: too many files being written at once", path);
    CHECK(rc == -1 && f == NULL && !strcmp(err.msg, want), "rc %d, '%s'\n    want '%s'", rc, err.msg, want);
    CHECK(access(path, F_OK) != 0, "nothing was created");
    if (f) tg_atomic_discard(f);
}
