#include "tests/compile_faults.h"

#include <string.h>

#include "base/alloc.h"
#include "compiler/compile.h"
#include "compiler/job.h"
#include "tests/harness.h"

void tg_test_compile_each_allocation_fails(const char *what, const char *text) {
    tg_job job;
    tg_err err = {{0}};
    REQUIRE(tg_job_parse_text(text, "job.txt", "", NULL, 0, &job, &err) == 0, "%s: %s", what, err.msg);
    tg_plan plan;
    tg_alloc_fail_after(-1);
    REQUIRE(tg_compile(&job, &plan, &err) == 0, "%s: %s", what, err.msg);
    tg_plan_free(&plan);
    const long total = tg_alloc_fail_after(-1);
    long clean = 0;
    for (long k = 0; k < total; k++) {
        tg_alloc_fail_only(k);
        const int rc = tg_compile(&job, &plan, &err);
        tg_alloc_fail_after(-1);
        if (rc == 0) {
            tg_plan_free(&plan);
            CHECK(0, "%s: allocation %ld of %ld failed and the compile succeeded", what, k, total);
            continue;
        }
        clean += CHECK(strstr(err.msg, "out of memory") != NULL, "%s: allocation %ld of %ld: %s", what, k, total,
                       err.msg);
    }
    CHECK(total > 100 && clean == total, "%s: %ld of %ld allocations failed cleanly", what, clean, total);
}
