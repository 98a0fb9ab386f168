/* The cost model's calibration file (plan/cost_calibration.h): a round trip through text
 * and through a file, the cache's path, applying it to a device, and the refusals of
 * malformed files, each naming the file, line and field. */
#include <stdlib.h>
#include <string.h>

#include "plan/cost_calibration.h"
#include "tests/harness.h"

static tg_cost_calibration sample(void) {
    tg_cost_calibration c;
    memset(&c, 0, sizeof c);
    snprintf(c.device, sizeof c.device, "cpu");
    snprintf(c.name, sizeof c.name, "the CPU executor, 3 threads");
    c.precision = TG_PREC_FP32, c.threads = 3;
    c.peak_tflops = 0.0315, c.peak_gbps = 12.25, c.link_gbps = 12.25, c.launch_us = 2.125;
    for (int g = 0; g < TG_GROUP_COUNT; g++) c.eff_flops[g] = 0.1 * (g + 1) / 3, c.eff_bw[g] = 0.9 - 0.1 * g, c.samples[g] = 7 * g;
    c.matmul_gflop_half = 2.0 / 3;
    c.attention[0] = (tg_cost_attention){0.1 / 3, 0.2 / 3, 4641.58, 0.8, 72};
    c.attention[1] = (tg_cost_attention){0.56, 0.36, 1e5 / 3, 1, 4};
    c.graph_launch_us = 1.0 / 7, c.update_overlap = 0.95;
    return c;
}

static const char k_text[] = "tunegraph cost calibration 1\n"
                             "device = cpu\n"
                             "name = the CPU executor, 3 threads\n"
                             "precision = fp32\n"
                             "threads = 3\n"
                             "peak_tflops = 0.0315\n"
                             "peak_gbps = 12.25\n"
                             "link_gbps = 12.25\n"
                             "launch_us = 2.125\n"
                             "group.matmul = 0.5 0.75 10\n"
                             "group.attention = 0.25 0.5 2\n"
                             "group.norm = 0.125 0.625 30\n"
                             "group.embedding = 0.0625 0.25 4\n"
                             "group.loss = 0.5 0.5 1\n"
                             "group.optimizer = 0.25 0.875 3\n"
                             "group.memory = 0.5 0.75 5\n"
                             "group.comm = 1 0.5 0\n";

