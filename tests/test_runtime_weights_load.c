/* Weights in and out of a tiny BERT classifier and a tiny GPT-2 (runtime/weights.c): the
 * names a checkpoint may use (without the base-model prefix, LayerNorm gamma and beta),
 * what a load reports as missing, unexpected and ignored (sorted as Hugging Face prints
 * them), the checkpoints it refuses (wrong shapes, values that are no numbers, none of the
 * model's parameters), initialisation of short and arange tensors, the int64 export of
 * int32 buffers, and every allocation of a load, a save and a report failed in turn. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "kernels/philox.h"
#include "models/safetensors.h"
#include "runtime/weights.h"
#include "tests/harness.h"

#define CHECK_MSG(err, s) CHECK(strstr((err).msg, (s)) != NULL, "message '%s' lacks '%s'", (err).msg, (s))

static const char *tmp_path(const char *name) {
    static char path[4][700];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, sizeof path[0], "%s/%s", tg_test_tmpdir(), name);
    return p;
}

/* The checkpoint items of every parameter of the image, under the plan's names; `rename`
 * maps a plan name to the file's (NULL: leave it out). Returns the count. */
typedef const char *(*rename_fn)(const char *name, char *buf, size_t cap);

static int items_of(const tg_weights_image *img, rename_fn rename, tg_st_item *items, char (*names)[TG_NAME_MAX]) {
    const tg_plan *p = img->plan;
    int n = 0;
    for (int t = 0; t < p->n_tensors; t++) {
        const tg_tensor *x = &p->tensors[t];
        if (!tg_tensor_is_value(x) || tg_tensor_class_of(x) == TG_CLASS_BUFFER) continue;
        const char *name = rename ? rename(x->name, names[n], TG_NAME_MAX) : x->name;
        if (!name) continue;
        items[n] = (tg_st_item){name, TG_ST_F32, x->ndim, x->shape, tg_weights_value(img, t)};
        n++;
    }
    return n;
}

/* As an old BertModel checkpoint names them: no "bert." prefix, LayerNorm gamma / beta; the
 * classifier left out. */
static const char *old_bert_name(const char *name, char *buf, size_t cap) {
    if (!strncmp(name, "classifier.", 11)) return NULL;
    const char *base = !strncmp(name, "bert.", 5) ? name + 5 : name;
    const size_t len = strlen(base);
    if (strstr(base, "LayerNorm.") && len > 7 && !strcmp(base + len - 7, ".weight"))
        snprintf(buf, cap, "%.*s.gamma", (int)(len - 7), base);
    else if (strstr(base, "LayerNorm.") && len > 5 && !strcmp(base + len - 5, ".bias"))
        snprintf(buf, cap, "%.*s.beta", (int)(len - 5), base);
    else
        snprintf(buf, cap, "%s", base);
    return buf;
}

static int bert_plan(tg_plan *p) { return tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, p); }

/* An old encoder checkpoint (with extra tensors) loads into the classifier: every encoder
 * value equal, the classifier missing, the extras unexpected or ignored, each list sorted. */
