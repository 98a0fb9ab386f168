/* Structs from a program built against an older header (include/tunegraph.h): a caller's
 * struct_size that stops before fields this library knows leaves those fields 0, their
 * defaults, whatever the bytes past the caller's struct hold; a struct as large as the
 * library's is read whole. */
#include "include/tunegraph.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/safetensors.h"
#include "tests/harness.h"

#define DEMO "examples/demo-classify.job"

static tunegraph_plan *one_step_plan(void) {
    const char *sets[] = {"steps=1", "batch=4", "seq=16"};
    tunegraph_plan *plan = NULL;
    if (tunegraph_compile_file(DEMO, sets, 3, &plan)) {
        CHECK(0, "compile: %s", tunegraph_last_error());
        return NULL;
    }
    return plan;
}

/* A struct the caller allocates, its bytes past `size` all 0xA5 (what an older program's
 * neighbouring memory may hold). */
typedef union older_trainer_options {
    tunegraph_trainer_options o;
    unsigned char bytes[sizeof(tunegraph_trainer_options)];
} older_trainer_options;

TG_TEST(test_api_older_trainer_options) {
    tunegraph_plan *plan = one_step_plan();
    REQUIRE(plan, "no plan");
    /* struct_size alone; then device and threads (no max_in_flight); then the whole struct */
    static const size_t sizes[] = {sizeof(size_t), offsetof(tunegraph_trainer_options, max_in_flight),
                                   sizeof(tunegraph_trainer_options)};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        older_trainer_options u;
        memset(u.bytes, 0xA5, sizeof u.bytes);
        u.o.struct_size = sizes[k];
        if (sizes[k] > offsetof(tunegraph_trainer_options, device)) u.o.device = TUNEGRAPH_DEVICE_CPU;
        if (sizes[k] > offsetof(tunegraph_trainer_options, threads)) u.o.threads = 1;
        if (sizes[k] > offsetof(tunegraph_trainer_options, max_in_flight)) u.o.max_in_flight = 2;
        tunegraph_trainer *tr = NULL;
        const int rc = tunegraph_trainer_open(plan, &u.o, &tr);
        CHECK(rc == 0 && tr, "struct_size %zu: open returned %d: %s", sizes[k], rc, tunegraph_last_error());
        int64_t total = 0;
        if (tr) CHECK(tunegraph_trainer_total_steps(tr, &total) == 0 && total == 1, "total steps %lld", (long long)total);
        tunegraph_step_metrics m = {.struct_size = sizeof m};
        if (tr) CHECK(tunegraph_trainer_step(tr, &m) == 0 && m.step == 1, "step: %s", tunegraph_last_error());
        tunegraph_trainer_close(tr);
        /* the caller's struct is read, never written (its last bytes: unread or padding) */
        CHECK(u.o.struct_size == sizes[k] && u.bytes[sizeof u.bytes - 1] == 0xA5,
              "struct_size %zu: the caller's struct changed", sizes[k]);
    }
    /* The whole struct with a field set past what the caller's size covers: not read. */
    older_trainer_options u;
    memset(u.bytes, 0, sizeof u.bytes);
    u.o.struct_size = offsetof(tunegraph_trainer_options, threads);
    u.o.device = TUNEGRAPH_DEVICE_CPU;
    u.o.threads = -5;
    tunegraph_trainer *tr = NULL;
    CHECK(tunegraph_trainer_open(plan, &u.o, &tr) == 0, "threads past struct_size read: %s", tunegraph_last_error());
    tunegraph_trainer_close(tr);
    /* The same field inside the caller's size: refused. */
    u.o.struct_size = sizeof u.o;
    tr = NULL;
    CHECK(tunegraph_trainer_open(plan, &u.o, &tr) == -1 && !tr &&
              !strcmp(tunegraph_last_error(), "tunegraph_trainer_options.threads: -5 is negative (0: one per core)"),
          "threads -5 within struct_size: %s", tunegraph_last_error());
    /* A newer header's struct: bytes past the library's read as 0 are taken; the first one
     * set is named, with the library's version and size. */
    struct {
        tunegraph_trainer_options o;
        unsigned char newer[16];
    } big;
    memset(&big, 0, sizeof big);
    big.o.struct_size = sizeof big;
    big.o.device = TUNEGRAPH_DEVICE_CPU;
    big.o.threads = 1;
    tr = NULL;
    CHECK(tunegraph_trainer_open(plan, &big.o, &tr) == 0 && tr, "a newer struct of zeros: %s", tunegraph_last_error());
    tunegraph_trainer_close(tr);
    for (size_t at = 0; at < sizeof big.newer; at += 5) {
        memset(big.newer, 0, sizeof big.newer);
        big.newer[at] = 1;
        big.newer[sizeof big.newer - 1] = 2; /* a later one: the first is named */
        char want[300];
        snprintf(want, sizeof want,
                 "tunegraph_trainer_options: byte %zu is set, but this library (%s) knows %zu bytes of the struct",
                 sizeof big.o + at, tunegraph_version(), sizeof big.o);
        tr = NULL;
        CHECK(tunegraph_trainer_open(plan, &big.o, &tr) == -1 && !tr && !strcmp(tunegraph_last_error(), want),
              "byte %zu set: '%s', want '%s'", sizeof big.o + at, tunegraph_last_error(), want);
    }
    /* a struct_size smaller than the size field itself */
    u.o.struct_size = sizeof(size_t) - 1;
    tr = NULL;
    char want[200];
    snprintf(want, sizeof want, "tunegraph_trainer_options.struct_size is %zu: set it to sizeof(tunegraph_trainer_options)",
             sizeof(size_t) - 1);
    CHECK(tunegraph_trainer_open(plan, &u.o, &tr) == -1 && !tr && !strcmp(tunegraph_last_error(), want),
          "struct_size %zu: %s", sizeof(size_t) - 1, tunegraph_last_error());
    tunegraph_plan_free(plan);
}

