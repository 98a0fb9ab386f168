/* `tunegraph sweep` run in process on the tiny BERT of the demo job, on the CPU: the
 * points run, a point too large for the machine's free memory refused unrun with the
 * numbers, results.jsonl against the score's formula, the ranked table in score order (and
 * on stdout), the plots, the artifact's manifest against the files, a point that cannot
 * compile reported as failed, and every refusal of a bad command line. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "tests/cli_in_process.h"
#include "tests/harness.h"

/* The lines of a JSON Lines file as an array (NULL when a line does not parse). */
static json_t *read_jsonl(const char *path) {
    char *text = tg_test_read_file(path, NULL);
    if (!text) return NULL;
    json_t *lines = json_array();
    for (char *line = strtok(text, "\n"); line && lines; line = strtok(NULL, "\n")) {
        json_error_t jerr;
        json_t *o = json_loads(line, 0, &jerr);
        if (!o) {
            json_decref(lines);
            lines = NULL;
        } else {
            json_array_append_new(lines, o);
        }
    }
    free(text);
    return lines;
}

static double number(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static const char *setting(json_t *point, const char *key) {
    return json_string_value(json_object_get(json_object_get(point, "settings"), key));
}

/* Every file the manifest lists has its size and xxh64; returns how many were checked. */
static int check_manifest(const char *dir) {
    char path[1200];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    json_error_t jerr;
    json_t *m = json_load_file(path, 0, &jerr);
    if (!CHECK(m, "%s: %s", path, jerr.text)) return 0;
    json_t *files = json_object_get(m, "files"), *f;
    size_t i;
    int checked = 0;
    json_array_foreach(files, i, f) {
        const char *name = json_string_value(json_object_get(f, "path"));
        snprintf(path, sizeof path, "%s/%s", dir, name ? name : "?");
        long len = 0;
        char *data = tg_test_read_file(path, &len);
        if (!CHECK(data, "%s listed but not there", path)) continue;
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH64(data, (size_t)len, 0));
        CHECK(number(f, "bytes") == (double)len, "%s: %ld bytes, manifest %g", path, len, number(f, "bytes"));
        CHECK(!strcmp(hex, json_string_value(json_object_get(f, "xxh64"))), "%s: xxh64 %s, manifest %s", path, hex,
              json_string_value(json_object_get(f, "xxh64")));
        free(data);
        checked++;
    }
    json_decref(m);
    return checked;
}

/* Whether the manifest lists `name`. */
static int manifest_lists(const char *dir, const char *name) {
    char path[1200];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    json_t *m = json_load_file(path, 0, NULL), *f;
    size_t i;
    int found = 0;
    json_array_foreach(json_object_get(m, "files"), i, f) found |= !strcmp(json_string_value(json_object_get(f, "path")), name);
    json_decref(m);
    return found;
}

/* batch 2 and 4 with two learning rates run; batch 20,000,000 (a plan of over a TiB) is
 * refused for both rates. */
