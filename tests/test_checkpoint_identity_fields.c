/* The run identity a checkpoint records (runtime/checkpoint.c, tg_checkpoint_identify): every
 * field, in order, with its exact text, for the tiny BERT classifier; the hashes as 16 hex
 * digits (the plan's fingerprint and structure, the training data's xxh64), the path as
 * given when it does not resolve. A resume compares these strings, so their formatting is
 * part of the file format. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <inttypes.h>
#define XXH_INLINE_ALL /* header-only, as runtime/checkpoint.c */
#include <xxhash.h>

#include "base/version.h"
#include "compiler/compile.h"
#include "compiler/job.h"
#include "plan/plan_file.h"
#include "runtime/checkpoint.h"
#include "tests/harness.h"

TG_TEST(test_checkpoint_identity_fields_exact) {
    tg_plan plan;
    REQUIRE(tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, &plan), "compile");
    snprintf(plan.run.train_data, sizeof plan.run.train_data, "no/such/train.jsonl");
    plan.fingerprint = 0x00000000000abcdeull; /* leading zeros: the field keeps all 16 digits */
    plan.run.seed = 18446744073709551615ull;
    const tg_checkpoint_run run = {.total_steps = 7, .train_examples = 11, .train_hash = 0x0123456789abcdefull};
    tg_checkpoint ck;
    tg_checkpoint_init(&ck);
    tg_err err = {{0}};
    REQUIRE(tg_checkpoint_identify(&ck, &plan, &run, &err) == 0, "%s", err.msg);
    char all[8192];
    size_t n = 0;
    for (int i = 0; i < ck.n_fields && n < sizeof all; i++)
        n += (size_t)snprintf(all + n, sizeof all - n, "%s=%s\n", ck.fields[i].key, ck.fields[i].value);
    /* The structure hash covers the plan's tables: it is checked for its form here and for
     * what it covers by the resume tests. */
    const char *structure = tg_checkpoint_field_value(&ck, "plan.structure");
    CHECK(structure && strlen(structure) == 16 && strspn(structure, "0123456789abcdef") == 16, "plan.structure '%s'",
          structure ? structure : "(none)");
    char want[8192];
    snprintf(want, sizeof want,
             "tunegraph=" TG_VERSION_STRING "\n"
             "model=tiny-bert\n"
             "model.arch=bert\n"
             "model.vocab_size=128\n"
             "model.hidden=32\n"
             "model.layers=2\n"
             "model.heads=4\n"
             "model.intermediate=64\n"
             "model.max_positions=64\n"
             "model.type_vocab_size=2\n"
             "model.gelu=0\n"
             "model.layer_norm_eps=9.99999996e-13\n"
             "model.dropout=hidden 0.100000001, attention 0.100000001, embedding 0.100000001, classifier 0.100000001\n"
             "task=classify\n"
             "num_labels=2\n"
             "batch=2\n"
             "seq=16\n"
             "pad_id=0\n"
             "precision=fp32\n"
             "allow_tf32=0\n"
             "data_parallel=1\n"
             "zero_stage=0\n"
             "attention=fused\n"
             "lr=4.99999987e-05\n"
             "warmup_steps=0\n"
             "lr_schedule=linear\n"
             "optimizer=adamw\n"
             "beta1=0.899999976\n"
             "beta2=0.999000013\n"
             "eps=9.99999994e-09\n"
             "weight_decay=0.00999999978\n"
             "grad_clip=1\n"
             "seed=18446744073709551615\n"
             "total_steps=7\n"
             "train_data=no/such/train.jsonl\n"
             "train_data.examples=11\n"
             "train_data.xxh64=0123456789abcdef\n"
             "plan.structure=%s\n"
             "plan.fingerprint=00000000000abcde\n",
             structure ? structure : "");
    CHECK(!strcmp(all, want), "fields\n%s\nwant\n%s", all, want);
    tg_checkpoint_free(&ck);

    /* A training data path that resolves is recorded resolved. */
    snprintf(plan.run.train_data, sizeof plan.run.train_data, "examples/../examples/data/sentiment-train.jsonl");
    char cwd[PATH_MAX], resolved[PATH_MAX + 64];
    REQUIRE(getcwd(cwd, sizeof cwd), "getcwd");
    snprintf(resolved, sizeof resolved, "%s/examples/data/sentiment-train.jsonl", cwd);
    tg_checkpoint_init(&ck);
    REQUIRE(tg_checkpoint_identify(&ck, &plan, &run, &err) == 0, "%s", err.msg);
    const char *train_data = tg_checkpoint_field_value(&ck, "train_data");
    CHECK(train_data && !strcmp(train_data, resolved), "train_data '%s', want '%s'", train_data ? train_data : "(none)",
          resolved);
    tg_checkpoint_free(&ck);
    tg_plan_free(&plan);
}

/* plan.structure is the xxh64 (seed 0) of the plan's file encoding with the run settings
 * zeroed and the fingerprint and paths cleared: run settings and paths do not change it. */
