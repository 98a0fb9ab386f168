/* What each tunegraph_export_options field does through the library (api/tunegraph.c passes
 * them to runtime/hf_export.c): bf16 stores the weights as BF16 (fp32 without it), force
 * replaces a folder that is not empty (refused without it), and n_labels up to INT32_MAX
 * reaches the export's own check. Also: a call that succeeds leaves the last error as it
 * was, and a plan file that names no job file says "the plan" where a refused key names the job. */
#include "include/tunegraph.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/front.h"
#include "plan/plan_file.h"
#include "tests/harness.h"

#define DEMO "examples/demo-classify.job"

static const char *const k_small[] = {"steps=1", "batch=4", "seq=16"};

/* The JSON header of a safetensors file (malloc'd), NULL if unreadable. */
static char *safetensors_header(const char *path, long *file_len) {
    long len = 0;
    char *bytes = tg_test_read_file(path, &len);
    if (!bytes || len < 8) return free(bytes), NULL;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | (unsigned char)bytes[i];
    if (n > (uint64_t)len - 8) return free(bytes), NULL;
    char *header = malloc(n + 1);
    if (header) memcpy(header, bytes + 8, n), header[n] = 0;
    free(bytes);
    *file_len = len;
    return header;
}

static int count_of(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

TG_TEST(test_api_export_bf16_and_force) {
    tunegraph_plan *plan = NULL;
    REQUIRE(tunegraph_compile_file(DEMO, k_small, 3, &plan) == 0, "%s", tunegraph_last_error());
    tunegraph_trainer_options topt = {sizeof topt, TUNEGRAPH_DEVICE_CPU, 1, 1};
    tunegraph_trainer *tr = NULL;
    REQUIRE(tunegraph_trainer_open(plan, &topt, &tr) == 0, "%s", tunegraph_last_error());
    tunegraph_plan_free(plan);
    const char *dir = tg_test_tmpdir();
    char out32[700], out16[700], file[800];
    snprintf(out32, sizeof out32, "%s/fp32", dir);
    snprintf(out16, sizeof out16, "%s/bf16", dir);
    tunegraph_export_options o = {.struct_size = sizeof o};
    REQUIRE(tunegraph_trainer_export_hf(tr, out32, &o) == 0, "%s", tunegraph_last_error());
    o.bf16 = 1;
    REQUIRE(tunegraph_trainer_export_hf(tr, out16, &o) == 0, "%s", tunegraph_last_error());
    long len32 = 0, len16 = 0;
    snprintf(file, sizeof file, "%s/model.safetensors", out32);
    char *h32 = safetensors_header(file, &len32);
    snprintf(file, sizeof file, "%s/model.safetensors", out16);
    char *h16 = safetensors_header(file, &len16);
    REQUIRE(h32 && h16, "safetensors headers");
    const int tensors = count_of(h32, "\"dtype\"");
    CHECK(tensors > 10 && count_of(h32, "\"F32\"") == tensors && !strstr(h32, "BF16"), "fp32 export: %d tensors, %d F32",
          tensors, count_of(h32, "\"F32\""));
    CHECK(count_of(h16, "\"BF16\"") == tensors && !strstr(h16, "\"F32\""), "bf16 export: %d BF16 of %d",
          count_of(h16, "\"BF16\""), tensors);
    /* Half the bytes of data, give or take the headers. */
    const long data32 = len32 - 8 - (long)strlen(h32), data16 = len16 - 8 - (long)strlen(h16);
    CHECK(data32 == 2 * data16, "data bytes: fp32 %ld, bf16 %ld", data32, data16);
    free(h32);
    free(h16);
    /* The folder is not empty now: refused without force, replaced with it. */
    o.bf16 = 0;
    char want[900];
    snprintf(want, sizeof want, "output folder %s: exists and is not empty (--force replaces it)", out16);
    CHECK(tunegraph_trainer_export_hf(tr, out16, &o) == -1 && strstr(tunegraph_last_error(), want),
          "no force: '%s'\n    want '%s'", tunegraph_last_error(), want);
    o.force = 1;
    CHECK(tunegraph_trainer_export_hf(tr, out16, &o) == 0, "force: %s", tunegraph_last_error());
    h16 = safetensors_header(file, &len16);
    CHECK(h16 && count_of(h16, "\"F32\"") == tensors, "the replaced folder holds fp32 weights");
    free(h16);
    /* n_labels of INT32_MAX passes the library's bounds; the export counts the names. */
    static const char *const names[] = {"neg", "pos"};
    snprintf(out32, sizeof out32, "%s/labels", dir);
    o = (tunegraph_export_options){.struct_size = sizeof o, .labels = names, .n_labels = INT32_MAX};
    CHECK(tunegraph_trainer_export_hf(tr, out32, &o) == -1 &&
              strstr(tunegraph_last_error(), "labels: 2147483647 names for a plan of num_labels 2"),
          "INT32_MAX names: '%s'", tunegraph_last_error());
    tunegraph_trainer_close(tr);
}

TG_TEST(test_api_success_keeps_the_last_error) {
    tunegraph_plan *plan = NULL;
    REQUIRE(tunegraph_compile_file(DEMO, k_small, 3, &plan) == 0, "%s", tunegraph_last_error());
    CHECK(tunegraph_plan_set(plan, "steps=many") == -1, "steps=many taken");
    char before[1100];
    snprintf(before, sizeof before, "%s", tunegraph_last_error());
    /* The smallest struct there is: its size field alone. */
    size_t only_size = sizeof(size_t);
    CHECK(tunegraph_plan_summarize(plan, (tunegraph_plan_summary *)&only_size) == 0, "%s", tunegraph_last_error());
    tunegraph_plan_summary s = {.struct_size = sizeof s};
    CHECK(tunegraph_plan_summarize(plan, &s) == 0 && tunegraph_plan_set(plan, "steps=2") == 0, "%s",
          tunegraph_last_error());
    CHECK(!strcmp(tunegraph_last_error(), before), "after calls that succeeded: '%s'\n    was '%s'",
          tunegraph_last_error(), before);
    tunegraph_plan_free(plan);
}

TG_TEST(test_api_plan_set_names_the_job_or_the_plan) {
    tunegraph_plan *compiled = NULL;
    REQUIRE(tunegraph_compile_file(DEMO, k_small, 3, &compiled) == 0, "%s", tunegraph_last_error());
    const char *named = "--set lr=1e-4: this key is compiled into examples/demo-classify.job; recompile the job";
    CHECK(tunegraph_plan_set(compiled, "lr=1e-4") == -1 && !strncmp(tunegraph_last_error(), named, strlen(named)),
          "'%s'\n    want '%s...'", tunegraph_last_error(), named);
    tunegraph_plan_free(compiled);
    tg_plan p;
    memset(&p, 0, sizeof p);
    tg_err err = {{0}};
    REQUIRE(tg_front_compile_file(DEMO, k_small, 3, &p, &err) == 0, "%s", err.msg);
    p.job_path[0] = 0;
    char path[700];
    snprintf(path, sizeof path, "%s/anonymous.tgp", tg_test_tmpdir());
    const int written = tg_plan_write(&p, path, &err);
    tg_plan_free(&p);
    REQUIRE(written == 0, "%s", err.msg);
    tunegraph_plan *plan = NULL;
    REQUIRE(tunegraph_plan_load(path, &plan) == 0, "%s", tunegraph_last_error());
    const char *want = "--set lr=1e-4: this key is compiled into the plan; recompile the job to change it";
    CHECK(tunegraph_plan_set(plan, "lr=1e-4") == -1 && !strncmp(tunegraph_last_error(), want, strlen(want)),
          "'%s'\n    want '%s...'", tunegraph_last_error(), want);
    tunegraph_plan_free(plan);
}
