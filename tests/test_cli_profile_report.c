/* `tunegraph run --profile` (cli/profile.c), in this process (tests/cli_in_process.h): the
 * times differ from run to run, so the test holds the report to what must hold between
 * its numbers: the op count is the plan's; the kernel groups, largest first, each the sum
 * of its kinds (in the metrics too); the kinds, each once, by time descending, their
 * counts adding up to the ops, their shares their part of the total; the phases adding up
 * to the total; the metrics file's line per kind and per op (every op, in order) agreeing
 * with stderr; the slowest ops, eight, each a distinct op by time descending, none slower
 * left out, named with its tensor (and a matmul's sizes) as the metrics file names it. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "include/tunegraph.h"
#include "plan/op_meta.h"
#include "plan/plan.h"
#include "tests/cli_in_process.h"
#include "tests/harness.h"

#define DEMO "examples/demo-classify.job"
#define MAX_OPS 256
#define MAX_KINDS 64

typedef struct op_line {
    char op[64], tensor[256];
    double ms;
    long long m, n, k, batch; /* -1: not a matmul */
} op_line;

typedef struct kind_line {
    char name[64];
    int count;
    double ms, share;
} kind_line;

/* A kernel group's total (count unused). */
typedef kind_line group_line;
static group_line g_metric_groups[TG_GROUP_COUNT];
static int g_n_metric_groups;

/* The metrics file's profile lines: per kind in *kinds (n_kinds), per op in ops by index
 * (n_ops lines, each index once and in order, else a failed CHECK). */
static int read_metrics(const char *path, kind_line *kinds, int *n_kinds, op_line *ops, int *n_ops) {
    char *text = tg_test_read_file(path, NULL);
    if (!CHECK(text, "%s missing", path)) return 0;
    *n_kinds = *n_ops = 0;
    g_n_metric_groups = 0;
    int ok = 1;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        if (!CHECK(o, "metrics line not JSON: %s", line)) {
            ok = 0;
            continue;
        }
        json_t *kind = json_object_get(o, "profile_op"), *index = json_object_get(o, "profile_op_index");
        json_t *group = json_object_get(o, "profile_group");
        if (group && g_n_metric_groups < TG_GROUP_COUNT) {
            group_line *g = &g_metric_groups[g_n_metric_groups++];
            snprintf(g->name, sizeof g->name, "%s", json_string_value(group));
            g->ms = json_real_value(json_object_get(o, "ms"));
            ok &= CHECK(json_object_size(o) == 2, "profile_group line: %s", line);
        }
        if (kind && *n_kinds < MAX_KINDS) {
            kind_line *k = &kinds[(*n_kinds)++];
            snprintf(k->name, sizeof k->name, "%s", json_string_value(kind));
            k->count = (int)json_integer_value(json_object_get(o, "count"));
            k->ms = json_real_value(json_object_get(o, "ms"));
            ok &= CHECK(json_object_size(o) == 3, "profile_op line: %s", line);
        }
        if (index && *n_ops < MAX_OPS) {
            ok &= CHECK(json_integer_value(index) == *n_ops, "op line %d has index %lld", *n_ops,
                        (long long)json_integer_value(index));
            op_line *p = &ops[(*n_ops)++];
            snprintf(p->op, sizeof p->op, "%s", json_string_value(json_object_get(o, "op")));
            snprintf(p->tensor, sizeof p->tensor, "%s", json_string_value(json_object_get(o, "tensor")));
            json_t *ms = json_object_get(o, "ms");
            p->ms = json_is_integer(ms) ? (double)json_integer_value(ms) : json_real_value(ms);
            const int matmul = !strcmp(p->op, "matmul");
            p->m = matmul ? json_integer_value(json_object_get(o, "M")) : -1;
            p->n = matmul ? json_integer_value(json_object_get(o, "N")) : -1;
            p->k = matmul ? json_integer_value(json_object_get(o, "K")) : -1;
            p->batch = matmul ? json_integer_value(json_object_get(o, "batch")) : -1;
            ok &= CHECK(json_object_size(o) == (matmul ? 14u : 4u) && (!matmul || p->m > 0),
                        "op line %d: %zu keys: %s", *n_ops - 1, json_object_size(o), line);
        }
        json_decref(o);
    }
    free(text);
    return ok;
}