TG_TEST(test_cli_sweep_runs_ranks_and_refuses) {
    const char *dir = tg_test_tmpdir();
    char line[2048], path[1200];
    snprintf(line, sizeof line,
             "sweep examples/demo-classify.job --grid batch=2,4,20000000 --grid lr=1e-3,2e-3 --set seq=16 --steps 3 "
             "--warmup 1 --threads 1 -o %s/out --artifact %s/art",
             dir, dir);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    /* The free memory the refusal names: the host's on the CPU, GPU 0's where the suite runs
     * on CUDA (the sweep's default device there). */
    const char *free_source = tg_test_device() ? "free on GPU 0" : "available (MemAvailable)";
    CHECK(strstr(r.err, "sweep: point 5 of 6 (batch=20000000 lr=1e-3) refused: needs ") && strstr(r.err, free_source),
          "the refusal is not reported: %s", r.err);
    snprintf(path, sizeof path, "%s/out/results.jsonl", dir);
    json_t *points = read_jsonl(path);
    REQUIRE(points && json_array_size(points) == 6, "%s: %zu points", path, points ? json_array_size(points) : 0);
    double tps[6], peak[6], score[6];
    int rank[6], n_ok = 0;
    for (size_t i = 0; i < 6; i++) {
        json_t *p = json_array_get(points, i);
        CHECK(number(p, "point") == (double)(i + 1), "point %zu numbered %g", i, number(p, "point"));
        static const char *const batches[] = {"2", "2", "4", "4", "20000000", "20000000"};
        static const char *const rates[] = {"1e-3", "2e-3", "1e-3", "2e-3", "1e-3", "2e-3"};
        CHECK(setting(p, "batch") && !strcmp(setting(p, "batch"), batches[i]) && setting(p, "lr") &&
                  !strcmp(setting(p, "lr"), rates[i]),
              "point %zu settings", i);
        const char *status = json_string_value(json_object_get(p, "status"));
        peak[i] = number(p, "planned_peak_bytes");
        CHECK(peak[i] > 0, "point %zu: planned peak %g", i, peak[i]);
        if (i >= 4) {
            const char *reason = json_string_value(json_object_get(p, "reason"));
            CHECK(status && !strcmp(status, "refused"), "point %zu status %s", i, status ? status : "(none)");
            CHECK(reason && !strncmp(reason, "needs ", 6) && strstr(reason, free_source), "reason %s",
                  reason ? reason : "(none)");
            CHECK(number(p, "memory_estimate_bytes") > number(p, "free_bytes") && peak[i] > 2e11, /* bf16 on CUDA: 7.7e11 */
                  "refused at %g bytes with %g free", number(p, "memory_estimate_bytes"), number(p, "free_bytes"));
            CHECK(!json_object_get(p, "rank") && !json_object_get(p, "median_step_ms"), "a refused point has timings");
            snprintf(path, sizeof path, "%s/out/points/%04zu/metrics.jsonl", dir, i + 1);
            struct stat st;
            CHECK(stat(path, &st) != 0, "a refused point ran: %s", path);
            continue;
        }
        REQUIRE(status && !strcmp(status, "ok"), "point %zu status %s: %s", i, status ? status : "(none)",
                json_string_value(json_object_get(p, "reason")));
        n_ok++;
        tps[i] = number(p, "tokens_per_s");
        score[i] = number(p, "score");
        rank[i] = (int)number(p, "rank");
        CHECK(number(p, "steps") == 4 && number(p, "timed_steps") == 3, "steps %g, timed %g", number(p, "steps"),
              number(p, "timed_steps"));
        CHECK(number(p, "median_step_ms") > 0 && tps[i] > 0 && isfinite(number(p, "final_loss")),
              "point %zu: median %g ms, %g tokens/s", i, number(p, "median_step_ms"), tps[i]);
        /* The point's metrics file: four step lines and the summary. */
        snprintf(path, sizeof path, "%s/out/%s", dir, json_string_value(json_object_get(p, "metrics")));
        json_t *metrics = read_jsonl(path);
        CHECK(metrics && json_array_size(metrics) == 5, "%s: %zu lines", path, metrics ? json_array_size(metrics) : 0);
        json_decref(metrics);
    }
    REQUIRE(n_ok == 4, "%d points ran", n_ok);
    /* A progress line per point run, in order: its settings and numbers as results.jsonl
     * has them, the runs done of the 4 to take, the time so far and the time left (none
     * after the last). */
    const char *after = r.err;
    for (size_t i = 0; i < 4; i++) {
        json_t *p = json_array_get(points, i);
        char head[160];
        snprintf(head, sizeof head, "sweep: point %zu of 6 (batch=%s lr=%s) ok: ", i + 1, setting(p, "batch"),
                 setting(p, "lr"));
        const char *at = strstr(after, head);
        if (!CHECK(at, "no progress line '%s' after the previous one: %s", head, r.err)) break;
        double ms = NAN, tok_s = NAN, loss = NAN;
        int done = 0, runs = 0, n = 0;
        char peak[32] = "", elapsed[32] = "", eta[32] = "";
        CHECK(sscanf(at + strlen(head), "%lf ms a step, %lf tokens/s, final loss %lf, planned peak %31[^;]; %d of %d runs "
                                        "done in %31s ETA %31s%n",
                     &ms, &tok_s, &loss, peak, &done, &runs, elapsed, eta, &n) == 8 && n > 0,
              "progress line: %.300s", at);
        CHECK(fabs(ms - number(p, "median_step_ms")) < 6e-4 && fabs(tok_s - number(p, "tokens_per_s")) < 0.06 &&
                  fabs(loss - number(p, "final_loss")) < 1e-4 * fmax(1, fabs(loss)),
              "point %zu: line says %g ms, %g tokens/s, loss %g; results %g, %g, %g", i, ms, tok_s, loss,
              number(p, "median_step_ms"), number(p, "tokens_per_s"), number(p, "final_loss"));
        CHECK(done == (int)i + 1 && runs == 4, "point %zu: %d of %d runs done", i, done, runs);
        int h = -1, m = -1, sec = -1;
        CHECK(sscanf(elapsed, "%d:%2d:%2d,", &h, &m, &sec) == 3 && h >= 0 && m < 60 && sec < 60, "elapsed '%s'", elapsed);
        CHECK(i < 3 ? sscanf(eta, "%d:%2d:%2d", &h, &m, &sec) == 3 : !strcmp(eta, "0:00:00"), "point %zu: ETA '%s'", i, eta);
        CHECK(peak[0] && strchr("0123456789", peak[0]), "planned peak '%s'", peak);
        after = at + strlen(head);
    }
    /* The score: tokens/s over the best plus the best planned peak over the point's, halved. */
    double best_tps = 0, best_peak = INFINITY;
    for (int i = 0; i < 4; i++) best_tps = fmax(best_tps, tps[i]), best_peak = fmin(best_peak, peak[i]);
    for (int i = 0; i < 4; i++) {
        const double want = (tps[i] / best_tps + best_peak / peak[i]) / 2;
        CHECK(fabs(score[i] - want) < 1e-4, "point %d: score %g, formula %g", i, score[i], want);
        for (int j = 0; j < 4; j++)
            if (score[j] > score[i] + 1e-9) CHECK(rank[j] < rank[i], "point %d (%g) ranks below point %d (%g)", j, score[j], i, score[i]);
    }
    /* The table lists the points by rank, the refused ones last with their reason. */
    snprintf(path, sizeof path, "%s/out/results.txt", dir);
    char *table = tg_test_read_file(path, NULL);
    REQUIRE(table, "%s", path);
    CHECK(r.out && !strcmp(r.out, table), "stdout is not the table: %s", r.out ? r.out : "");
    CHECK(strstr(table, "6 points (4 ran, 2 refused, 0 failed); 3 timed steps after 1 warm-up steps a point") &&
              strstr(table, "score = sum(weight * normalised) / sum(weight)") &&
              strstr(table, "left out (weight 0, or not measured on every ok point): energy, cost"),
          "table: %s", table);
    const char *prev = table;
    for (int k = 1; k <= 4; k++) {
        int i = 0;
        while (i < 4 && rank[i] != k) i++;
        REQUIRE(i < 4, "no point of rank %d", k);
        char row[128];
        snprintf(row, sizeof row, "\n%4d  %-8s  %-4s  ok", k, setting(json_array_get(points, (size_t)i), "batch"),
                 setting(json_array_get(points, (size_t)i), "lr"));
        const char *at = strstr(table, row);
        CHECK(at && at > prev, "row '%s' missing or out of order: %s", row + 1, table);
        if (at) prev = at;
    }
    const char *refused = strstr(table, "\n   -  20000000  1e-3  refused");
    CHECK(refused && refused > prev && strstr(refused, "needs "), "refused row: %s", table);
    free(table);
    /* The plots: throughput and memory against each key. */
    static const char *const plots[] = {"throughput_vs_batch.svg", "memory_vs_batch.svg", "throughput_vs_lr.svg",
                                        "memory_vs_lr.svg"};
    for (size_t k = 0; k < 4; k++) {
        snprintf(path, sizeof path, "%s/out/plots/%s", dir, plots[k]);
        char *svg = tg_test_read_file(path, NULL);
        CHECK(svg && !strncmp(svg, "<svg", 4) && strstr(svg, "polyline"), "%s", path);
        free(svg);
        snprintf(path, sizeof path, "plots/%s", plots[k]);
        snprintf(line, sizeof line, "%s/art", dir);
        CHECK(manifest_lists(line, path), "the artifact's manifest lacks %s", path);
    }
    /* The artifact: the job, the environment, the results, a plan per compiled point, and a
     * manifest whose sizes and hashes match. */
    snprintf(path, sizeof path, "%s/art", dir);
    const int checked = check_manifest(path);
    CHECK(checked >= 2 + 2 + 4 + 6 * 2 + 4, "the manifest lists %d files", checked);
    static const char *const listed[] = {"job.job", "environment.json", "results.jsonl", "results.txt",
                                         "points/0001/plan.tgp", "points/0001/metrics.jsonl", "points/0006/plan.tgp",
                                         "points/0006/job.resolved.json"};
    for (size_t k = 0; k < sizeof listed / sizeof listed[0]; k++)
        CHECK(manifest_lists(path, listed[k]), "the manifest lacks %s", listed[k]);
    CHECK(!manifest_lists(path, "points/0005/metrics.jsonl"), "a refused point has a metrics file in the artifact");
    json_decref(points);
    tg_cli_run_free(&r);
}

