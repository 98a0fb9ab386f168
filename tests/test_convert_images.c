/* `data convert --format images` (datasets/convert_images.h): a folder per label of PNG
 * and JPEG files to an image shard set, read back record by record (labels in order,
 * files in name order, each image decoded to the channels asked for and resized as the
 * IDX path does), label folders named by whole numbers ordered by value, images of one
 * size kept as they are, and every refusal naming the file and leaving no set behind:
 * a missing folder, no label folders, an empty label folder, a corrupt, truncated or
 * non-image file, images of another size without --image-size, options of other formats.
 * The CLI's report and its refusals. */
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "datasets/convert.h"
#include "datasets/file_bytes.h"
#include "datasets/idx.h"
#include "datasets/image_decode.h"
#include "datasets/shard_reader.h"
#include "tests/cli_in_process.h"
#include "tests/harness.h"
#include "tests/image_fixtures.h"

static void make_dir(const char *root, const char *sub) {
    char path[800];
    snprintf(path, sizeof path, "%s%s%s", root, sub[0] ? "/" : "", sub);
    CHECK(mkdir(path, 0755) == 0, "cannot make %s", path);
}

static const char *join(char *buf, size_t cap, const char *a, const char *b) {
    snprintf(buf, cap, "%s/%s", a, b);
    return buf;
}

/* Small images in several kinds; pixel values vary so a resize shows. */
static const uint8_t k_gray[4 * 6] = {0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110,
                                      120, 130, 140, 150, 160, 170, 180, 190, 200, 210, 220, 230};

static void write_gray_png(const char *path) {
    CHECK(tg_test_write_png(path, &(tg_test_png){6, 4, PNG_COLOR_TYPE_GRAY, 8, k_gray, .interlace = 0}) == 0,
          "cannot write %s", path);
}

static void write_rgba_png(const char *path, uint8_t shift) {
    uint8_t px[4 * 6 * 4];
    for (int k = 0; k < 24; k++)
        px[4 * k] = (uint8_t)(k * 10 + shift), px[4 * k + 1] = (uint8_t)(255 - k * 10), px[4 * k + 2] = (uint8_t)(k * 3),
        px[4 * k + 3] = (uint8_t)k;
    CHECK(tg_test_write_png(path, &(tg_test_png){6, 4, PNG_COLOR_TYPE_RGB_ALPHA, 8, px, .interlace = 0}) == 0,
          "cannot write %s", path);
}

static void write_palette_png(const char *path) {
    static const uint8_t pal[6] = {255, 0, 0, 0, 0, 255};
    static const uint8_t trns[1] = {0};
    /* 8 bits an index, 6 x 4: alternating columns. */
    uint8_t idx[24];
    for (int k = 0; k < 24; k++) idx[k] = (uint8_t)(k % 2);
    CHECK(tg_test_write_png(path, &(tg_test_png){6, 4, PNG_COLOR_TYPE_PALETTE, 8, idx, pal, 2, trns, 1, 0}) == 0,
          "cannot write %s", path);
}

static void write_rgb_jpeg(const char *path) {
    uint8_t px[8 * 8 * 3];
    for (int k = 0; k < 64; k++) px[3 * k] = (uint8_t)(k * 4), px[3 * k + 1] = 90, px[3 * k + 2] = (uint8_t)(250 - k);
    CHECK(tg_test_write_jpeg(path, 8, 8, 3, px, 95, 0) == 0, "cannot write %s", path);
}

/* What the converter should have written for the file: decoded and resized to s x s. */
static uint8_t *expected(const char *path, int32_t channels, int32_t s) {
    char *buf;
    size_t len;
    tg_err err;
    tg_image im;
    if (tg_file_bytes(path, &buf, &len, &err)) return NULL;
    int rc = tg_image_decode((const uint8_t *)buf, len, path, channels, &im, &err);
    free(buf);
    if (rc) return NULL;
    uint8_t *out = malloc((size_t)channels * s * s);
    tg_image_resize_bilinear(im.pixels, channels, im.height, im.width, out, s, s);
    tg_image_free(&im);
    return out;
}

