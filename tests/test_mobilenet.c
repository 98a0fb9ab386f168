/* model = mobilenet_v2 (torchvision's architecture, compiler/model_build.c): its parameter
 * and buffer names and shapes against torchvision's state dict, the job's refusals, the plan
 * file round trip and its io check, the trainer's channels-last batch from an RGB shard set,
 * the whole model's gradient against finite differences,
 * a few CPU training steps on a learnable synthetic task (the loss goes down, the running
 * statistics move, eval uses them), and its weights through a torchvision-style safetensors
 * file and back, and the export folder. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "datasets/shard_dataset.h"
#include "datasets/shard_writer.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "plan/plan_file.h"
#include "runtime/hf_export.h"
#include "runtime/trainer.h"
#include "runtime/weights.h"
#include "tests/harness.h"
#include "tests/image_fixtures.h"

/* The tiny configuration the tests train: width 0.25 (the stem 8 channels, last_channel
 * 1280), 32 x 32 images, a batch of 4; `sets` "key=value" overrides, one a line (the tests
 * set num_labels 3). */
static int compile_text(const char *sets, tg_plan *p, tg_err *err) {
    const char *text = "model = mobilenet_v2\nimage_size = 32\nwidth_mult = 0.25\nbatch = 4\nsteps = 40\n"
                       "train_data = none.jsonl\n";
    char buf[1024], *over[16];
    int n = 0;
    snprintf(buf, sizeof buf, "%s", sets);
    for (char *line = strtok(buf, "\n"); line && n < 16; line = strtok(NULL, "\n")) over[n++] = line;
    tg_job job;
    if (tg_job_parse_text(text, "tiny.job", NULL, (const char *const *)over, n, &job, err)) return -1;
    return tg_compile(&job, p, err);
}

/* Parameters and persistent buffers in tensor order (views excluded). */
static int value_tensor(const tg_tensor *x) {
    if (x->flags & TG_TENSOR_VIEW) return 0;
    return (x->flags & (TG_TENSOR_PARAM | TG_TENSOR_FROZEN)) || (x->flags & TG_TENSOR_PERSISTENT);
}

/* The names and shapes of torchvision.models.mobilenet_v2(width_mult=0.25, num_classes=3),
 * in state-dict order, num_batches_tracked left out (the plans have none: their momentum is
 * fixed, and torch fills the entry in when a state dict lacks it). */
TG_TEST(test_mobilenet_v2_state_dict_names) {
    tg_plan p;
    tg_err err;
    REQUIRE(compile_text("num_labels=3", &p, &err) == 0, "%s", err.msg);
    char *text = tg_test_read_file("tests/data/mobilenet_v2_w0.25_c3_state_dict.txt", NULL);
    REQUIRE(text, "tests/data/mobilenet_v2_w0.25_c3_state_dict.txt not readable");
    int t = 0, entries = 0;
    int64_t trainable = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#' || strstr(line, "num_batches_tracked")) continue;
        char name[TG_NAME_MAX], shape[64];
        if (!CHECK(sscanf(line, "%95s %63s", name, shape) == 2, "bad line '%s'", line)) break;
        while (t < p.n_tensors && !value_tensor(&p.tensors[t])) t++;
        if (!CHECK(t < p.n_tensors, "the plan has no tensor for %s", name)) break;
        const tg_tensor *x = &p.tensors[t++];
        char have[64] = "";
        for (int d = 0; d < x->ndim; d++)
            snprintf(have + strlen(have), sizeof have - strlen(have), "%s%lld", d ? "," : "", (long long)x->shape[d]);
        CHECK(!strcmp(x->name, name) && !strcmp(have, shape), "entry %d: plan %s [%s], torchvision %s [%s]", entries,
              x->name, have, name, shape);
        const int buffer = (x->flags & TG_TENSOR_BUFFER) != 0;
        CHECK(buffer == (strstr(name, "running_") != NULL), "%s: buffer flag %d", x->name, buffer);
        if (x->flags & TG_TENSOR_PARAM) trainable += tg_tensor_numel(x);
        entries++;
    }
    while (t < p.n_tensors && !value_tensor(&p.tensors[t])) t++;
    CHECK(t == p.n_tensors, "the plan has more values than torchvision: %s", t < p.n_tensors ? p.tensors[t].name : "");
    CHECK(entries == 262, "%d entries compared, want 262 (314 less 52 num_batches_tracked)", entries);
    /* sum(p.numel() for p in model.parameters()) */
    CHECK(trainable == 241955, "%lld trainable elements, torchvision has 241955", (long long)trainable);
    free(text);
    tg_plan_free(&p);

    /* The default width at ImageNet's 1000 classes: torchvision's 3,504,872 parameters. */
    tg_job job;
    const char *big = "model = mobilenet_v2\nnum_labels = 1000\nbatch = 1\nimage_size = 64\nsteps = 1\n"
                      "train_data = none.jsonl\n";
    REQUIRE(tg_job_parse_text(big, "big.job", NULL, NULL, 0, &job, &err) == 0 && tg_compile(&job, &p, &err) == 0, "%s",
            err.msg);
    trainable = 0;
    for (int k = 0; k < p.n_tensors; k++)
        if ((p.tensors[k].flags & TG_TENSOR_PARAM) && !(p.tensors[k].flags & TG_TENSOR_VIEW))
            trainable += tg_tensor_numel(&p.tensors[k]);
    CHECK(trainable == 3504872, "%lld trainable elements at width 1.0, torchvision has 3504872", (long long)trainable);
    tg_plan_free(&p);
}

