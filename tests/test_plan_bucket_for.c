/* tg_plan_bucket_for and tg_plan_bucket (plan/plan.c) on hand-set bucket tables: the
 * smallest bucket whose length holds len, the last for anything longer, 0 without buckets;
 * only the first n_buckets entries of bucket_seq are read (a table reused for fewer buckets
 * may keep older lengths past them). */
#include <string.h>

#include "plan/plan.h"
#include "tests/harness.h"

TG_TEST(test_plan_bucket_for_lengths) {
    tg_plan p;
    memset(&p, 0, sizeof p);
    /* Three buckets: 4, 8, 16; stale lengths 32 and 64 past them. */
    p.train.n_buckets = 3;
    const int32_t seq[TG_MAX_BUCKETS] = {4, 8, 16, 32, 64};
    memcpy(p.train.bucket_seq, seq, sizeof seq);
    const struct {
        int32_t len;
        int want;
    } cases[] = {{-5, 0}, {0, 0}, {1, 0}, {4, 0}, {5, 1}, {8, 1}, {9, 2}, {16, 2}, {17, 2}, {20, 2}, {32, 2}, {60, 2}, {1000, 2}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        CHECK(tg_plan_bucket_for(&p, cases[i].len) == cases[i].want, "3 buckets, len %d: bucket %d, want %d",
              cases[i].len, tg_plan_bucket_for(&p, cases[i].len), cases[i].want);
    /* Every bucket in use: the last holds anything longer. */
    p.train.n_buckets = TG_MAX_BUCKETS;
    for (int k = 0; k < TG_MAX_BUCKETS; k++) p.train.bucket_seq[k] = 4 << k;
    CHECK(tg_plan_bucket_for(&p, 4 << (TG_MAX_BUCKETS - 1)) == TG_MAX_BUCKETS - 1 &&
              tg_plan_bucket_for(&p, (4 << (TG_MAX_BUCKETS - 1)) + 1) == TG_MAX_BUCKETS - 1 &&
              tg_plan_bucket_for(&p, 5) == 1 && tg_plan_bucket_for(&p, 4) == 0,
          "%d buckets", TG_MAX_BUCKETS);
    /* One bucket (the plan itself) or none: always 0, whatever lengths the table keeps. */
    for (int n = 0; n <= 1; n++) {
        p.train.n_buckets = n;
        memcpy(p.train.bucket_seq, seq, sizeof seq);
        CHECK(tg_plan_bucket_for(&p, 1) == 0 && tg_plan_bucket_for(&p, 6) == 0 && tg_plan_bucket_for(&p, 20) == 0 &&
                  tg_plan_bucket_for(&p, 100) == 0,
              "%d buckets: %d %d %d", n, tg_plan_bucket_for(&p, 1), tg_plan_bucket_for(&p, 6), tg_plan_bucket_for(&p, 20));
    }
}
