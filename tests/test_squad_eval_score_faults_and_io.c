/* datasets/squad_eval.c: scoring under each failed allocation in turn (the windows' logits,
 * their context ranges, the post-processing, the metric's normalized forms) fails cleanly,
 * saying what ran out, and succeeds with the totals of an unhindered run once nothing fails;
 * a missing eval file is refused naming it; a line whose closing newline cannot be written
 * (the stream's buffer is full when it comes, on /dev/full) is a write error naming the file. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "datasets/squad_eval.h"
#include "tests/harness.h"

static const char k_eval[] =
    "{\"context\": \"cat dog bird\", \"offsets\": [0, 3, 4, 7, 8, 12]}\n"
    "{\"question\": \"q1\", \"context\": 0, \"answers\": [\"cat\", \"dog\"]}\n"
    "{\"window\": 0, \"at\": 4, \"first\": 0, \"count\": 3}\n"
    "{\"window\": 0, \"at\": 4, \"first\": 1, \"count\": 2}\n"
    "{\"question\": \"q2\", \"context\": 0, \"answers\": []}\n"
    "{\"window\": 1, \"at\": 5, \"first\": 1, \"count\": 2}\n"
    "{\"end\": {\"contexts\": 1, \"questions\": 2, \"windows\": 3}}\n";

TG_TEST(test_squad_eval_score_each_allocation_failing) {
    tg_squad_eval ev;
    tg_err err = {{0}};
    REQUIRE(tg_squad_eval_parse("e.jsonl", k_eval, strlen(k_eval), &ev, &err) == 0, "%s", err.msg);
    enum { T = 9 };
    float start[3 * T] = {0}, end[3 * T] = {0};
    start[0 * T + 5] = 5, end[0 * T + 5] = 5; /* q1: "dog" */
    start[2 * T + 0] = 9, end[2 * T + 0] = 9; /* q2: no answer */
    const tg_qa_postprocess_options opt = {.n_best = 20, .max_answer_len = 30, .version_2 = 1};
    tg_squad_totals want, tot;
    REQUIRE(tg_squad_eval_score(&ev, start, end, T, T, &opt, &want, &err) == 0, "%s", err.msg);
    REQUIRE(want.total == 2 && want.exact == 2, "unhindered: total %lld, exact %g", (long long)want.total, want.exact);
    int failures = 0, done = 0;
    for (long k = 0; k < 200 && !done; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_only(k);
        const int rc = tg_squad_eval_score(&ev, start, end, T, T, &opt, &tot, &err);
        tg_alloc_fail_after(-1);
        if (rc == 0) {
            done = 1;
            CHECK(tot.total == want.total && tot.exact == want.exact && tot.f1 == want.f1,
                  "allocation %ld: totals %lld %g %g", k, (long long)tot.total, tot.exact, tot.f1);
            break;
        }
        failures++;
        CHECK(rc == -1 && strstr(err.msg, "out of memory for "), "allocation %ld: rc %d '%s'", k, rc, err.msg);
        if (k < 2)
            CHECK(!strcmp(err.msg, "out of memory for the context ranges of 2 eval windows"), "allocation %ld: '%s'", k,
                  err.msg);
    }
    CHECK(done && failures >= 5, "%d allocations failed before the run succeeded", failures);
    tg_squad_eval_free(&ev);
}

TG_TEST(test_squad_eval_load_missing_file) {
    char path[800], want[1000];
    snprintf(path, sizeof path, "%s/no_such_eval.jsonl", tg_test_tmpdir());
    tg_squad_eval ev;
    tg_err err = {{0}};
    snprintf(want, sizeof want, "%s: cannot open: %s", path, strerror(ENOENT));
    CHECK(tg_squad_eval_load(path, &ev, &err) == -1 && !strcmp(err.msg, want), "'%s'\n    want '%s'", err.msg, want);
    CHECK(ev.n_contexts == 0 && ev.contexts == NULL, "nothing left in ev");
}

TG_TEST(test_squad_eval_put_newline_write_error) {
    /* The line's length, from a first writing into memory. */
    char *mem = NULL;
    size_t mem_len = 0;
    FILE *m = open_memstream(&mem, &mem_len);
    REQUIRE(m, "open_memstream");
    tg_err err = {{0}};
    REQUIRE(tg_squad_eval_put_end(m, "mem", 1, 2, 3, &err) == 0, "%s", err.msg);
    fclose(m);
    REQUIRE(mem_len > 1 && mem[mem_len - 1] == '\n', "one line: %zu bytes", mem_len);
    const size_t line = mem_len - 1;
    free(mem);
    /* A buffer with room for exactly the line after some earlier bytes: the text fills it
     * and the newline must flush it. (A write the buffer cannot take at all would go to the
     * file directly and fail in fwrite instead.) */
    FILE *f = fopen("/dev/full", "w");
    REQUIRE(f, "/dev/full: %s", strerror(errno));
    static char buf[256], before[256];
    REQUIRE(line < sizeof buf && setvbuf(f, buf, _IOFBF, sizeof buf) == 0, "setvbuf for a line of %zu", line);
    memset(before, 'x', sizeof buf - line);
    REQUIRE(fputs(before, f) >= 0, "the earlier bytes stay in the buffer");
    const int rc = tg_squad_eval_put_end(f, "full.jsonl", 1, 2, 3, &err);
    CHECK(rc == -1 && !strcmp(err.msg, "full.jsonl: write error"), "rc %d '%s'", rc, err.msg);
    fclose(f);
}
