/* `tunegraph sweep`'s --grid and --weights parsers and its weighted score and ranking
 * (cli/sweep_spec.c): what each accepts, each refusal's message, and the score's formula
 * on numbers worked out by hand. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/sweep_spec.h"
#include "tests/harness.h"

TG_TEST(test_cli_sweep_grid_parse_accepts) {
    sweep_axis axis;
    tg_err err = {{0}};
    REQUIRE(sweep_grid_parse("batch=8,16,32", &axis, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(axis.key, "batch") && axis.n_values == 3 && !strcmp(axis.values[0], "8") &&
              !strcmp(axis.values[1], "16") && !strcmp(axis.values[2], "32"),
          "key %s, %d values", axis.key, axis.n_values);
    sweep_axis_free(&axis);
    /* '|' separates values that hold commas. */
    REQUIRE(sweep_grid_parse("seq_buckets=16,32|32,64", &axis, &err) == 0, "%s", err.msg);
    CHECK(axis.n_values == 2 && !strcmp(axis.values[0], "16,32") && !strcmp(axis.values[1], "32,64"), "%d values",
          axis.n_values);
    sweep_axis_free(&axis);
    REQUIRE(sweep_grid_parse("precision=bf16", &axis, &err) == 0, "%s", err.msg);
    CHECK(axis.n_values == 1 && !strcmp(axis.values[0], "bf16"), "one value");
    sweep_axis_free(&axis);
    /* SWEEP_VALUES_MAX values pass, one more does not. */
    char spec[1024];
    int used = snprintf(spec, sizeof spec, "batch=");
    for (int v = 1; v <= SWEEP_VALUES_MAX; v++) used += snprintf(spec + used, sizeof spec - (size_t)used, "%s%d", v > 1 ? "," : "", v);
    REQUIRE(sweep_grid_parse(spec, &axis, &err) == 0, "%s", err.msg);
    CHECK(axis.n_values == SWEEP_VALUES_MAX, "%d values", axis.n_values);
    sweep_axis_free(&axis);
    snprintf(spec + used, sizeof spec - (size_t)used, ",%d", SWEEP_VALUES_MAX + 1);
    CHECK(sweep_grid_parse(spec, &axis, &err) == -1 && strstr(err.msg, "more than 64 values"), "%s", err.msg);
}

