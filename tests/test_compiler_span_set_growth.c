/* Span sets (compiler/span_set.c) against a model: random ranges added one by one must
 * leave exactly the sorted, merged ranges a bitmap of the same bytes holds; and a set that
 * cannot grow (its allocation refused) returns -1 with its ranges, count and capacity as
 * they were, then grows once memory is back. Touching ranges merge although they share no
 * byte: [a, b) then [b, c) covers bytes b - 1 and b, one run in the bitmap too. */
#include <stdint.h>
#include <string.h>

#include "base/alloc.h"
#include "compiler/span_set.h"
#include "tests/harness.h"

enum { BYTES = 300 };

/* The ranges of `covered` as the set must hold them: maximal runs of covered bytes, where
 * runs that touch count as one (a range [a, b) and [b, c) merge). */
static int runs_of(const unsigned char *covered, tg_span *out) {
    int n = 0;
    for (int i = 0; i < BYTES;) {
        if (!covered[i]) {
            i++;
            continue;
        }
        int j = i;
        while (j < BYTES && covered[j]) j++;
        out[n++] = (tg_span){(uint64_t)i, (uint64_t)j};
        i = j;
    }
    return n;
}

TG_TEST(test_compiler_span_set_against_a_bitmap) {
    uint32_t seed = 12345;
    for (int round = 0; round < 40; round++) {
        tg_span_set s = {0};
        unsigned char covered[BYTES] = {0};
        /* The capacity as the set grows it: 8, then doubled whenever a range comes while
         * the count is at the capacity (whether or not the range merges). */
        int cap = 0;
        tg_span runs[BYTES];
        const int adds = 1 + round % 25;
        for (int k = 0; k < adds; k++) {
            seed = seed * 1103515245u + 12345u;
            const uint64_t a = (seed >> 8) % (BYTES - 1);
            seed = seed * 1103515245u + 12345u;
            const uint64_t len = (seed >> 8) % (round % 3 == 0 ? 4 : 40);
            const uint64_t b = a + len < BYTES ? a + len : BYTES;
            if (a < b && runs_of(covered, runs) == cap) cap = cap ? 2 * cap : 8;
            REQUIRE(tg_span_set_add(&s, a, b) == 0, "round %d: add [%llu, %llu)", round, (unsigned long long)a,
                    (unsigned long long)b);
            for (uint64_t i = a; i < b; i++) covered[i] = 1;
        }
        tg_span want[BYTES];
        const int n = runs_of(covered, want);
        int same = s.n == n;
        for (int i = 0; same && i < n; i++) same = s.v[i].a == want[i].a && s.v[i].b == want[i].b;
        CHECK(same, "round %d: %d spans, want %d (first [%llu, %llu), want [%llu, %llu))", round, s.n, n,
              s.n ? (unsigned long long)s.v[0].a : 0ULL, s.n ? (unsigned long long)s.v[0].b : 0ULL,
              n ? (unsigned long long)want[0].a : 0ULL, n ? (unsigned long long)want[0].b : 0ULL);
        CHECK(s.cap == cap && (cap > 0) == (s.v != NULL), "round %d: capacity %d, want %d", round, s.cap, cap);
        tg_span_set_free(&s);
    }
}

TG_TEST(test_compiler_span_set_growth_refused) {
    /* The first allocation refused: nothing changes. */
    tg_span_set s = {0};
    tg_alloc_fail_only(0);
    const int rc = tg_span_set_add(&s, 10, 20);
    tg_alloc_fail_after(-1);
    CHECK(rc == -1 && s.n == 0 && s.cap == 0 && s.v == NULL, "first growth refused: rc %d, %d spans, cap %d", rc,
          s.n, s.cap);
    /* Eight disjoint ranges fill the first 8 places. */
    for (int i = 0; i < 8; i++) REQUIRE(tg_span_set_add(&s, 10 * (uint64_t)i, 10 * (uint64_t)i + 5) == 0, "add %d", i);
    REQUIRE(s.n == 8 && s.cap == 8, "%d spans, cap %d", s.n, s.cap);
    /* A ninth, new or merging into one held, needs room first: refused, the set as it was. */
    const uint64_t ninth[2][2] = {{100, 105}, {5, 10}};
    for (int k = 0; k < 2; k++) {
        tg_alloc_fail_only(0);
        const int r = tg_span_set_add(&s, ninth[k][0], ninth[k][1]);
        tg_alloc_fail_after(-1);
        int same = s.n == 8 && s.cap == 8;
        for (int i = 0; same && i < 8; i++) same = s.v[i].a == 10 * (uint64_t)i && s.v[i].b == 10 * (uint64_t)i + 5;
        CHECK(r == -1 && same, "growth refused for [%llu, %llu): rc %d, %d spans, cap %d",
              (unsigned long long)ninth[k][0], (unsigned long long)ninth[k][1], r, s.n, s.cap);
    }
    /* With memory back it grows to 16 and takes the range. */
    CHECK(tg_span_set_add(&s, 100, 105) == 0 && s.n == 9 && s.cap == 16 && s.v[8].a == 100 && s.v[8].b == 105,
          "grown: %d spans, cap %d", s.n, s.cap);
    tg_span_set_free(&s);
}