TG_TEST(test_runtime_weights_old_names_and_report) {
    tg_plan p;
    if (!bert_plan(&p)) return;
    tg_weights_image src, got;
    tg_err err = {{0}};
    REQUIRE(tg_weights_image_alloc(&p, &src, &err) == 0 && tg_weights_image_alloc(&p, &got, &err) == 0, "%s",
            err.msg);
    tg_weights_init(&src, 7);
    tg_st_item items[256];
    static char names[256][TG_NAME_MAX];
    int n = items_of(&src, old_bert_name, items, names);
    REQUIRE(n > 10 && n < 250, "%d items", n);
    static const float extra[4] = {1, 2, 3, 4};
    static const int64_t four[] = {4};
    /* unexpected (two, out of order), and position_ids HF drops for a model that has them */
    items[n++] = (tg_st_item){"zz.extra", TG_ST_F32, 1, four, extra};
    items[n++] = (tg_st_item){"cls.predictions.bias", TG_ST_F32, 1, four, extra};
    items[n++] = (tg_st_item){"position_ids", TG_ST_F32, 1, four, extra};
    items[n++] = (tg_st_item){"other.position_ids", TG_ST_F32, 1, four, extra};
    const char *path = tmp_path("old.safetensors");
    REQUIRE(tg_st_write(path, items, n, &err) == 0, "%s", err.msg);

    tg_weights_report r;
    REQUIRE(tg_weights_load(&got, path, &r, &err) == 0, "%s", err.msg);
    CHECK(r.missing == 2 && !strcmp(r.missing_names[0], "classifier.bias") &&
              !strcmp(r.missing_names[1], "classifier.weight") && !strcmp(r.first_missing, "classifier.weight"),
          "missing %d: %s", r.missing, r.first_missing);
    CHECK(r.unexpected == 2 && !strcmp(r.unexpected_names[0], "cls.predictions.bias") &&
              !strcmp(r.unexpected_names[1], "zz.extra"),
          "unexpected %d", r.unexpected);
    CHECK(r.ignored == 2 && r.loaded == n - 4 && r.trainable == n - 4 && r.frozen == 0 && r.buffers == 0 && r.files == 1,
          "ignored %d loaded %d trainable %d of %d", r.ignored, r.loaded, r.trainable, n - 4);
    int same = 1;
    for (int t = 0; t < p.n_tensors; t++) {
        const tg_tensor *x = &p.tensors[t];
        if (!tg_tensor_is_value(x) || tg_tensor_class_of(x) == TG_CLASS_BUFFER || !strncmp(x->name, "classifier.", 11))
            continue;
        same &= !memcmp(tg_weights_value(&src, t), tg_weights_value(&got, t), (size_t)tg_tensor_numel(x) * 4);
    }
    CHECK(same, "a value loaded from its old name differs");

    char *text = tg_weights_report_text(&r, "BertForSequenceClassification", "old");
    CHECK(text && !strcmp(text, "Some weights of the model checkpoint at old were not used when initializing "
                                "BertForSequenceClassification: ['cls.predictions.bias', 'zz.extra']\n"
                                "Some weights of BertForSequenceClassification were not initialized from the model "
                                "checkpoint at old and are newly initialized: ['classifier.bias', 'classifier.weight']\n"),
          "report: %s", text ? text : "(null)");
    free(text);

    /* every allocation of that load failed in turn, then of the report's text */
    tg_weights_report_free(&r);
    tg_alloc_fail_after(-1);
    REQUIRE(tg_weights_load(&got, path, &r, &err) == 0, "%s", err.msg);
    const long total = tg_alloc_fail_after(-1);
    for (long k = 0; k < total; k++) {
        tg_weights_report_free(&r);
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = tg_weights_load(&got, path, &r, &err);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && strstr(err.msg, "out of memory"), "load: allocation %ld of %ld failing: rc %d, '%s'", k,
              total, rc, err.msg);
    }
    tg_weights_report_free(&r);
    REQUIRE(tg_weights_load(&got, path, &r, &err) == 0, "%s", err.msg);
    tg_alloc_fail_after(-1);
    text = tg_weights_report_text(&r, "BertForSequenceClassification", "old");
    const long report_allocs = tg_alloc_fail_after(-1);
    free(text);
    REQUIRE(report_allocs >= 1, "%ld allocations for the report", report_allocs);
    for (long k = 0; k < report_allocs; k++) {
        tg_alloc_fail_after(k);
        text = tg_weights_report_text(&r, "BertForSequenceClassification", "old");
        tg_alloc_fail_after(-1);
        CHECK(text == NULL, "report text: allocation %ld of %ld failing gave text", k, report_allocs);
        free(text);
    }
    tg_weights_report_free(&r);
    tg_weights_report_free(&r); /* twice is harmless */
    tg_weights_image_free(&src);
    tg_weights_image_free(&got);
    tg_plan_free(&p);
}

/* The report's text grows past its first buffer for long names; nothing missing or
 * unexpected is "". */
