/* `data convert --format idx` (datasets/idx.h, datasets/convert.h): MNIST's IDX images and
 * labels files to an image shard set, read back record by record; the bilinear resize
 * against hand-computed values (torchvision's Resize, antialias off: half-pixel centres,
 * edge clamping, round half to even); the strict parse's refusals naming file and field;
 * the labels file found beside the images by MNIST's names; the manifest's image shape and
 * an image set refused by a token model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "datasets/convert.h"
#include "datasets/dataset.h"
#include "datasets/idx.h"
#include "datasets/shard_dataset.h"
#include "datasets/shard_reader.h"
#include "plan/ops.h"
#include "tests/cli_in_process.h"
#include "tests/harness.h"
#include "tests/image_fixtures.h"

/* An images file of n h x w images (pixel (i, y, x) = (i * 7 + y * w + x) % 256) and a
 * labels file of n labels (i % n_labels); header fields overridable for refusals. */
static uint8_t *idx_images(int32_t n, int32_t h, int32_t w, size_t *len) {
    *len = 16 + (size_t)n * h * w;
    uint8_t *b = malloc(*len);
    b[0] = b[1] = 0, b[2] = 8, b[3] = 3;
    tg_test_put_be32(b + 4, (uint32_t)n), tg_test_put_be32(b + 8, (uint32_t)h), tg_test_put_be32(b + 12, (uint32_t)w);
    for (int32_t i = 0; i < n; i++)
        for (int32_t k = 0; k < h * w; k++) b[16 + (size_t)i * h * w + k] = (uint8_t)((i * 7 + k) % 256);
    return b;
}

static uint8_t *idx_labels(int32_t n, int32_t n_labels, size_t *len) {
    *len = 8 + (size_t)n;
    uint8_t *b = malloc(*len);
    b[0] = b[1] = 0, b[2] = 8, b[3] = 1;
    tg_test_put_be32(b + 4, (uint32_t)n);
    for (int32_t i = 0; i < n; i++) b[8 + i] = (uint8_t)(i % n_labels);
    return b;
}

TG_TEST(test_idx_resize_bilinear_hand_computed) {
    /* 2 x 2 up to 3 x 3: scale 2/3, source rows (and columns) 0, 0.5, 1.1667 (clamped to
     * the last pixel beyond 1). */
    const uint8_t up[4] = {0, 100, 200, 40};
    const uint8_t up_want[9] = {0, 50, 100, 100, 85, 70, 200, 120, 40};
    uint8_t got[16];
    tg_image_resize_bilinear(up, 1, 2, 2, got, 3, 3);
    for (int i = 0; i < 9; i++) CHECK(got[i] == up_want[i], "2x2 -> 3x3: [%d] = %d, want %d", i, got[i], up_want[i]);
    /* 4 x 4 down to 2 x 2: each output the mean of a 2 x 2 block (source 0.5 and 2.5),
     * 2.5 rounding to 2 and 3.5 to 4 (half to even), 0.25 to 0, 254.75 to 255. */
    const uint8_t down[16] = {2, 3, 3, 4, 2, 3, 3, 4, 0, 1, 255, 255, 0, 0, 254, 255};
    const uint8_t down_want[4] = {2, 4, 0, 255};
    tg_image_resize_bilinear(down, 1, 4, 4, got, 2, 2);
    for (int i = 0; i < 4; i++) CHECK(got[i] == down_want[i], "4x4 -> 2x2: [%d] = %d, want %d", i, got[i], down_want[i]);
    /* Two channels are resized plane by plane; a same-size resize is the identity. */
    uint8_t two[8] = {0, 100, 200, 40, 9, 9, 9, 9}, out2[18];
    tg_image_resize_bilinear(two, 2, 2, 2, out2, 3, 3);
    CHECK(!memcmp(out2, up_want, 9), "channel 0 differs");
    for (int i = 9; i < 18; i++) CHECK(out2[i] == 9, "channel 1 [%d] = %d", i - 9, out2[i]);
    tg_image_resize_bilinear(down, 1, 4, 4, got, 4, 4);
    CHECK(!memcmp(got, down, 16), "the identity resize changed pixels");
}