TG_TEST(test_checkpoint_identity_structure_hash_value) {
    tg_plan plan;
    REQUIRE(tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, &plan), "compile");
    tg_plan bare = plan; /* shallow: the tables are only read */
    memset(&bare.run, 0, sizeof bare.run);
    bare.fingerprint = 0;
    bare.job_path[0] = 0;
    bare.model.source[0] = 0;
    bare.model.weights[0] = 0;
    uint8_t *bytes = NULL;
    size_t len = 0;
    tg_err err = {{0}};
    REQUIRE(tg_plan_encode(&bare, &bytes, &len, &err) == 0, "%s", err.msg);
    char want[17];
    snprintf(want, sizeof want, "%016" PRIx64, (uint64_t)XXH64(bytes, len, 0));
    free(bytes);
    const tg_checkpoint_run run = {.total_steps = 3, .train_examples = 5, .train_hash = 1};
    for (int variant = 0; variant < 2; variant++) {
        if (variant) {
            plan.run.seed = 99;
            plan.fingerprint = 7;
            snprintf(plan.run.train_data, sizeof plan.run.train_data, "other.jsonl");
        }
        tg_checkpoint ck;
        tg_checkpoint_init(&ck);
        REQUIRE(tg_checkpoint_identify(&ck, &plan, &run, &err) == 0, "%s", err.msg);
        const char *got = tg_checkpoint_field_value(&ck, "plan.structure");
        CHECK(got && !strcmp(got, want), "variant %d: plan.structure %s, want %s", variant, got ? got : "(none)", want);
        tg_checkpoint_free(&ck);
    }
    tg_plan_free(&plan);
}

/* An Adan plan records its optimizer settings between grad_clip's neighbours: the optimizer's
 * name, the betas, beta3 and no_prox (Adan's alone), then eps, weight decay and clipping. A
 * model name holding '%' is recorded as it is, never read as a format. */
TG_TEST(test_checkpoint_identity_fields_adan) {
    static tg_job job;
    tg_err err = {{0}};
    const char *sets[] = {"optimizer=adan", "beta3=0.995", "no_prox=true"};
    REQUIRE(tg_job_parse_text("model = tiny-bert\nsteps = 2\nseq = 16\ntrain_data = t.jsonl\n", "j.job", NULL, sets, 3,
                              &job, &err) == 0,
            "%s", err.msg);
    tg_plan plan;
    REQUIRE(tg_compile(&job, &plan, &err) == 0, "%s", err.msg);
    snprintf(plan.model.source, sizeof plan.model.source, "runs/100%%%%-bert %%d");
    const tg_checkpoint_run run = {.total_steps = 2, .train_examples = 3, .train_hash = 5};
    tg_checkpoint ck;
    tg_checkpoint_init(&ck);
    REQUIRE(tg_checkpoint_identify(&ck, &plan, &run, &err) == 0, "%s", err.msg);
    char all[8192];
    size_t n = 0;
    for (int i = 0; i < ck.n_fields && n < sizeof all; i++)
        n += (size_t)snprintf(all + n, sizeof all - n, "%s=%s\n", ck.fields[i].key, ck.fields[i].value);
    CHECK(strstr(all, "tunegraph=" TG_VERSION_STRING "\nmodel=runs/100%%-bert %d\nmodel.arch=bert\n") == all,
          "fields begin\n%s", all);
    CHECK(strstr(all, "\noptimizer=adan\n"
                      "beta1=0.980000019\n"
                      "beta2=0.920000017\n"
                      "beta3=0.995000005\n"
                      "no_prox=1\n"
                      "eps=9.99999994e-09\n"
                      "weight_decay=0.00999999978\n"
                      "grad_clip=1\n"
                      "seed="),
          "fields\n%s", all);
    tg_checkpoint_free(&ck);
    tg_plan_free(&plan);
}

/* Gradient accumulation is recorded only past 1 (checkpoints from before the key resume),
 * after zero_stage; the schedule's warmup and form as the schedule op holds them. */
TG_TEST(test_checkpoint_identity_fields_accumulation_and_schedule) {
    tg_plan plan;
    REQUIRE(tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, &plan), "compile");
    tg_op *schedule = NULL;
    for (int o = 0; o < plan.n_ops; o++)
        if (plan.ops[o].kind == TG_OP_SCHEDULE) schedule = &plan.ops[o];
    REQUIRE(schedule, "no schedule op");
    const tg_checkpoint_run run = {.total_steps = 2, .train_examples = 3, .train_hash = 5};
    const struct {
        int accumulation, warmup, form;
        const char *want;
    } cases[] = {
        {1, 0, TG_LR_LINEAR, "\nzero_stage=0\nattention=fused\nlr=4.99999987e-05\nwarmup_steps=0\nlr_schedule=linear\n"},
        {2, 4, TG_LR_COSINE,
         "\nzero_stage=0\ngrad_accumulation=2\nattention=fused\nlr=4.99999987e-05\nwarmup_steps=4\nlr_schedule=cosine\n"},
        {3, 2147483647, TG_LR_CONSTANT,
         "\nzero_stage=0\ngrad_accumulation=3\nattention=fused\nlr=4.99999987e-05\nwarmup_steps=2147483647\n"
         "lr_schedule=constant\n"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        plan.train.grad_accumulation = cases[k].accumulation;
        schedule->p.schedule.warmup = cases[k].warmup;
        schedule->p.schedule.form = cases[k].form;
        tg_checkpoint ck;
        tg_checkpoint_init(&ck);
        tg_err err = {{0}};
        REQUIRE(tg_checkpoint_identify(&ck, &plan, &run, &err) == 0, "%s", err.msg);
        char all[8192];
        size_t n = 0;
        for (int i = 0; i < ck.n_fields && n < sizeof all; i++)
            n += (size_t)snprintf(all + n, sizeof all - n, "%s=%s\n", ck.fields[i].key, ck.fields[i].value);
        CHECK(strstr(all, cases[k].want), "case %zu: fields\n%s", k, all);
        tg_checkpoint_free(&ck);
    }
    tg_plan_free(&plan);
}