/* The plan's op count, compiled as the run compiles it. */
static int64_t plan_ops(void) {
    const char *sets[] = {"steps=2", "batch=4", "seq=16"};
    tunegraph_plan *plan = NULL;
    tunegraph_plan_summary s = {.struct_size = sizeof s};
    const int ok = tunegraph_compile_file(DEMO, sets, 3, &plan) == 0 && tunegraph_plan_summarize(plan, &s) == 0;
    tunegraph_plan_free(plan);
    return CHECK(ok, "compile: %s", tunegraph_last_error()) ? s.ops : -1;
}

/* The profile on stderr checked against itself and, with metrics, against its lines. */
static void check_profile(const char *err, const op_line *ops, int n_metric_ops, const kind_line *mkinds,
                          int n_metric_kinds, int64_t n_plan_ops) {
    const char *at = strstr(err, "profile (ops launched one by one, mean of 5 steps): ");
    REQUIRE(at, "no profile: %s", err);
    double total = -1, captured = -1, median = -2, phase[3] = {-1, -1, -1};
    int n_ops = -1, used = 0;
    REQUIRE(sscanf(at, "profile (ops launched one by one, mean of 5 steps): %lf ms in %d ops; the captured step took "
                       "%lf ms\n  forward %lf ms, backward %lf ms, optimizer %lf ms%n",
                   &total, &n_ops, &captured, &phase[0], &phase[1], &phase[2], &used) == 6 && used > 0 && at[used] == '\n',
            "profile head: %.300s", at);
    CHECK(n_ops == n_plan_ops, "%d ops in the profile, the plan has %lld", n_ops, (long long)n_plan_ops);
    const char *median_at = strstr(err, "median step ");
    CHECK(median_at && sscanf(median_at, "median step %lf ms", &median) == 1 && fabs(median - captured) < 1e-9,
          "captured step %.3f ms, the run's median step %.3f ms", captured, median);
    CHECK(phase[0] > 0 && phase[1] > 0 && phase[2] > 0 && fabs(phase[0] + phase[1] + phase[2] - total) <= 0.0021,
          "phases %.3f + %.3f + %.3f, total %.3f", phase[0], phase[1], phase[2], total);
    at += used + 1;
    /* "  by kernel group: NAME X ms (S%), ...": largest first, shares of the total. */
    static const char by_group[] = "  by kernel group:";
    REQUIRE(!strncmp(at, by_group, sizeof by_group - 1), "no kernel groups: %.100s", at);
    const char *groups_end = strchr(at, '\n');
    REQUIRE(groups_end, "kernel groups unterminated");
    group_line groups[TG_GROUP_COUNT];
    int n_groups = 0;
    for (const char *item = at + sizeof by_group - 1; item < groups_end && n_groups < TG_GROUP_COUNT;) {
        const char *ms_at = strstr(item, " ms (");
        REQUIRE(ms_at && ms_at < groups_end, "group item: %.100s", item);
        const char *num = ms_at;
        while (num > item && num[-1] != ' ') num--;
        group_line *g = &groups[n_groups++];
        const int name_len = (int)(num - 1 - (item + 1));
        REQUIRE(name_len > 0 && name_len < 64 && sscanf(num, "%lf ms (%lf%%)", &g->ms, &g->share) == 2, "group item: %.100s",
                item);
        snprintf(g->name, sizeof g->name, "%.*s", name_len, item + 1);
        CHECK(n_groups == 1 || g->ms <= groups[n_groups - 2].ms, "group %s after a smaller one", g->name);
        CHECK(fabs(g->share - 100 * g->ms / total) <= 0.05 + 100 * 0.0011 / total, "group %s: share %.1f%%", g->name,
              g->share);
        const char *next = strchr(ms_at, ',');
        item = next && next < groups_end ? next + 1 : groups_end;
    }
    at = groups_end + 1;
    static const char head[] = "  op                 count         ms  share\n";
    REQUIRE(!strncmp(at, head, sizeof head - 1), "kinds' head: %.100s", at);
    at += sizeof head - 1;
    kind_line kinds[MAX_KINDS];
    int n_kinds = 0, counted = 0;
    double kinds_ms = 0;
    while (strncmp(at, "  slowest ops:\n", 15) && n_kinds < MAX_KINDS) {
        kind_line *k = &kinds[n_kinds];
        const char *end = strchr(at, '\n');
        REQUIRE(end && sscanf(at, "  %63s %d %lf %lf%%", k->name, &k->count, &k->ms, &k->share) == 4, "kind line: %.100s",
                at);
        char again[256];
        snprintf(again, sizeof again, "  %-18s %5d %10.3f %5.1f%%", k->name, k->count, k->ms, k->share);
        CHECK(strlen(again) == (size_t)(end - at) && !strncmp(again, at, (size_t)(end - at)), "kind line '%.*s'",
              (int)(end - at), at);
        CHECK(k->count > 0, "%s: count %d", k->name, k->count);
        const kind_line *before = n_kinds ? &kinds[n_kinds - 1] : NULL;
        CHECK(!before || k->ms <= before->ms, "%s (%.3f ms) after %s (%.3f ms)", k->name, k->ms, before ? before->name : "-",
              before ? before->ms : 0.0);
        CHECK(fabs(k->share - 100 * k->ms / total) <= 0.05 + 100 * 0.0011 / total, "%s: share %.1f%% of %.3f ms for %.3f ms",
              k->name, k->share, total, k->ms);
        for (int j = 0; j < n_kinds; j++) CHECK(strcmp(kinds[j].name, k->name), "%s twice", k->name);
        counted += k->count;
        kinds_ms += k->ms;
        n_kinds++;
        at = end + 1;
    }
    CHECK(counted == n_ops, "the kinds count %d ops of %d", counted, n_ops);
    /* Each group the sum of its kinds (each kind's group its ops.def row's). */
    int grouped = 0;
    for (int g = 0; g < n_groups; g++) {
        double ms = 0;
        int members = 0;
        for (int j = 0; j < n_kinds; j++) {
            const int kind = tg_op_kind_of_name(kinds[j].name);
            if (kind >= 0 && !strcmp(tg_op_group_name(tg_op_group_of(kind)), groups[g].name)) ms += kinds[j].ms, members++;
        }
        grouped += members;
        CHECK(members > 0 && fabs(ms - groups[g].ms) <= 0.0005 * (members + 1), "group %s: %.3f ms, its %d kinds %.3f",
              groups[g].name, groups[g].ms, members, ms);
    }
    CHECK(grouped == n_kinds, "%d of %d kinds in the groups", grouped, n_kinds);
    if (n_metric_ops) {
        CHECK(g_n_metric_groups == n_groups, "%d groups in the metrics, %d on stderr", g_n_metric_groups, n_groups);
        for (int g = 0; g < n_groups && g < g_n_metric_groups; g++)
            CHECK(!strcmp(g_metric_groups[g].name, groups[g].name) && fabs(g_metric_groups[g].ms - groups[g].ms) <= 0.00056,
                  "group %d: metrics %s %.4f, stderr %s %.3f", g, g_metric_groups[g].name, g_metric_groups[g].ms,
                  groups[g].name, groups[g].ms);
    }
    CHECK(fabs(kinds_ms - total) <= 0.0005 * (n_kinds + 1) + 1e-9, "the kinds take %.3f ms of %.3f", kinds_ms, total);
    REQUIRE(!strncmp(at, "  slowest ops:\n", 15), "no slowest ops: %.100s", at);
    at += 15;
    int listed[8], n_listed = 0;
    double last = INFINITY;
    while (!strncmp(at, "    ", 4) && n_listed < 9) {
        const char *end = strchr(at, '\n');
        int index = -1, name_at = 0;
        char op[64], tensor[256];
        double ms = -1;
        REQUIRE(end && sscanf(at, "    %d %63s %lf ms  %255s%n", &index, op, &ms, tensor, &name_at) == 4, "slow op: %.200s",
                at);
        CHECK(n_listed < 8, "more than 8 slowest ops");
        if (n_listed >= 8) break;
        CHECK(ms <= last, "op %d (%.3f ms) after one of %.3f ms", index, ms, last);
        last = ms;
        for (int j = 0; j < n_listed; j++) CHECK(listed[j] != index, "op %d listed twice", index);
        listed[n_listed++] = index;
        if (n_metric_ops) {
            REQUIRE(index >= 0 && index < n_metric_ops, "op index %d", index);
            const op_line *p = &ops[index];
            CHECK(!strcmp(op, p->op) && !strcmp(tensor, p->tensor) && fabs(ms - p->ms) <= 0.00056,
                  "slow op %d: %s %s %.3f ms, the metrics say %s %s %.4f", index, op, tensor, ms, p->op, p->tensor, p->ms);
            char sizes[200] = "";
            if (p->m >= 0) snprintf(sizes, sizeof sizes, "  M=%lld N=%lld K=%lld batch=%lld", p->m, p->n, p->k, p->batch);
            CHECK((size_t)(end - (at + name_at)) == strlen(sizes) && !strncmp(at + name_at, sizes, strlen(sizes)),
                  "slow op %d: '%.*s', want '%s'", index, (int)(end - (at + name_at)), at + name_at, sizes);
        }
        at = end + 1;
    }
    CHECK(n_listed == (n_ops < 8 ? n_ops : 8), "%d slowest ops listed", n_listed);
    if (!n_metric_ops) return;
    /* none left out is slower than the last listed */
    for (int o = 0; o < n_metric_ops; o++) {
        int in = 0;
        for (int j = 0; j < n_listed; j++) in |= listed[j] == o;
        CHECK(in || ops[o].ms <= last + 0.00056, "op %d (%.4f ms) left out of the slowest, the last of which took %.3f ms",
              o, ops[o].ms, last);
    }
    /* the metrics' kinds: the same, in the same order; each the sum of its ops */
    CHECK(n_metric_kinds == n_kinds, "%d kinds in the metrics, %d on stderr", n_metric_kinds, n_kinds);
    for (int j = 0; j < n_kinds && j < n_metric_kinds; j++) {
        CHECK(!strcmp(mkinds[j].name, kinds[j].name) && mkinds[j].count == kinds[j].count &&
                  fabs(mkinds[j].ms - kinds[j].ms) <= 0.00056,
              "kind %d: metrics %s %d %.4f, stderr %s %d %.3f", j, mkinds[j].name, mkinds[j].count, mkinds[j].ms,
              kinds[j].name, kinds[j].count, kinds[j].ms);
        int count = 0;
        double ms = 0;
        for (int o = 0; o < n_metric_ops; o++)
            if (!strcmp(ops[o].op, kinds[j].name)) count++, ms += ops[o].ms;
        CHECK(count == kinds[j].count && fabs(ms - mkinds[j].ms) <= 0.00005 * (count + 1) + 1e-9,
              "kind %s: %d ops of %.4f ms in the metrics, the kind line says %d of %.4f", kinds[j].name, count, ms,
              kinds[j].count, mkinds[j].ms);
    }
}