/* An export with options whose struct_size ends before bf16 (and before force): the weights
 * in fp32, and a folder that is not empty refused, as with bf16 and force 0. */
TG_TEST(test_api_older_export_options) {
    tunegraph_plan *plan = one_step_plan();
    REQUIRE(plan, "no plan");
    tunegraph_trainer_options to = {sizeof to, TUNEGRAPH_DEVICE_CPU, 1, 1};
    tunegraph_trainer *tr = NULL;
    const int opened = tunegraph_trainer_open(plan, &to, &tr);
    tunegraph_plan_free(plan);
    REQUIRE(opened == 0 && tr, "open: %s", tunegraph_last_error());
    const char *dir = tg_test_tmpdir();
    static const char *const names[] = {"neg", "pos"};
    union {
        tunegraph_export_options o;
        unsigned char bytes[sizeof(tunegraph_export_options)];
    } u;
    memset(u.bytes, 0xA5, sizeof u.bytes);
    u.o.struct_size = offsetof(tunegraph_export_options, bf16);
    u.o.tokenizer = NULL;
    u.o.labels = names;
    u.o.n_labels = 2;
    u.o.force = 0;
    char out[800], path[900];
    snprintf(out, sizeof out, "%s/hf", dir);
    REQUIRE(tunegraph_trainer_export_hf(tr, out, &u.o) == 0, "export: %s", tunegraph_last_error());
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    tg_safetensors st;
    tg_err err;
    if (CHECK(tg_st_open(path, &st, &err) == 0, "%s", err.msg)) {
        const tg_st_entry *e = tg_st_find(&st, "classifier.weight");
        CHECK(e && e->dtype == TG_ST_F32 && st.n == 41, "dtype %s, %d tensors (want F32, 41)",
              e ? tg_st_dtype_name(e->dtype) : "-", st.n);
        tg_st_close(&st);
    }
    snprintf(path, sizeof path, "%s/config.json", out);
    char *config = tg_test_read_file(path, NULL);
    CHECK(config && strstr(config, "\"neg\"") && strstr(config, "\"pos\""), "config.json: %s", config ? config : "(none)");
    free(config);
    /* force past the caller's size: 0, so the folder (now not empty) is refused */
    u.o.struct_size = offsetof(tunegraph_export_options, force);
    CHECK(tunegraph_trainer_export_hf(tr, out, &u.o) == -1 && strstr(tunegraph_last_error(), out),
          "a second export into %s: %s", out, tunegraph_last_error());
    /* labels past the caller's size: NULL with n_labels 0, so the defaults */
    u.o.struct_size = offsetof(tunegraph_export_options, labels);
    snprintf(out, sizeof out, "%s/hf-default", dir);
    CHECK(tunegraph_trainer_export_hf(tr, out, &u.o) == 0, "export: %s", tunegraph_last_error());
    snprintf(path, sizeof path, "%s/config.json", out);
    config = tg_test_read_file(path, NULL);
    CHECK(config && strstr(config, "\"LABEL_0\"") && strstr(config, "\"LABEL_1\""), "config.json: %s",
          config ? config : "(none)");
    free(config);
    tunegraph_trainer_close(tr);
}
