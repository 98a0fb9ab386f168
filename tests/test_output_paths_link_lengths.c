/* base/output_paths.c reads a symlink's text into a buffer that starts at the size lstat
 * gives (at least 256 bytes) and doubles until the text fits: link texts of lengths on
 * each side of 256 and 512 resolve to exactly their target, dangling or not, and each
 * allocation failing alone gives ENOMEM; so do the links of /proc, whose size lstat does
 * not give (the buffer grows from 256 bytes). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/output_paths.h"
#include "tests/harness.h"

/* The relative link text of `len` bytes: folders "d" + 99 x 'a' (made here, under root),
 * then a file name of 'f' making up the length. */
static int make_target(const char *root, size_t len, char *target, size_t cap) {
    size_t n = 0;
    target[0] = 0;
    while (len - n > 200) {
        char folder[PATH_MAX + 256];
        memset(target + n, 'a', 100);
        target[n] = 'd', target[n + 100] = 0;
        snprintf(folder, sizeof folder, "%s/%s", root, target);
        if (mkdir(folder, 0755) != 0 && errno != EEXIST) return 0;
        target[n + 100] = '/';
        n += 101;
    }
    if (n + (len - n) + 1 > cap) return 0;
    memset(target + n, 'f', len - n);
    target[len] = 0;
    return 1;
}

TG_TEST(test_output_paths_link_texts_around_the_buffer_sizes) {
    char root[PATH_MAX];
    REQUIRE(realpath(tg_test_tmpdir(), root), "realpath");
    const size_t lengths[] = {1, 200, 255, 256, 257, 258, 511, 512, 513, 1023, 1024, 1025};
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
        char target[2048], link[PATH_MAX + 64], want[PATH_MAX + 2048];
        REQUIRE(make_target(root, lengths[i], target, sizeof target) && strlen(target) == lengths[i], "target %zu",
                lengths[i]);
        snprintf(link, sizeof link, "%s/link%zu", root, lengths[i]);
        REQUIRE(symlink(target, link) == 0, "symlink %zu: %s", lengths[i], strerror(errno));
        snprintf(want, sizeof want, "%s/%s", root, target);
        char *out = NULL;
        int rc = tg_output_resolve(link, &out);
        CHECK(rc == 0 && out && !strcmp(out, want), "a %zu-byte link (dangling): rc %d, '%.80s'", lengths[i], rc,
              out ? out : "(null)");
        free(out);
        /* The same once the target exists: its name, not the link's. */
        REQUIRE(tg_test_write_file(want, "x") == 0, "write %zu", lengths[i]);
        out = NULL;
        rc = tg_output_resolve(link, &out);
        CHECK(rc == 0 && out && !strcmp(out, want), "a %zu-byte link: rc %d, '%.80s'", lengths[i], rc,
              out ? out : "(null)");
        free(out);
        /* Each allocation failing alone: ENOMEM and no name, never another name. */
        tg_alloc_fail_after(-1);
        out = NULL;
        rc = tg_output_resolve(link, &out);
        const long total = tg_alloc_fail_after(-1);
        free(out);
        REQUIRE(rc == 0 && total >= 4, "a %zu-byte link: %ld allocations", lengths[i], total);
        for (long k = 0; k < total; k++) {
            out = (char *)"unset";
            tg_alloc_fail_only(k);
            rc = tg_output_resolve(link, &out);
            tg_alloc_fail_after(-1);
            CHECK(rc == ENOMEM && out == NULL, "a %zu-byte link, allocation %ld of %ld failing: rc %d", lengths[i], k,
                  total, rc);
            if (rc == 0) free(out);
        }
    }
}

TG_TEST(test_output_paths_proc_links_longer_than_their_size) {
    char root[PATH_MAX];
    REQUIRE(realpath(tg_test_tmpdir(), root), "realpath");
    const size_t texts[] = {255, 256, 257, 511, 512, 513, 1023, 1024, 1025};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        const size_t len = texts[i] - strlen(root) - 1; /* the text: root "/" target */
        char target[2048], want[PATH_MAX + 2048], fd_link[64];
        REQUIRE(texts[i] > strlen(root) + 1 && make_target(root, len, target, sizeof target), "target %zu", texts[i]);
        snprintf(want, sizeof want, "%s/%s", root, target);
        REQUIRE(strlen(want) == texts[i] && tg_test_write_file(want, "x") == 0, "write %zu", texts[i]);
        const int fd = open(want, O_RDONLY | O_CLOEXEC);
        REQUIRE(fd >= 0, "open %zu: %s", texts[i], strerror(errno));
        snprintf(fd_link, sizeof fd_link, "/proc/self/fd/%d", fd);
        char *out = NULL;
        const int rc = tg_output_resolve(fd_link, &out);
        CHECK(rc == 0 && out && !strcmp(out, want), "%s, a %zu-byte text: rc %d, '%.80s'", fd_link, texts[i], rc,
              out ? out : "(null)");
        free(out);
        close(fd);
    }
}