static int convert_images(const char *root, const char *out, int32_t size, int32_t channels, double eval_fraction,
                          tg_convert_report *rep, tg_err *err) {
    const char *inputs[1] = {root};
    tg_convert_options o = {.inputs = inputs, .n_inputs = 1, .outdir = out, .format = TG_INPUT_IMAGES,
                            .doc_stride = -1, .image_size = size, .image_channels = channels,
                            .eval_fraction = eval_fraction, .seed = 7, .command = "test"};
    return tg_convert(&o, NULL, rep, err);
}

TG_TEST(test_convert_image_folders_to_image_set) {
    const char *dir = tg_test_tmpdir();
    char root[700], p[900], out[700];
    snprintf(root, sizeof root, "%s/pets", dir);
    make_dir(root, "");
    make_dir(root, "dog");
    make_dir(root, "cat");
    make_dir(root, "cat/nested"); /* left out: files directly in a label folder only */
    write_gray_png(join(p, sizeof p, root, "cat/b-gray.png"));
    write_rgb_jpeg(join(p, sizeof p, root, "cat/a-rgb.jpg"));
    write_gray_png(join(p, sizeof p, root, "cat/nested/x.png"));
    CHECK(tg_test_write_file(join(p, sizeof p, root, "cat/.DS_Store"), "not an image") == 0, "hidden file");
    CHECK(tg_test_write_file(join(p, sizeof p, root, "README.txt"), "files under ROOT are left out") == 0, "readme");
    write_rgba_png(join(p, sizeof p, root, "dog/2.png"), 3);
    write_palette_png(join(p, sizeof p, root, "dog/10.png")); /* file names in byte order: "10" before "2" */
    static const char *const order[4] = {"cat/a-rgb.jpg", "cat/b-gray.png", "dog/10.png", "dog/2.png"};
    static const int32_t labels[4] = {0, 0, 1, 1};
    for (int32_t channels = 1; channels <= 3; channels += 2) {
        snprintf(out, sizeof out, "%s/set%d", dir, channels);
        tg_convert_report rep;
        tg_err err = {{0}};
        REQUIRE(convert_images(root, out, 5, channels, 0, &rep, &err) == 0, "%s", err.msg);
        const int64_t values = (int64_t)channels * 25;
        CHECK(rep.format == TG_INPUT_IMAGES && rep.task == TG_SHARD_IMAGE && rep.units == 4 && rep.n_labels == 2 &&
                  rep.seq == values && rep.records[0] == 4 && rep.records[1] == 0 && rep.tokens[0] == 4 * values,
              "report: format %d task %d units %lld labels %d seq %d records %lld", rep.format, rep.task,
              (long long)rep.units, rep.n_labels, rep.seq, (long long)rep.records[0]);
        tg_shard_set set;
        REQUIRE(tg_shard_set_open(out, TG_SPLIT_TRAIN, &set, &err) == 0, "%s", err.msg);
        const tg_shard_manifest *m = &set.manifest;
        CHECK(m->task == TG_SHARD_IMAGE && m->image_channels == channels && m->image_height == 5 && m->image_width == 5 &&
                  m->n_labels == 2 && !strcmp(m->labels[0], "cat") && !strcmp(m->labels[1], "dog"),
              "manifest: %d channels, labels %s, %s", m->image_channels, m->n_labels > 0 ? m->labels[0] : "",
              m->n_labels > 1 ? m->labels[1] : "");
        tg_shard_cursor cur;
        REQUIRE(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg);
        for (int64_t r = 0; r < set.n_records && r < 4; r++) {
            tg_shard_record rec;
            if (!CHECK(tg_shard_cursor_get(&cur, r, &rec, &err) == 0, "%s", err.msg)) break;
            uint8_t *want = expected(join(p, sizeof p, root, order[r]), channels, 5);
            int same = want && rec.len == values && rec.label == labels[r];
            for (int64_t k = 0; k < values && same; k++) same = rec.input_ids[k] == want[k];
            CHECK(same, "%d channels: record %lld is not %s (label %d, len %d)", channels, (long long)r, order[r],
                  rec.label, rec.len);
            free(want);
        }
        CHECK(set.n_records == 4, "%lld records", (long long)set.n_records);
        tg_shard_cursor_close(&cur);
        tg_shard_set_close(&set);
    }
    /* The gray PNG by hand: at 3 channels its three planes are the gray plane, resized. */
    uint8_t gray5[25];
    tg_image_resize_bilinear(k_gray, 1, 4, 6, gray5, 5, 5);
    uint8_t *want = expected(join(p, sizeof p, root, "cat/b-gray.png"), 3, 5);
    REQUIRE(want, "cannot decode the gray PNG");
    for (int c = 0; c < 3; c++) CHECK(!memcmp(want + 25 * c, gray5, 25), "gray plane %d differs", c);
    free(want);

    /* An eval split: 1 of the 4 files (ceil(0.25 x 4)); both splits' labels still both. */
    snprintf(out, sizeof out, "%s/split", dir);
    tg_convert_report rep;
    tg_err err = {{0}};
    REQUIRE(convert_images(root, out, 5, 1, 0.25, &rep, &err) == 0, "%s", err.msg);
    CHECK(rep.records[0] == 3 && rep.records[1] == 1 && rep.tokens[1] == 25, "split: %lld + %lld",
          (long long)rep.records[0], (long long)rep.records[1]);
}