/* Each refusal of an image job names its key and the reason. */
TG_TEST(test_mobilenet_v2_job_refusals) {
    static const struct {
        const char *extra, *want;
    } cases[] = {
        {"task=lm", "key 'task': model 'mobilenet_v2' (mobilenet_v2) classifies images: task must be classify"},
        {"seq=64", "key 'seq': model 'mobilenet_v2' (mobilenet_v2) takes images, not token sequences"},
        {"lora_r=4", "key 'lora_r': model 'mobilenet_v2' (mobilenet_v2) takes images, not token sequences"},
        {"recompute=layers", "key 'recompute': model 'mobilenet_v2' (mobilenet_v2) has no transformer layers"},
        {"num_labels=1", "--set num_labels=1: key 'num_labels': 1 is out of range (must be 2.."},
        {"image_channels=2", "key 'image_channels': 2 is not an image's channel count (1: grey, 3: RGB)"},
        {"image_channels=4", "key 'image_channels': 4 is out of range (must be 1..3; 1: grey, 3: RGB)"},
        {"image_size=0", "key 'image_size': 0 is out of range (must be 1..4096; pixels, square images)"},
        {"width_mult=0", "key 'width_mult': 0"},
        {"random_crop_padding=32", "key 'random_crop_padding': 32 must be below image_size 32: a crop of the image "
                                   "padded by as much could miss it entirely"},
        {"random_crop_padding=-1", "key 'random_crop_padding': -1 is out of range (must be 0..4095"},
        {"random_horizontal_flip=2", "key 'random_horizontal_flip'"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        tg_plan p;
        tg_err err = {{0}};
        const int rc = compile_text(cases[k].extra, &p, &err);
        if (!rc) tg_plan_free(&p);
        CHECK(rc == -1 && strstr(err.msg, cases[k].want), "'%s': got '%s', want '%s'", cases[k].extra,
              rc ? err.msg : "(compiled)", cases[k].want);
    }
    /* The image keys on a transformer. */
    tg_job job;
    tg_plan p;
    tg_err err = {{0}};
    const char *bert = "model = tiny-bert\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = none.jsonl\nimage_size = 32\n";
    REQUIRE(tg_job_parse_text(bert, "bert.job", NULL, NULL, 0, &job, &err) == 0, "%s", err.msg);
    const int rc = tg_compile(&job, &p, &err);
    if (!rc) tg_plan_free(&p);
    CHECK(rc == -1 && strstr(err.msg, "bert.job:6: key 'image_size': only image models take it; model 'tiny-bert' is bert"),
          "%s", rc ? err.msg : "(compiled)");
}

/* random_crop_padding and random_horizontal_flip become IMAGE_INPUT's crop_pad and flip,
 * with the step counter and a stream key of its own (the classifier's dropout takes the
 * next); without them the op reads no step and the job's fingerprint is what it was. A
 * transformer refuses them. On the CPU executor the same stored batch comes out augmented
 * differently at each training step and as stored in eval mode. */
TG_TEST(test_mobilenet_v2_augmentation_keys) {
    tg_plan plain, aug;
    tg_err err = {{0}};
    REQUIRE(compile_text("num_labels=3\nimage_channels=3", &plain, &err) == 0, "%s", err.msg);
    REQUIRE(compile_text("num_labels=3\nimage_channels=3\nrandom_crop_padding=4\nrandom_horizontal_flip=true", &aug,
                         &err) == 0,
            "%s", err.msg);
    const tg_op *ops[2] = {NULL, NULL}, *drop = NULL;
    for (int k = 0; k < 2; k++) {
        const tg_plan *p = k ? &aug : &plain;
        for (int o = 0; o < p->n_ops; o++) {
            if (p->ops[o].kind == TG_OP_IMAGE_INPUT) ops[k] = &p->ops[o];
            if (k && p->ops[o].kind == TG_OP_DROPOUT && !drop) drop = &p->ops[o];
        }
    }
    REQUIRE(ops[0] && ops[1] && drop, "an IMAGE_INPUT in each plan and the classifier's dropout");
    CHECK(ops[0]->in[0] == plain.io.pixel_values && ops[0]->in[1] == -1 && ops[0]->p.image_input.crop_pad == 0 &&
              ops[0]->p.image_input.flip == 0 && ops[0]->p.image_input.key == 0,
          "plain: in %d %d, crop_pad %lld flip %lld key %lld", ops[0]->in[0], ops[0]->in[1],
          (long long)ops[0]->p.image_input.crop_pad, (long long)ops[0]->p.image_input.flip,
          (long long)ops[0]->p.image_input.key);
    CHECK(ops[1]->in[1] == aug.io.step && ops[1]->p.image_input.crop_pad == 4 && ops[1]->p.image_input.flip == 1 &&
              ops[1]->p.image_input.key != drop->p.dropout.key && ops[1]->p.image_input.mean1 == 0.5f &&
              ops[1]->p.image_input.std2 == 0.5f,
          "augmented: step %d, crop_pad %lld, flip %lld, key %lld (dropout's %lld)", ops[1]->in[1],
          (long long)ops[1]->p.image_input.crop_pad, (long long)ops[1]->p.image_input.flip,
          (long long)ops[1]->p.image_input.key, (long long)drop->p.dropout.key);
    CHECK(plain.fingerprint != aug.fingerprint, "the augmentation keys leave the fingerprint");

    tg_trainer tr;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 2, .load_data = 0};
    REQUIRE(tg_trainer_open(&tr, &aug, &o, &err) == 0, "%s", err.msg);
    const int x_t = tg_test_tensor_named(&aug, "pixel_values.normalized");
    const int64_t n = tg_tensor_numel(&aug.tensors[x_t]);
    float *x[3];
    for (int k = 0; k < 3; k++) x[k] = malloc(sizeof(float) * (size_t)n);
    REQUIRE(x[0] && x[1] && x[2] && x_t >= 0, "out of memory");
    tg_test_fill_pixels(&tr, &aug, 5);
    int32_t *labels = tg_trainer_input(&tr, aug.io.labels);
    for (int b = 0; b < 4; b++) labels[b] = b % 3;
    /* Two training steps on the same stored batch, then its eval forward. */
    for (int k = 0; k < 3; k++)
        REQUIRE(tg_trainer_run(&tr, TG_PHASE_FORWARD, k < 2 ? TG_PHASE_OPTIMIZER : TG_PHASE_FORWARD, k < 2, &err) == 0 &&
                    (k == 2 || tg_trainer_run(&tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 1, &err) == 0) &&
                    tg_trainer_read(&tr, x_t, x[k], &err) == 0,
                "run %d: %s", k, err.msg);
    uint8_t *stored = malloc((size_t)n);
    REQUIRE(stored && tg_trainer_read(&tr, aug.io.pixel_values, stored, &err) == 0, "%s", err.msg);
    int as_stored = 1;
    const int64_t S = aug.model.image_size, C = 3;
    for (int64_t i = 0; i < n && as_stored; i++) {
        const int64_t b = i / (S * S * C), c = i % C, pix = i / C % (S * S);
        as_stored = x[2][i] == ((float)stored[(b * C + c) * S * S + pix] / 255.0f - 0.5f) / 0.5f;
    }
    CHECK(memcmp(x[0], x[1], sizeof(float) * (size_t)n) != 0, "two training steps augmented the batch alike");
    CHECK(as_stored, "eval mode: the input is not the stored batch normalised");
    for (int k = 0; k < 3; k++) free(x[k]);
    free(stored);
    tg_trainer_close(&tr);
    tg_plan_free(&plain);
    tg_plan_free(&aug);

    tg_job job;
    tg_plan p;
    const char *bert = "model = tiny-bert\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = none.jsonl\nrandom_horizontal_flip = 1\n";
    REQUIRE(tg_job_parse_text(bert, "bert.job", NULL, NULL, 0, &job, &err) == 0, "%s", err.msg);
    const int rc = tg_compile(&job, &p, &err);
    if (!rc) tg_plan_free(&p);
    CHECK(rc == -1 && strstr(err.msg, "bert.job:6: key 'random_horizontal_flip': only image models take it"), "%s",
          rc ? err.msg : "(compiled)");
}

