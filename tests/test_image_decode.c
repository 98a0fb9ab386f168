/* PNG and JPEG decoding (datasets/image_decode.h): each PNG colour type and bit depth to
 * one and three channels against hand-computed pixels (palettes expanded, alpha and tRNS
 * dropped, 16 bits scaled, gray copied to RGB, RGB to Pillow's luma), interlaced as plain,
 * JPEG gray and RGB (baseline and progressive) within JPEG's rounding, and the refusals of
 * bad files word for word: empty, not an image, truncated, corrupt, CMYK, too large. */
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datasets/file_bytes.h"
#include "datasets/image_decode.h"
#include "tests/harness.h"
#include "tests/image_fixtures.h"

/* Decodes dir/name to `channels`; NULL pixels (and a failed CHECK) on an error. */
static tg_image decode_file(const char *path, int32_t channels, tg_err *err) {
    char *buf;
    size_t len;
    tg_image im = {0};
    if (tg_file_bytes(path, &buf, &len, err)) return im;
    tg_image_decode((const uint8_t *)buf, len, path, channels, &im, err);
    free(buf);
    return im;
}

static uint8_t luma(uint8_t r, uint8_t g, uint8_t b) { return (uint8_t)((19595 * r + 38470 * g + 7471 * b + 32768) >> 16); }

/* Checks im (channels x 2 x 3) against want_rgb (6 RGB triples, row by row): three
 * channels as planes, one as their luma, or gray_exact (6 values) where the file is gray. */
static void check_pixels(const char *what, const tg_image *im, int32_t channels, const uint8_t *want_rgb,
                         const uint8_t *gray_exact) {
    if (!CHECK(im->pixels && im->channels == channels && im->height == 2 && im->width == 3, "%s: %d x %d x %d", what,
               im->channels, im->height, im->width))
        return;
    for (int k = 0; k < 6; k++) {
        if (channels == 1) {
            const uint8_t want = gray_exact ? gray_exact[k] : luma(want_rgb[3 * k], want_rgb[3 * k + 1], want_rgb[3 * k + 2]);
            CHECK(im->pixels[k] == want, "%s: gray pixel %d = %d, want %d", what, k, im->pixels[k], want);
        } else {
            for (int c = 0; c < 3; c++) {
                const uint8_t want = gray_exact ? gray_exact[k] : want_rgb[3 * k + c];
                CHECK(im->pixels[c * 6 + k] == want, "%s: channel %d pixel %d = %d, want %d", what, c, k,
                      im->pixels[c * 6 + k], want);
            }
        }
    }
}

