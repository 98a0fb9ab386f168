/* model = mobilenet_v2 against PyTorch + torchvision (tests/golden/make_golden_mobilenet.py
 * made tests/golden/data/mobilenet_v2): the plan compiled from the case's config and
 * torchvision state dict, on the same batch (the images' bytes, which the plan's IMAGE_INPUT
 * must normalise and lay out channels last into exactly torchvision's ToTensor + Normalize
 * values; the weights, statistics, logits and loss have no image layout), must give
 * torchvision's training-mode logits
 * and loss, every parameter gradient, and after 3 AdamW steps (constant lr, eps 1e-2, clipping at 1,
 * no decay on the batch-norm parameters and biases) the weights, the batch normalisations'
 * running statistics and the eval-mode logits.
 *
 * Tolerances, against a reference computed in float64 (the script's docstring says why):
 * the initial logits, every gradient (within that of its norm) and the first step's
 * statistics 1e-4, the loss 1e-5, as the transformer golden tests (tests/test_golden.c);
 * after the steps, the weights, the running statistics and the eval-mode logits within 1e-3
 * of their norms, the later steps' losses 1e-4 and gradient norms 5e-3. A batch
 * normalisation over few values (the last blocks see 4 images of 2 x 2 positions) amplifies
 * rounding step by step: the script draws the images until torch's own float32 run of the
 * three steps stays close to float64's (meta.json image_seed 5: the weights 2.2e-6 from
 * float64's, the gradient norms 1.1e-3; torch 2.15.0, torchvision 0.29.2). The biases of the blocks' last
 * normalisations are frozen on both sides (meta.json freeze): the loss does not depend on
 * them, so their gradients are rounding noise, on which AdamW would step either way. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

#define CASE_DIR "tests/golden/data/mobilenet_v2"
#define REL_TOL 1e-4
#define STEPS_TOL 1e-3
#define GRAD_NORM_STEPS_TOL 5e-3

/* ||got - want|| <= tol ||want|| (every element finite); *rel the ratio. */
static int within(const float *got, const float *want, int64_t n, double tol, double *rel) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) {
            *rel = INFINITY;
            return 0;
        }
        const double d = (double)got[i] - want[i];
        num += d * d, den += (double)want[i] * want[i];
    }
    *rel = sqrt(num) / fmax(sqrt(den), 1e-30);
    return sqrt(num) <= tol * sqrt(den) || sqrt(num) <= 1e-9;
}

static float *golden(const tg_safetensors *st, const char *name, int64_t n) {
    const tg_st_entry *e = tg_st_find(st, name);
    float *v = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    tg_err err;
    if (!CHECK(e && v && tg_st_read_f32(st, e, v, n, &err) == 0, "golden %s: %s", name, e ? err.msg : "missing")) {
        free(v);
        return NULL;
    }
    return v;
}

/* The plan's tensor `t` against golden key prefix.<name>. */
static void compare_tensor(tg_trainer *tr, const tg_safetensors *st, const char *prefix, int t, double tol) {
    const tg_tensor *x = &tr->plan->tensors[t];
    char key[200];
    snprintf(key, sizeof key, "%s.%s", prefix, x->name);
    const int64_t n = tg_tensor_numel(x);
    float *want = golden(st, key, n), *got = malloc(sizeof(float) * (size_t)n);
    tg_err err = {{0}};
    double rel = 0;
    if (want && got) {
        const int ok = tg_trainer_read(tr, t, got, &err) == 0 && within(got, want, n, tol, &rel);
        CHECK(ok, "%s: relative error %.3g > %g %s", key, rel, tol, err.msg);
    }
    free(want), free(got);
}

static void compare_output(tg_trainer *tr, const tg_safetensors *st, const char *key, int t, double tol) {
    const int64_t n = tg_tensor_numel(&tr->plan->tensors[t]);
    float *want = golden(st, key, n), *got = malloc(sizeof(float) * (size_t)n);
    tg_err err = {{0}};
    double rel = 0;
    if (want && got) {
        const int ok = tg_trainer_read(tr, t, got, &err) == 0 && within(got, want, n, tol, &rel);
        CHECK(ok, "%s: relative error %.3g > %g %s", key, rel, tol, err.msg);
    }
    free(want), free(got);
}