TG_TEST(test_cli_sweep_grid_parse_refusals) {
    static const struct {
        const char *spec, *want;
    } bad[] = {
        {"batch", "--grid 'batch': no '=' (want key=v1,v2,...)"},
        {"=1,2", "--grid '=1,2': no key before '='"},
        {"batch=", "--grid 'batch=': no values after '='"},
        {"batch=2,,4", "--grid 'batch=2,,4': value 2 is empty"},
        {"batch=2,4,", "--grid 'batch=2,4,': value 3 is empty"},
        {"batch=2,2", "--grid 'batch=2,2': value 2 repeats value 1 ('2')"},
        {"Batch=2", "--grid 'Batch=2': a job key is lower-case letters, digits and '_'"},
        {"bat ch=2", "a job key is lower-case letters, digits and '_'"},
        {"batch=2,\t4", "--grid 'batch=2,\t4': value 2 holds a control character"},
        {"seq_buckets=16,32|", "value 2 is empty"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        sweep_axis axis;
        tg_err err = {{0}};
        CHECK(sweep_grid_parse(bad[k].spec, &axis, &err) == -1 && strstr(err.msg, bad[k].want) && axis.n_values == 0,
              "'%s': %s (want %s)", bad[k].spec, err.msg, bad[k].want);
    }
    char spec[600];
    snprintf(spec, sizeof spec, "batch=2,%0300d", 1);
    sweep_axis axis;
    tg_err err = {{0}};
    CHECK(sweep_grid_parse(spec, &axis, &err) == -1 && strstr(err.msg, "value 2 is longer than 255 bytes"), "%s", err.msg);
    snprintf(spec, sizeof spec, "%064d=1", 0);
    CHECK(sweep_grid_parse(spec, &axis, &err) == -1 && strstr(err.msg, "the key is longer than 63 bytes"), "%s", err.msg);
}

TG_TEST(test_cli_sweep_weights_parse) {
    sweep_weights w;
    sweep_weights_default(&w);
    CHECK(w.w[SWEEP_THROUGHPUT] == 1 && w.w[SWEEP_MEMORY] == 1 && w.w[SWEEP_ENERGY] == 1 && w.w[SWEEP_COST] == 1,
          "the default weights are all 1");
    tg_err err = {{0}};
    REQUIRE(sweep_weights_parse("memory=0.5,throughput=2", &w, &err) == 0, "%s", err.msg);
    CHECK(w.w[SWEEP_THROUGHPUT] == 2 && w.w[SWEEP_MEMORY] == 0.5 && w.w[SWEEP_ENERGY] == 0 && w.w[SWEEP_COST] == 0,
          "weights %g %g %g %g: the names not given weigh 0", w.w[0], w.w[1], w.w[2], w.w[3]);
    static const struct {
        const char *spec, *want;
    } bad[] = {
        {"", "--weights '': empty"},
        {"speed=1", "--weights 'speed=1': unknown metric 'speed' (throughput, memory, energy or cost)"},
        {"throughput", "--weights 'throughput': 'throughput' is not name=W"},
        {"throughput=-1", "the weight of 'throughput' must be a number from 0 to 1e6, got '-1'"},
        {"memory=abc", "the weight of 'memory' must be a number from 0 to 1e6, got 'abc'"},
        {"memory=", "the weight of 'memory' must be a number from 0 to 1e6, got ''"},
        {"energy=nan", "got 'nan'"},
        {"cost=2e6", "got '2e6'"},
        {"throughput=1,throughput=2", "'throughput' given twice"},
        {"throughput=1,", "nothing after the last ','"},
        {"throughput=0,memory=0", "every weight is 0"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        sweep_weights before = {{3, 3, 3, 3}}, got = before;
        CHECK(sweep_weights_parse(bad[k].spec, &got, &err) == -1 && strstr(err.msg, bad[k].want) &&
                  !memcmp(&got, &before, sizeof got),
              "'%s': %s (want %s)", bad[k].spec, err.msg, bad[k].want);
    }
}

/* Three ok points and a refused one: tokens/s 100, 200, 50; planned peaks 10, 20, 5. With
 * weights 1 and 1: point 0 (100/200 + 5/10) / 2 = 0.5, point 1 (1 + 0.25) / 2 = 0.625,
 * point 2 (0.25 + 1) / 2 = 0.625. Energy is on one point only, so it drops out. */
TG_TEST(test_cli_sweep_score_and_rank) {
    const double metric[4][SWEEP_METRICS] = {
        {100, 10, NAN, NAN}, {200, 20, 3, NAN}, {50, 5, NAN, NAN}, {NAN, 1, NAN, NAN}};
    const int ok[4] = {1, 1, 1, 0};
    sweep_weights w;
    sweep_weights_default(&w);
    double score[4];
    int used[SWEEP_METRICS], order[4], rank[4];
    sweep_score(metric, ok, 4, &w, score, used);
    CHECK(used[SWEEP_THROUGHPUT] && used[SWEEP_MEMORY] && !used[SWEEP_ENERGY] && !used[SWEEP_COST], "used %d %d %d %d",
          used[0], used[1], used[2], used[3]);
    CHECK(fabs(score[0] - 0.5) < 1e-12 && fabs(score[1] - 0.625) < 1e-12 && fabs(score[2] - 0.625) < 1e-12 &&
              isnan(score[3]),
          "scores %g %g %g %g", score[0], score[1], score[2], score[3]);
    CHECK(sweep_rank(score, ok, 4, order, rank) == 3, "three ok points");
    /* The tie keeps point order; the refused point comes last, unranked. */
    CHECK(order[0] == 1 && order[1] == 2 && order[2] == 0 && order[3] == 3, "order %d %d %d %d", order[0], order[1],
          order[2], order[3]);
    CHECK(rank[1] == 1 && rank[2] == 2 && rank[0] == 3 && rank[3] == 0, "ranks %d %d %d %d", rank[0], rank[1], rank[2],
          rank[3]);
    /* Throughput alone: the ranking follows tokens/s, normalised to the best. */
    w = (sweep_weights){{1, 0, 0, 0}};
    sweep_score(metric, ok, 4, &w, score, used);
    CHECK(score[0] == 0.5 && score[1] == 1 && score[2] == 0.25 && !used[SWEEP_MEMORY], "scores %g %g %g", score[0],
          score[1], score[2]);
    /* Only energy weighs, and not every ok point has it: no score, the ok points in point order. */
    w = (sweep_weights){{0, 0, 1, 0}};
    sweep_score(metric, ok, 4, &w, score, used);
    CHECK(isnan(score[0]) && isnan(score[1]) && isnan(score[2]) && !used[SWEEP_ENERGY], "scores without a metric");
    CHECK(sweep_rank(score, ok, 4, order, rank) == 3 && order[0] == 0 && order[1] == 1 && order[2] == 2 && rank[2] == 3,
          "unscored order %d %d %d", order[0], order[1], order[2]);
    CHECK(!strcmp(sweep_metric_name(SWEEP_COST), "cost") && !strcmp(sweep_metric_name(9), "?"), "metric names");
}
