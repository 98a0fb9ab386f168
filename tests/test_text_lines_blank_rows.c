/* Plain text lines (datasets/text_lines.c): a line of blanks is no row, whatever blanks
 * make it up (space, tab, FF, VT, and a carriage return that is not the line's end), while a
 * line with anything else is a row, its blanks kept. */
#include <string.h>

#include "datasets/text_rows.h"
#include "tests/harness.h"

TG_TEST(test_text_lines_blank_lines_of_each_blank) {
    /* lines 2 to 6 are blank: "\r" (CR CR LF less its end), " \r ", "\t\f\v", " ", "\r" */
    static const char text[] = "a\n\r\r\n \r \n\t\f\v\n \n\r\nb \r\n";
    tg_text_rows rows = {0};
    tg_err err = {{0}};
    REQUIRE(tg_text_read_lines("t.txt", text, sizeof text - 1, 0, &rows, &err) == 0, "%s", err.msg);
    REQUIRE(rows.n == 2, "%lld rows", (long long)rows.n);
    CHECK(rows.rows[0].line == 1 && rows.rows[0].text_len == 1 && !memcmp(tg_text_rows_at(&rows, rows.rows[0].text), "a", 1),
          "row 1: line %lld", (long long)rows.rows[0].line);
    CHECK(rows.rows[1].line == 7 && rows.rows[1].text_len == 2 && !memcmp(tg_text_rows_at(&rows, rows.rows[1].text), "b ", 2),
          "row 2: line %lld, %lld bytes", (long long)rows.rows[1].line, (long long)rows.rows[1].text_len);
    tg_text_rows_free(&rows);
}
