/* Compiling each task's head and each precision (compiler/model_build.c, precision.c,
 * compile.c) with each allocation failing in turn: the masked-LM heads of BERT and RoBERTa,
 * GPT-2's padded tied head, QA spans, bf16 and fp16 copies, accumulation. Every failure
 * ends the compile with a message saying it ran out of memory, never a success or another
 * refusal, and nothing stays allocated (the sanitizer build's leak check). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "compiler/compile.h"
#include "compiler/job.h"
#include "tests/compile_faults.h"
#include "tests/harness.h"

/* A copy of preset `preset`'s config.json in folder `name` of the test's directory, with
 * each of the `n` (key, value) pairs' values replaced (the keys must be there). "" when it
 * cannot be written. */
static const char *preset_variant(const char *name, const char *preset, const char *const (*kv)[2], int n, char *dir,
                                  size_t len) {
    char path[600];
    snprintf(path, sizeof path, "models/presets/%s/config.json", preset);
    long size = 0;
    char *text = tg_test_read_file(path, &size);
    snprintf(dir, len, "%s/%s", tg_test_tmpdir(), name);
    for (int i = 0; text && i < n; i++) {
        char key[64];
        snprintf(key, sizeof key, "\"%s\": ", kv[i][0]);
        char *at = strstr(text, key);
        char *next = text;
        if (at) {
            char *value_end = at + strlen(key) + strcspn(at + strlen(key), ",\n}");
            const size_t head = (size_t)(at - text) + strlen(key);
            next = malloc(strlen(text) + strlen(kv[i][1]) + 1);
            if (next) snprintf(next, strlen(text) + strlen(kv[i][1]) + 1, "%.*s%s%s", (int)head, text, kv[i][1], value_end);
        }
        free(text);
        text = at ? next : NULL;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    const int bad = !text || (mkdir(dir, 0755) && errno != EEXIST) || tg_test_write_file(path, text);
    free(text);
    return bad ? "" : dir;
}

#define RUN "batch = 2\nseq = 8\nsteps = 1\ntrain_data = train.jsonl\n"

TG_TEST(test_compile_heads_each_allocation_fails) {
    tg_test_compile_each_allocation_fails("BERT mlm", "model = tiny-bert\ntask = mlm\n" RUN);
    tg_test_compile_each_allocation_fails("RoBERTa mlm", "model = tiny-roberta\ntask = mlm\n" RUN);
    tg_test_compile_each_allocation_fails("GPT-2 lm", "model = tiny-gpt2\ntask = lm\n" RUN);
    tg_test_compile_each_allocation_fails("GPT-2 classify", "model = tiny-gpt2\n" RUN);
    /* tiny-gpt2 with a vocabulary of 100, which the tied head pads to 128. */
    static const char *const vocab_100[][2] = {{"vocab_size", "100"}};
    char dir[512], job[1024];
    const char *model = preset_variant("gpt2-vocab-100", "tiny-gpt2", vocab_100, 1, dir, sizeof dir);
    REQUIRE(model[0], "cannot write a model folder in %s", dir);
    snprintf(job, sizeof job, "model = %s\ntask = lm\n" RUN, model);
    tg_test_compile_each_allocation_fails("GPT-2 lm, a padded head", job);
    tg_test_compile_each_allocation_fails("BERT qa", "model = tiny-bert\ntask = qa\n" RUN);
}

TG_TEST(test_compile_precisions_each_allocation_fails) {
    tg_test_compile_each_allocation_fails("bf16", "model = tiny-bert\nprecision = bf16\n" RUN);
    tg_test_compile_each_allocation_fails("fp16", "model = tiny-bert\nprecision = fp16\n" RUN);
    tg_test_compile_each_allocation_fails("bf16 frozen", "model = tiny-gpt2\ntask = lm\nprecision = bf16\nfreeze = transformer.wte.*\n" RUN);
    tg_test_compile_each_allocation_fails("accumulation", "model = tiny-bert\ngrad_accumulation = 2\n" RUN);
    tg_test_compile_each_allocation_fails("length buckets", "model = tiny-bert\nbatch = 2\nseq_buckets = 4, 8\nsteps = 1\n"
                                           "train_data = train.jsonl\n");
}

/* The tensor table grows at 256, 512, 1024 tensors. A BERT MLM of 14 layers without hidden
 * dropout makes its loss as tensor 512 (right after the logits), one of 30 layers without
 * any dropout its head's bias as tensor 1024 (after its transform), and a 16-layer BERT
 * classifier with five parameter sets frozen its gradient norm as tensor 1024 (the
 * optimizer's second scalar), a 19-layer BERT QA with three frozen its logits' gradient as
 * tensor 1024 (the span loss's backward): the growth failing there ends the compile naming
 * that point.
 * The allocations before and up to it fail in turn, each cleanly. */
TG_TEST(test_compile_head_tensor_table_growth_fails) {
    static const char *const layers_14[][2] = {{"hidden_dropout_prob", "0.0"}, {"num_hidden_layers", "14"}};
    static const char *const layers_30[][2] = {
        {"attention_probs_dropout_prob", "0.0"}, {"hidden_dropout_prob", "0.0"}, {"num_hidden_layers", "30"}};
    static const char *const layers_16[][2] = {{"num_hidden_layers", "16"}};
    static const char *const layers_19[][2] = {{"num_hidden_layers", "19"}};
    static const struct {
        const char *name;
        const char *const (*kv)[2];
        int n;
        const char *job, *want;
    } cases[] = {
        {"bert-mlm-14", layers_14, 2, "task = mlm\n", "' (at 512 tensors and 123 ops)"},
        {"bert-mlm-30", layers_30, 3, "task = mlm\n", "' (at 1024 tensors and 250 ops)"},
        {"bert-16", layers_16, 1,
         "freeze = bert.embeddings.token_type_embeddings.*, bert.embeddings.position_embeddings.*, bert.pooler.*, "
         "bert.encoder.layer.15.intermediate.*, bert.encoder.layer.15.output.dense.*\n",
         "' (at 1024 tensors and 343 ops)"},
        {"bert-qa-19", layers_19, 1,
         "task = qa\nfreeze = bert.embeddings.token_type_embeddings.*, bert.embeddings.position_embeddings.*, "
         "bert.encoder.layer.18.output.dense.bias\n",
         "' (at 1024 tensors and 162 ops)"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char dir[512], text[1024];
        const char *model = preset_variant(cases[c].name, "tiny-bert", cases[c].kv, cases[c].n, dir, sizeof dir);
        REQUIRE(model[0], "cannot write a model folder in %s", dir);
        snprintf(text, sizeof text, "model = %s\n%s" RUN, model, cases[c].job);
        tg_job job;
        tg_err err = {{0}};
        REQUIRE(tg_job_parse_text(text, "job.txt", "", NULL, 0, &job, &err) == 0, "%s: %s", model, err.msg);
        char want[700];
        snprintf(want, sizeof want, "out of memory compiling model '%s%s", model, cases[c].want);
        int found = 0, clean = 1;
        /* Up to a few allocations past the first that fails there: the growth is among them. */
        for (long k = 0, last = 1000; k < last; k++) {
            tg_plan plan;
            tg_alloc_fail_only(k);
            const int rc = tg_compile(&job, &plan, &err);
            tg_alloc_fail_after(-1);
            if (rc == 0) {
                tg_plan_free(&plan);
                break;
            }
            clean &= CHECK(strstr(err.msg, "out of memory") != NULL, "%s: allocation %ld: %s", model, k, err.msg);
            if (!found && !strcmp(err.msg, want)) found = 1, last = k + 4;
        }
        CHECK(found && clean, "%s: no allocation failed with '%s'", model, want);
    }
}