/* Label folders named by whole numbers are ordered by value ("2" < "10"), as the text
 * converters order labels; without --image-size, images of one size are kept as stored. */
TG_TEST(test_convert_image_folders_label_order_and_size) {
    const char *dir = tg_test_tmpdir();
    char root[700], p[900], out[700];
    snprintf(root, sizeof root, "%s/digits/", dir); /* a trailing slash is fine */
    make_dir(root, "");
    static const char *const names[3] = {"10", "2", "9"};
    for (int i = 0; i < 3; i++) {
        make_dir(root, names[i]);
        snprintf(p, sizeof p, "%s%s/img.png", root, names[i]);
        write_gray_png(p);
    }
    snprintf(out, sizeof out, "%s/set", dir);
    tg_convert_report rep;
    tg_err err = {{0}};
    REQUIRE(convert_images(root, out, 0, 1, 0, &rep, &err) == 0, "%s", err.msg);
    tg_shard_set set;
    REQUIRE(tg_shard_set_open(out, TG_SPLIT_TRAIN, &set, &err) == 0, "%s", err.msg);
    const tg_shard_manifest *m = &set.manifest;
    CHECK(m->n_labels == 3 && !strcmp(m->labels[0], "2") && !strcmp(m->labels[1], "9") && !strcmp(m->labels[2], "10"),
          "labels in the manifest: %d", m->n_labels);
    CHECK(m->image_channels == 1 && m->image_height == 4 && m->image_width == 6 && m->seq == 24, "stored size %d x %d",
          m->image_height, m->image_width);
    tg_shard_cursor cur;
    REQUIRE(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg);
    for (int64_t r = 0; r < 3; r++) {
        tg_shard_record rec;
        if (!CHECK(tg_shard_cursor_get(&cur, r, &rec, &err) == 0, "%s", err.msg)) break;
        int same = rec.len == 24 && rec.label == r;
        for (int k = 0; k < 24 && same; k++) same = rec.input_ids[k] == k_gray[k];
        CHECK(same, "record %lld: label %d, len %d", (long long)r, rec.label, rec.len);
    }
    tg_shard_cursor_close(&cur);
    tg_shard_set_close(&set);
    /* Mixed names go by bytes: "10" < "a" < "b". */
    snprintf(root, sizeof root, "%s/mixed", dir);
    make_dir(root, "");
    static const char *const mixed[3] = {"b", "a", "10"};
    for (int i = 0; i < 3; i++) {
        make_dir(root, mixed[i]);
        snprintf(p, sizeof p, "%s/%s/img.png", root, mixed[i]);
        write_gray_png(p);
    }
    snprintf(out, sizeof out, "%s/mixed-set", dir);
    REQUIRE(convert_images(root, out, 2, 3, 0, &rep, &err) == 0, "%s", err.msg);
    REQUIRE(tg_shard_set_open(out, TG_SPLIT_TRAIN, &set, &err) == 0, "%s", err.msg);
    m = &set.manifest;
    CHECK(m->n_labels == 3 && !strcmp(m->labels[0], "10") && !strcmp(m->labels[1], "a") && !strcmp(m->labels[2], "b"),
          "mixed labels: %d", m->n_labels);
    tg_shard_set_close(&set);
}