TG_TEST(test_cost_calibration_round_trip) {
    const tg_cost_calibration c = sample();
    char *text;
    size_t len;
    tg_err err = {{0}};
    REQUIRE(tg_cost_calibration_format(&c, &text, &len, &err) == 0, "%s", err.msg);
    tg_cost_calibration back;
    CHECK(tg_cost_calibration_parse(text, len, "mem", &back, &err) == 0 && !memcmp(&c, &back, sizeof c),
          "text round trip: %s\n%s", err.msg, text);
    free(text);
    /* The written file reads back the same. */
    char path[1024];
    snprintf(path, sizeof path, "%s/sub/dir/cal.txt", tg_test_tmpdir());
    REQUIRE(tg_cost_calibration_write(path, &c, &err) == 0, "%s", err.msg);
    CHECK(tg_cost_calibration_read(path, &back, &err) == 0 && !memcmp(&c, &back, sizeof c), "file round trip: %s",
          err.msg);
    /* The hand-written text: values exactly as written. */
    REQUIRE(tg_cost_calibration_parse(k_text, strlen(k_text), "k", &back, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(back.device, "cpu") && back.threads == 3 && back.peak_gbps == 12.25 && back.launch_us == 2.125 &&
              back.eff_flops[TG_GROUP_NORM] == 0.125 && back.eff_bw[TG_GROUP_OPTIMIZER] == 0.875 &&
              back.samples[TG_GROUP_NORM] == 30 && back.samples[TG_GROUP_COMM] == 0,
          "parsed values");
    /* Version 1 (no tail): both attention backends the group's factor, no shape terms, the
     * step's launch the op-by-op one, the update's hiding whole. */
    CHECK(back.matmul_gflop_half == 0 && back.attention[1].eff_forward == 0.25 && back.attention[0].eff_backward == 0.25 &&
              back.attention[1].work_half == 0 && back.attention[0].causal_factor == 1 && back.attention[1].samples == 2 &&
              back.graph_launch_us == 2.125 && back.update_overlap == 1,
          "version 1 defaults");
    /* Version 2: the tail's values exactly as written. */
    static const char tail[] = "matmul_gflop_half = 5.5\n"
                               "attention.own = 0.125 0.25 4096 0.75 72\n"
                               "attention.cudnn = 0.5 0.375 100000 1 4\n"
                               "graph_launch_us = 0.5\n"
                               "update_overlap = 0.25\n";
    char v2[sizeof k_text + sizeof tail];
    snprintf(v2, sizeof v2, "%s%s", k_text, tail);
    v2[strlen("tunegraph cost calibration ")] = '2';
    REQUIRE(tg_cost_calibration_parse(v2, strlen(v2), "v2", &back, &err) == 0, "%s", err.msg);
    CHECK(back.matmul_gflop_half == 5.5 && back.attention[0].eff_forward == 0.125 && back.attention[0].work_half == 4096 &&
              back.attention[0].causal_factor == 0.75 && back.attention[0].samples == 72 &&
              back.attention[1].eff_backward == 0.375 && back.graph_launch_us == 0.5 && back.update_overlap == 0.25,
          "version 2 values");
    tg_cost_device g;
    REQUIRE(tg_cost_device_builtin("h100", TG_PREC_BF16, 0, &g, &err) == 0, "%s", err.msg);
    snprintf(back.device, sizeof back.device, "h100");
    REQUIRE(tg_cost_device_apply(&g, &back, &err) == 0, "%s", err.msg);
    CHECK(g.matmul_flops_half == 5.5e9 && g.attention[1].eff_forward == 0.5 && g.graph_launch_s == 0.5e-6 &&
              g.update_overlap == 0.25,
          "version 2 applied");
    snprintf(back.device, sizeof back.device, "cpu");
    /* Applied to the CPU: factors, launch and the measured peaks; to a GPU: refused. */
    tg_cost_device d;
    REQUIRE(tg_cost_device_builtin("cpu", TG_PREC_FP32, 0, &d, &err) == 0, "%s", err.msg);
    REQUIRE(tg_cost_device_apply(&d, &back, &err) == 0, "%s", err.msg);
    CHECK(d.calibrated && d.peak_flops == 0.0315e12 && d.peak_bw == 12.25e9 && d.launch_s == 2.125e-6 &&
              d.eff_bw[TG_GROUP_OPTIMIZER] == 0.875 && d.threads == 3 && !strcmp(d.name, "the CPU executor, 3 threads"),
          "applied");
    REQUIRE(tg_cost_device_builtin("h100", TG_PREC_BF16, 0, &d, &err) == 0, "%s", err.msg);
    CHECK(tg_cost_device_apply(&d, &back, &err) == -1 && !strcmp(err.msg, "the calibration is for device 'cpu', not 'h100'"),
          "%s", err.msg);
    /* A GPU keeps its datasheet peaks. */
    snprintf(back.device, sizeof back.device, "h100");
    REQUIRE(tg_cost_device_apply(&d, &back, &err) == 0, "%s", err.msg);
    CHECK(d.peak_flops == 989.4e12 && d.eff_flops[TG_GROUP_MATMUL] == 0.5, "GPU peaks kept");
}

TG_TEST(test_cost_calibration_path) {
    char path[256];
    const char *old = getenv("TUNEGRAPH_CACHE_DIR");
    char *saved = old ? strdup(old) : NULL;
    setenv("TUNEGRAPH_CACHE_DIR", "/x/cache", 1);
    CHECK(tg_cost_calibration_path("h100", 0, path, sizeof path) == 0 && !strcmp(path, "/x/cache/cost-h100.txt"), "%s",
          path);
    CHECK(tg_cost_calibration_path("cpu", 4, path, sizeof path) == 0 && !strcmp(path, "/x/cache/cost-cpu-threads4.txt"),
          "%s", path);
    CHECK(tg_cost_calibration_path("cpu", 4, path, 10) == -1, "a path too long for the buffer");
    if (saved) setenv("TUNEGRAPH_CACHE_DIR", saved, 1);
    else unsetenv("TUNEGRAPH_CACHE_DIR");
    free(saved);
}

/* k_text with line `line` (1-based) replaced by `with` (NULL: removed). */
static char *edited(int line, const char *with) {
    char *out = calloc(1, sizeof k_text + 256);
    const char *s = k_text;
    for (int l = 1; *s; l++) {
        const char *nl = strchr(s, '\n');
        if (l == line) {
            if (with) strcat(out, with);
        } else strncat(out, s, (size_t)(nl - s + 1));
        s = nl + 1;
    }
    return out;
}

TG_TEST(test_cost_calibration_refusals) {
    static const struct {
        int line;
        const char *with, *want;
    } cases[] = {
        {1, "tunegraph cost calibration 3\n", "c.txt:1: not a cost calibration file (the first line must be 'tunegraph cost calibration 2')"},
        {2, "name = x\n", "c.txt:2: field 'device' expected here (the fields come in a fixed order), found 'name'"},
        {2, "device = CPU\n", "c.txt:2: field 'device': needs lowercase letters, digits and '-' ('CPU')"},
        {3, "name = \n", "c.txt:3: field 'name': needs 1 to 127 characters ('')"},
        {3, "name = a\tb\n", "c.txt:3: field 'name': needs printable ASCII"},
        {4, "precision = fp64\n", "c.txt:4: field 'precision': needs fp32, bf16 or fp16 ('fp64')"},
        {5, "threads = 03\n", "c.txt:5: field 'threads': needs a whole number 0 to 1024 ('03')"},
        {5, "threads = 2000\n", "c.txt:5: field 'threads': needs a whole number 0 to 1024 ('2000')"},
        {6, "peak_tflops = 0\n", "c.txt:6: field 'peak_tflops': needs a number above 0, at most 1e6 ('0')"},
        {7, "peak_gbps = abc\n", "c.txt:7: field 'peak_gbps': needs a number above 0, at most 1e6 ('abc')"},
        {8, "link_gbps = nan\n", "c.txt:8: field 'link_gbps': needs a number above 0, at most 1e6 ('nan')"},
        {9, "launch_us = -1\n", "c.txt:9: field 'launch_us': needs a number from 0 to 1e6 ('-1')"},
        {9, "launch_us=2\n", "c.txt:9: field 'launch_us' expected here (the fields come in a fixed order), found 'launch_us'"},
        {10, "group.matmul = 0.5 0.75\n", "c.txt:10: field 'group.matmul': needs three values: eff_flops eff_bw samples ('0.5 0.75')"},
        {11, "group.attention = 0 0.5 2\n", "c.txt:11: field 'group.attention': eff_flops needs a number above 0, at most 100"},
        {12, "group.norm = 0.5 101 2\n", "c.txt:12: field 'group.norm': eff_bw needs a number above 0, at most 100"},
        {13, "group.embedding = 0.5 0.5 -1\n", "c.txt:13: field 'group.embedding': samples needs a whole number 0 to 1e9"},
        {14, "group.loss = 0.5 0.5 1 \n", "c.txt:14: field 'group.loss': needs three values"},
        {17, NULL, "c.txt:17: the file ends here; more fields expected"},
        {17, "group.comm = 1 0.5 0\nmore = 1\n", "c.txt:18: text after the last field"},
        {17, "group.comm = 1 0.5 0", "c.txt:17: the line has no newline at its end"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char *text = edited(cases[k].line, cases[k].with);
        tg_cost_calibration c;
        tg_err err = {{0}};
        CHECK(tg_cost_calibration_parse(text, strlen(text), "c.txt", &c, &err) == -1 &&
                  !strncmp(err.msg, cases[k].want, strlen(cases[k].want)),
              "case %zu: '%s'\n      want '%s'", k, err.msg, cases[k].want);
        free(text);
    }
    /* Version 2's tail, each field refused with its file, line and field. */
    static const struct {
        const char *tail, *want;
    } tails[] = {
        {"", "v.txt:18: the file ends here; more fields expected"},
        {"matmul_gflop_half = -1\n", "v.txt:18: field 'matmul_gflop_half': needs a number from 0 to 1e6 ('-1')"},
        {"matmul_gflop_half = 1\nattention.own = 0.1 0.1 0 1\n",
         "v.txt:19: field 'attention.own': needs five values: eff_forward eff_backward work_half causal_factor samples"},
        {"matmul_gflop_half = 1\nattention.own = 0.1 0.1 0 1 2 3\n", "v.txt:19: field 'attention.own': needs five values"},
        {"matmul_gflop_half = 1\nattention.own = 0 0.1 0 1 2\n",
         "v.txt:19: field 'attention.own': eff_forward needs a number above 0, at most 100"},
        {"matmul_gflop_half = 1\nattention.own = 0.1 x 0 1 2\n",
         "v.txt:19: field 'attention.own': eff_backward needs a number above 0, at most 100"},
        {"matmul_gflop_half = 1\nattention.own = 0.1 0.1 -5 1 2\n",
         "v.txt:19: field 'attention.own': work_half needs a number from 0 to 1e12"},
        {"matmul_gflop_half = 1\nattention.own = 0.1 0.1 0 0 2\n",
         "v.txt:19: field 'attention.own': causal_factor needs a number above 0, at most 100"},
        {"matmul_gflop_half = 1\nattention.own = 0.1 0.1 0 1 02\n",
         "v.txt:19: field 'attention.own': samples needs a whole number 0 to 1e9"},
        {"matmul_gflop_half = 1\nattention.own = 0.1 0.1 0 1 2\nattention.cuda = 0.1 0.1 0 1 2\n",
         "v.txt:20: field 'attention.cudnn' expected here"},
        {"matmul_gflop_half = 1\nattention.own = 0.1 0.1 0 1 2\nattention.cudnn = 0.1 0.1 0 1 2\ngraph_launch_us = x\n",
         "v.txt:21: field 'graph_launch_us': needs a number from 0 to 1e6 ('x')"},
        {"matmul_gflop_half = 1\nattention.own = 0.1 0.1 0 1 2\nattention.cudnn = 0.1 0.1 0 1 2\ngraph_launch_us = 1\n"
         "update_overlap = 1.5\n",
         "v.txt:22: field 'update_overlap': needs a number from 0 to 1 ('1.5')"},
        {"matmul_gflop_half = 1\nattention.own = 0.1 0.1 0 1 2\nattention.cudnn = 0.1 0.1 0 1 2\ngraph_launch_us = 1\n"
         "update_overlap = 1\nmore = 1\n",
         "v.txt:23: text after the last field"},
    };
    for (size_t k = 0; k < sizeof tails / sizeof tails[0]; k++) {
        char text[2048];
        snprintf(text, sizeof text, "%s%s", k_text, tails[k].tail);
        text[strlen("tunegraph cost calibration ")] = '2';
        tg_cost_calibration c;
        tg_err err = {{0}};
        CHECK(tg_cost_calibration_parse(text, strlen(text), "v.txt", &c, &err) == -1 &&
                  !strncmp(err.msg, tails[k].want, strlen(tails[k].want)),
              "tail %zu: '%s'\n      want '%s'", k, err.msg, tails[k].want);
    }
    tg_cost_calibration c;
    tg_err err = {{0}};
    CHECK(tg_cost_calibration_parse("", 0, "e.txt", &c, &err) == -1 &&
              !strcmp(err.msg, "e.txt:1: the file ends here; the header 'tunegraph cost calibration 2' expected"),
          "empty: %s", err.msg);
    char path[1024];
    snprintf(path, sizeof path, "%s/missing.txt", tg_test_tmpdir());
    CHECK(tg_cost_calibration_read(path, &c, &err) == -1 && strstr(err.msg, "missing.txt"), "missing: %s", err.msg);
}