TG_TEST(test_runtime_weights_report_text) {
    char long_name[400];
    memset(long_name, 'n', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = 0;
    char *missing[] = {long_name}, *unexpected[] = {"a", "b", "c"};
    tg_weights_report r = {0};
    r.missing = 1, r.missing_names = missing;
    char *text = tg_weights_report_text(&r, "M", "ck");
    char want[600];
    snprintf(want, sizeof want,
             "Some weights of M were not initialized from the model checkpoint at ck and are newly initialized: ['%s']\n",
             long_name);
    CHECK(text && !strcmp(text, want), "long: %.120s", text ? text : "(null)");
    free(text);
    r = (tg_weights_report){0};
    r.unexpected = 3, r.unexpected_names = unexpected;
    text = tg_weights_report_text(&r, "M", "ck");
    CHECK(text && !strcmp(text, "Some weights of the model checkpoint at ck were not used when initializing M: "
                                "['a', 'b', 'c']\n"),
          "unexpected: %s", text ? text : "(null)");
    free(text);
    r = (tg_weights_report){0};
    text = tg_weights_report_text(&r, "M", "ck");
    CHECK(text && !strcmp(text, ""), "empty report: '%s'", text ? text : "(null)");
    free(text);
}

/* One tensor of the image replaced by a file tensor of another shape or with a NaN. */
static int write_with(const tg_weights_image *img, const char *replace, const tg_st_item *with, const char *path) {
    tg_st_item items[256];
    static char names[256][TG_NAME_MAX];
    int n = items_of(img, NULL, items, names);
    for (int i = 0; i < n; i++)
        if (!strcmp(items[i].name, replace)) items[i] = *with;
    tg_err err;
    return tg_st_write(path, items, n, &err);
}

TG_TEST(test_runtime_weights_refused_checkpoints) {
    tg_plan p;
    if (!bert_plan(&p)) return;
    tg_weights_image img;
    tg_err err = {{0}};
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
    tg_weights_init(&img, 1);
    const int we = tg_test_tensor_named(&p, "bert.embeddings.word_embeddings.weight");
    const int cb = tg_test_tensor_named(&p, "classifier.bias");
    REQUIRE(we >= 0 && cb >= 0, "tensors");
    const tg_tensor *wt = &p.tensors[we];
    static float big[64 * 1024];
    tg_weights_report r;
    const char *path = tmp_path("bad.safetensors");

    /* a vocabulary of one row more: named, with the hint */
    const int64_t more[] = {wt->shape[0] + 1, wt->shape[1]};
    tg_st_item it = {wt->name, TG_ST_F32, 2, more, big};
    REQUIRE((size_t)(more[0] * more[1]) <= sizeof big / 4 && write_with(&img, wt->name, &it, path) == 0, "write");
    CHECK(tg_weights_load(&img, path, &r, &err) == -1, "wrong vocabulary loaded");
    char want[256];
    snprintf(want, sizeof want, "tensor '%s' has shape [%lld, %lld] but the model config needs [%lld, %lld] for %s "
             "(wrong vocabulary size?)", wt->name, (long long)more[0], (long long)more[1], (long long)wt->shape[0],
             (long long)wt->shape[1], wt->name);
    CHECK_MSG(err, want);
    tg_weights_report_free(&r);

    /* another tensor of another rank: no hint */
    const int64_t wide[] = {2, 1};
    it = (tg_st_item){"classifier.bias", TG_ST_F32, 2, wide, big};
    REQUIRE(write_with(&img, "classifier.bias", &it, path) == 0, "write");
    CHECK(tg_weights_load(&img, path, &r, &err) == -1, "wrong rank loaded");
    CHECK_MSG(err, "tensor 'classifier.bias' has shape [2, 1] but the model config needs [2] for classifier.bias");
    CHECK(!strstr(err.msg, "vocabulary"), "hint for a bias: %s", err.msg);
    tg_weights_report_free(&r);

    /* a shape too long to print in full (8 dimensions, no elements): cut, still named */
    const int64_t eight[] = {0, 1000000000000000000, 1000000000000000000, 1000000000000000000,
                             1000000000000000000, 1000000000000000000, 1000000000000000000, 7};
    it = (tg_st_item){"classifier.bias", TG_ST_F32, 8, eight, NULL};
    REQUIRE(write_with(&img, "classifier.bias", &it, path) == 0, "write");
    CHECK(tg_weights_load(&img, path, &r, &err) == -1, "8-dim shape loaded");
    CHECK_MSG(err, "tensor 'classifier.bias' has shape [0, 1000000000000000000, 1000000000000000000, ");
    CHECK_MSG(err, "but the model config needs [2] for classifier.bias");
    tg_weights_report_free(&r);

    /* a NaN among the values */
    float bias[2] = {0.5f, NAN};
    const int64_t two[] = {2};
    it = (tg_st_item){"classifier.bias", TG_ST_F32, 1, two, bias};
    REQUIRE(write_with(&img, "classifier.bias", &it, path) == 0, "write");
    CHECK(tg_weights_load(&img, path, &r, &err) == -1, "NaN loaded");
    CHECK_MSG(err, "tensor 'classifier.bias' (F32): element 1 is NaN");
    tg_weights_report_free(&r);

    /* buffers only: not a checkpoint of this model */
    static int32_t ids[4096];
    const int pid = tg_test_tensor_named(&p, "bert.embeddings.position_ids");
    REQUIRE(pid >= 0 && tg_tensor_numel(&p.tensors[pid]) <= 4096, "position_ids");
    it = (tg_st_item){"bert.embeddings.position_ids", TG_ST_I32, p.tensors[pid].ndim, p.tensors[pid].shape, ids};
    REQUIRE(tg_st_write(path, &it, 1, &err) == 0, "%s", err.msg);
    CHECK(tg_weights_load(&img, path, &r, &err) == -1, "buffers alone loaded");
    /* the count: every value but the buffers (trainable and frozen) */
    int params = 0;
    for (int t = 0; t < p.n_tensors; t++)
        params += tg_tensor_is_value(&p.tensors[t]) && tg_tensor_class_of(&p.tensors[t]) != TG_CLASS_BUFFER;
    snprintf(want, sizeof want,
             "bad.safetensors: holds none of the model's %d parameters (first: bert.embeddings.word_embeddings.weight); "
             "is it a checkpoint of this model?", params);
    CHECK(params > 10, "%d parameters", params);
    CHECK_MSG(err, want);
    tg_weights_report_free(&r);

    /* a file that is not there */
    CHECK(tg_weights_load(&img, tmp_path("none.safetensors"), &r, &err) == -1, "missing file loaded");
    CHECK_MSG(err, "none.safetensors: cannot open");
    tg_weights_image_free(&img);
    tg_plan_free(&p);
}

/* GPT-2: the tied lm_head.weight and the attention-mask buffers are taken without a word. */
TG_TEST(test_runtime_weights_gpt2_ignored) {
    tg_plan p;
    if (!tg_test_compile_preset("tiny-gpt2", TG_TASK_LM, TG_PREC_FP32, 1, &p)) return;
    tg_weights_image img;
    tg_err err = {{0}};
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
    tg_weights_init(&img, 3);
    tg_st_item items[256];
    static char names[256][TG_NAME_MAX];
    int n = items_of(&img, NULL, items, names);
    static const float v[4] = {0};
    static const int64_t four[] = {4};
    const int wte = tg_test_tensor_named(&p, "transformer.wte.weight");
    REQUIRE(wte >= 0, "wte");
    items[n++] = (tg_st_item){"lm_head.weight", TG_ST_F32, p.tensors[wte].ndim, p.tensors[wte].shape,
                              tg_weights_value(&img, wte)};
    /* position_ids of a model without such a buffer is unexpected */
    const char *masks[] = {"h.0.attn.bias", "h.0.attn.masked_bias", "h.0.crossattention.bias",
                           "h.0.crossattention.masked_bias", "h.0.attn.bias_extra", "position_ids"};
    for (int i = 0; i < 6; i++) items[n++] = (tg_st_item){masks[i], TG_ST_F32, 1, four, v};
    const char *path = tmp_path("gpt2.safetensors");
    REQUIRE(tg_st_write(path, items, n, &err) == 0, "%s", err.msg);
    tg_weights_report r;
    REQUIRE(tg_weights_load(&img, path, &r, &err) == 0, "%s", err.msg);
    CHECK(r.ignored == 4 && r.unexpected == 2 && !strcmp(r.unexpected_names[0], "h.0.attn.bias_extra") &&
              !strcmp(r.unexpected_names[1], "position_ids") && r.missing == 0 && r.loaded == n - 7,
          "ignored %d unexpected %d missing %d loaded %d", r.ignored, r.unexpected, r.missing, r.loaded);
    tg_weights_report_free(&r);

    /* a token table of another size: the vocabulary is suspected */
    static float big[8192];
    const int64_t fewer[] = {p.tensors[wte].shape[0] - 1, p.tensors[wte].shape[1]};
    REQUIRE(fewer[0] * fewer[1] <= 8192, "wte size");
    n = items_of(&img, NULL, items, names);
    for (int i = 0; i < n; i++)
        if (!strcmp(items[i].name, "transformer.wte.weight")) items[i] = (tg_st_item){items[i].name, TG_ST_F32, 2, fewer, big};
    REQUIRE(tg_st_write(path, items, n, &err) == 0, "%s", err.msg);
    CHECK(tg_weights_load(&img, path, &r, &err) == -1, "short wte loaded");
    CHECK_MSG(err, "for transformer.wte.weight (wrong vocabulary size?)");
    tg_weights_report_free(&r);
    tg_weights_image_free(&img);
    tg_plan_free(&p);
}

/* Initialisation: a normal tensor of one element writes that one only; arange tensors count
 * along their last dimension; a value that is no tensor has no values. */
TG_TEST(test_runtime_weights_init_shapes) {
    tg_plan p;
    if (!bert_plan(&p)) return;
    const int cb = tg_test_tensor_named(&p, "classifier.bias"), cw = tg_test_tensor_named(&p, "classifier.weight");
    REQUIRE(cb >= 0 && cw >= 0, "tensors");
    tg_tensor *bias = &p.tensors[cb], *weight = &p.tensors[cw];
    bias->init = TG_INIT_NORMAL, bias->init_std = 1.0f, bias->shape[0] = 1; /* its second float is untouched */
    weight->init = TG_INIT_ARANGE;
    tg_weights_image img;
    tg_err err = {{0}};
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
    float *b = tg_weights_value(&img, cb), *w = tg_weights_value(&img, cw);
    b[1] = 42.0f;
    tg_weights_init(&img, 11);
    CHECK(b[0] != 0.0f && isfinite(b[0]) && b[1] == 42.0f, "one normal: %g, then %g", b[0], b[1]);
    const int64_t cols = weight->shape[1];
    CHECK(w[0] == 0.0f && w[1] == 1.0f && w[cols - 1] == (float)(cols - 1) && w[cols] == 0.0f, "arange %g %g %g %g",
          w[0], w[1], w[cols - 1], w[cols]);
    /* a scalar counts from 0 (int32 and float); so does nothing else */
    const int pid = tg_test_tensor_named(&p, "bert.embeddings.position_ids");
    REQUIRE(pid >= 0, "position_ids");
    int32_t *pos = tg_weights_value(&img, pid);
    CHECK(pos[5] == 5, "position 5 is %d", pos[5]);
    p.tensors[pid].ndim = 0, pos[0] = 9, pos[1] = 9;
    bias->ndim = 0, bias->init = TG_INIT_ARANGE, b[0] = 5.0f;
    tg_weights_init(&img, 11);
    CHECK(pos[0] == 0 && pos[1] == 9 && b[0] == 0.0f && b[1] == 42.0f, "scalars: %d %d %g %g", pos[0], pos[1], b[0], b[1]);

    /* the padding row of the token table is zero, unless the padding index lies past it */
    const int we = tg_test_tensor_named(&p, "bert.embeddings.word_embeddings.weight");
    tg_op *embed = NULL;
    for (int o = 0; o < p.n_ops; o++)
        if (p.ops[o].kind == TG_OP_EMBEDDING && p.ops[o].in[1] == we) embed = &p.ops[o];
    REQUIRE(we >= 0 && embed && embed->p.embedding.padding_idx >= 0, "embedding op");
    const int64_t pad = embed->p.embedding.padding_idx, width = p.tensors[we].shape[1];
    const float *table = tg_weights_value(&img, we);
    CHECK(table[pad * width] == 0.0f && table[pad * width + width - 1] == 0.0f && table[(pad + 1) * width] != 0.0f,
          "padding row %lld not zero", (long long)pad);
    embed->p.embedding.padding_idx = (int32_t)p.tensors[we].shape[0];
    tg_weights_init(&img, 11);
    CHECK(table[pad * width] != 0.0f, "a row zeroed for a padding index past the table");

    const int ids = p.io.input_ids;
    tg_weights_image no_params = img;
    no_params.params = NULL;
    CHECK(tg_weights_value(&img, ids) == NULL && tg_weights_value(&no_params, cw) == NULL, "values of non-values");
    tg_weights_image_free(&img);
    tg_plan_free(&p);
}

/* Normal initialisation, value by value: element i of a tensor is the Box-Muller normal of
 * Philox block i / 4 of the stream (seed, the init step 2^64 - 1, FNV-1a of the name),
 * cos for the even element of a pair and sin for the odd one, times init_std; nothing past
 * the tensor's last element is written, whatever its length modulo 4. Zeros, ones and no
 * init (zeros) in int32 and float tensors. */
static float expected_normal(uint64_t seed, const char *name, float std, int64_t i) {
    uint32_t key = 2166136261u;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++) key = (key ^ *c) * 16777619u;
    float u[4];
    tg_philox_uniform4(seed, UINT64_MAX, key, (uint64_t)(i / 4), u);
    const int k = (int)(i % 4) & ~1;
    const double r = sqrt(-2.0 * log(1.0 - (double)u[k])), a = 6.283185307179586 * u[k + 1];
    return (float)(std * r * (i % 2 ? sin(a) : cos(a)));
}