/* The plan file holds the image model whole (re-encoded byte for byte), and the decoder's
 * io check refuses images of another size than the model's. */
TG_TEST(test_mobilenet_v2_plan_file) {
    tg_plan p, back;
    tg_err err;
    REQUIRE(compile_text("num_labels=3\nimage_channels=1", &p, &err) == 0, "%s", err.msg);
    CHECK(p.model.arch == TG_ARCH_MOBILENET_V2 && p.model.image_channels == 1 && p.model.image_size == 32 &&
              p.model.width_mult == 0.25f && p.model.batch_norm_momentum == 0.1f && p.model.layer_norm_eps == 1e-5f &&
              p.model.classifier_dropout == 0.2f,
          "model config: channels %d size %d width %g momentum %g eps %g dropout %g", p.model.image_channels,
          p.model.image_size, (double)p.model.width_mult, (double)p.model.batch_norm_momentum,
          (double)p.model.layer_norm_eps, (double)p.model.classifier_dropout);
    CHECK(p.io.pixel_values >= 0 && p.io.input_ids < 0 && p.io.attention_mask < 0 && p.io.position_ids < 0,
          "io: pixel_values %d, input_ids %d", p.io.pixel_values, p.io.input_ids);
    uint8_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    REQUIRE(tg_plan_encode(&p, &a, &na, &err) == 0, "%s", err.msg);
    REQUIRE(tg_plan_decode(a, na, "tiny.tgp", &back, &err) == 0, "%s", err.msg);
    REQUIRE(tg_plan_encode(&back, &b, &nb, &err) == 0, "%s", err.msg);
    CHECK(na == nb && !memcmp(a, b, na), "the decoded plan re-encodes differently");
    CHECK(back.model.image_channels == 1 && back.io.pixel_values == p.io.pixel_values, "decoded model or io differs");
    tg_plan_free(&back);
    free(a), free(b);
    p.model.image_size = 33;
    REQUIRE(tg_plan_encode(&p, &a, &na, &err) == 0, "%s", err.msg);
    CHECK(tg_plan_decode(a, na, "tiny.tgp", &back, &err) == -1 &&
              strstr(err.msg, "io pixel_values is tensor 0 (pixel_values) of shape [4, 1, 32, 32]; it must be "
                              "[4, 1, 33, 33]"),
          "%s", err.msg);
    free(a);
    tg_plan_free(&p);
}

/* ---- on the CPU ---------------------------------------------------------------------------- */

/* A run that would read JSON Lines (token sequences) is refused before anything is read. */
TG_TEST(test_mobilenet_v2_no_data_sets) {
    tg_plan p;
    tg_err err = {{0}};
    REQUIRE(compile_text("num_labels=3", &p, &err) == 0, "%s", err.msg);
    tg_trainer tr;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1};
    CHECK(tg_trainer_open(&tr, &p, &o, &err) == -1 &&
              !strcmp(err.msg, "none.jsonl: an image model reads an image shard set made by `tunegraph data convert "
                               "--format idx`, not JSON Lines"),
          "%s", err.msg);
    tg_plan_free(&p);
}

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* A learnable task: class k is a bright 8-pixel-wide stripe in column band k of the image,
 * over uniform noise in [0, 128); image i of the set is of class i % 3. Stored as the batch
 * takes them, each image as its channels' planes of bytes. */
