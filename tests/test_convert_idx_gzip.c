/* IDX files gzip'd as MNIST distributes them (datasets/gunzip.h): converted, the set's
 * records equal the plain files' (one member and two concatenated, labels found beside as
 * ...labels-idx1-ubyte.gz); refused, naming the file: cut short, a failed CRC, bytes after
 * the data, a gunzipped file that is no IDX file ("NAME (gunzipped): ..."), and more bytes
 * than the limit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "datasets/convert.h"
#include "datasets/gunzip.h"
#include "datasets/shard_reader.h"
#include "tests/harness.h"
#include "tests/image_fixtures.h"

/* n images of 5 x 5 (pixel (i, k) = (i * 31 + k * 7) % 256) and their labels (i % 4). */
static uint8_t *idx_images(int32_t n, size_t *len) {
    *len = 16 + (size_t)n * 25;
    uint8_t *b = malloc(*len);
    b[0] = b[1] = 0, b[2] = 8, b[3] = 3;
    tg_test_put_be32(b + 4, (uint32_t)n), tg_test_put_be32(b + 8, 5), tg_test_put_be32(b + 12, 5);
    for (int32_t i = 0; i < n; i++)
        for (int k = 0; k < 25; k++) b[16 + (size_t)i * 25 + k] = (uint8_t)((i * 31 + k * 7) % 256);
    return b;
}

static uint8_t *idx_labels(int32_t n, size_t *len) {
    *len = 8 + (size_t)n;
    uint8_t *b = malloc(*len);
    b[0] = b[1] = 0, b[2] = 8, b[3] = 1;
    tg_test_put_be32(b + 4, (uint32_t)n);
    for (int32_t i = 0; i < n; i++) b[8 + i] = (uint8_t)(i % 4);
    return b;
}