/* Memory alone weighs: the smaller batch ranks first with score 1, the other scores the
 * ratio of the planned peaks, whatever the timings. */
TG_TEST(test_cli_sweep_memory_weight_ranks_by_planned_peak) {
    const char *dir = tg_test_tmpdir();
    char line[2048], path[1200];
    snprintf(line, sizeof line,
             "sweep examples/demo-classify.job --grid batch=4,2 --set seq=16 --steps 1 --warmup 0 --threads 1 "
             "--weights memory=1 -o %s/out",
             dir);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    snprintf(path, sizeof path, "%s/out/results.jsonl", dir);
    json_t *points = read_jsonl(path);
    REQUIRE(points && json_array_size(points) == 2, "%s", path);
    json_t *b4 = json_array_get(points, 0), *b2 = json_array_get(points, 1);
    CHECK(number(b2, "rank") == 1 && number(b4, "rank") == 2, "ranks %g (batch 2), %g (batch 4)", number(b2, "rank"),
          number(b4, "rank"));
    const double ratio = number(b2, "planned_peak_bytes") / number(b4, "planned_peak_bytes");
    CHECK(number(b2, "score") == 1 && fabs(number(b4, "score") - ratio) < 1e-6 && ratio < 1, "scores %g, %g (ratio %g)",
          number(b2, "score"), number(b4, "score"), ratio);
    CHECK(r.out && strstr(r.out, "memory 1: the best planned peak / planned peak") &&
              strstr(r.out, "left out (weight 0, or not measured on every ok point): throughput, energy, cost"),
          "table: %s", r.out ? r.out : "");
    json_decref(points);
    tg_cli_run_free(&r);
}

