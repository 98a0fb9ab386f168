/* base/atomic_file.c holds its target's folder open while it writes: when the process has
 * closed its standard input, that folder gets descriptor 0, which is as valid as any other.
 * A commit and a discard close it all the same (a descriptor left open would be leaked,
 * and a later open would not get 0). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/atomic_file.h"
#include "tests/harness.h"

/* Whether descriptor 0 is open on a folder. */
static int zero_is_a_folder(void) {
    struct stat st;
    return fstat(0, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Whether descriptor 0 is closed. */
static int zero_is_closed(void) {
    errno = 0;
    return fcntl(0, F_GETFD) == -1 && errno == EBADF;
}

TG_TEST(test_atomic_file_folder_on_descriptor_zero) {
    const char *dir = tg_test_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/target", dir);
    const int saved = dup(0);
    REQUIRE(saved >= 0, "dup: %s", strerror(errno));
    REQUIRE(close(0) == 0, "close 0");
    tg_err err = {{0}};
    for (int commit = 0; commit < 2; commit++) {
        tg_atomic_file *f = NULL;
        const int rc = tg_atomic_begin(path, "plan", &f, &err);
        CHECK(rc == 0 && f, "begin %d: %s", commit, err.msg);
        if (rc) break;
        CHECK(zero_is_a_folder(), "begin %d: the folder is not on descriptor 0", commit);
        CHECK(tg_atomic_fd(f) > 0, "begin %d: the file's descriptor %d", commit, tg_atomic_fd(f));
        CHECK(write(tg_atomic_fd(f), "ab", 2) == 2, "write %d", commit);
        if (commit) CHECK(tg_atomic_commit(f, &err) == 0, "commit: %s", err.msg);
        else tg_atomic_discard(f);
        CHECK(zero_is_closed(), "%s left descriptor 0 open", commit ? "a commit" : "a discard");
        if (!zero_is_closed()) close(0);
    }
    const int back = dup2(saved, 0);
    close(saved);
    REQUIRE(back == 0, "dup2: %s", strerror(errno));
    long len = 0;
    char *text = tg_test_read_file(path, &len);
    CHECK(text && len == 2 && !memcmp(text, "ab", 2), "the committed file: %ld bytes", len);
    free(text);
    CHECK(tg_test_count_files(dir) == 1, "%d files in the folder, want the target alone", tg_test_count_files(dir));
}