static void synthetic_images(int n, int channels, int size, uint8_t *pixels, int32_t *labels, uint64_t seed) {
    uint64_t s = seed;
    for (int i = 0; i < n; i++) {
        const int k = i % 3;
        labels[i] = k;
        for (int c = 0; c < channels; c++)
            for (int y = 0; y < size; y++)
                for (int x = 0; x < size; x++) {
                    int v = (int)(lcg(&s) % 128);
                    if (x >= 2 + 10 * k && x < 10 + 10 * k) v += 128;
                    pixels[(((int64_t)i * channels + c) * size + y) * size + x] = (uint8_t)v;
                }
    }
}

/* The loss of the forward pass in training mode (dropout masks fixed by the step, batch
 * statistics) at the given parameters. */
static double loss_at(tg_trainer *tr, const tg_plan *p, const float *params) {
    tg_err err;
    float loss;
    if (tg_trainer_write(tr, p->io.params_all, params, &err) ||
        tg_trainer_run(tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 1, &err) || tg_trainer_read(tr, p->io.loss, &loss, &err))
        return NAN;
    return loss;
}

/* Every parameter's gradient from the plan's backward (conv2d_bwd, the pointwise
 * convolutions' matmuls, batchnorm_bwd, relu6_bwd, global_avg_pool_bwd, the residual adds,
 * the classifier and its dropout) against central
 * differences of the loss along a direction half the gradient, half random: a check of the
 * wiring (a wrong or missing contribution is off by its whole size), within 5% and 3e-3. The
 * float32 loss through batch normalisations over few values is too rough for a closer one
 * (torch's own float32 gradients of this model are 6e-5 from float64's; steps of 3e-4 meet
 * ReLU6's kinks and the loss's rounding); tests/test_golden_mobilenet.c checks every
 * gradient against torchvision's within 1e-4. */
TG_TEST(test_mobilenet_v2_model_gradient) {
    tg_plan p;
    tg_err err;
    REQUIRE(compile_text("num_labels=3\nimage_size=64", &p, &err) == 0, "%s", err.msg);
    tg_trainer tr;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 2, .load_data = 0};
    REQUIRE(tg_trainer_open(&tr, &p, &o, &err) == 0, "%s", err.msg);
    synthetic_images(4, 3, 64, tg_trainer_input(&tr, p.io.pixel_values), tg_trainer_input(&tr, p.io.labels), 7);
    REQUIRE(tg_trainer_run(&tr, TG_PHASE_FORWARD, TG_PHASE_BACKWARD, 1, &err) == 0, "%s", err.msg);
    const size_t pbytes = p.pool_bytes[TG_POOL_PARAMS];
    float *grads = malloc(pbytes), *saved = malloc(pbytes), *params = malloc(pbytes);
    REQUIRE(grads && saved && params, "out of memory");
    REQUIRE(tg_trainer_read(&tr, p.io.grads_all, grads, &err) == 0 && tg_trainer_read(&tr, p.io.params_all, saved, &err) == 0,
            "%s", err.msg);
    memcpy(params, saved, pbytes);
    uint64_t rng = 99;
    int checked = 0, kinds[3] = {0, 0, 0}, ordinal = -1;
    for (int t = 0; t < p.n_tensors; t++) {
        const tg_tensor *x = &p.tensors[t];
        if (!(x->flags & TG_TENSOR_PARAM) || (x->flags & TG_TENSOR_VIEW)) continue;
        /* A sample across the model: every fourth parameter (in state-dict order, whatever the
         * activations between them) from features.3 on, and the classifier. A step along
         * features.0 .. 2 moves the ReLU6 kinks of every later layer, and there the float32
         * loss's differences are no gradient at all (6 to 20% off either way); the golden
         * test checks those gradients against torchvision's. */
        ++ordinal;
        const int early = !strncmp(x->name, "features.0.", 11) || !strncmp(x->name, "features.1.", 11) ||
                          !strncmp(x->name, "features.2.", 11);
        if ((ordinal % 4 || early) && !strstr(x->name, "classifier")) continue;
        const int64_t n = tg_tensor_numel(x);
        const float *g = grads + x->offset / 4;
        double *v = malloc(sizeof(double) * (size_t)n), gn = 0, vn = 0, analytic = 0;
        REQUIRE(v, "out of memory");
        for (int64_t i = 0; i < n; i++) gn += (double)g[i] * g[i];
        gn = sqrt(gn);
        for (int64_t i = 0; i < n; i++) {
            v[i] = (gn > 0 ? g[i] / gn : 0) + ((double)(lcg(&rng) % 2001) / 1000.0 - 1.0) / sqrt((double)n);
            vn += v[i] * v[i];
        }
        vn = sqrt(vn);
        for (int64_t i = 0; i < n; i++) analytic += g[i] * (v[i] /= vn);
        const double eps = 3e-4;
        float *w = params + x->offset / 4;
        for (int64_t i = 0; i < n; i++) w[i] = (float)(saved[x->offset / 4 + i] + eps * v[i]);
        const double up = loss_at(&tr, &p, params);
        for (int64_t i = 0; i < n; i++) w[i] = (float)(saved[x->offset / 4 + i] - eps * v[i]);
        const double down = loss_at(&tr, &p, params);
        memcpy(w, saved + x->offset / 4, sizeof(float) * (size_t)n);
        const double fd = (up - down) / (2 * eps);
        CHECK(fabs(fd - analytic) <= 5e-2 * fabs(analytic) + 3e-3, "%s: finite difference %.6g, backward %.6g", x->name,
              fd, analytic);
        kinds[x->ndim == 4 ? 0 : strstr(x->name, "classifier") ? 2 : 1]++;
        checked++;
        free(v);
    }
    CHECK(checked > 30 && kinds[0] > 10 && kinds[1] > 10 && kinds[2] == 2,
          "%d parameters checked (%d convolutions, %d normalisations, %d of the classifier)", checked, kinds[0], kinds[1],
          kinds[2]);
    free(grads), free(saved), free(params);
    tg_trainer_close(&tr);
    tg_plan_free(&p);
}