TG_TEST(test_runtime_weights_init_values) {
    tg_plan p;
    if (!bert_plan(&p)) return;
    const int cw = tg_test_tensor_named(&p, "classifier.weight");
    REQUIRE(cw >= 0, "classifier.weight");
    tg_tensor *x = &p.tensors[cw];
    const int64_t room = tg_tensor_numel(x);
    REQUIRE(room > 20, "%lld elements", (long long)room);
    x->init = TG_INIT_NORMAL, x->init_std = 0.5f;
    tg_weights_image img;
    tg_err err = {{0}};
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
    float *w = tg_weights_value(&img, cw);
    for (int64_t n = 1; n <= 18; n++) {
        x->shape[0] = 1, x->shape[1] = n;
        for (int64_t i = 0; i < room; i++) w[i] = 42.0f;
        tg_weights_init(&img, 9);
        int64_t wrong = -1;
        for (int64_t i = 0; i < n && wrong < 0; i++)
            if (w[i] != expected_normal(9, "classifier.weight", 0.5f, i)) wrong = i;
        CHECK(wrong < 0, "%lld elements: element %lld is %.9g, expected %.9g", (long long)n, (long long)wrong,
              wrong < 0 ? 0.0 : w[wrong], wrong < 0 ? 0.0 : expected_normal(9, "classifier.weight", 0.5f, wrong));
        CHECK(w[n] == 42.0f && w[n + 1] == 42.0f, "%lld elements: the next two were written (%g %g)", (long long)n,
              w[n], w[n + 1]);
    }
    /* int32 and float tensors of zeros and ones (and none: zeros), whatever they held. */
    const int pid = tg_test_tensor_named(&p, "bert.embeddings.position_ids");
    REQUIRE(pid >= 0 && p.tensors[pid].dtype == TG_I32, "position_ids");
    int32_t *ids = tg_weights_value(&img, pid);
    const int64_t n_ids = tg_tensor_numel(&p.tensors[pid]);
    static const int inits[] = {TG_INIT_ZEROS, TG_INIT_ONES, TG_INIT_NONE};
    for (int k = 0; k < 3; k++) {
        p.tensors[pid].init = inits[k], x->init = inits[k];
        x->shape[1] = 6;
        for (int64_t i = 0; i < n_ids; i++) ids[i] = 7;
        for (int64_t i = 0; i < 6; i++) w[i] = 7.0f;
        tg_weights_init(&img, 9);
        const int want = inits[k] == TG_INIT_ONES;
        int64_t bad_id = -1, bad_w = -1;
        for (int64_t i = 0; i < n_ids && bad_id < 0; i++)
            if (ids[i] != want) bad_id = i;
        for (int64_t i = 0; i < 6 && bad_w < 0; i++)
            if (w[i] != (float)want) bad_w = i;
        CHECK(bad_id < 0 && bad_w < 0, "init %d: int32 element %lld, float element %lld not %d", inits[k],
              (long long)bad_id, (long long)bad_w, want);
    }
    x->init = TG_INIT_NORMAL;
    /* Another seed gives other values. */
    x->shape[1] = 4;
    tg_weights_init(&img, 10);
    CHECK(w[0] == expected_normal(10, "classifier.weight", 0.5f, 0) && w[0] != expected_normal(9, "classifier.weight", 0.5f, 0),
          "seed 10: %g", w[0]);
    tg_weights_image_free(&img);
    tg_plan_free(&p);
}

