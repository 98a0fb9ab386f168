/* Label sets (datasets/labels.c): the order of collected names at the edges of "a whole
 * number" (18 digits or 19, "-0", a leading zero, a sign alone), lookups of names that are
 * prefixes of others, and every allocation of a list and of a collection failed in turn:
 * the error says what ran out and the set is left empty. */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "datasets/labels.h"
#include "datasets/text_rows.h"
#include "tests/harness.h"

static int collect(const char *const *labels, tg_text_rows *rows, tg_label_set *ls, tg_err *err) {
    memset(rows, 0, sizeof *rows);
    int32_t src;
    if (tg_text_rows_source(rows, "x", &src, err)) return -1;
    for (int i = 0; labels[i]; i++)
        if (tg_text_rows_add(rows, src, i + 1, "t", 1, NULL, 0, labels[i], strlen(labels[i]), err)) return -1;
    return tg_labels_collect(rows, ls, err);
}

TG_TEST(test_labels_collected_order_at_whole_number_edges) {
    static const struct {
        const char *labels[8];
        const char *want;
    } cases[] = {
        {{"123456789012345678", "-5", "99", NULL}, "-5,99,123456789012345678"},
        {{"1234567890123456789", "-5", "99", NULL}, "-5,1234567890123456789,99"}, /* 19 digits: bytes */
        {{"-0", "5", "10", NULL}, "-0,10,5"},
        {{"0", "-1", "10", "9", NULL}, "-1,0,9,10"},
        {{"-", "10", "9", NULL}, "-,10,9"},
        {{"-10", "-9", "-100", "3", "-9", NULL}, "-100,-10,-9,3"},
        {{"ab", "a", "abc", "a", NULL}, "a,ab,abc"},
        {{"+1", "10", "9", NULL}, "+1,10,9"}, /* a byte below '0' */
        {{"1.5", "10", "9", NULL}, "1.5,10,9"},
        {{"", "10", "9", NULL}, ",10,9"}, /* an empty name (the readers refuse one) is no number */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        tg_text_rows rows;
        tg_label_set ls;
        tg_err err = {{0}};
        if (!CHECK(collect(cases[k].labels, &rows, &ls, &err) == 0, "case %zu: %s", k, err.msg)) continue;
        char names[256] = "";
        size_t at = 0;
        for (int32_t i = 0; i < ls.n; i++)
            at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", i ? "," : "", ls.names[i]);
        CHECK(!strcmp(names, cases[k].want), "case %zu: %s, want %s", k, names, cases[k].want);
        for (int32_t i = 0; i < ls.n; i++)
            CHECK(tg_labels_find(&ls, ls.names[i], ls.lens[i]) == i && ls.lens[i] == strlen(ls.names[i]),
                  "case %zu: find %s", k, ls.names[i]);
        tg_labels_free(&ls);
        tg_text_rows_free(&rows);
    }
    /* Prefixes of a name and names a byte longer are not it. */
    tg_label_set ls;
    tg_err err = {{0}};
    REQUIRE(tg_labels_parse_list("abc,b", &ls, &err) == 0, "%s", err.msg);
    CHECK(tg_labels_find(&ls, "ab", 2) == -1 && tg_labels_find(&ls, "abcd", 4) == -1 &&
              tg_labels_find(&ls, "abc", 3) == 0 && tg_labels_find(&ls, "b", 1) == 1 && tg_labels_find(&ls, "", 0) == -1,
          "lookups");
    tg_labels_free(&ls);
    CHECK(ls.names == NULL && ls.lens == NULL && ls.sorted == NULL && ls.n == 0, "freed");
}

TG_TEST(test_labels_each_allocation_failing) {
    static const char *const labels[] = {"b", "a", "c", NULL};
    for (int what = 0; what < 2; what++) {
        tg_text_rows rows = {0};
        tg_label_set ls;
        tg_err err = {{0}};
        if (what == 1) {
            memset(&rows, 0, sizeof rows);
            int32_t src;
            REQUIRE(tg_text_rows_source(&rows, "x", &src, &err) == 0, "%s", err.msg);
            for (int i = 0; labels[i]; i++)
                REQUIRE(tg_text_rows_add(&rows, src, i + 1, "t", 1, NULL, 0, labels[i], 1, &err) == 0, "%s", err.msg);
        }
        tg_alloc_fail_after(-1);
        REQUIRE((what == 0 ? tg_labels_parse_list("b,a,c", &ls, &err) : tg_labels_collect(&rows, &ls, &err)) == 0,
                "%s", err.msg);
        const long total = tg_alloc_fail_after(-1);
        tg_labels_free(&ls);
        REQUIRE(total == (what == 0 ? 7 : 7), "%d: %ld allocations", what, total);
        static const char *const want[2][7] = {
            {"--labels: out of memory", "out of memory for 3 label names", "out of memory for 3 label names",
             "out of memory for 3 label names", "out of memory for label name 0", "out of memory for label name 1",
             "out of memory for label name 2"},
            {"out of memory collecting 3 labels", "out of memory for 3 label names", "out of memory for 3 label names",
             "out of memory for 3 label names", "out of memory for label name 0", "out of memory for label name 1",
             "out of memory for label name 2"},
        };
        for (long k = 0; k < total; k++) {
            err.msg[0] = 0;
            tg_alloc_fail_only(k);
            const int rc = what == 0 ? tg_labels_parse_list("b,a,c", &ls, &err) : tg_labels_collect(&rows, &ls, &err);
            tg_alloc_fail_after(-1);
            CHECK(rc == -1 && !strcmp(err.msg, want[what][k]) && ls.n == 0 && ls.names == NULL && ls.lens == NULL &&
                      ls.sorted == NULL,
                  "%d: allocation %ld failed: rc %d '%s', want '%s'", what, k, rc, err.msg, want[what][k]);
        }
        tg_text_rows_free(&rows);
    }
}