/* Converts root and expects a message holding `want`, and no set. */
static void expect_refusal(const char *dir, const char *root, int32_t size, int32_t channels, const char *want) {
    char out[700];
    snprintf(out, sizeof out, "%s/refused", dir);
    tg_convert_report rep;
    tg_err err = {{0}};
    CHECK(convert_images(root, out, size, channels, 0, &rep, &err) == -1 && strstr(err.msg, want), "message '%s' lacks '%s'",
          err.msg, want);
    struct stat st;
    CHECK(stat(out, &st) != 0, "a failed conversion left %s", out);
}

TG_TEST(test_convert_image_folders_refusals) {
    const char *dir = tg_test_tmpdir();
    char root[700], p[900], want[1200];
    snprintf(root, sizeof root, "%s/none", dir);
    snprintf(want, sizeof want, "%s: cannot open the folder: No such file or directory", root);
    expect_refusal(dir, root, 4, 1, want);
    snprintf(root, sizeof root, "%s/flat", dir);
    make_dir(root, "");
    write_gray_png(join(p, sizeof p, root, "a.png"));
    snprintf(want, sizeof want, "%s: no label folders (the layout is %s/LABEL/FILE, one folder per label)", root, root);
    expect_refusal(dir, root, 4, 1, want);
    snprintf(root, sizeof root, "%s/pets", dir);
    make_dir(root, "");
    make_dir(root, "cat");
    make_dir(root, "dog");
    write_gray_png(join(p, sizeof p, root, "cat/a.png"));
    CHECK(tg_test_write_file(join(p, sizeof p, root, "dog/.hidden.png"), "x") == 0, "hidden");
    snprintf(want, sizeof want, "%s/dog: no image files (every label folder needs at least one; names starting with "
                                "'.' are left out)", root);
    expect_refusal(dir, root, 4, 1, want);
    /* A corrupt PNG (its IDAT's CRC), a truncated one, a JPEG cut short, a text file, an
     * empty file: each named, each leaving no set. */
    write_gray_png(join(p, sizeof p, root, "dog/b.png"));
    size_t len;
    char *png;
    tg_err err;
    REQUIRE(tg_file_bytes(p, &png, &len, &err) == 0, "%s", err.msg);
    FILE *f = fopen(p, "wb");
    REQUIRE(f && fwrite(png, 1, len - 12, f) == len - 12 && fclose(f) == 0, "cannot cut %s", p);
    snprintf(want, sizeof want, "%s: truncated PNG: the file ends after %zu bytes, inside its data", p, len - 12);
    expect_refusal(dir, root, 4, 1, want);
    png[len - 13] ^= 1; /* the last byte of IDAT's CRC */
    f = fopen(p, "wb");
    REQUIRE(f && fwrite(png, 1, len, f) == len && fclose(f) == 0, "cannot write %s", p);
    snprintf(want, sizeof want, "%s: corrupt PNG: IDAT: CRC error", p);
    expect_refusal(dir, root, 4, 1, want);
    free(png);
    remove(p);
    write_rgb_jpeg(join(p, sizeof p, root, "dog/c.jpg"));
    REQUIRE(tg_file_bytes(p, &png, &len, &err) == 0, "%s", err.msg);
    f = fopen(p, "wb");
    REQUIRE(f && fwrite(png, 1, len / 2, f) == len / 2 && fclose(f) == 0, "cannot cut %s", p);
    free(png);
    snprintf(want, sizeof want, "%s: truncated JPEG: Premature end of JPEG file", p);
    expect_refusal(dir, root, 4, 1, want);
    remove(p);
    CHECK(tg_test_write_file(join(p, sizeof p, root, "dog/notes.txt"), "woof") == 0, "text");
    snprintf(want, sizeof want, "%s: not a PNG or JPEG file (it starts with 77 6f 6f 66)", p);
    expect_refusal(dir, root, 4, 1, want);
    CHECK(tg_test_write_file(p, "") == 0, "empty");
    snprintf(want, sizeof want, "%s: an empty file, not a PNG or JPEG image", p);
    expect_refusal(dir, root, 4, 1, want);
    remove(p);
    /* Another size without --image-size (the JPEG is 8 x 8, the PNG before it 6 x 4). */
    write_rgb_jpeg(join(p, sizeof p, root, "dog/d.jpg"));
    snprintf(want, sizeof want, "%s: 8 x 8 pixels, the images before it are 6 x 4 (give --image-size N to resize them "
                                "all to N x N)", p);
    expect_refusal(dir, root, 0, 3, want);
    /* Options: channels, other formats' options, inputs. */
    expect_refusal(dir, root, 4, 2, "--channels 2: images have 1 or 3");
    const char *inputs[2] = {root, root};
    tg_convert_options o = {.inputs = inputs, .n_inputs = 2, .outdir = "x", .format = TG_INPUT_IMAGES, .doc_stride = -1};
    tg_convert_report rep;
    CHECK(tg_convert(&o, NULL, &rep, &err) == -1 &&
              !strcmp(err.msg, "--format images takes one folder (ROOT/LABEL/FILE), got 2 inputs"),
          "%s", err.msg);
    o.n_inputs = 1, o.seq = 16;
    CHECK(tg_convert(&o, NULL, &rep, &err) == -1 &&
              !strcmp(err.msg, "--format images takes --image-size, --channels, --eval-fraction and --seed only"),
          "%s", err.msg);
    o.seq = 0, o.format = TG_INPUT_IDX, o.image_channels = 3;
    CHECK(tg_convert(&o, NULL, &rep, &err) == -1 &&
              !strcmp(err.msg, "--format idx takes --labels FILE, --image-size, --eval-fraction and --seed only"),
          "%s", err.msg);
    o.format = TG_INPUT_CSV;
    CHECK(tg_convert(&o, NULL, &rep, &err) == -1 &&
              !strcmp(err.msg, "--labels FILE, --image-size and --channels are for image inputs (idx, images)"),
          "%s", err.msg);
}