TG_TEST(test_convert_idx_to_image_set) {
    const char *dir = tg_test_tmpdir();
    char images[600], labels[600], out[600];
    snprintf(images, sizeof images, "%s/train-images-idx3-ubyte", dir);
    snprintf(labels, sizeof labels, "%s/train-labels-idx1-ubyte", dir);
    snprintf(out, sizeof out, "%s/set", dir);
    size_t il, ll;
    uint8_t *ib = idx_images(10, 4, 4, &il), *lb = idx_labels(10, 3, &ll);
    REQUIRE(tg_test_write_bytes(images, ib, il) == 0 && tg_test_write_bytes(labels, lb, ll) == 0, "cannot write the IDX files");
    const char *inputs[1] = {images};
    /* The labels file found beside the images; resized to 2 x 2; 2 of 10 to eval. */
    tg_convert_options o = {.inputs = inputs, .n_inputs = 1, .outdir = out, .format = TG_INPUT_IDX, .doc_stride = -1,
                            .image_size = 2, .eval_fraction = 0.2, .seed = 1, .command = "test"};
    tg_convert_report rep;
    tg_err err = {{0}};
    REQUIRE(tg_convert(&o, NULL, &rep, &err) == 0, "%s", err.msg);
    CHECK(rep.task == TG_SHARD_IMAGE && rep.n_labels == 3 && rep.units == 10 && rep.seq == 4, "report task %d labels %d",
          rep.task, rep.n_labels);
    CHECK(rep.records[0] == 8 && rep.records[1] == 2 && rep.tokens[0] == 32, "records %lld + %lld",
          (long long)rep.records[0], (long long)rep.records[1]);
    tg_shard_set set;
    REQUIRE(tg_shard_set_open(out, TG_SPLIT_TRAIN, &set, &err) == 0, "%s", err.msg);
    const tg_shard_manifest *m = &set.manifest;
    CHECK(m->task == TG_SHARD_IMAGE && m->image_channels == 1 && m->image_height == 2 && m->image_width == 2 &&
              m->seq == 4 && m->n_labels == 3 && !strcmp(m->labels[2], "2"),
          "manifest: task %d image %d x %d x %d", m->task, m->image_channels, m->image_height, m->image_width);
    char *text = NULL;
    char mpath[700];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", out);
    text = tg_test_read_file(mpath, NULL);
    CHECK(text && strstr(text, "\"task\": \"image\"") && strstr(text, "\"image\": {\n    \"channels\": 1,\n    \"height\": 2,\n    \"width\": 2\n  }") &&
              !strstr(text, "tokenizer"),
          "manifest.json: %s", text ? text : "(none)");
    free(text);
    /* Each train record: the 4 x 4 image i (train images in input order, 8 of them),
     * resized, with label i % 3. */
    tg_shard_cursor cur;
    REQUIRE(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg);
    int32_t prev = -1;
    for (int64_t r = 0; r < set.n_records; r++) {
        tg_shard_record rec;
        if (!CHECK(tg_shard_cursor_get(&cur, r, &rec, &err) == 0, "%s", err.msg)) break;
        /* Find which input image this is: its first resized pixel is the mean of the
         * top-left block (i * 7 + {0, 1, 4, 5}) % 256 = i * 7 + 2.5 -> even rounding. */
        int32_t i = -1;
        for (int32_t c = prev + 1; c < 10 && i < 0; c++) {
            uint8_t src[16], want[4];
            for (int k = 0; k < 16; k++) src[k] = (uint8_t)((c * 7 + k) % 256);
            tg_image_resize_bilinear(src, 1, 4, 4, want, 2, 2);
            int same = rec.len == 4 && rec.label == c % 3;
            for (int k = 0; k < 4 && same; k++) same = rec.input_ids[k] == want[k];
            if (same) i = c;
        }
        CHECK(i > prev, "train record %lld matches no later input image", (long long)r);
        prev = i;
    }
    tg_shard_cursor_close(&cur);
    tg_shard_set_close(&set);
    /* A token model refuses the set, naming it and its shape. */
    tg_data_rules rules = {TG_TASK_CLASSIFY, 3, 300, 2, 0, 0};
    tg_dataset ds;
    CHECK(tg_shard_dataset_load(out, &rules, 0, &ds, &err) != 0 &&
              strstr(err.msg, "the set holds images (1 x 2 x 2), not token sequences"),
          "a token model took the image set: %s", err.msg);

    /* As stored (no --image-size), --labels FILE given under another name. */
    char other[600];
    snprintf(other, sizeof other, "%s/other-labels", dir);
    REQUIRE(tg_test_write_bytes(other, lb, ll) == 0, "cannot write %s", other);
    o.labels_path = other, o.image_size = 0, o.eval_fraction = 0;
    REQUIRE(tg_convert(&o, NULL, &rep, &err) == 0, "%s", err.msg);
    REQUIRE(tg_shard_set_open(out, TG_SPLIT_TRAIN, &set, &err) == 0, "%s", err.msg);
    CHECK(set.manifest.image_height == 4 && set.n_records == 10, "as stored: %d rows, %lld records",
          set.manifest.image_height, (long long)set.n_records);
    REQUIRE(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg);
    tg_shard_record rec;
    if (CHECK(tg_shard_cursor_get(&cur, 9, &rec, &err) == 0, "%s", err.msg)) {
        CHECK(rec.len == 16 && rec.label == 0, "record 9: len %d label %d", rec.len, rec.label);
        for (int k = 0; k < 16; k++) CHECK(rec.input_ids[k] == (63 + k) % 256, "record 9 pixel %d = %d", k, rec.input_ids[k]);
    }
    tg_shard_cursor_close(&cur);
    tg_shard_set_close(&set);
    free(ib);
    free(lb);
}

