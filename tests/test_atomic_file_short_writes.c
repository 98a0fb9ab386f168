/* base/atomic_file.c when write(2) takes only part of a chunk: under a file-size limit
 * (RLIMIT_FSIZE, SIGXFSZ ignored) the first write stops at the limit and the next one fails
 * with EFBIG. The write must then fail whole, naming the file and the cause, leave the target
 * as it was and no temporary file; a chunk just twice the limit is the case where a wrong
 * count of the bytes left would come out at 0 and take the half-written file for done. */
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

/* Entries of dir other than "." and "..". */
static int entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

TG_TEST(test_atomic_file_short_writes_under_a_size_limit) {
    char dir[700], path[800];
    snprintf(dir, sizeof dir, "%s/short", tg_test_tmpdir());
    REQUIRE(mkdir(dir, 0755) == 0, "%s", dir);
    snprintf(path, sizeof path, "%s/out.bin", dir);
    enum { LIMIT = 4096 };
    static char data[3 * LIMIT];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (char)('a' + i % 26);
    REQUIRE(tg_test_write_file(path, "old\n") == 0, "%s", path);

    struct rlimit saved;
    REQUIRE(getrlimit(RLIMIT_FSIZE, &saved) == 0, "getrlimit");
    void (*old)(int) = signal(SIGXFSZ, SIG_IGN);
    /* Each chunk list goes past the limit: a chunk of twice and three times the limit (the
     * first write takes LIMIT bytes), one not a multiple of it, and two chunks of the limit
     * each (the first written whole, the second refused at once). */
    const struct {
        size_t first, second;
    } cases[] = {{2 * LIMIT, 0}, {3 * LIMIT, 0}, {LIMIT + 1000, 0}, {LIMIT, LIMIT}};
    char want[1000];
    snprintf(want, sizeof want, "%s: cannot write the plan (write: %s)", path, strerror(EFBIG));
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const tg_chunk chunks[2] = {{data, cases[k].first}, {data + cases[k].first, cases[k].second}};
        tg_err err = {{0}};
        struct rlimit lim = saved;
        lim.rlim_cur = LIMIT;
        REQUIRE(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit");
        const int rc = tg_write_file_atomic(path, chunks, 2, "plan", &err);
        setrlimit(RLIMIT_FSIZE, &saved);
        CHECK(rc == -1 && !strcmp(err.msg, want), "chunks %zu + %zu: rc %d, '%s'", cases[k].first, cases[k].second, rc,
              err.msg);
        char *text = tg_test_read_file(path, NULL);
        CHECK(text && !strcmp(text, "old\n"), "chunks %zu + %zu: the target became '%.20s'", cases[k].first,
              cases[k].second, text ? text : "(none)");
        free(text);
        CHECK(entries(dir) == 1, "chunks %zu + %zu: %d entries in the folder", cases[k].first, cases[k].second,
              entries(dir));
    }
    signal(SIGXFSZ, old);

    /* Without the limit the same chunks go in whole. */
    const tg_chunk chunks[2] = {{data, 2 * LIMIT}, {data + 2 * LIMIT, LIMIT}};
    tg_err err = {{0}};
    CHECK(tg_write_file_atomic(path, chunks, 2, "plan", &err) == 0, "%s", err.msg);
    long len = 0;
    char *text = tg_test_read_file(path, &len);
    CHECK(text && len == (long)sizeof data && !memcmp(text, data, sizeof data), "read back %ld bytes", len);
    free(text);
    CHECK(entries(dir) == 1, "%d entries in the folder", entries(dir));
}
