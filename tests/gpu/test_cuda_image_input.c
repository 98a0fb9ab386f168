/* IMAGE_INPUT on the CUDA executor against the CPU reference, inside whole captured steps:
 * an RGB plan with the augmentation on (random_crop_padding 5, random_horizontal_flip) and a
 * grey one without, fed the same stored bytes; after each of three training steps (the
 * step counter moves the draws) the network's input is the CPU's bit for bit (the draws
 * and the values are the same expressions, kernels/image_input.h, in IEEE float division),
 * the steps' inputs differ from each other where the augmentation is on and are the stored
 * image where it is off, and an eval forward gives the stored image on both. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "runtime/trainer.h"
#include "tests/harness.h"
#include "tests/image_fixtures.h"

typedef struct input_run {
    tg_plan plan;
    tg_trainer tr;
    int x; /* the normalised input's tensor */
} input_run;

static int open_run(input_run *r, tg_device device, int channels, int augment) {
    memset(r, 0, sizeof *r);
    tg_job job;
    tg_err err;
    tg_job_defaults(&job);
    snprintf(job.model, sizeof job.model, "mobilenet_v2");
    job.task = TG_TASK_CLASSIFY, job.num_labels = 4, job.batch = 8, job.steps = 10, job.seed = 23;
    job.lr = 1e-8f, job.image_size = 37, job.image_channels = channels, job.width_mult = 0.35f;
    job.random_crop_padding = augment ? 5 : 0, job.random_horizontal_flip = augment;
    job.n_image_mean = job.n_image_std = channels;
    for (int c = 0; c < channels; c++) job.image_mean[c] = 0.4f + 0.05f * (float)c, job.image_std[c] = 0.2f + 0.03f * (float)c;
    if (!CHECK(tg_compile(&job, &r->plan, &err) == 0, "%s", err.msg)) return 0;
    r->x = tg_test_tensor_named(&r->plan, "pixel_values.normalized");
    tg_trainer_options o = {.device = device, .threads = 0, .load_data = 0, .no_graphs = 0};
    if (!CHECK(r->x >= 0 && tg_trainer_open(&r->tr, &r->plan, &o, &err) == 0, "%s", err.msg)) {
        tg_plan_free(&r->plan);
        return 0;
    }
    return 1;
}

static void compare_inputs(int channels, int augment) {
    input_run run[2];
    if (!open_run(&run[0], TG_DEVICE_CPU, channels, augment)) return;
    if (!open_run(&run[1], TG_DEVICE_CUDA, channels, augment)) {
        tg_trainer_close(&run[0].tr);
        tg_plan_free(&run[0].plan);
        return;
    }
    const int64_t n = tg_tensor_numel(&run[0].plan.tensors[run[0].x]);
    float *got[2][4];
    for (int e = 0; e < 2; e++)
        for (int k = 0; k < 4; k++) {
            got[e][k] = malloc(sizeof(float) * (size_t)n);
            REQUIRE(got[e][k], "out of memory");
            for (int64_t i = 0; i < n; i++) got[e][k][i] = NAN; /* poisoned: the read must overwrite it */
        }
    tg_err err;
    for (int e = 0; e < 2; e++) {
        tg_test_fill_pixels(&run[e].tr, &run[e].plan, 77);
        int32_t *labels = tg_trainer_input(&run[e].tr, run[e].plan.io.labels);
        for (int b = 0; b < 8; b++) labels[b] = b % 4;
        /* Steps 1 to 3 (each read by a forward of its own at that step's counter), then eval. */
        for (int k = 0; k < 4; k++) {
            const int training = k < 3;
            if (training)
                REQUIRE(tg_trainer_run(&run[e].tr, TG_PHASE_FORWARD, TG_PHASE_OPTIMIZER, 1, &err) == 0, "%s", err.msg);
            REQUIRE(tg_trainer_run(&run[e].tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, training, &err) == 0 &&
                        tg_trainer_read(&run[e].tr, run[e].x, got[e][k], &err) == 0,
                    "%s: %s", e ? "cuda" : "cpu", err.msg);
        }
    }
    for (int k = 0; k < 4; k++) {
        int64_t same = 0, finite = 0;
        for (int64_t i = 0; i < n; i++) {
            same += got[0][k][i] == got[1][k][i];
            finite += isfinite(got[1][k][i]) != 0;
        }
        CHECK(same == n && finite == n, "channels %d augment %d, %s %d: %lld of %lld values the CPU's, %lld finite",
              channels, augment, k < 3 ? "step" : "eval", k + 1, (long long)same, (long long)n, (long long)finite);
    }
    const int moved = memcmp(got[1][0], got[1][1], sizeof(float) * (size_t)n) != 0 &&
                      memcmp(got[1][1], got[1][2], sizeof(float) * (size_t)n) != 0;
    const int eval_is_step = !memcmp(got[1][0], got[1][3], sizeof(float) * (size_t)n);
    CHECK(augment ? moved && !eval_is_step : !moved && eval_is_step,
          "augment %d: the steps' inputs %s, eval's %s step 1's", augment, moved ? "differ" : "are alike",
          eval_is_step ? "is" : "is not");
    for (int e = 0; e < 2; e++) {
        for (int k = 0; k < 4; k++) free(got[e][k]);
        tg_trainer_close(&run[e].tr);
        tg_plan_free(&run[e].plan);
    }
}

TG_TEST(test_gpu_image_input_augmented_matches_cpu) { compare_inputs(3, 1); }

TG_TEST(test_gpu_image_input_plain_matches_cpu) { compare_inputs(1, 0); }
