/* base/atomic_file.c: the mode of what it writes (a replaced file keeps its set-id and
 * sticky bits too; a new file gets 0644 less the umask, as open(2) gives it), a file in
 * the root folder, the hundredth temporary name still tried, and no descriptor left open
 * by any way a write ends (commit, discard, refusal; a device discarded too). */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/atomic_file.h"
#include "tests/harness.h"

static const char *in_dir(const char *dir, const char *name) {
    static char buf[8][PATH_MAX];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static int write_text(const char *path, const char *text, tg_err *err) {
    const tg_chunk chunk = {text, strlen(text)};
    return tg_write_file_atomic(path, &chunk, 1, "plan", err);
}

static mode_t mode_of(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? st.st_mode & 07777 : (mode_t)-1;
}

/* Descriptors open in this process. */
static int open_descriptors(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the listing's own */
}

TG_TEST(test_atomic_file_modes_of_new_and_replaced_files) {
    const char *dir = tg_test_tmpdir();
    tg_err err = {{0}};
    /* New files: 0644 less the umask. */
    static const struct {
        mode_t umask, want;
    } fresh[] = {{077, 0600}, {022, 0644}, {0, 0644}, {0266, 0400}};
    for (int i = 0; i < 4; i++) {
        char name[32];
        snprintf(name, sizeof name, "new%d", i);
        const mode_t old = umask(fresh[i].umask);
        const int rc = write_text(in_dir(dir, name), "x", &err);
        umask(old);
        CHECK(rc == 0 && mode_of(in_dir(dir, name)) == fresh[i].want, "umask %03o: mode %o, want %o (%s)",
              fresh[i].umask, mode_of(in_dir(dir, name)), fresh[i].want, err.msg);
    }
    /* Replaced files keep every bit, set-id and sticky bits included, whatever the umask. */
    static const mode_t kept[] = {04755, 02750, 01644, 06711};
    const char *target = in_dir(dir, "kept");
    REQUIRE(write_text(target, "one", &err) == 0, "%s", err.msg);
    for (int i = 0; i < 4; i++) {
        REQUIRE(chmod(target, kept[i]) == 0, "chmod %o", kept[i]);
        if (mode_of(target) != kept[i]) continue; /* a file system that drops the bits */
        const mode_t old = umask(077);
        const int rc = write_text(target, "two", &err);
        umask(old);
        CHECK(rc == 0 && mode_of(target) == kept[i], "replaced: mode %o, want %o (%s)", mode_of(target), kept[i],
              err.msg);
    }
}

TG_TEST(test_atomic_file_in_the_root_folder) {
    if (access("/", W_OK) != 0) return; /* only where this process may write there */
    char path[64];
    snprintf(path, sizeof path, "/tg-atomic-file-test-%ld", (long)getpid());
    tg_err err = {{0}};
    const int rc = write_text(path, "root", &err);
    long len = 0;
    char *text = tg_test_read_file(path, &len);
    CHECK(rc == 0 && text && len == 4 && !memcmp(text, "root", 4), "%s: rc %d, %s", path, rc, err.msg);
    free(text);
    unlink(path);
}

TG_TEST(test_atomic_file_hundredth_name_tried) {
    const char *dir = tg_test_tmpdir();
    tg_err err = {{0}};
    char suffix[64], names[64];
    snprintf(suffix, sizeof suffix, "r.tmp.%ld.", (long)getpid());
    tg_atomic_file *f;
    REQUIRE(tg_atomic_begin(in_dir(dir, "r"), "plan", &f, &err) == 0, "%s", err.msg);
    DIR *d = opendir(dir);
    REQUIRE(d, "opendir");
    unsigned serial = 0;
    int found = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (!strncmp(e->d_name, suffix, strlen(suffix))) found += sscanf(e->d_name + strlen(suffix), "%u", &serial);
    closedir(d);
    tg_atomic_discard(f);
    REQUIRE(found == 1, "the temporary name's serial");
    /* The next 99 names exist: the 100th attempt takes the one after them. */
    for (unsigned s = serial + 1; s <= serial + 99; s++) {
        snprintf(names, sizeof names, "%s%u", suffix, s);
        REQUIRE(tg_test_write_file(in_dir(dir, names), "") == 0, "write %s", names);
    }
    CHECK(write_text(in_dir(dir, "r"), "late", &err) == 0, "the 100th name: %s", err.msg);
    snprintf(names, sizeof names, "%s%u", suffix, serial + 100);
    CHECK(access(in_dir(dir, names), F_OK) != 0 && tg_test_count_files(dir) == 100, "%d files, want 99 + r",
          tg_test_count_files(dir));
}

TG_TEST(test_atomic_file_leaves_no_descriptor_open) {
    const char *dir = tg_test_tmpdir();
    tg_err err = {{0}};
    const int before = open_descriptors();
    REQUIRE(before > 0, "/proc/self/fd");
    tg_atomic_file *f;
    /* Commit, discard, a refused begin and a failing commit. */
    CHECK(write_text(in_dir(dir, "a"), "x", &err) == 0, "%s", err.msg);
    REQUIRE(tg_atomic_begin(in_dir(dir, "b"), "plan", &f, &err) == 0, "%s", err.msg);
    tg_atomic_discard(f);
    CHECK(tg_atomic_begin(in_dir(dir, "nowhere/c"), "plan", &f, &err) == -1, "a missing folder taken");
    REQUIRE(mkdir(in_dir(dir, "sub"), 0755) == 0, "mkdir");
    REQUIRE(tg_atomic_begin(in_dir(dir, "sub"), "plan", &f, &err) == 0, "%s", err.msg);
    CHECK(tg_atomic_commit(f, &err) == -1, "a file renamed over a folder");
    /* A device, committed and discarded: written in place, nothing to remove. */
    REQUIRE(tg_atomic_begin("/dev/null", "log", &f, &err) == 0, "%s", err.msg);
    CHECK(tg_atomic_commit(f, &err) == 0, "%s", err.msg);
    REQUIRE(tg_atomic_begin("/dev/null", "log", &f, &err) == 0, "%s", err.msg);
    CHECK(write(tg_atomic_fd(f), "x", 1) == 1, "write /dev/null");
    tg_atomic_discard(f);
    const FILE *stream = NULL;
    REQUIRE(tg_atomic_begin(in_dir(dir, "s"), "plan", &f, &err) == 0, "%s", err.msg);
    stream = tg_atomic_stream(f);
    CHECK(stream && fputs("streamed", tg_atomic_stream(f)) >= 0, "stream");
    CHECK(tg_atomic_commit(f, &err) == 0, "%s", err.msg);
    CHECK(open_descriptors() == before, "%d descriptors open, %d before", open_descriptors(), before);
    CHECK(tg_test_count_files(dir) == 3, "%d files: a, s, sub and nothing else", tg_test_count_files(dir));
}