static void expect_idx_error(const char *dir, const uint8_t *ib, size_t il, const uint8_t *lb, size_t ll,
                             const char *want_file, const char *want) {
    char images[600], labels[600], out[600];
    snprintf(images, sizeof images, "%s/t10k-images-idx3-ubyte", dir);
    snprintf(labels, sizeof labels, "%s/t10k-labels-idx1-ubyte", dir);
    snprintf(out, sizeof out, "%s/bad", dir);
    if (tg_test_write_bytes(images, ib, il) || tg_test_write_bytes(labels, lb, ll)) {
        CHECK(0, "cannot write the IDX files");
        return;
    }
    const char *inputs[1] = {images};
    tg_convert_options o = {.inputs = inputs, .n_inputs = 1, .outdir = out, .format = TG_INPUT_IDX, .doc_stride = -1};
    tg_convert_report rep;
    tg_err err = {{0}};
    char full[900];
    snprintf(full, sizeof full, "%s/%s: %s", dir, want_file, want);
    CHECK(tg_convert(&o, NULL, &rep, &err) == -1 && strstr(err.msg, full), "message '%s' lacks '%s'", err.msg, full);
    struct stat st;
    CHECK(stat(out, &st) != 0, "a failed conversion left %s", out);
}

TG_TEST(test_convert_idx_refusals) {
    const char *dir = tg_test_tmpdir();
    size_t il, ll;
    uint8_t *ib = idx_images(3, 2, 2, &il), *lb = idx_labels(3, 2, &ll);
    const char *I = "t10k-images-idx3-ubyte", *L = "t10k-labels-idx1-ubyte";
    expect_idx_error(dir, ib, il - 1, lb, ll, I, "the header's dimensions need 28 bytes, the file has 27");
    expect_idx_error(dir, ib, 3, lb, ll, I, "3 bytes, too short for an IDX header");
    ib[0] = 0x1f;
    expect_idx_error(dir, ib, il, lb, ll, I, "magic bytes 1f 00, an IDX file starts with 00 00");
    ib[0] = 0, ib[2] = 0x0d;
    expect_idx_error(dir, ib, il, lb, ll, I, "value type 0x0d, the images file must hold unsigned bytes");
    ib[2] = 8, ib[3] = 1;
    expect_idx_error(dir, ib, il, lb, ll, I, "1 dimensions, an IDX images file has 3 (magic 0x00000803)");
    expect_idx_error(dir, lb, ll, lb, ll, I, "1 dimensions, an IDX images file has 3");
    ib[3] = 3;
    tg_test_put_be32(ib + 8, 0);
    expect_idx_error(dir, ib, 16, lb, ll, I, "rows 0 is outside 1 to 65536");
    /* Dimensions whose product overflows 64 bits. */
    uint8_t huge[16] = {0, 0, 8, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    expect_idx_error(dir, huge, 16, lb, ll, I, "the dimensions overflow");
    tg_test_put_be32(ib + 8, 2);
    lb[3] = 3;
    expect_idx_error(dir, ib, il, lb, ll, L, "3 dimensions, an IDX labels file has 1 (magic 0x00000801)");
    free(lb);
    lb = idx_labels(4, 2, &ll);
    expect_idx_error(dir, ib, il, lb, ll, L, "4 labels, the images file");
    expect_idx_error(dir, ib, il, lb, ll - 1, L, "the header's dimensions need 12 bytes, the file has 11");
    /* No labels file by MNIST's names, and none given. */
    char images[600], out[600];
    snprintf(images, sizeof images, "%s/digits.idx", dir);
    snprintf(out, sizeof out, "%s/bad", dir);
    REQUIRE(tg_test_write_bytes(images, ib, il) == 0, "cannot write %s", images);
    const char *inputs[1] = {images};
    tg_convert_options o = {.inputs = inputs, .n_inputs = 1, .outdir = out, .format = TG_INPUT_IDX, .doc_stride = -1};
    tg_convert_report rep;
    tg_err err = {{0}};
    CHECK(tg_convert(&o, NULL, &rep, &err) == -1 && strstr(err.msg, "digits.idx: no labels file given (--labels FILE)"),
          "%s", err.msg);
    char beside[64];
    CHECK(tg_idx_labels_beside("a/train-images-idx3-ubyte.gz", beside, sizeof beside) == 0 &&
              !strcmp(beside, "a/train-labels-idx1-ubyte.gz"),
          "beside: %s", beside);
    CHECK(tg_idx_labels_beside("d/t10k-images.idx3-ubyte", beside, sizeof beside) == 0 &&
              !strcmp(beside, "d/t10k-labels.idx1-ubyte"),
          "beside: %s", beside);
    CHECK(tg_idx_labels_beside("train-images-idx3-ubyte/x", beside, sizeof beside) == -1, "a folder's name was used");
    free(ib);
    free(lb);
}

/* An image set's manifest: its shape against seq and the token counts, and "image" and
 * "tokenizer" each where they belong. */
TG_TEST(test_image_manifest_fields) {
    const char *dir = tg_test_tmpdir();
    char images[600], out[600], mpath[700];
    snprintf(images, sizeof images, "%s/train-images-idx3-ubyte", dir);
    snprintf(out, sizeof out, "%s/set", dir);
    snprintf(mpath, sizeof mpath, "%s/manifest.json", out);
    size_t il, ll;
    uint8_t *ib = idx_images(4, 3, 2, &il), *lb = idx_labels(4, 2, &ll);
    char labels[600];
    snprintf(labels, sizeof labels, "%s/train-labels-idx1-ubyte", dir);
    REQUIRE(tg_test_write_bytes(images, ib, il) == 0 && tg_test_write_bytes(labels, lb, ll) == 0, "cannot write the IDX files");
    free(ib);
    free(lb);
    const char *inputs[1] = {images};
    tg_convert_options o = {.inputs = inputs, .n_inputs = 1, .outdir = out, .format = TG_INPUT_IDX, .doc_stride = -1};
    tg_convert_report rep;
    tg_err err = {{0}};
    REQUIRE(tg_convert(&o, NULL, &rep, &err) == 0, "%s", err.msg);
    long len = 0;
    char *text = tg_test_read_file(mpath, &len);
    REQUIRE(text, "no manifest");
    tg_shard_manifest m;
    REQUIRE(tg_shard_manifest_parse(text, (size_t)len, "m.json", &m, &err) == 0, "%s", err.msg);
    CHECK(m.task == TG_SHARD_IMAGE && m.image_height == 3 && m.image_width == 2 && m.seq == 6 && m.vocab_size == 256,
          "parsed image %d x %d seq %d", m.image_height, m.image_width, m.seq);
    tg_shard_manifest_free(&m);
    static const struct {
        const char *from, *to, *want;
    } edits[] = {
        {"\"width\": 2", "\"width\": 3", "image 1 x 3 x 3 is 9 values, \"seq\" says 6"},
        {"\"width\": 2", "\"width\": 2, \"depth\": 1", "depth"},
        {"\"height\": 3", "\"height\": 0", "height"},
        {"\"task\": \"image\"", "\"task\": \"classify\"", "tokenizer"},
        {"\"image\": {", "\"tokenizer\": {\"identity\": \"0000000000000000\", \"family\": \"x\", \"vocab_size\": 9}, \"image\": {",
         "an image set has no \"tokenizer\""},
        {"\"train\": 24", "\"train\": 23", "tokens.train 23 is not 4 images of 6 values"},
        {"\"labels\": [\n    \"0\",\n    \"1\"\n  ]", "\"labels\": []", "an image set needs label names"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof *edits; i++) {
        const char *at = strstr(text, edits[i].from);
        if (!CHECK(at, "edit %zu: '%s' not in the manifest", i, edits[i].from)) continue;
        char *e = malloc((size_t)len + strlen(edits[i].to) + 1);
        size_t pre = (size_t)(at - text);
        memcpy(e, text, pre);
        strcpy(e + pre, edits[i].to);
        strcat(e, at + strlen(edits[i].from));
        CHECK(tg_shard_manifest_parse(e, strlen(e), "m.json", &m, &err) == -1 && strstr(err.msg, edits[i].want),
              "edit %zu: '%s' lacks '%s'", i, err.msg, edits[i].want);
        free(e);
    }
    free(text);
}

/* The CLI: what it wrote, and its refusals of a tokenizer and a bad --image-size. */
TG_TEST(test_cli_data_convert_idx) {
    const char *dir = tg_test_tmpdir();
    char images[600], labels[600], line[2400], want[1400];
    snprintf(images, sizeof images, "%s/train-images-idx3-ubyte", dir);
    snprintf(labels, sizeof labels, "%s/train-labels-idx1-ubyte", dir);
    size_t il, ll;
    uint8_t *ib = idx_images(10, 4, 4, &il), *lb = idx_labels(10, 3, &ll);
    REQUIRE(tg_test_write_bytes(images, ib, il) == 0 && tg_test_write_bytes(labels, lb, ll) == 0, "cannot write the IDX files");
    free(ib);
    free(lb);
    snprintf(line, sizeof line, "data convert %s -o %s/set --format idx --image-size 2 --eval-fraction 0.2 --seed 3", images,
             dir);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    snprintf(want, sizeof want,
             "tunegraph: wrote %s/set: image with 3 labels, 8 train records (32 pixels) and 2 eval records (8 pixels) "
             "from 10 images\n",
             dir);
    CHECK(r.status == 0 && r.err && !strcmp(r.err, want), "status %d, stderr '%s'", r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
    snprintf(line, sizeof line, "data convert %s -o %s/set2 --format idx --tokenizer vocab.txt", images, dir);
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 2 && r.err && strstr(r.err, "tunegraph: --format idx takes no --tokenizer (images)\n"),
          "status %d, stderr '%s'", r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
    snprintf(line, sizeof line, "data convert %s -o %s/set2 --format idx --image-size 0", images, dir);
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 2 && r.err && strstr(r.err, "--image-size needs a whole number from 1 to 4096, got '0'"),
          "status %d, stderr '%s'", r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
}
