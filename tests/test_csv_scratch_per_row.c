/* The CSV reader's scratch (datasets/csv.c) holds one row's quoted fields: a row is read into
 * it from the start again, so rows no larger than the ones before allocate nothing however
 * many follow, and each row's fields (quoted with doubled quotes, or plain) read back
 * exactly, each row with its own line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "datasets/csv.h"
#include "tests/harness.h"

TG_TEST(test_csv_scratch_reused_by_each_row) {
    enum { ROWS = 40 };
    /* Each row: a quoted field of 100 bytes with a doubled quote, then a plain one. */
    static char buf[ROWS * 160];
    size_t len = 0;
    for (int r = 0; r < ROWS; r++) {
        char field[128];
        memset(field, 'a' + r % 26, 98);
        field[98] = 0;
        len += (size_t)snprintf(buf + len, sizeof buf - len, "\"%.49s\"\"%s\",plain%d\n", field, field + 49, r);
    }
    tg_csv c;
    tg_csv_init(&c, "t.csv", buf, len, ',');
    tg_err err = {{0}};
    REQUIRE(tg_csv_next(&c, &err) == 1, "%s", err.msg);
    const size_t cap = c.scratch_cap;
    /* No allocation from here on: every later row fits what the first one made. */
    tg_alloc_fail_after(0);
    int rows = 1, bad = 0;
    for (;;) {
        const int rc = tg_csv_next(&c, &err);
        if (rc != 1) {
            CHECK(rc == 0, "row %d: rc %d, '%s'", rows + 1, rc, err.msg);
            break;
        }
        char want[128], plain[32];
        memset(want, 'a' + rows % 26, 99);
        want[49] = '"';
        snprintf(plain, sizeof plain, "plain%d", rows);
        if (c.n_fields != 2 || c.fields[0].len != 99 || memcmp(c.fields[0].p, want, 99) ||
            c.fields[1].len != strlen(plain) || memcmp(c.fields[1].p, plain, strlen(plain)) ||
            c.row_line != rows + 1)
            bad++;
        rows++;
    }
    tg_alloc_fail_after(-1);
    CHECK(rows == ROWS && bad == 0, "%d rows read, %d wrong", rows, bad);
    CHECK(c.scratch_cap == cap && c.scratch_len == 0, "scratch %zu of %zu bytes at the end (%zu after the first row)",
          c.scratch_len, c.scratch_cap, cap);
    tg_csv_free(&c);
}