TG_TEST(test_cli_profile_report_and_metrics) {
    const char *dir = tg_test_tmpdir();
    const int64_t n_plan_ops = plan_ops();
    REQUIRE(n_plan_ops > 8, "plan ops %lld", (long long)n_plan_ops);
    char line[1024], path[800];
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    snprintf(line, sizeof line, "run " DEMO " --set steps=2 --set batch=4 --set seq=16 --metrics %s --profile", path);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0 && r.err, "%s: exit %d: %s", line, r.status, r.err ? r.err : "(nothing)");
    static op_line ops[MAX_OPS];
    kind_line kinds[MAX_KINDS];
    int n_ops = 0, n_kinds = 0;
    if (read_metrics(path, kinds, &n_kinds, ops, &n_ops)) {
        CHECK(n_ops == n_plan_ops, "%d op lines in the metrics, the plan has %lld ops", n_ops, (long long)n_plan_ops);
        check_profile(r.err, ops, n_ops, kinds, n_kinds, n_plan_ops);
    }
    tg_cli_run_free(&r);
    /* without a metrics file: the same report on stderr */
    snprintf(line, sizeof line, "run " DEMO " --set steps=2 --set batch=4 --set seq=16 --profile");
    r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0 && r.err, "%s: exit %d: %s", line, r.status, r.err ? r.err : "(nothing)");
    check_profile(r.err, NULL, 0, NULL, 0, n_plan_ops);
    tg_cli_run_free(&r);
}
