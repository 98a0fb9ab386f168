/* The gradient sums' timeline of data-parallel steps: a step's busy and exposed time from
 * its buckets' stamps and the trainer's sums over the steps after the first
 * (runtime/trainer.c), and the --profile report of it (cli/profile.c) with its metrics
 * lines. The CUDA executor fills the stamps; here they are made by hand. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/profile.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

static tg_step_result result_of(int n, const float *begin, const float *end) {
    tg_step_result r;
    memset(&r, 0, sizeof r);
    r.comm_buckets = n;
    for (int j = 0; j < n && j < TG_COMM_TIMELINE_MAX; j++) r.comm_begin_ms[j] = begin[j], r.comm_end_ms[j] = end[j];
    return r;
}

TG_TEST(test_comm_timeline_add) {
    tg_comm_timeline c;
    memset(&c, 0, sizeof c);
    float busy = 0, exposed = 0;
    /* No sums measured: -1 each, nothing added. */
    tg_step_result none = result_of(0, NULL, NULL);
    tg_comm_timeline_add(&c, &none, 5, &busy, &exposed);
    CHECK(busy == -1.0f && exposed == -1.0f && c.buckets == 0 && c.steps == 0, "none: busy %g exposed %g", busy, exposed);
    /* Three buckets, the last past the backward's end by 0.25 ms. */
    const float b1[] = {-2.0f, -1.0f, -0.125f}, e1[] = {-1.5f, -0.25f, 0.25f};
    tg_step_result r1 = result_of(3, b1, e1);
    tg_comm_timeline_add(&c, &r1, 1, &busy, &exposed); /* the first step: its stats only */
    CHECK(busy == 1.625f && exposed == 0.25f && c.steps == 0 && c.buckets == 0, "step 1: busy %g exposed %g, %lld steps",
          busy, exposed, (long long)c.steps);
    tg_comm_timeline_add(&c, &r1, 2, &busy, &exposed);
    /* Ended within the backward: nothing exposed. */
    const float b2[] = {-3.0f, -2.0f, -1.0f}, e2[] = {-2.5f, -1.5f, -0.5f};
    tg_step_result r2 = result_of(3, b2, e2);
    tg_comm_timeline_add(&c, &r2, 3, &busy, &exposed);
    CHECK(busy == 1.5f && exposed == 0.0f, "step 3: busy %g exposed %g", busy, exposed);
    CHECK(c.buckets == 3 && c.steps == 2 && c.begin_ms[0] == -5.0 && c.end_ms[2] == -0.25 && c.begin_ms[1] == -3.0,
          "timeline: %d buckets, %lld steps, begin[0] %g end[2] %g begin[1] %g", c.buckets, (long long)c.steps,
          c.begin_ms[0], c.end_ms[2], c.begin_ms[1]);
    /* A step of another shape keeps its own stats out of the timeline. */
    const float b3[] = {-1.0f, -0.5f}, e3[] = {-0.75f, 0.5f};
    tg_step_result r3 = result_of(2, b3, e3);
    tg_comm_timeline_add(&c, &r3, 4, &busy, &exposed);
    CHECK(busy == 1.25f && exposed == 0.5f && c.steps == 2 && c.buckets == 3, "other shape: %lld steps", (long long)c.steps);
    /* More buckets than the timeline holds: the entries it has. */
    tg_step_result many = result_of(0, NULL, NULL);
    many.comm_buckets = TG_COMM_TIMELINE_MAX + 5;
    for (int j = 0; j < TG_COMM_TIMELINE_MAX; j++) many.comm_begin_ms[j] = (float)j - 40, many.comm_end_ms[j] = (float)j - 39.5f;
    tg_comm_timeline d;
    memset(&d, 0, sizeof d);
    tg_comm_timeline_add(&d, &many, 2, &busy, &exposed);
    CHECK(busy == 0.5f * TG_COMM_TIMELINE_MAX && exposed == 0.0f && d.buckets == TG_COMM_TIMELINE_MAX && d.steps == 1,
          "many: busy %g exposed %g, %d entries", busy, exposed, d.buckets);
}

/* The report of a two-replica plan's timeline: a line per bucket with its bytes (the
 * buckets' bytes add up to the gradients'), mean begin and end, and the exposed part. */
TG_TEST(test_comm_timeline_report) {
    tg_plan p;
    REQUIRE(tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 2, &p), "compile");
    int buckets = 0;
    for (int o = p.phase_begin[TG_PHASE_BACKWARD]; o < p.phase_begin[TG_PHASE_OPTIMIZER]; o++)
        buckets += p.ops[o].kind == TG_OP_ALL_REDUCE;
    REQUIRE(buckets >= 2 && buckets <= TG_COMM_TIMELINE_MAX, "%d buckets", buckets);
    tg_comm_timeline c;
    memset(&c, 0, sizeof c);
    c.buckets = buckets, c.steps = 4;
    for (int j = 0; j < buckets; j++) /* means: bucket j from j - buckets + 0.5 to j - buckets + 1.5 ms */
        c.begin_ms[j] = 4.0 * (j - buckets + 0.5), c.end_ms[j] = 4.0 * (j - buckets + 1.5);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    REQUIRE(f, "open_memstream");
    int rc = report_comm_timeline(&p, &c, f);
    tg_comm_timeline empty;
    memset(&empty, 0, sizeof empty);
    rc |= report_comm_timeline(&p, &empty, f); /* nothing */
    fclose(f);
    CHECK(rc == 0 && text, "report failed");
    int lines = 0;
    long long bytes = 0;
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL, lines++) {
        int j;
        long long b;
        double begin, end, exposed;
        if (!CHECK(sscanf(l, "{\"profile_comm_bucket\": %d, \"bytes\": %lld, \"begin_ms\": %lf, \"end_ms\": %lf, "
                             "\"exposed_ms\": %lf}",
                          &j, &b, &begin, &end, &exposed) == 5,
                   "line %d: %.120s", lines, l))
            break;
        bytes += b;
        const double want_begin = j - buckets + 0.5, want_end = j - buckets + 1.5;
        const double want_exposed = want_end > 0 ? want_end - (want_begin > 0 ? want_begin : 0) : 0;
        CHECK(j == lines && b > 0 && fabs(begin - want_begin) < 1e-4 && fabs(end - want_end) < 1e-4 &&
                  fabs(exposed - want_exposed) < 1e-4,
              "bucket %d: %lld bytes, %g to %g, exposed %g", j, b, begin, end, exposed);
    }
    long long summed = 0;
    for (int o = 0; o < p.n_ops; o++) summed += p.ops[o].kind == TG_OP_ALL_REDUCE ? 4 * p.ops[o].p.count.n : 0;
    CHECK(lines == buckets && bytes == summed, "%d lines for %d buckets, %lld bytes of %lld summed", lines, buckets,
          bytes, summed);
    free(text);
    tg_plan_free(&p);
}