TG_TEST(test_golden_mobilenet_v2) {
    json_error_t jerr;
    json_t *meta = json_load_file(CASE_DIR "/meta.json", 0, &jerr);
    REQUIRE(meta, "%s", jerr.text);
    tg_err err;
    tg_model_config cfg;
    REQUIRE(tg_model_config_load(CASE_DIR, &cfg, &err) == 0, "%s", err.msg);
    REQUIRE(cfg.weights[0] && cfg.classifier_dropout == 0.0f, "the case has no weights, or a classifier dropout");
    json_t *opt = json_object_get(meta, "optimizer"), *sched = json_object_get(meta, "scheduler");
    tg_job job;
    tg_job_defaults(&job);
    snprintf(job.model, sizeof job.model, "%s", CASE_DIR);
    job.num_labels = (int)json_integer_value(json_object_get(meta, "num_labels"));
    job.batch = (int)json_integer_value(json_object_get(meta, "B"));
    job.lr = (float)json_number_value(json_object_get(opt, "lr"));
    job.beta1 = (float)json_number_value(json_array_get(json_object_get(opt, "betas"), 0));
    job.beta2 = (float)json_number_value(json_array_get(json_object_get(opt, "betas"), 1));
    job.eps = (float)json_number_value(json_object_get(opt, "eps"));
    job.weight_decay = (float)json_number_value(json_object_get(opt, "weight_decay"));
    job.lr_schedule = TG_LR_CONSTANT;
    job.warmup_steps = (int)json_integer_value(json_object_get(sched, "num_warmup_steps"));
    job.steps = (int)json_integer_value(json_object_get(sched, "num_training_steps"));
    job.grad_clip = (float)json_number_value(json_object_get(meta, "max_grad_norm"));
    REQUIRE(!strcmp(json_string_value(json_object_get(sched, "name")), "constant") && job.steps == 3,
            "meta.json: an unexpected schedule");
    snprintf(job.freeze, sizeof job.freeze, "%s", json_string_value(json_object_get(meta, "freeze")));
    /* torchvision's Normalize of the case's images. */
    json_t *mean = json_object_get(meta, "image_mean"), *std = json_object_get(meta, "image_std");
    REQUIRE(json_array_size(mean) == 3 && json_array_size(std) == 3, "meta.json: image_mean and image_std, 3 each");
    job.n_image_mean = job.n_image_std = 3;
    for (int c = 0; c < 3; c++) {
        job.image_mean[c] = (float)json_number_value(json_array_get(mean, (size_t)c));
        job.image_std[c] = (float)json_number_value(json_array_get(std, (size_t)c));
    }
    tg_plan p;
    REQUIRE(tg_compile_with_config(&job, &cfg, &p, &err) == 0, "%s", err.msg);
    /* The no-decay set is torchvision's 1-D parameters, as the script's AdamW groups. */
    json_t *no_decay = json_object_get(meta, "no_decay");
    int n_no_decay = 0;
    for (int t = 0; t < p.n_tensors; t++) {
        const tg_tensor *x = &p.tensors[t];
        if (!(x->flags & TG_TENSOR_PARAM) || (x->flags & TG_TENSOR_VIEW)) continue;
        int listed = 0;
        for (size_t k = 0; k < json_array_size(no_decay); k++)
            listed |= !strcmp(json_string_value(json_array_get(no_decay, k)), x->name);
        CHECK(listed == ((x->flags & TG_TENSOR_NO_DECAY) != 0), "%s: no_decay %d, the script's %d", x->name,
              (x->flags & TG_TENSOR_NO_DECAY) != 0, listed);
        n_no_decay += listed;
    }
    CHECK(n_no_decay == (int)json_array_size(no_decay), "%d of %zu no-decay parameters found", n_no_decay,
          json_array_size(no_decay));

    tg_trainer tr;
    tg_trainer_options o = {.device = tg_test_device(), .threads = 0, .load_data = 0};
    REQUIRE(tg_trainer_open(&tr, &p, &o, &err) == 0, "%s", err.msg);
    /* Every parameter and running statistic from the torchvision file, its 52
     * num_batches_tracked passed over. */
    CHECK(tr.weights.missing == 0 && tr.weights.unexpected == 0 && tr.weights.ignored == 52 &&
              tr.weights.buffers == 104,
          "weights: missing %d (first %s), unexpected %d, ignored %d, buffers %d", tr.weights.missing,
          tr.weights.first_missing, tr.weights.unexpected, tr.weights.ignored, tr.weights.buffers);
    tg_safetensors st;
    REQUIRE(tg_st_open(CASE_DIR "/golden.safetensors", &st, &err) == 0, "%s", err.msg);
    const tg_plan_io *io = &p.io;
    const tg_st_entry *px = tg_st_find(&st, "pixels"), *lb = tg_st_find(&st, "labels");
    /* The images' bytes go into the batch as stored (channel planes); the plan's IMAGE_INPUT
     * makes the channels-last input, which must be torchvision's normalised images. */
    const int64_t C = p.model.image_channels, S = p.model.image_size, plane = S * S;
    const int64_t n_px = tg_tensor_numel(&p.tensors[io->pixel_values]);
    int32_t *bytes = malloc(sizeof(int32_t) * (size_t)n_px);
    float *nchw = malloc(sizeof(float) * (size_t)n_px), *nhwc = malloc(sizeof(float) * (size_t)n_px);
    REQUIRE(bytes && nchw && nhwc && n_px == job.batch * C * plane, "pixel_values: %lld elements", (long long)n_px);
    REQUIRE(px && lb && tg_st_read_i32(&st, px, bytes, n_px, &err) == 0 &&
                tg_st_read_f32(&st, tg_st_find(&st, "pixel_values"), nchw, n_px, &err) == 0 &&
                tg_st_read_i32(&st, lb, tg_trainer_input(&tr, io->labels), job.batch, &err) == 0,
            "inputs: %s", err.msg);
    uint8_t *in = tg_trainer_input(&tr, io->pixel_values);
    for (int64_t i = 0; i < n_px; i++) in[i] = (uint8_t)bytes[i];
    free(bytes);
    /* The buffers as loaded: the gradients' forward moves them, the script puts them back. */
    float *saved[256] = {0};
    int n_buffers = 0;
    for (int t = 0; t < p.n_tensors && n_buffers < 256; t++)
        if (p.tensors[t].flags & TG_TENSOR_BUFFER) {
            saved[n_buffers] = malloc(p.tensors[t].bytes);
            REQUIRE(saved[n_buffers] && tg_trainer_read(&tr, t, saved[n_buffers], &err) == 0, "%s", err.msg);
            n_buffers++;
        }
    REQUIRE(tg_trainer_run(&tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 1, &err) == 0, "%s", err.msg);
    const int x_t = tg_test_tensor_named(&p, "pixel_values.normalized");
    REQUIRE(x_t >= 0 && tg_trainer_read(&tr, x_t, nhwc, &err) == 0, "normalised input: %s", err.msg);
    int64_t same = 0;
    for (int64_t b = 0; b < job.batch; b++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < plane; i++) same += nhwc[(b * plane + i) * C + c] == nchw[(b * C + c) * plane + i];
    CHECK(same == n_px, "%lld of %lld normalised pixels are torchvision's bit for bit", (long long)same, (long long)n_px);
    free(nchw), free(nhwc);
    compare_output(&tr, &st, "logits", io->logits, REL_TOL);
    float *want_loss = golden(&st, "loss", 1), loss = NAN;
    if (want_loss && CHECK(tg_trainer_read(&tr, io->loss, &loss, &err) == 0, "%s", err.msg))
        CHECK(fabsf(loss - want_loss[0]) <= 1e-5f * want_loss[0], "loss %.7g, torch %.7g", loss, want_loss[0]);
    free(want_loss);
    REQUIRE(tg_trainer_run(&tr, TG_PHASE_BACKWARD, TG_PHASE_BACKWARD, 1, &err) == 0, "%s", err.msg);
    int grads = 0;
    for (int t = 0; t < p.n_tensors; t++) {
        const tg_tensor *x = &p.tensors[t];
        if (!(x->flags & TG_TENSOR_PARAM) || (x->flags & TG_TENSOR_VIEW)) continue;
        char key[200];
        snprintf(key, sizeof key, "grad.%s", x->name);
        const int64_t n = tg_tensor_numel(x);
        float *want = golden(&st, key, n), *got = malloc(x->bytes);
        double rel = 0;
        if (want && got) {
            const int ok = tg_trainer_read(&tr, x->grad, got, &err) == 0 && within(got, want, n, REL_TOL, &rel);
            CHECK(ok, "%s: relative error %.3g > %g", key, rel, REL_TOL);
        }
        free(want), free(got);
        grads++;
    }
    CHECK(grads == 141, "%d gradients compared, want 141 (158 parameters, 17 frozen)", grads);
    for (int t = 0, k = 0; t < p.n_tensors; t++)
        if (p.tensors[t].flags & TG_TENSOR_BUFFER) {
            REQUIRE(tg_trainer_write(&tr, t, saved[k], &err) == 0, "%s", err.msg);
            free(saved[k++]);
        }

    /* Three steps on the same batch. */
    for (int s = 0; s < 3; s++) {
        tg_step_stats stats;
        REQUIRE(tg_trainer_run_step(&tr, &stats, &err) == 0, "step %d: %s", s, err.msg);
        static const char *const keys[3] = {"loss_steps", "lr_steps", "grad_norm_steps"};
        const float got[3] = {stats.loss, stats.lr, stats.grad_norm};
        for (int k = 0; k < 3; k++) {
            float *want = golden(&st, keys[k], 3);
            const double tol = k == 2 && s > 0 ? GRAD_NORM_STEPS_TOL : REL_TOL;
            if (want)
                CHECK(fabs((double)got[k] - want[s]) <= tol * fabs((double)want[s]), "step %d: %s %.7g, torch %.7g", s,
                      keys[k], got[k], want[s]);
            free(want);
        }
    }
    int after = 0;
    for (int t = 0; t < p.n_tensors; t++) {
        const tg_tensor *x = &p.tensors[t];
        if (x->flags & TG_TENSOR_VIEW) continue;
        if (x->flags & (TG_TENSOR_PARAM | TG_TENSOR_FROZEN | TG_TENSOR_BUFFER)) compare_tensor(&tr, &st, "step3", t, STEPS_TOL), after++;
    }
    CHECK(after == 262, "%d tensors compared after 3 steps, want 158 parameters and 104 running statistics", after);
    /* Eval mode: the running statistics normalise. */
    REQUIRE(tg_trainer_run(&tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 0, &err) == 0, "%s", err.msg);
    compare_output(&tr, &st, "eval_logits", io->logits, STEPS_TOL);
    tg_st_close(&st);
    tg_trainer_close(&tr);
    tg_plan_free(&p);
    json_decref(meta);
}