/* b gzip'd (zlib's gzip wrapper), as one member, or two when split_at > 0. */
static uint8_t *gzip_bytes(const uint8_t *b, size_t n, size_t split_at, size_t *out_len) {
    const size_t cap = 2 * n + 256;
    uint8_t *out = malloc(cap);
    size_t used = 0;
    const size_t parts[2][2] = {{0, split_at ? split_at : n}, {split_at ? split_at : n, n}};
    for (int m = 0; m < (split_at ? 2 : 1); m++) {
        z_stream zs;
        memset(&zs, 0, sizeof zs);
        if (deflateInit2(&zs, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) abort();
        zs.next_in = (Bytef *)(b + parts[m][0]), zs.avail_in = (uInt)(parts[m][1] - parts[m][0]);
        zs.next_out = out + used, zs.avail_out = (uInt)(cap - used);
        if (deflate(&zs, Z_FINISH) != Z_STREAM_END) abort();
        used = cap - zs.avail_out;
        deflateEnd(&zs);
    }
    *out_len = used;
    return out;
}

/* Every record of both splits of two sets, equal. */
static int same_sets(const char *a, const char *b) {
    int same = 1;
    for (int split = 0; split < TG_SPLIT_COUNT && same; split++) {
        tg_shard_set sa, sb;
        tg_err err;
        if (tg_shard_set_open(a, split, &sa, &err)) return CHECK(0, "%s", err.msg);
        if (tg_shard_set_open(b, split, &sb, &err)) {
            tg_shard_set_close(&sa);
            return CHECK(0, "%s", err.msg);
        }
        tg_shard_cursor ca, cb;
        same = sa.n_records == sb.n_records && sa.n_records > 0 && !tg_shard_cursor_open(&ca, &sa, &err);
        if (same && tg_shard_cursor_open(&cb, &sb, &err)) {
            tg_shard_cursor_close(&ca);
            same = 0;
        } else if (same) {
            for (int64_t r = 0; r < sa.n_records && same; r++) {
                tg_shard_record x, y;
                same = !tg_shard_cursor_get(&ca, r, &x, &err) && !tg_shard_cursor_get(&cb, r, &y, &err) &&
                       x.len == y.len && x.label == y.label && !memcmp(x.input_ids, y.input_ids, (size_t)x.len * 4);
            }
            tg_shard_cursor_close(&ca);
            tg_shard_cursor_close(&cb);
        }
        tg_shard_set_close(&sa);
        tg_shard_set_close(&sb);
    }
    return same;
}

static int convert_idx(const char *images, const char *out, tg_err *err) {
    const char *inputs[1] = {images};
    tg_convert_options o = {.inputs = inputs, .n_inputs = 1, .outdir = out, .format = TG_INPUT_IDX, .doc_stride = -1,
                            .image_size = 3, .eval_fraction = 0.25, .seed = 5};
    tg_convert_report rep;
    return tg_convert(&o, NULL, &rep, err);
}

TG_TEST(test_convert_idx_gzip_equals_plain) {
    const char *dir = tg_test_tmpdir();
    char plain[700], gz[700], labels[700], gz_labels[700], two[700], out_a[700], out_b[700];
    size_t il, ll, gl, gll;
    uint8_t *ib = idx_images(12, &il), *lb = idx_labels(12, &ll);
    snprintf(plain, sizeof plain, "%s/train-images-idx3-ubyte", dir);
    snprintf(labels, sizeof labels, "%s/train-labels-idx1-ubyte", dir);
    snprintf(gz, sizeof gz, "%s/train-images-idx3-ubyte.gz", dir);
    snprintf(gz_labels, sizeof gz_labels, "%s/train-labels-idx1-ubyte.gz", dir);
    uint8_t *gb = gzip_bytes(ib, il, 0, &gl), *glb = gzip_bytes(lb, ll, 0, &gll);
    REQUIRE(tg_test_write_bytes(plain, ib, il) == 0 && tg_test_write_bytes(labels, lb, ll) == 0 && tg_test_write_bytes(gz, gb, gl) == 0 &&
                tg_test_write_bytes(gz_labels, glb, gll) == 0,
            "cannot write the IDX files");
    snprintf(out_a, sizeof out_a, "%s/plain-set", dir);
    snprintf(out_b, sizeof out_b, "%s/gz-set", dir);
    tg_err err = {{0}};
    REQUIRE(convert_idx(plain, out_a, &err) == 0, "%s", err.msg);
    REQUIRE(convert_idx(gz, out_b, &err) == 0, "%s", err.msg);
    CHECK(same_sets(out_a, out_b), "the gzip'd files' set differs from the plain files'");
    /* Two members, split inside the pixels, read as one file (as gunzip does). */
    size_t tl;
    uint8_t *tb = gzip_bytes(ib, il, 100, &tl);
    snprintf(two, sizeof two, "%s/t10k-images-idx3-ubyte.gz", dir);
    char two_labels[700];
    snprintf(two_labels, sizeof two_labels, "%s/t10k-labels-idx1-ubyte.gz", dir);
    REQUIRE(tg_test_write_bytes(two, tb, tl) == 0 && tg_test_write_bytes(two_labels, glb, gll) == 0, "cannot write %s", two);
    snprintf(out_b, sizeof out_b, "%s/two-set", dir);
    REQUIRE(convert_idx(two, out_b, &err) == 0, "%s", err.msg);
    CHECK(same_sets(out_a, out_b), "the two-member file's set differs from the plain files'");
    /* tg_gunzip itself: the bytes back, and its limit. */
    uint8_t *back;
    size_t back_len;
    CHECK(tg_gunzip(tb, tl, "t", il, &back, &back_len, &err) == 0 && back_len == il && !memcmp(back, ib, il), "%s",
          err.msg);
    free(back);
    CHECK(tg_gunzip(tb, tl, "t", il - 1, &back, &back_len, &err) == -1 &&
              !strcmp(err.msg, "t: gunzipped, it is more than 315 bytes") && !back,
          "%s", err.msg);
    CHECK(tg_gunzip(ib, il, "p", 100, &back, &back_len, &err) == -1 &&
              !strcmp(err.msg, "p: not a gzip file (it does not start with 1f 8b)"),
          "%s", err.msg);
    free(tb);
    free(gb);
    free(glb);
    free(ib);
    free(lb);
}

/* gz (bytes n) as dir/NAME with the plain labels beside; expects the message. */
static void expect_gz_error(const char *dir, const uint8_t *gz, size_t n, const char *want) {
    char images[700], labels[700], out[700], full[1400];
    snprintf(images, sizeof images, "%s/x-images-idx3-ubyte.gz", dir);
    snprintf(labels, sizeof labels, "%s/x-labels-idx1-ubyte.gz", dir);
    snprintf(out, sizeof out, "%s/refused", dir);
    size_t ll;
    uint8_t *lb = idx_labels(12, &ll);
    if (!CHECK(tg_test_write_bytes(images, gz, n) == 0 && tg_test_write_bytes(labels, lb, ll) == 0, "cannot write %s", images)) {
        free(lb);
        return;
    }
    free(lb);
    snprintf(full, sizeof full, "%s: %s", images, want);
    tg_err err = {{0}};
    CHECK(convert_idx(images, out, &err) == -1 && !strcmp(err.msg, full), "message '%s', want '%s'", err.msg, full);
    struct stat st;
    CHECK(stat(out, &st) != 0, "a failed conversion left %s", out);
}

TG_TEST(test_convert_idx_gzip_refusals) {
    const char *dir = tg_test_tmpdir();
    size_t il, gl;
    uint8_t *ib = idx_images(12, &il);
    uint8_t *gb = gzip_bytes(ib, il, 0, &gl);
    char want[300];
    snprintf(want, sizeof want, "truncated: the gzip data ends after %zu bytes, before its end", gl - 4);
    expect_gz_error(dir, gb, gl - 4, want); /* the length field cut */
    snprintf(want, sizeof want, "truncated: the gzip data ends after %zu bytes, before its end", gl / 2);
    expect_gz_error(dir, gb, gl / 2, want);
    expect_gz_error(dir, gb, 2, "truncated: the gzip data ends after 2 bytes, before its end");
    gb[gl - 8] ^= 1; /* the CRC-32 */
    snprintf(want, sizeof want, "corrupt gzip data near byte %zu: incorrect data check", gl - 4);
    expect_gz_error(dir, gb, gl, want);
    gb[gl - 8] ^= 1;
    gb[3] = 0xe0; /* reserved header flags */
    expect_gz_error(dir, gb, gl, "corrupt gzip data near byte 4: unknown header flags set");
    gb[3] = 0;
    uint8_t *tail = malloc(gl + 3);
    memcpy(tail, gb, gl);
    memcpy(tail + gl, "xyz", 3);
    snprintf(want, sizeof want, "3 bytes after the end of the gzip data (at byte %zu), which are not another gzip member", gl);
    expect_gz_error(dir, tail, gl + 3, want);
    free(tail);
    /* A well-formed gzip file whose contents are no IDX file: the IDX message, named so. */
    free(gb);
    gb = gzip_bytes(ib, il - 1, 0, &gl);
    char images[700], labels[700], out[700], full[900];
    snprintf(images, sizeof images, "%s/y-images-idx3-ubyte.gz", dir);
    snprintf(labels, sizeof labels, "%s/y-labels-idx1-ubyte", dir);
    snprintf(out, sizeof out, "%s/refused", dir);
    size_t ll;
    uint8_t *lb = idx_labels(12, &ll);
    REQUIRE(tg_test_write_bytes(images, gb, gl) == 0 && tg_test_write_bytes(labels, lb, ll) == 0, "cannot write %s", images);
    free(lb);
    snprintf(full, sizeof full, "%s (gunzipped): the header's dimensions need 316 bytes, the file has 315", images);
    tg_err err = {{0}};
    CHECK(convert_idx(images, out, &err) == -1 && !strcmp(err.msg, full), "message '%s', want '%s'", err.msg, full);
    free(gb);
    free(ib);
}