/* Where each tensor's values lie: trainable ones in the parameter pool's image, the other
 * values (buffers, frozen tensors) one after the other in `fixed` in the plan's order, and
 * no place (UINT64_MAX) for a tensor that holds no values. */
TG_TEST(test_runtime_weights_image_layout) {
    tg_plan p;
    if (!bert_plan(&p)) return;
    const int pid = tg_test_tensor_named(&p, "bert.embeddings.position_ids");
    REQUIRE(pid >= 0, "position_ids");
    p.tensors[pid].flags |= TG_TENSOR_PERSISTENT;
    tg_weights_image img;
    tg_err err = {{0}};
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
    uint64_t next = 0;
    int fixed = 0, none = 0, trainable = 0;
    for (int t = 0; t < p.n_tensors; t++) {
        const tg_tensor *x = &p.tensors[t];
        const int value = tg_tensor_is_value(x), train = value && tg_tensor_class_of(x) == TG_CLASS_TRAINABLE;
        if (value && !train) {
            CHECK(img.fixed_offset[t] == next && tg_weights_value(&img, t) == img.fixed + next,
                  "%s: offset %llu, expected %llu", x->name, (unsigned long long)img.fixed_offset[t],
                  (unsigned long long)next);
            next += (uint64_t)tg_tensor_numel(x) * 4;
            fixed++;
        } else {
            CHECK(img.fixed_offset[t] == UINT64_MAX, "%s: offset %llu, expected none", x->name,
                  (unsigned long long)img.fixed_offset[t]);
            if (train) {
                CHECK(tg_weights_value(&img, t) == (void *)(img.params + x->offset / sizeof(float)),
                      "%s: not in the pool", x->name);
                trainable++;
            } else {
                CHECK(tg_weights_value(&img, t) == NULL, "%s: values of a non-value", x->name);
                none++;
            }
        }
    }
    CHECK(img.fixed_bytes == next && fixed >= 1 && trainable > 10 && none > 10,
          "fixed %llu bytes, expected %llu (%d fixed, %d trainable, %d without values)",
          (unsigned long long)img.fixed_bytes, (unsigned long long)next, fixed, trainable, none);
    tg_weights_image_free(&img);
    tg_plan_free(&p);
}