TG_TEST(test_image_decode_png_kinds) {
    const char *dir = tg_test_tmpdir();
    char path[700];
    tg_err err = {{0}};
    static const uint8_t rgb[18] = {255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30, 128, 128, 128, 1, 254, 77};
    static const uint8_t gray[6] = {0, 1, 127, 128, 254, 255};
    uint8_t rgba[24], ga[12], g16[12];
    for (int k = 0; k < 6; k++) {
        memcpy(rgba + 4 * k, rgb + 3 * k, 3), rgba[4 * k + 3] = (uint8_t)(40 * k); /* alpha is dropped, not composited */
        ga[2 * k] = gray[k], ga[2 * k + 1] = (uint8_t)(255 - 40 * k);
    }
    /* 16 bits: v x 257 scales back to v exactly; 0x1234 (18.1) to 18, 0xff7f (254.5) to 254 or 255. */
    static const uint16_t v16[6] = {0, 257, 0x1234, 0x8080, 0xff7f, 0xffff};
    static const uint8_t v16_want[6] = {0, 1, 18, 128, 255, 255};
    for (int k = 0; k < 6; k++) g16[2 * k] = (uint8_t)(v16[k] >> 8), g16[2 * k + 1] = (uint8_t)v16[k];
    /* Palette: 4 colours, index 3 transparent by tRNS (dropped too); 2 bits an index, so a
     * row of 3 packs into one byte, left to right from the high bits. */
    static const uint8_t pal[12] = {9, 8, 7, 200, 100, 50, 0, 255, 255, 12, 34, 56};
    static const uint8_t trns[4] = {255, 128, 255, 0};
    static const uint8_t idx_rows[2] = {0x1b /* 0 1 2 (3) */, 0xe4 /* 3 2 1 (0) */};
    static const uint8_t pal_rgb[18] = {9, 8, 7, 200, 100, 50, 0, 255, 255, 12, 34, 56, 0, 255, 255, 200, 100, 50};
    /* 1 bit gray: 1 0 1 / 0 1 1, to 255 and 0. */
    static const uint8_t bits[2] = {0xa0, 0x60};
    static const uint8_t bits_want[6] = {255, 0, 255, 0, 255, 255};
    const struct {
        const char *name;
        tg_test_png png;
        const uint8_t *rgb, *gray; /* what it decodes to */
    } cases[] = {
        {"gray8", {3, 2, PNG_COLOR_TYPE_GRAY, 8, gray, .interlace = 0}, NULL, gray},
        {"rgb8", {3, 2, PNG_COLOR_TYPE_RGB, 8, rgb, .interlace = 0}, rgb, NULL},
        {"rgb8-adam7", {3, 2, PNG_COLOR_TYPE_RGB, 8, rgb, .interlace = 1}, rgb, NULL},
        {"rgba8", {3, 2, PNG_COLOR_TYPE_RGB_ALPHA, 8, rgba, .interlace = 0}, rgb, NULL},
        {"gray-alpha8", {3, 2, PNG_COLOR_TYPE_GRAY_ALPHA, 8, ga, .interlace = 0}, NULL, gray},
        {"gray16", {3, 2, PNG_COLOR_TYPE_GRAY, 16, g16, .interlace = 0}, NULL, v16_want},
        {"palette2-trns", {3, 2, PNG_COLOR_TYPE_PALETTE, 2, idx_rows, pal, 4, trns, 4, 0}, pal_rgb, NULL},
        {"gray1", {3, 2, PNG_COLOR_TYPE_GRAY, 1, bits, .interlace = 0}, NULL, bits_want},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(path, sizeof path, "%s/%s.png", dir, cases[i].name);
        if (!CHECK(tg_test_write_png(path, &cases[i].png) == 0, "cannot write %s", path)) continue;
        for (int32_t ch = 1; ch <= 3; ch += 2) {
            tg_image im = decode_file(path, ch, &err);
            CHECK(im.pixels, "%s: %s", cases[i].name, err.msg);
            check_pixels(cases[i].name, &im, ch, cases[i].rgb, cases[i].gray);
            tg_image_free(&im);
        }
    }
    /* The decoder alone gives the file's own channels, interleaved. */
    snprintf(path, sizeof path, "%s/rgb8.png", dir);
    char *buf;
    size_t len;
    REQUIRE(tg_file_bytes(path, &buf, &len, &err) == 0, "%s", err.msg);
    tg_image im;
    CHECK(tg_png_decode((const uint8_t *)buf, len, "rgb8.png", &im, &err) == 0 && im.channels == 3 &&
              !memcmp(im.pixels, rgb, 18),
          "tg_png_decode: %s", err.msg);
    tg_image_free(&im);
    CHECK(tg_jpeg_decode((const uint8_t *)buf, len, "rgb8.png", &im, &err) == -1 &&
              !strcmp(err.msg, "rgb8.png: not a JPEG file (it does not start with ff d8 ff)"),
          "%s", err.msg);
    CHECK(tg_image_decode((const uint8_t *)buf, len, "rgb8.png", 2, &im, &err) == -1 &&
              !strcmp(err.msg, "rgb8.png: 2 channels asked for, 1 or 3 are"),
          "%s", err.msg);
    free(buf);
    CHECK(tg_png_decode((const uint8_t *)"\xff\xd8\xff", 3, "x.jpg", &im, &err) == -1 &&
              !strcmp(err.msg, "x.jpg: not a PNG file (no PNG signature)"),
          "%s", err.msg);
}

/* Flat-coloured JPEGs: quality 100 keeps a flat block within a step or two of its colour
 * (the colour transform rounds); the gray file stays gray. */