/* A point whose value the compiler refuses is reported failed with the compiler's message
 * (the others still run); the sweep then exits 1. */
TG_TEST(test_cli_sweep_point_that_cannot_compile) {
    const char *dir = tg_test_tmpdir();
    char line[2048], path[1200];
    snprintf(line, sizeof line,
             "sweep examples/demo-classify.job --grid attention=fused,sideways --set batch=2 --set seq=16 --steps 1 "
             "--warmup 0 --threads 1 -o %s/out",
             dir);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 1, "exit %d: %s", r.status, r.err ? r.err : "");
    snprintf(path, sizeof path, "%s/out/results.jsonl", dir);
    json_t *points = read_jsonl(path);
    REQUIRE(points && json_array_size(points) == 2, "%s", path);
    json_t *ok = json_array_get(points, 0), *bad = json_array_get(points, 1);
    CHECK(!strcmp(json_string_value(json_object_get(ok, "status")), "ok") && number(ok, "rank") == 1, "the fused point");
    const char *reason = json_string_value(json_object_get(bad, "reason"));
    CHECK(!strcmp(json_string_value(json_object_get(bad, "status")), "failed") && reason &&
              strstr(reason, "--set attention=sideways: key 'attention'"),
          "failed point: %s", reason ? reason : "(no reason)");
    CHECK(r.out && strstr(r.out, "2 points (1 ran, 0 refused, 1 failed)") && strstr(r.out, "failed  --set attention=sideways"),
          "table: %s", r.out ? r.out : "");
    json_decref(points);
    tg_cli_run_free(&r);
}