/* Means of a buffer tensor's values. */
static double tensor_mean(tg_trainer *tr, const tg_plan *p, const char *name) {
    for (int t = 0; t < p->n_tensors; t++)
        if (!strcmp(p->tensors[t].name, name)) {
            const int64_t n = tg_tensor_numel(&p->tensors[t]);
            float *v = malloc(sizeof(float) * (size_t)n);
            tg_err err;
            double s = NAN;
            if (v && !tg_trainer_read(tr, t, v, &err)) {
                s = 0;
                for (int64_t i = 0; i < n; i++) s += v[i];
                s /= (double)n;
            }
            free(v);
            return s;
        }
    return NAN;
}

/* 30 steps of AdamW (lr 1e-3, constant) on 12 grey 48 x 48 images in batches of 6: the loss
 * falls from about log 3 to under a quarter of it and the running statistics leave their
 * initial 0 and 1; eval mode reads them (an image's logits the same in any batch) and leaves
 * them; a save writes the trained values under torchvision's names, which load back
 * unchanged; torchvision's num_batches_tracked entries in such a file are passed over as
 * torch passes them. */
TG_TEST(test_mobilenet_v2_trains_on_cpu) {
    tg_plan p;
    tg_err err;
    REQUIRE(compile_text("num_labels=3\nimage_channels=1\nimage_size=48\nbatch=6\nlr=1e-3\nlr_schedule=constant", &p, &err) == 0,
            "%s", err.msg);
    tg_trainer tr;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 2, .load_data = 0};
    REQUIRE(tg_trainer_open(&tr, &p, &o, &err) == 0, "%s", err.msg);
    enum { SET = 12, B = 6, S = 48 };
    static uint8_t pixels[SET * S * S];
    static int32_t labels[SET];
    synthetic_images(SET, 1, S, pixels, labels, 3);
    uint8_t *in = tg_trainer_input(&tr, p.io.pixel_values);
    int32_t *lab = tg_trainer_input(&tr, p.io.labels);
    CHECK(fabs(tensor_mean(&tr, &p, "features.0.1.running_mean")) == 0.0 &&
              tensor_mean(&tr, &p, "features.0.1.running_var") == 1.0,
          "running statistics do not start at 0 and 1");
    double first = 0, last = 0;
    const int steps = 30;
    for (int s = 0; s < steps; s++) {
        const int at = (s % (SET / B)) * B;
        memcpy(in, pixels + (int64_t)at * S * S, (size_t)B * S * S);
        memcpy(lab, labels + at, sizeof(int32_t) * B);
        float loss;
        REQUIRE(tg_trainer_run(&tr, TG_PHASE_FORWARD, TG_PHASE_OPTIMIZER, 1, &err) == 0 &&
                    tg_trainer_read(&tr, p.io.loss, &loss, &err) == 0,
                "step %d: %s", s, err.msg);
        REQUIRE(isfinite(loss), "step %d: loss %g", s, loss);
        if (s < 6) first += loss / 6;
        if (s >= steps - 6) last += loss / 6;
    }
    CHECK(first > 0.8 && last < 0.25 * first, "mean loss of the first 6 steps %.4f, of the last 6 %.4f", first, last);
    const double rm = tensor_mean(&tr, &p, "features.0.1.running_mean"),
                 rv = tensor_mean(&tr, &p, "features.18.1.running_var");
    CHECK(rm != 0.0 && rv != 1.0 && isfinite(rm) && isfinite(rv), "running statistics stayed: mean %g, var %g", rm, rv);
    /* Eval mode normalises with the running statistics: an image's logits do not depend on
     * the rest of its batch (bit for bit), as they do in training mode (batch statistics). */
    float logits[2][2][B * 3];
    for (int mode = 0; mode < 2; mode++)
        for (int k = 0; k < 2; k++) {
            /* Batch 0: images 0..5; batch 1: images 6..11 with image 0 in place of image 9. */
            memcpy(in, pixels + (int64_t)k * B * S * S, (size_t)B * S * S);
            if (k == 1) memcpy(in + 3 * S * S, pixels, (size_t)S * S);
            memcpy(lab, labels + k * B, sizeof(int32_t) * B);
            REQUIRE(tg_trainer_run(&tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, mode, &err) == 0 &&
                        tg_trainer_read(&tr, p.io.logits, logits[mode][k], &err) == 0,
                    "%s", err.msg);
        }
    CHECK(!memcmp(logits[0][0], logits[0][1] + 3 * 3, 3 * sizeof(float)),
          "eval mode: image 0's logits %g %g %g in one batch, %g %g %g in another", logits[0][0][0], logits[0][0][1],
          logits[0][0][2], logits[0][1][9], logits[0][1][10], logits[0][1][11]);
    CHECK(memcmp(logits[1][0], logits[1][1] + 3 * 3, 3 * sizeof(float)) != 0,
          "training mode: image 0's logits do not depend on its batch");
    const double calibrated = tensor_mean(&tr, &p, "features.0.1.running_mean");
    CHECK(calibrated != rm, "the training-mode forwards left the running statistics");
    REQUIRE(tg_trainer_run(&tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 0, &err) == 0, "%s", err.msg);
    CHECK(calibrated == tensor_mean(&tr, &p, "features.0.1.running_mean"), "eval moved the running statistics");

    /* Saved under torchvision's names; loaded back (with torchvision's num_batches_tracked
     * added) into a fresh image, every value equal. */
    char path[512], with_counts[512];
    snprintf(path, sizeof path, "%s/model.safetensors", tg_test_tmpdir());
    snprintf(with_counts, sizeof with_counts, "%s/torchvision.safetensors", tg_test_tmpdir());
    REQUIRE(tg_trainer_save(&tr, path, &err) == 0, "%s", err.msg);
    static tg_safetensors stf;
    tg_safetensors *st = &stf;
    REQUIRE(tg_st_open(path, st, &err) == 0, "%s", err.msg);
    int n_items = 0, n_counts = 0;
    tg_st_item items[400];
    static float data[400][4096];
    static int64_t shapes[400][4], one_shape[1] = {0};
    static int64_t zero64 = 7;
    for (int t = 0; t < p.n_tensors && n_items < 380; t++) {
        const tg_tensor *x = &p.tensors[t];
        if (!value_tensor(x)) continue;
        const tg_st_entry *e = tg_st_find(st, x->name);
        if (!CHECK(e && tg_st_numel(e) == tg_tensor_numel(x), "%s: not in the saved file", x->name)) continue;
        if (tg_tensor_numel(x) > 4096) continue; /* the larger weights are compared through the load below */
        REQUIRE(tg_st_read_f32(st, e, data[n_items], tg_tensor_numel(x), &err) == 0, "%s", err.msg);
        for (int d = 0; d < x->ndim; d++) shapes[n_items][d] = x->shape[d];
        items[n_items] = (tg_st_item){x->name, TG_ST_F32, x->ndim, shapes[n_items], data[n_items]};
        n_items++;
        if (x->flags & TG_TENSOR_BUFFER && strstr(x->name, "running_var")) {
            static char names[200][TG_NAME_MAX];
            snprintf(names[n_counts], TG_NAME_MAX, "%.*s.num_batches_tracked",
                     (int)(strlen(x->name) - strlen(".running_var")), x->name);
            items[n_items++] = (tg_st_item){names[n_counts++], TG_ST_I64, 0, one_shape, &zero64};
        }
    }
    tg_st_close(st);
    CHECK(n_counts == 52, "%d batch norms, torchvision's has 52", n_counts);
    REQUIRE(tg_st_write(with_counts, items, n_items, &err) == 0, "%s", err.msg);
    tg_weights_image img;
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
    tg_weights_report report;
    memset(&report, 0, sizeof report);
    REQUIRE(tg_weights_load(&img, with_counts, &report, &err) == 0, "%s", err.msg);
    CHECK(report.unexpected == 0 && report.ignored == 52, "unexpected %d, ignored %d", report.unexpected,
          report.ignored);
    int compared = 0;
    for (int k = 0; k < n_items; k++) {
        if (items[k].dtype != TG_ST_F32) continue;
        for (int t = 0; t < p.n_tensors; t++)
            if (value_tensor(&p.tensors[t]) && !strcmp(p.tensors[t].name, items[k].name)) {
                const float *v = tg_weights_value(&img, t);
                CHECK(v && !memcmp(v, items[k].data, sizeof(float) * (size_t)tg_tensor_numel(&p.tensors[t])),
                      "%s differs after the round trip", items[k].name);
                compared++;
            }
    }
    CHECK(compared == n_items - n_counts, "%d of %d values compared", compared, n_items - n_counts);
    tg_weights_report_free(&report);
    tg_weights_image_free(&img);
    tg_trainer_close(&tr);
    tg_plan_free(&p);
}

