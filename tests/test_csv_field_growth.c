/* The CSV reader's field and scratch tables past their first size (datasets/csv.c): a row
 * of 40 fields, quoted and not, read field by field; the same row read with each of its
 * allocations failed alone, which must end in "t.csv: out of memory" with every table
 * still owned by the reader (tg_csv_free releases it: the sanitizer build's leak check
 * sees a table dropped when its growth failed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "datasets/csv.h"
#include "tests/harness.h"

enum { N_FIELDS = 40 };

/* "f0,"q1 ""x"", y",f2,... then a second row "z": every odd field quoted, with a doubled
 * quote and a delimiter inside, so that the scratch buffer grows too. */
static char *wide_rows(void) {
    size_t cap = 4096, n = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    for (int i = 0; i < N_FIELDS; i++) {
        if (i % 2) n += (size_t)snprintf(s + n, cap - n, "%s\"q%d \"\"x\"\", y%.*s\"", i ? "," : "", i, i * 2,
                                         "--------------------------------------------------------------------------------");
        else n += (size_t)snprintf(s + n, cap - n, "%sf%d", i ? "," : "", i);
    }
    snprintf(s + n, cap - n, "\nz\n");
    return s;
}

static void want_field(int i, char *buf, size_t cap) {
    if (i % 2) snprintf(buf, cap, "q%d \"x\", y%.*s", i, i * 2,
                        "--------------------------------------------------------------------------------");
    else snprintf(buf, cap, "f%d", i);
}

/* Reads both rows; 0 when they are as written, -1 with err filled by the reader. */
static int read_wide(const char *text, tg_err *err, int *wrong) {
    tg_csv c;
    tg_csv_init(&c, "t.csv", text, strlen(text), ',');
    int rc = tg_csv_next(&c, err);
    *wrong = 0;
    if (rc == 1) {
        *wrong |= c.n_fields != N_FIELDS || c.row_line != 1;
        for (int i = 0; i < c.n_fields && i < N_FIELDS; i++) {
            char want[128];
            want_field(i, want, sizeof want);
            *wrong |= c.fields[i].len != strlen(want) || memcmp(c.fields[i].p, want, c.fields[i].len) != 0;
        }
        rc = tg_csv_next(&c, err);
        *wrong |= rc != 1 || c.n_fields != 1 || c.row_line != 2 || c.fields[0].len != 1 || c.fields[0].p[0] != 'z';
        if (rc == 1) rc = tg_csv_next(&c, err);
    }
    tg_csv_free(&c);
    return rc < 0 ? -1 : 0;
}

TG_TEST(test_csv_field_growth_wide_row) {
    char *text = wide_rows();
    REQUIRE(text, "out of memory");
    tg_err err = {{0}};
    int wrong = 1;
    tg_alloc_fail_after(-1);
    CHECK(read_wide(text, &err, &wrong) == 0 && !wrong, "the 40-field row: %s", err.msg);
    /* fields 16 -> 32 -> 64 and their scratch offsets (6), scratch 256 -> 512 -> 1024 (3) */
    const long made = tg_alloc_fail_after(-1);
    CHECK(made == 9, "%ld allocations for the 40-field row, want 9", made);
    for (long k = 0; k < made; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_only(k);
        const int rc = read_wide(text, &err, &wrong);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && !strcmp(err.msg, "t.csv: out of memory"), "allocation %ld of %ld failing: rc %d, '%s'", k, made,
              rc, err.msg);
    }
    free(text);
}
