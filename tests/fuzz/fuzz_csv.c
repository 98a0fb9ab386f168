/* libFuzzer target: the CSV/TSV reader (datasets/csv.c) and the rows it gives by column
 * name (datasets/text_csv.c). The first byte picks the delimiter and the columns; every
 * field must lie inside the input or the reader's scratch, and rows must move forward. */
#include <string.h>

#include "datasets/csv.h"
#include "datasets/text_rows.h"
#include "tests/fuzz/fuzz_input.h"

static void rows_of(const char *buf, size_t len, char delim) {
    tg_csv c;
    tg_err err;
    tg_csv_init(&c, "fuzz.csv", buf, len, delim);
    int64_t last_line = 0;
    int rc;
    while ((rc = tg_csv_next(&c, &err)) == 1) {
        FUZZ_ASSERT(c.n_fields >= 1, "a row of %d fields", c.n_fields);
        FUZZ_ASSERT(c.row_line > last_line, "row at line %lld after %lld", (long long)c.row_line, (long long)last_line);
        last_line = c.row_line;
        for (int32_t i = 0; i < c.n_fields; i++) {
            const char *p = c.fields[i].p;
            size_t n = c.fields[i].len;
            int in_buf = p >= buf && p + n <= buf + len;
            int in_scratch = c.scratch && p >= c.scratch && p + n <= c.scratch + c.scratch_len;
            FUZZ_ASSERT(in_buf || in_scratch || n == 0, "field %d outside the input and the scratch", i);
        }
    }
    FUZZ_ASSERT(rc == 0 || err.msg[0], "failed without a message");
    tg_csv_free(&c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char delim = data[0] & 1 ? '\t' : ',';
    const char *buf = (const char *)data + 1;
    const size_t len = size - 1;
    rows_of(buf, len, delim);
    tg_text_columns cols = {.text = "text", .label = "label", .pair = data[0] & 2 ? "pair" : NULL,
                            .label_required = (data[0] & 4) != 0, .skip_invalid = (data[0] & 8) != 0};
    tg_text_rows rows = {0};
    tg_err err;
    if (tg_text_read_csv("fuzz.csv", buf, len, delim, &cols, &rows, &err) != 0) {
        FUZZ_ASSERT(err.msg[0], "failed without a message");
    } else {
        for (int64_t i = 0; i < rows.n; i++) {
            const tg_text_row *r = &rows.rows[i];
            FUZZ_ASSERT(r->text >= 0 && r->text + r->text_len < rows.n_bytes, "row %lld text out of the arena",
                        (long long)i);
            FUZZ_ASSERT(!cols.pair || (r->pair >= 0 && r->pair + r->pair_len < rows.n_bytes), "row %lld pair",
                        (long long)i);
            FUZZ_ASSERT(r->label < 0 || (r->label_len > 0 && r->label + r->label_len < rows.n_bytes),
                        "row %lld label", (long long)i);
        }
    }
    tg_text_rows_free(&rows);
    return 0;
}