/* An image shard set at dir of n images of c x s x s (train split), pixel k of image i
 * (i mul + k step) % 256 (also into pixels, n c s s ids), label i % n_labels (at most 3). */
static int write_image_set(const char *dir, int n, int c, int s, int n_labels, int mul, int step, int32_t *pixels,
                           tg_err *err) {
    static char *const names[3] = {"a", "b", "c"};
    const int per = c * s * s;
    tg_shard_set_desc desc = {.task = TG_SHARD_IMAGE, .seq = per, .n_labels = n_labels, .labels = names,
                              .vocab_size = 256, .command = "test", .image_channels = c, .image_height = s,
                              .image_width = s};
    tg_shard_writer *w;
    if (tg_shard_writer_open(dir, &desc, &w, err)) return -1;
    for (int i = 0; i < n; i++) {
        int32_t *px = pixels + (int64_t)i * per;
        for (int k = 0; k < per; k++) px[k] = (i * mul + k * step) % 256;
        const tg_shard_record rec = {.len = per, .input_ids = px, .label = i % n_labels};
        if (tg_shard_writer_add(w, TG_SPLIT_TRAIN, &rec, err)) {
            tg_shard_writer_abort(w);
            return -1;
        }
    }
    return tg_shard_writer_commit(w, err);
}

/* The trainer's batch holds each image as the shard set stores it (three planes of bytes
 * for RGB), and the plan's IMAGE_INPUT makes the network's channels-last input of it:
 * x[r, i, c] = (byte[c plane + i] / 255 - image_mean[c]) / image_std[c] for each row's
 * image, with the per-channel normalisation telling the channels apart. */
