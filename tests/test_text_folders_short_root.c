/* Folder inputs (datasets/text_folders.c) under a root of one character, as given and with
 * trailing slashes: the slashes go, the one character stays, and the files are named
 * "d/LABEL/FILE" from it. */
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "datasets/text_rows.h"
#include "tests/harness.h"

TG_TEST(test_text_folders_one_character_root) {
    char cwd[PATH_MAX], path[900];
    REQUIRE(getcwd(cwd, sizeof cwd), "getcwd");
    const char *dir = tg_test_tmpdir();
    snprintf(path, sizeof path, "%s/d", dir);
    REQUIRE(mkdir(path, 0755) == 0, "mkdir %s", path);
    snprintf(path, sizeof path, "%s/d/pos", dir);
    REQUIRE(mkdir(path, 0755) == 0, "mkdir %s", path);
    snprintf(path, sizeof path, "%s/d/pos/1.txt", dir);
    REQUIRE(tg_test_write_file(path, "sun") == 0, "write");
    REQUIRE(chdir(dir) == 0, "chdir %s", dir);
    static const char *const roots[] = {"d", "d/", "d//"};
    for (size_t k = 0; k < sizeof roots / sizeof *roots; k++) {
        tg_text_rows rows = {0};
        tg_err err = {{0}};
        const int rc = tg_text_read_folders(roots[k], 0, &rows, &err);
        if (CHECK(rc == 0, "'%s': %s", roots[k], err.msg)) {
            CHECK(rows.n == 1 && rows.n_sources == 1 && !strcmp(rows.sources[rows.rows[0].source], "d/pos/1.txt") &&
                      rows.rows[0].label_len == 3 && !strcmp(tg_text_rows_at(&rows, rows.rows[0].label), "pos"),
                  "'%s': %lld rows, source '%s'", roots[k], (long long)rows.n, rows.n_sources ? rows.sources[0] : "");
        }
        tg_text_rows_free(&rows);
    }
    REQUIRE(chdir(cwd) == 0, "chdir back");
}
