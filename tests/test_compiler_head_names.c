/* The classification heads' tensors by name (compiler/model_build.c): each dropout of the
 * head is an op of its own whose output carries the head's name, between the tensors the
 * Hugging Face modules name. */
#include <stdio.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "tests/harness.h"

static int compile_job(const char *text, tg_plan *plan, tg_err *err) {
    char path[512];
    snprintf(path, sizeof path, "%s/head_names.job", tg_test_tmpdir());
    if (tg_test_write_file(path, text)) return tg_fail(err, "cannot write %s", path);
    tg_job job;
    if (tg_job_load(path, NULL, 0, &job, err)) return -1;
    return tg_compile(&job, plan, err);
}

/* The first op that writes tensor t (out[0]), a forward one; -1 if none. */
static int producer(const tg_plan *p, int t) {
    for (int o = 0; o < p->n_ops; o++)
        if (p->ops[o].out[0] == t) return o;
    return -1;
}

/* The op that reads tensor t as in[0]; -1 if none. */
static int reader(const tg_plan *p, int t) {
    for (int o = 0; o < p->n_ops; o++)
        if (p->ops[o].in[0] == t) return o;
    return -1;
}

/* Dropout `name` is made by a DROPOUT op and read by the matmul with weight `weight`. */
static void check_dropout(const tg_plan *p, const char *name, const char *weight) {
    const int t = tg_test_tensor_named(p, name);
    if (!CHECK(t >= 0, "no tensor %s", name)) return;
    const int o = producer(p, t), r = reader(p, t);
    CHECK(o >= 0 && p->ops[o].kind == TG_OP_DROPOUT, "%s is not made by a DROPOUT op", name);
    if (!CHECK(r >= 0 && p->ops[r].kind == TG_OP_MATMUL, "%s is not read by a MATMUL", name)) return;
    const int w = p->ops[r].in[1];
    CHECK(w >= 0 && !strcmp(p->tensors[w].name, weight), "%s is read by the matmul of %s, expected %s", name,
          w >= 0 ? p->tensors[w].name : "(none)", weight);
}

TG_TEST(test_roberta_classification_head_names) {
    tg_plan p;
    tg_err err;
    /* tiny-roberta: classifier_dropout null, so the hidden dropout 0.1 is the head's. */
    REQUIRE(compile_job("model = tiny-roberta\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\n", &p, &err) == 0, "%s",
            err.msg);
    check_dropout(&p, "classifier.dropout_in", "classifier.dense.weight");
    check_dropout(&p, "classifier.dropout_out", "classifier.out_proj.weight");
    CHECK(tg_test_tensor_named(&p, "") < 0, "roberta: a tensor with an empty name");
    tg_plan_free(&p);
}

TG_TEST(test_bert_classification_head_names) {
    tg_plan p;
    tg_err err;
    REQUIRE(compile_job("model = tiny-bert\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\n", &p, &err) == 0, "%s",
            err.msg);
    check_dropout(&p, "classifier.dropout", "classifier.weight");
    CHECK(tg_test_tensor_named(&p, "") < 0, "bert: a tensor with an empty name");
    tg_plan_free(&p);
}