/* A persistent int32 buffer (position_ids made persistent): loaded with the parameters,
 * missing when the file lacks it, saved as int64 for PyTorch, read back the same. */
TG_TEST(test_runtime_weights_int_buffer_round_trip) {
    tg_plan p;
    if (!bert_plan(&p)) return;
    const int pid = tg_test_tensor_named(&p, "bert.embeddings.position_ids");
    REQUIRE(pid >= 0 && p.tensors[pid].dtype == TG_I32, "position_ids");
    p.tensors[pid].flags |= TG_TENSOR_PERSISTENT;
    tg_weights_image img, got;
    tg_err err = {{0}};
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0 && tg_weights_image_alloc(&p, &got, &err) == 0, "%s",
            err.msg);
    tg_weights_init(&img, 5);
    const int32_t *ids = tg_weights_value(&img, pid);
    CHECK(ids[0] == 0 && ids[3] == 3, "arange ids %d %d", ids[0], ids[3]);
    const char *path = tmp_path("hf.safetensors");
    REQUIRE(tg_weights_save_hf(&img, path, 1, &err) == 0, "%s", err.msg);
    tg_safetensors st;
    REQUIRE(tg_st_open(path, &st, &err) == 0, "%s", err.msg);
    const tg_st_entry *e = tg_st_find(&st, "bert.embeddings.position_ids"), *cw = tg_st_find(&st, "classifier.weight");
    CHECK(e && e->dtype == TG_ST_I64 && cw && cw->dtype == TG_ST_BF16 && !tg_st_find(&st, "bert.embeddings.token_type_ids"),
          "dtypes in the export");
    tg_st_close(&st);
    tg_weights_report r;
    REQUIRE(tg_weights_load(&got, path, &r, &err) == 0, "%s", err.msg);
    CHECK(r.buffers == 1 && r.missing == 0 && r.ignored == 0 && !memcmp(tg_weights_value(&got, pid), ids, 4 * 4),
          "buffers %d missing %d ignored %d", r.buffers, r.missing, r.ignored);
    tg_weights_report_free(&r);

    /* saved by tg_weights_save (int32 kept), and a file without it: the buffer is missing */
    REQUIRE(tg_weights_save(&img, path, &err) == 0, "%s", err.msg);
    REQUIRE(tg_st_open(path, &st, &err) == 0, "%s", err.msg);
    e = tg_st_find(&st, "bert.embeddings.position_ids");
    CHECK(e && e->dtype == TG_ST_I32, "tg_weights_save dtype");
    tg_st_close(&st);
    p.tensors[pid].flags &= ~TG_TENSOR_PERSISTENT;
    REQUIRE(tg_weights_save(&img, path, &err) == 0, "%s", err.msg);
    p.tensors[pid].flags |= TG_TENSOR_PERSISTENT;
    REQUIRE(tg_weights_load(&got, path, &r, &err) == 0, "%s", err.msg);
    CHECK(r.missing == 1 && !strcmp(r.missing_names[0], "bert.embeddings.position_ids"), "missing %d", r.missing);
    tg_weights_report_free(&r);

    /* every allocation of the export failed in turn, then of the image */
    tg_alloc_fail_after(-1);
    REQUIRE(tg_weights_save_hf(&img, path, 1, &err) == 0, "%s", err.msg);
    long total = tg_alloc_fail_after(-1);
    for (long k = 0; k < total; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = tg_weights_save_hf(&img, path, 1, &err);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && (strstr(err.msg, "out of memory") || strstr(err.msg, "Cannot allocate memory")) &&
                  strstr(err.msg, "hf.safetensors"),
              "save_hf: allocation %ld of %ld failing: rc %d, '%s'", k, total, rc, err.msg);
    }
    tg_alloc_fail_after(-1);
    REQUIRE(tg_weights_save(&img, path, &err) == 0, "%s", err.msg);
    total = tg_alloc_fail_after(-1);
    for (long k = 0; k < total; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = tg_weights_save(&img, path, &err);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && (strstr(err.msg, "out of memory") || strstr(err.msg, "Cannot allocate memory")),
              "save: allocation %ld of %ld failing: rc %d, '%s'", k, total, rc, err.msg);
    }
    tg_weights_image again;
    for (long k = 0; k < 3; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = tg_weights_image_alloc(&p, &again, &err);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && !strcmp(err.msg, "out of memory for the weights") && again.params == NULL && again.fixed == NULL,
              "image: allocation %ld failing: rc %d, '%s'", k, rc, err.msg);
    }
    tg_weights_image_free(&img);
    tg_weights_image_free(&got);
    tg_plan_free(&p);
}

