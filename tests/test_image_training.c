/* Image data end to end through the CLI: a tiny IDX pair (48 images of 8 x 8, three labels
 * each with its own bright half: top, bottom, left, under noise) converted with
 * --image-size 32 and an eval split, then mobilenet_v2 (width 0.25, batch 8) trained on
 * the CPU: the loss falls and the eval's accuracy is printed. Also the refusals: a set
 * whose image shape is not the plan's, and image_mean / image_std of the wrong count. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/cli_in_process.h"
#include "tests/harness.h"

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

static int write_pair(const char *dir) {
    enum { N = 48, S = 8 };
    uint8_t images[16 + N * S * S], labels[8 + N];
    images[0] = images[1] = 0, images[2] = 8, images[3] = 3;
    put_be32(images + 4, N), put_be32(images + 8, S), put_be32(images + 12, S);
    labels[0] = labels[1] = 0, labels[2] = 8, labels[3] = 1;
    put_be32(labels + 4, N);
    uint64_t state = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < N; i++) {
        const int l = i % 3;
        labels[8 + i] = (uint8_t)l;
        for (int y = 0; y < S; y++)
            for (int x = 0; x < S; x++) {
                const int on = l == 0 ? y < S / 2 : l == 1 ? y >= S / 2 : x < S / 2;
                const int noise = (int)(tg_test_rand(&state) % 41) - 20;
                images[16 + (i * S + y) * S + x] = (uint8_t)((on ? 200 : 30) + noise);
            }
    }
    char path[600];
    FILE *f;
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte", dir);
    if (!(f = fopen(path, "wb")) || fwrite(images, 1, sizeof images, f) != sizeof images || fclose(f)) return -1;
    snprintf(path, sizeof path, "%s/train-labels-idx1-ubyte", dir);
    if (!(f = fopen(path, "wb")) || fwrite(labels, 1, sizeof labels, f) != sizeof labels || fclose(f)) return -1;
    return 0;
}

static int write_job(const char *dir, const char *name, const char *extra) {
    char path[600], text[2048];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(text, sizeof text,
             "model = mobilenet_v2\nnum_labels = 3\nimage_channels = 1\nimage_size = 32\nwidth_mult = 0.25\n"
             "batch = 8\nsteps = 60\nlr = 0.003\nlast_batch = drop\nlog_every = 20\n"
             "train_data = %s/set\neval_data = %s/set/eval\n%s",
             dir, dir, extra);
    return tg_test_write_file(path, text);
}

/* The mean loss of metrics lines [from, to) (steps from 1). */
static double mean_loss(const char *metrics, int from, int to) {
    double sum = 0;
    int n = 0;
    for (const char *l = metrics; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        int step;
        double loss;
        if (sscanf(l, "{\"step\": %d, \"loss\": %lf", &step, &loss) == 2 && step >= from && step < to) sum += loss, n++;
    }
    return n ? sum / n : -1;
}

TG_TEST(test_image_training_cli) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_pair(dir) == 0, "cannot write the IDX pair");
    char line[2400];
    snprintf(line, sizeof line,
             "data convert %s/train-images-idx3-ubyte -o %s/set --format idx --image-size 32 --eval-fraction 0.25 "
             "--seed 1",
             dir, dir);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "convert: %s", r.err ? r.err : "");
    tg_cli_run_free(&r);
    REQUIRE(write_job(dir, "img.job", "image_mean = 0.5\nimage_std = 0.5\n") == 0, "cannot write the job");
    snprintf(line, sizeof line, "run %s/img.job --threads 2 --metrics %s/m.jsonl", dir, dir);
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 0, "run: status %d: %s", r.status, r.err ? r.err : "");
    CHECK(r.err && strstr(r.err, "mobilenet_v2 classify on cpu: 36 examples, batch 8"), "run: %s", r.err ? r.err : "");
    CHECK(r.err && strstr(r.err, "eval on 12 examples: loss ") && strstr(r.err, ", accuracy "), "no eval accuracy: %s",
          r.err ? r.err : "");
    tg_cli_run_free(&r);
    char path[700];
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    char *metrics = tg_test_read_file(path, NULL);
    REQUIRE(metrics, "no metrics file");
    const double first = mean_loss(metrics, 1, 11), last = mean_loss(metrics, 51, 61);
    CHECK(first > 0 && last >= 0 && last < 0.6 * first, "the loss did not fall: first 10 steps %.4f, last 10 %.4f", first,
          last);
    free(metrics);

    /* predict: a line per eval image with its index, label and logits, no pixels as ids. */
    snprintf(line, sizeof line, "compile %s/img.job -o %s/img.tgp", dir, dir);
    r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "compile: %s", r.err ? r.err : "");
    tg_cli_run_free(&r);
    snprintf(line, sizeof line, "predict %s/img.tgp -o %s/p.jsonl --threads 2 --init-missing", dir, dir);
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 0, "predict: status %d: %s", r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
    snprintf(path, sizeof path, "%s/p.jsonl", dir);
    char *pred = tg_test_read_file(path, NULL);
    REQUIRE(pred, "no predictions file");
    int lines = 0, shaped = 0;
    for (char *l = pred; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        lines++;
        int index, label;
        shaped += sscanf(l, "{\"index\": %d, \"label\": %d, \"logits\": [", &index, &label) == 2 && index == lines - 1;
    }
    CHECK(lines == 12 && shaped == 12 && !strstr(pred, "input_ids"), "%d lines, %d shaped as {index, label, logits}: %.200s",
          lines, shaped, pred);
    free(pred);

    /* A set of 16 x 16 images for a plan of 32 x 32. */
    snprintf(line, sizeof line, "data convert %s/train-images-idx3-ubyte -o %s/set --format idx --image-size 16 "
             "--eval-fraction 0.25 --seed 1", dir, dir);
    r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "convert: %s", r.err ? r.err : "");
    tg_cli_run_free(&r);
    snprintf(line, sizeof line, "run %s/img.job --threads 1", dir);
    r = tg_test_cli_line(dir, line, NULL);
    char want[1400];
    snprintf(want, sizeof want, "%s/set/manifest.json: the set's images are 1 x 16 x 16, the plan's are 1 x 32 x 32", dir);
    CHECK(r.status != 0 && r.err && strstr(r.err, want), "status %d, stderr '%s'", r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);

    /* One value per channel. */
    REQUIRE(write_job(dir, "bad.job", "image_mean = 0.5, 0.5\n") == 0, "cannot write the job");
    snprintf(line, sizeof line, "compile %s/bad.job -o %s/bad.tgp", dir, dir);
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status != 0 && r.err && strstr(r.err, "key 'image_mean': 2 values for 1 channel (image_channels): one per channel"),
          "status %d, stderr '%s'", r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
    REQUIRE(write_job(dir, "bad.job", "image_std = 0\n") == 0, "cannot write the job");
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status != 0 && r.err && strstr(r.err, "key 'image_std'"), "status %d, stderr '%s'", r.status,
          r.err ? r.err : "");
    tg_cli_run_free(&r);
}