TG_TEST(test_image_decode_jpeg_kinds) {
    const char *dir = tg_test_tmpdir();
    char path[700];
    tg_err err = {{0}};
    uint8_t flat_rgb[16 * 16 * 3], flat_gray[16 * 16];
    for (int k = 0; k < 16 * 16; k++) {
        flat_rgb[3 * k] = 200, flat_rgb[3 * k + 1] = 50, flat_rgb[3 * k + 2] = 10;
        flat_gray[k] = 100;
    }
    for (int progressive = 0; progressive < 2; progressive++) {
        snprintf(path, sizeof path, "%s/rgb%d.jpg", dir, progressive);
        REQUIRE(tg_test_write_jpeg(path, 16, 16, 3, flat_rgb, 100, progressive) == 0, "cannot write %s", path);
        tg_image im = decode_file(path, 3, &err);
        if (CHECK(im.pixels && im.channels == 3 && im.height == 16 && im.width == 16, "%s: %s", path, err.msg)) {
            static const int want[3] = {200, 50, 10};
            for (int c = 0; c < 3; c++)
                for (int k = 0; k < 256; k++)
                    if (!CHECK(abs(im.pixels[c * 256 + k] - want[c]) <= 2, "%s: channel %d pixel %d = %d", path, c, k,
                               im.pixels[c * 256 + k]))
                        break;
        }
        tg_image_free(&im);
        im = decode_file(path, 1, &err);
        if (CHECK(im.pixels && im.channels == 1, "%s as gray: %s", path, err.msg))
            CHECK(abs(im.pixels[0] - luma(200, 50, 10)) <= 2, "%s as gray: %d, want %d", path, im.pixels[0],
                  luma(200, 50, 10));
        tg_image_free(&im);
    }
    snprintf(path, sizeof path, "%s/gray.jpg", dir);
    REQUIRE(tg_test_write_jpeg(path, 16, 16, 1, flat_gray, 100, 0) == 0, "cannot write %s", path);
    tg_image im = decode_file(path, 3, &err);
    if (CHECK(im.pixels && im.channels == 3, "%s: %s", path, err.msg))
        for (int k = 0; k < 3 * 256; k++)
            if (!CHECK(im.pixels[k] == 100, "gray.jpg as RGB: value %d = %d", k, im.pixels[k])) break;
    tg_image_free(&im);
}

/* Decodes buf[0..len) as `name` and expects the message. */
static void expect_refusal(const char *name, const uint8_t *buf, size_t len, const char *want) {
    tg_image im;
    tg_err err = {{0}};
    char full[400];
    snprintf(full, sizeof full, "%s: %s", name, want);
    CHECK(tg_image_decode(buf, len, name, 3, &im, &err) == -1 && !strncmp(err.msg, full, strlen(full)),
          "%s: message '%s', want '%s'", name, err.msg, full);
    CHECK(!im.pixels, "%s: pixels after a refusal", name);
}

static uint8_t *file_copy(const char *path, size_t *len) {
    char *buf;
    tg_err err;
    if (tg_file_bytes(path, &buf, len, &err)) return NULL;
    return (uint8_t *)buf;
}

/* Where a PNG chunk of this type starts (its length field), or 0. */
static size_t png_chunk_at(const uint8_t *b, size_t len, const char *type) {
    for (size_t at = 8; at + 8 <= len;) {
        const size_t n = (size_t)b[at] << 24 | (size_t)b[at + 1] << 16 | (size_t)b[at + 2] << 8 | b[at + 3];
        if (!memcmp(b + at + 4, type, 4)) return at;
        at += 12 + n;
    }
    return 0;
}