/* Model class names of every length from 200 to 700 bytes: the text is right whether a
 * piece ends just short of the buffer, exactly at its end (its terminator one past: the
 * buffer must grow), or past it; after growing, the same again at the next buffer's end. */
TG_TEST(test_runtime_weights_report_text_buffer_ends) {
    static char model[701], want[2000];
    char *missing[] = {"w"}, *unexpected[] = {"u"};
    for (int len = 200; len <= 700; len++) {
        memset(model, 'C', (size_t)len);
        model[len] = 0;
        tg_weights_report r = {0};
        r.missing = 1, r.missing_names = missing;
        r.unexpected = 1, r.unexpected_names = unexpected;
        char *text = tg_weights_report_text(&r, model, "ck");
        snprintf(want, sizeof want,
                 "Some weights of the model checkpoint at ck were not used when initializing %s: ['u']\n"
                 "Some weights of %s were not initialized from the model checkpoint at ck and are newly initialized: "
                 "['w']\n",
                 model, model);
        if (!CHECK(text && !strcmp(text, want), "class of %d bytes: %.100s", len, text ? text : "(null)")) {
            free(text);
            break;
        }
        free(text);
    }
}

/* A plan (as a plan file may have it) whose LayerNorm parameter is named neither .weight
 * nor .bias, and whose position_ids buffer is named otherwise: the parameter loads under its
 * own name only (no gamma / beta alias), and a checkpoint's position_ids, which the model no
 * longer has, is unexpected though the model has other buffers. */
TG_TEST(test_runtime_weights_renamed_layernorm_and_buffers) {
    tg_plan p;
    if (!bert_plan(&p)) return;
    const int ln = tg_test_tensor_named(&p, "bert.embeddings.LayerNorm.weight");
    const int pos = tg_test_tensor_named(&p, "bert.embeddings.position_ids");
    REQUIRE(ln >= 0 && pos >= 0 && tg_test_tensor_named(&p, "bert.embeddings.token_type_ids") >= 0, "tensors");
    snprintf(p.tensors[ln].name, sizeof p.tensors[ln].name, "bert.embeddings.LayerNorm.scale");
    snprintf(p.tensors[pos].name, sizeof p.tensors[pos].name, "bert.embeddings.position_index");
    tg_weights_image src, got;
    tg_err err = {{0}};
    REQUIRE(tg_weights_image_alloc(&p, &src, &err) == 0 && tg_weights_image_alloc(&p, &got, &err) == 0, "%s",
            err.msg);
    tg_weights_init(&src, 7);
    tg_weights_init(&got, 8);
    tg_st_item items[256];
    static char names[256][TG_NAME_MAX];
    const int n0 = items_of(&src, old_bert_name, items, names);
    int n = n0;
    static const int64_t four[] = {4};
    static const float v[4] = {0, 1, 2, 3};
    items[n++] = (tg_st_item){"embeddings.position_ids", TG_ST_F32, 1, four, v};
    const char *path = tmp_path("renamed.safetensors");
    REQUIRE(tg_st_write(path, items, n, &err) == 0, "%s", err.msg);
    tg_weights_report r;
    REQUIRE(tg_weights_load(&got, path, &r, &err) == 0, "%s", err.msg);
    CHECK(!memcmp(tg_weights_value(&src, ln), tg_weights_value(&got, ln), (size_t)tg_tensor_numel(&p.tensors[ln]) * 4),
          "the LayerNorm parameter under its own name did not load");
    CHECK(r.unexpected == 1 && !strcmp(r.unexpected_names[0], "embeddings.position_ids") && r.ignored == 0 &&
              r.missing == 2 && r.loaded == n0,
          "unexpected %d (%s) ignored %d missing %d loaded %d of %d", r.unexpected,
          r.unexpected ? r.unexpected_names[0] : "", r.ignored, r.missing, r.loaded, n0);
    tg_weights_report_free(&r);
    /* The checkpoint under the old alias only: the parameter is missing, the alias unexpected. */
    for (int i = 0; i < n0; i++)
        if (!strcmp(items[i].name, "embeddings.LayerNorm.scale")) items[i].name = "embeddings.LayerNorm.gamma";
    REQUIRE(tg_st_write(path, items, n0, &err) == 0, "%s", err.msg);
    REQUIRE(tg_weights_load(&got, path, &r, &err) == 0, "%s", err.msg);
    int missing = 0;
    for (int i = 0; i < r.missing; i++) missing |= !strcmp(r.missing_names[i], "bert.embeddings.LayerNorm.scale");
    CHECK(missing && r.missing == 3 && r.unexpected == 1 && !strcmp(r.unexpected_names[0], "embeddings.LayerNorm.gamma"),
          "gamma for .scale: missing %d, unexpected %d", r.missing, r.unexpected);
    tg_weights_report_free(&r);
    tg_weights_image_free(&src);
    tg_weights_image_free(&got);
    tg_plan_free(&p);
}