TG_TEST(test_mobilenet_v2_batch_channels_last) {
    enum { N = 4, C = 3, S = 4, PLANE = S * S, PER = C * PLANE };
    char dir[600], job_text[1600];
    snprintf(dir, sizeof dir, "%s/rgb-set", tg_test_tmpdir());
    static int32_t pixels[N][PER];
    tg_err err = {{0}};
    REQUIRE(write_image_set(dir, N, C, S, 3, 61, 5, pixels[0], &err) == 0, "%s", err.msg);
    snprintf(job_text, sizeof job_text,
             "model = mobilenet_v2\nnum_labels = 3\nimage_channels = 3\nimage_size = %d\nwidth_mult = 0.25\n"
             "batch = %d\nsteps = 1\nimage_mean = 0.5, 0.25, 0.125\nimage_std = 0.5, 2, 0.25\n"
             "train_data = %s\n",
             S, N, dir);
    tg_job job;
    tg_plan p;
    REQUIRE(tg_job_parse_text(job_text, "rgb.job", NULL, NULL, 0, &job, &err) == 0 && tg_compile(&job, &p, &err) == 0,
            "%s", err.msg);
    const tg_tensor *px = &p.tensors[p.io.pixel_values];
    CHECK(px->dtype == TG_U8 && px->ndim == 4 && px->shape[0] == N && px->shape[1] == C && px->shape[2] == S &&
              px->shape[3] == S,
          "pixel_values is %s [%lld, %lld, %lld, %lld]", tg_dtype_name(px->dtype), (long long)px->shape[0],
          (long long)px->shape[1], (long long)px->shape[2], (long long)px->shape[3]);
    const int x_t = tg_test_tensor_named(&p, "pixel_values.normalized");
    REQUIRE(x_t >= 0 && p.tensors[x_t].ndim == 4 && p.tensors[x_t].shape[1] == S && p.tensors[x_t].shape[3] == C,
            "no channels-last pixel_values.normalized");
    tg_trainer tr;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1};
    REQUIRE(tg_trainer_open(&tr, &p, &o, &err) == 0, "%s", err.msg);
    tg_step_stats stats;
    REQUIRE(tg_trainer_step(&tr, &stats, &err) == 0, "%s", err.msg);
    static uint8_t stored[N * PER];
    static float got[N * PER];
    /* A batch through the forward alone (its input is live after it), then what the
     * executor was given and made of it. */
    REQUIRE(tg_trainer_run(&tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 1, &err) == 0 &&
                tg_trainer_read(&tr, p.io.pixel_values, stored, &err) == 0 && tg_trainer_read(&tr, x_t, got, &err) == 0,
            "%s", err.msg);
    static const float mean[C] = {0.5f, 0.25f, 0.125f}, std[C] = {0.5f, 2, 0.25f};
    int matched = 0;
    for (int r = 0; r < N; r++)
        for (int n = 0; n < N; n++) { /* the sampler's order is its own: find the row's image */
            int same_image = 1;
            for (int k = 0; k < PER && same_image; k++) same_image = stored[r * PER + k] == pixels[n][k];
            for (int i = 0; i < PLANE && same_image; i++)
                for (int c = 0; c < C && same_image; c++) {
                    const float want = ((float)pixels[n][c * PLANE + i] / 255.0f - mean[c]) / std[c];
                    same_image = got[(r * PLANE + i) * C + c] == want;
                }
            matched += same_image;
        }
    CHECK(matched == N, "%d of %d batch rows are an image of the set, stored as planes and normalised [S, S, C]", matched, N);
    tg_trainer_close(&tr);
    tg_plan_free(&p);
}

/* An image set in memory: a byte a pixel as stored (channel planes), no ids; each example's
 * bytes and label the record's, the set's pixel count its n_tokens. */
TG_TEST(test_mobilenet_v2_image_set_as_bytes) {
    enum { N = 6, C = 3, S = 5, PER = C * S * S };
    char dir[600];
    snprintf(dir, sizeof dir, "%s/bytes-set", tg_test_tmpdir());
    static int32_t pixels[N][PER];
    tg_err err = {{0}};
    REQUIRE(write_image_set(dir, N, C, S, 2, 97, 13, pixels[0], &err) == 0, "%s", err.msg);
    const tg_data_rules rules = {.task = TG_TASK_CLASSIFY, .num_labels = 2, .image_channels = C, .image_size = S};
    tg_dataset ds;
    REQUIRE(tg_shard_dataset_load(dir, &rules, 0, &ds, &err) == 0, "%s", err.msg);
    int same = 0;
    for (int n = 0; n < ds.n; n++) {
        const tg_example *e = &ds.examples[n];
        int ok = e->len == PER && !e->input_ids && !e->token_type_ids && e->pixels && e->label == n % 2;
        for (int k = 0; ok && k < PER; k++) ok = e->pixels[k] == pixels[n][k];
        ok = ok && (n == 0 || e->pixels == ds.examples[n - 1].pixels + PER); /* one block */
        same += ok;
    }
    CHECK(ds.n == N && same == N && ds.n_tokens == (int64_t)N * PER, "%d examples, %d as stored, %lld pixels", ds.n,
          same, (long long)ds.n_tokens);
    tg_dataset_free(&ds);
    CHECK(ds.examples == NULL && ds.n == 0, "not cleared");
}

/* `export`'s folder: a config.json that reads back as the plan's model (the job's image
 * keys in it), and a model.safetensors holding exactly torchvision's state-dict entries but
 * num_batches_tracked, in fp32 (what torchvision's load_state_dict(strict=True) takes: torch
 * fills num_batches_tracked in when a state dict lacks it). */