TG_TEST(test_image_decode_refusals) {
    const char *dir = tg_test_tmpdir();
    char path[700];
    expect_refusal("empty.png", (const uint8_t *)"", 0, "an empty file, not a PNG or JPEG image");
    expect_refusal("notes.png", (const uint8_t *)"hello, world", 12,
                   "not a PNG or JPEG file (it starts with 68 65 6c 6c 6f 2c 20 77)");
    expect_refusal("x.gif", (const uint8_t *)"GIF", 3, "not a PNG or JPEG file (it starts with 47 49 46)");
    /* A 16 x 16 RGB PNG of varied pixels, so its IDAT is long. */
    uint8_t px[16 * 16 * 3];
    for (int k = 0; k < 16 * 16 * 3; k++) px[k] = (uint8_t)(k * 37 % 251);
    snprintf(path, sizeof path, "%s/v.png", dir);
    REQUIRE(tg_test_write_png(path, &(tg_test_png){16, 16, PNG_COLOR_TYPE_RGB, 8, px, .interlace = 0}) == 0, "cannot write %s", path);
    size_t len;
    uint8_t *png = file_copy(path, &len);
    REQUIRE(png, "cannot read %s", path);
    const size_t idat = png_chunk_at(png, len, "IDAT"), iend = png_chunk_at(png, len, "IEND");
    REQUIRE(idat && iend == len - 12, "chunks: IDAT at %zu, IEND at %zu of %zu", idat, iend, len);
    expect_refusal("cut-header.png", png, 20, "truncated PNG: the file ends after 20 bytes, inside its data");
    char want[200];
    snprintf(want, sizeof want, "truncated PNG: the file ends after %zu bytes, inside its data", idat + 40);
    expect_refusal("cut-idat.png", png, idat + 40, want);
    snprintf(want, sizeof want, "truncated PNG: the file ends after %zu bytes, inside its data", iend);
    expect_refusal("no-iend.png", png, iend, want);
    /* A changed byte of compressed data: zlib's own check sees it before the chunk's CRC. */
    png[idat + 8 + 10] ^= 0x55;
    expect_refusal("bad-data.png", png, len, "corrupt PNG: IDAT: incorrect data check");
    png[idat + 8 + 10] ^= 0x55;
    const size_t idat_len = (size_t)png[idat] << 24 | (size_t)png[idat + 1] << 16 | (size_t)png[idat + 2] << 8 | png[idat + 3];
    png[idat + 8 + idat_len] ^= 1;
    expect_refusal("bad-crc.png", png, len, "corrupt PNG: IDAT: CRC error");
    png[idat + 8 + idat_len] ^= 1;
    png[12] = 'X'; /* IHDR's type: the first chunk is no longer IHDR */
    expect_refusal("no-ihdr.png", png, len, "corrupt PNG: ");
    free(png);

    /* JPEG: cut short, a marker that is not one, CMYK. */
    snprintf(path, sizeof path, "%s/v.jpg", dir);
    REQUIRE(tg_test_write_jpeg(path, 16, 16, 3, px, 90, 0) == 0, "cannot write %s", path);
    uint8_t *jpg = file_copy(path, &len);
    REQUIRE(jpg, "cannot read %s", path);
    expect_refusal("cut.jpg", jpg, len - 40, "truncated JPEG: Premature end of JPEG file");
    expect_refusal("cut-header.jpg", jpg, 30, "truncated JPEG: Premature end of JPEG file");
    /* APP0's marker becomes ff 01: libjpeg skips to the next marker with a warning, which
     * is an error here. */
    jpg[3] = 0x01;
    expect_refusal("bad-marker.jpg", jpg, len, "corrupt JPEG: Corrupt JPEG data: 16 extraneous bytes before marker 0xdb");
    free(jpg);
    uint8_t cmyk[8 * 8 * 4];
    memset(cmyk, 90, sizeof cmyk);
    snprintf(path, sizeof path, "%s/cmyk.jpg", dir);
    REQUIRE(tg_test_write_jpeg(path, 8, 8, 4, cmyk, 90, 0) == 0, "cannot write %s", path);
    jpg = file_copy(path, &len);
    REQUIRE(jpg, "cannot read %s", path);
    expect_refusal("cmyk.jpg", jpg, len, "a JPEG of 4 colour components that are not gray or RGB (CMYK?): save it as RGB");
    free(jpg);

    /* Too wide: 70000 x 1 (libpng reads it; the side limit refuses it). */
    uint8_t *wide = calloc(70000, 1);
    snprintf(path, sizeof path, "%s/wide.png", dir);
    REQUIRE(wide && tg_test_write_png(path, &(tg_test_png){70000, 1, PNG_COLOR_TYPE_GRAY, 8, wide, .interlace = 0}) == 0,
            "cannot write %s", path);
    free(wide);
    uint8_t *w = file_copy(path, &len);
    REQUIRE(w, "cannot read %s", path);
    expect_refusal("wide.png", w, len, "70000 x 1 pixels, more than the 67108864 (and 65535 a side) an image may have");
    free(w);
}
