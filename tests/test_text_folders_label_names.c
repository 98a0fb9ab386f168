/* Folder inputs (datasets/text_folders.c): a label folder's name must be UTF-8 from its
 * first byte on (a name that starts with a stray byte, one that is such a byte alone, one
 * cut inside a character), while a name of multi-byte characters is a label like any. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "datasets/text_rows.h"
#include "tests/harness.h"

TG_TEST(test_text_folders_label_name_not_utf8_at_any_byte) {
    static const char *const names[] = {"\xff" "c", "\xff", "\x80", "ok\xc3", "\xc3(", "\xe2\x82"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char root[700], dir[800], file[900];
        snprintf(root, sizeof root, "%s/tree%zu", tg_test_tmpdir(), i);
        mkdir(root, 0755);
        snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
        REQUIRE(mkdir(dir, 0755) == 0, "mkdir %zu", i);
        snprintf(file, sizeof file, "%s/1.txt", dir);
        tg_test_write_file(file, "text");
        tg_text_rows rows = {0};
        tg_err err = {{0}};
        const int rc = tg_text_read_folders(root, 1, &rows, &err);
        char want[1024];
        snprintf(want, sizeof want, "%s: the folder's name is not UTF-8, so it cannot name a label", dir);
        CHECK(rc == -1 && !strcmp(err.msg, want) && rows.n == 0, "name %zu: rc %d, '%s'", i, rc, err.msg);
        tg_text_rows_free(&rows);
    }
    /* Multi-byte names are labels. */
    char root[700], dir[800], file[900];
    snprintf(root, sizeof root, "%s/utf8", tg_test_tmpdir());
    mkdir(root, 0755);
    snprintf(dir, sizeof dir, "%s/\xc3\xa9t\xc3\xa9", root);
    mkdir(dir, 0755);
    snprintf(file, sizeof file, "%s/1.txt", dir);
    tg_test_write_file(file, "sun");
    tg_text_rows rows = {0};
    tg_err err = {{0}};
    REQUIRE(tg_text_read_folders(root, 0, &rows, &err) == 0, "%s", err.msg);
    CHECK(rows.n == 1 && rows.rows[0].label_len == 5 &&
              !memcmp(tg_text_rows_at(&rows, rows.rows[0].label), "\xc3\xa9t\xc3\xa9", 5) &&
              rows.rows[0].text_len == 3 && !memcmp(tg_text_rows_at(&rows, rows.rows[0].text), "sun", 3),
          "%lld rows", (long long)rows.n);
    tg_text_rows_free(&rows);
}