TG_TEST(test_mobilenet_v2_export_folder) {
    tg_plan p;
    tg_err err;
    REQUIRE(compile_text("num_labels=3\nimage_channels=1\nimage_size=40", &p, &err) == 0, "%s", err.msg);
    tg_trainer tr;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 0};
    REQUIRE(tg_trainer_open(&tr, &p, &o, &err) == 0, "%s", err.msg);
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/exported", tg_test_tmpdir());
    tg_hf_export_options eo = {.out_dir = dir};
    REQUIRE(tg_trainer_export_hf(&tr, &eo, &err) == 0, "%s", err.msg);
    tg_model_config back;
    snprintf(path, sizeof path, "%s/config.json", dir);
    REQUIRE(tg_model_config_parse(path, &back, &err) == 0, "%s", err.msg);
    CHECK(back.arch == TG_ARCH_MOBILENET_V2 && back.image_channels == 1 && back.image_size == 40 &&
              back.width_mult == 0.25f && back.classifier_dropout == p.model.classifier_dropout &&
              back.layer_norm_eps == p.model.layer_norm_eps && back.batch_norm_momentum == p.model.batch_norm_momentum,
          "config.json reads back as channels %d size %d width %g", back.image_channels, back.image_size,
          (double)back.width_mult);
    char *text = tg_test_read_file(path, NULL);
    CHECK(text && strstr(text, "\"architectures\": [\n    \"MobileNetV2\"\n  ]") && strstr(text, "\"num_labels\": 3") &&
              !strstr(text, "pad_token_id"),
          "config.json: %s", text ? text : "(none)");
    free(text);
    static tg_safetensors st;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    REQUIRE(tg_st_open(path, &st, &err) == 0, "%s", err.msg);
    char *names = tg_test_read_file("tests/data/mobilenet_v2_w0.25_c3_state_dict.txt", NULL);
    REQUIRE(names, "tests/data/mobilenet_v2_w0.25_c3_state_dict.txt not readable");
    int found = 0;
    for (char *line = strtok(names, "\n"); line; line = strtok(NULL, "\n")) {
        char name[TG_NAME_MAX];
        if (line[0] == '#' || strstr(line, "num_batches_tracked") || sscanf(line, "%95s", name) != 1) continue;
        const tg_st_entry *e = tg_st_find(&st, name);
        CHECK(e && e->dtype == TG_ST_F32, "%s: %s", name, e ? tg_st_dtype_name(e->dtype) : "not in the export");
        found += e != NULL;
    }
    CHECK(found == 262 && st.n == 262, "%d of torchvision's 262 entries found, the file holds %d", found, st.n);
    free(names);
    tg_st_close(&st);
    tg_trainer_close(&tr);
    tg_plan_free(&p);
}

/* fuse_bn_relu6 (the default): each Conv2dNormActivation's ReLU6 runs inside its batch
 * norm's op, forward (the clamp after the normalisation) and backward (dy masked by the
 * ReLU6's output): no RELU6 ops, two passes fewer over each such activation, and training
 * bit for bit the same as the separate ops (three steps' losses, every parameter and running statistic). */
TG_TEST(test_mobilenet_v2_fused_bn_relu6_trains_the_same) {
    tg_plan p[2];
    tg_err err;
    REQUIRE(compile_text("num_labels=3\nimage_channels=1\nimage_size=40\nbatch=4\nlr=1e-3", &p[0], &err) == 0, "%s",
            err.msg);
    REQUIRE(compile_text("num_labels=3\nimage_channels=1\nimage_size=40\nbatch=4\nlr=1e-3\nfuse_bn_relu6=false", &p[1],
                         &err) == 0,
            "%s", err.msg);
    int relu6[2] = {0, 0}, fused[2] = {0, 0};
    for (int k = 0; k < 2; k++)
        for (int o = 0; o < p[k].n_ops; o++) {
            relu6[k] += p[k].ops[o].kind == TG_OP_RELU6 || p[k].ops[o].kind == TG_OP_RELU6_BWD;
            fused[k] += (p[k].ops[o].kind == TG_OP_BATCHNORM && p[k].ops[o].p.batchnorm.relu6) ||
                        (p[k].ops[o].kind == TG_OP_BATCHNORM_BWD && p[k].ops[o].p.batchnorm_bwd.relu6);
        }
    CHECK(relu6[0] == 0 && fused[0] == 70 && relu6[1] == 70 && fused[1] == 0,
          "fused plan: %d ReLU6 ops, %d fused batch norms; separate: %d and %d", relu6[0], fused[0], relu6[1], fused[1]);
    tg_trainer tr[2];
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 2, .load_data = 0};
    REQUIRE(tg_trainer_open(&tr[0], &p[0], &o, &err) == 0, "%s", err.msg);
    REQUIRE(tg_trainer_open(&tr[1], &p[1], &o, &err) == 0, "%s", err.msg);
    enum { B = 4, S = 40 };
    static uint8_t pixels[3 * B * S * S];
    static int32_t labels[3 * B];
    synthetic_images(3 * B, 1, S, pixels, labels, 11);
    for (int s = 0; s < 3; s++) {
        float loss[2];
        for (int k = 0; k < 2; k++) {
            memcpy(tg_trainer_input(&tr[k], p[k].io.pixel_values), pixels + (int64_t)s * B * S * S,
                   (size_t)B * S * S);
            memcpy(tg_trainer_input(&tr[k], p[k].io.labels), labels + s * B, sizeof(int32_t) * B);
            REQUIRE(tg_trainer_run(&tr[k], TG_PHASE_FORWARD, TG_PHASE_OPTIMIZER, 1, &err) == 0 &&
                        tg_trainer_read(&tr[k], p[k].io.loss, &loss[k], &err) == 0,
                    "%s", err.msg);
        }
        CHECK(loss[0] == loss[1], "step %d: loss fused %.9g, separate %.9g", s, loss[0], loss[1]);
    }
    int compared = 0;
    for (int t = 0; t < p[0].n_tensors; t++) {
        const tg_tensor *x = &p[0].tensors[t];
        if (!value_tensor(x)) continue;
        int u = -1;
        for (int k = 0; k < p[1].n_tensors && u < 0; k++)
            if (!strcmp(p[1].tensors[k].name, x->name)) u = k;
        if (!CHECK(u >= 0, "%s: not in the separate plan", x->name)) continue;
        float *a = malloc(x->bytes), *b = malloc(x->bytes);
        REQUIRE(a && b, "out of memory");
        REQUIRE(tg_trainer_read(&tr[0], t, a, &err) == 0 && tg_trainer_read(&tr[1], u, b, &err) == 0, "%s", err.msg);
        compared += CHECK(!memcmp(a, b, x->bytes), "%s differs after 3 steps", x->name);
        free(a), free(b);
    }
    CHECK(compared > 200, "%d values compared", compared);
    tg_trainer_close(&tr[0]), tg_trainer_close(&tr[1]);
    tg_plan_free(&p[0]), tg_plan_free(&p[1]);
}