/* The padding row of an embedding table is zeroed at initialisation only where the table
 * has rows: a plan whose table is one flat dimension (which the op's element count allows)
 * keeps its drawn values there. */
TG_TEST(test_runtime_weights_padding_row_needs_a_2d_table) {
    tg_plan p;
    if (!bert_plan(&p)) return;
    int table = -1;
    int64_t pad = -1;
    for (int o = p.phase_begin[TG_PHASE_FORWARD]; o < p.phase_begin[TG_PHASE_BACKWARD] && table < 0; o++)
        if (p.ops[o].kind == TG_OP_EMBEDDING && p.ops[o].p.embedding.padding_idx >= 0)
            table = p.ops[o].in[1], pad = p.ops[o].p.embedding.padding_idx;
    REQUIRE(table >= 0 && p.tensors[table].ndim == 2 && pad < p.tensors[table].shape[0], "an embedding with padding");
    const int64_t D = p.tensors[table].shape[1], V = p.tensors[table].shape[0];
    for (int flat = 0; flat < 2; flat++) {
        if (flat) p.tensors[table].ndim = 1, p.tensors[table].shape[0] = V * D, p.tensors[table].shape[1] = 0;
        tg_weights_image img;
        tg_err err = {{0}};
        REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
        tg_weights_init(&img, 5);
        const float *row = (const float *)tg_weights_value(&img, table) + pad * D;
        int zeros = 0;
        for (int64_t d = 0; d < D; d++) zeros += row[d] == 0.0f;
        CHECK(flat ? zeros < D : zeros == D, "%s table: %d of %lld padding-row values are 0", flat ? "flat" : "2-D", zeros,
              (long long)D);
        tg_weights_image_free(&img);
    }
    tg_plan_free(&p);
}

/* Extra checkpoint names no longer than what the ignore rules look for at their ends (a
 * name that is exactly the tail is ignored, a shorter one is unexpected and must not be
 * read before its first byte): for BERT, which has a position_ids buffer, and for GPT-2's
 * attention-mask buffers. Unexpected names come sorted. */
static void load_with_extras(tg_plan *p, const char *const *extras, int n_extras, int ignored,
                             const char *const *unexpected, int n_unexpected, const char *what) {
    tg_weights_image img;
    tg_err err = {{0}};
    REQUIRE(tg_weights_image_alloc(p, &img, &err) == 0, "%s", err.msg);
    tg_weights_init(&img, 5);
    tg_st_item items[256];
    static char names[256][TG_NAME_MAX];
    int n = items_of(&img, NULL, items, names);
    const int params = n;
    static const float v[2] = {1, 2};
    static const int64_t two[] = {2};
    for (int i = 0; i < n_extras; i++) items[n++] = (tg_st_item){extras[i], TG_ST_F32, 1, two, v};
    const char *path = tmp_path("extras.safetensors");
    REQUIRE(tg_st_write(path, items, n, &err) == 0, "%s", err.msg);
    tg_weights_report r;
    REQUIRE(tg_weights_load(&img, path, &r, &err) == 0, "%s: %s", what, err.msg);
    int same = r.unexpected == n_unexpected;
    for (int i = 0; same && i < n_unexpected; i++) same = !strcmp(r.unexpected_names[i], unexpected[i]);
    CHECK(same && r.ignored == ignored && r.missing == 0 && r.loaded == params, "%s: unexpected %d (%s, ...), "
          "ignored %d, missing %d, loaded %d of %d", what, r.unexpected, r.unexpected ? r.unexpected_names[0] : "",
          r.ignored, r.missing, r.loaded, params);
    tg_weights_report_free(&r);
    tg_weights_image_free(&img);
}

TG_TEST(test_runtime_weights_short_extra_names) {
    tg_plan p;
    if (!bert_plan(&p)) return;
    REQUIRE(tg_test_tensor_named(&p, "bert.embeddings.position_ids") >= 0, "position_ids buffer");
    static const char *const bert_extras[] = {"p", ".position_ids", "ids", "xposition_ids", "position_ids"};
    static const char *const bert_unexpected[] = {"ids", "p", "xposition_ids"};
    load_with_extras(&p, bert_extras, 5, 2, bert_unexpected, 3, "BERT");
    tg_plan_free(&p);

    if (!tg_test_compile_preset("tiny-gpt2", TG_TASK_LM, TG_PREC_FP32, 1, &p)) return;
    static const char *const gpt2_extras[] = {"b", ".attn.bias", "attn.bias", ".attn.masked_bias", "masked_bias",
                                              ".crossattention.bias", "crossattention.bias"};
    static const char *const gpt2_unexpected[] = {"attn.bias", "b", "crossattention.bias", "masked_bias"};
    load_with_extras(&p, gpt2_extras, 7, 3, gpt2_unexpected, 4, "GPT-2");
    tg_plan_free(&p);
}