TG_TEST(test_cli_sweep_refuses_bad_command_lines) {
    static const struct {
        const char *args, *want;
    } bad[] = {
        {"--grid batch", "tunegraph sweep: --grid 'batch': no '=' (want key=v1,v2,...)"},
        {"--grid batch=", "--grid 'batch=': no values after '='"},
        {"--grid batch=2,,4", "--grid 'batch=2,,4': value 2 is empty"},
        {"--grid batch=2,2", "value 2 repeats value 1 ('2')"},
        {"--grid Batch=2", "a job key is lower-case letters, digits and '_'"},
        {"--grid foo=1,2", "--grid foo=...: 'foo' is not a job key"},
        {"--grid steps=1,2", "--grid steps=...: the sweep sets the steps itself"},
        {"--grid batch=2 --grid batch=4", "--grid batch=...: key 'batch' is swept by an earlier --grid"},
        {"--grid batch=2 --set batch=4", "--grid batch=...: key 'batch' is also fixed by --set batch=4"},
        {"--grid batch=2 --set epochs=1", "--set epochs=1: the sweep sets the steps itself"},
        {"--grid batch=2 --set lr", "--set needs key=value, got 'lr'"},
        {"--grid batch=2 --weights speed=1", "--weights 'speed=1': unknown metric 'speed'"},
        {"--grid batch=2 --weights throughput=-1", "the weight of 'throughput' must be a number from 0 to 1e6, got '-1'"},
        {"--grid batch=2 --weights throughput=0", "every weight is 0"},
        {"--grid batch=2 --steps 0", "--steps needs a whole number from 1 to 1000000, got '0'"},
        {"--grid batch=2 --warmup x", "--warmup needs a whole number from 0 to 1000, got 'x'"},
        {"--grid batch=2 --device tpu", "--device must be cpu or cuda, got 'tpu'"},
        {"--grid batch=2 --threads", "--threads needs a whole number from 0 to 1024, got '-o'"},
        {"--grid batch=2 --bogus", "unknown option --bogus"},
        {"", "give at least one --grid key=v1,v2,..."},
    };
    const char *dir = tg_test_tmpdir();
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char line[1024], out[900];
        snprintf(out, sizeof out, "%s/out%zu", dir, k);
        snprintf(line, sizeof line, "sweep examples/demo-classify.job %s -o %s", bad[k].args, out);
        tg_cli_run r = tg_test_cli_line(dir, line, NULL);
        struct stat st;
        CHECK(r.status == 2 && r.err && strstr(r.err, bad[k].want) && strstr(r.err, "usage: tunegraph sweep JOB"),
              "'%s': exit %d: %s (want %s)", bad[k].args, r.status, r.err ? r.err : "", bad[k].want);
        CHECK(stat(out, &st) != 0, "'%s': the output folder was made", bad[k].args);
        tg_cli_run_free(&r);
    }
    /* No -o; a grid past SWEEP_POINTS_MAX points. */
    tg_cli_run r = tg_test_cli_line(dir, "sweep examples/demo-classify.job --grid batch=2,4", NULL);
    CHECK(r.status == 2 && strstr(r.err, "no output folder given (-o DIR)"), "exit %d: %s", r.status, r.err);
    tg_cli_run_free(&r);
    char line[1024];
    snprintf(line, sizeof line,
             "sweep examples/demo-classify.job --grid batch=1,2,3,4,5,6,7,8,9,10,11 --grid seq=1,2,3,4,5,6,7,8,9,10 "
             "--grid lr=1,2,3,4,5,6,7,8,9,10 -o %s/big",
             dir);
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 2 && strstr(r.err, "the grid has 1100 points, more than 1024"), "exit %d: %s", r.status, r.err);
    tg_cli_run_free(&r);
}