/* The CLI: what it wrote, and its refusals of a tokenizer and of --channels 2. */
TG_TEST(test_cli_data_convert_images) {
    const char *dir = tg_test_tmpdir();
    char root[700], p[900], line[2400], want[1400];
    snprintf(root, sizeof root, "%s/pets", dir);
    make_dir(root, "");
    make_dir(root, "cat");
    make_dir(root, "dog");
    write_gray_png(join(p, sizeof p, root, "cat/a.png"));
    write_rgb_jpeg(join(p, sizeof p, root, "cat/b.jpg"));
    write_palette_png(join(p, sizeof p, root, "dog/c.png"));
    write_rgba_png(join(p, sizeof p, root, "dog/d.png"), 0);
    snprintf(line, sizeof line, "data convert %s -o %s/set --format images --image-size 3 --channels 1 "
                                "--eval-fraction 0.25 --seed 3",
             root, dir);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    snprintf(want, sizeof want,
             "tunegraph: wrote %s/set: image with 2 labels, 3 train records (27 pixels) and 1 eval records (9 pixels) "
             "from 4 images\n",
             dir);
    CHECK(r.status == 0 && r.err && !strcmp(r.err, want), "status %d, stderr '%s'", r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
    snprintf(line, sizeof line, "data convert %s -o %s/set2 --format images --tokenizer vocab.txt", root, dir);
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 2 && r.err && strstr(r.err, "tunegraph: --format images takes no --tokenizer\n"), "status %d, stderr '%s'",
          r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
    snprintf(line, sizeof line, "data convert %s -o %s/set2 --format images --channels 2", root, dir);
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 2 && r.err && strstr(r.err, "tunegraph: --channels must be 1 or 3, got '2'"), "status %d, stderr '%s'",
          r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
    snprintf(line, sizeof line, "data convert %s/cat/a.png -o %s/set2 --format images", root, dir);
    r = tg_test_cli_line(dir, line, NULL);
    snprintf(want, sizeof want, "tunegraph: %s/cat/a.png: cannot open the folder: Not a directory\n", root);
    CHECK(r.status == 1 && r.err && !strcmp(r.err, want), "status %d, stderr '%s'", r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
}
