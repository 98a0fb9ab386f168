/* The body of the image fuzz targets (fuzz_png.c, fuzz_jpeg.c): the input is one file,
 * decoded by the format's own decoder (its channels, interleaved) and through
 * tg_image_decode to 1 and to 3 channels (datasets/image_decode.h). All three succeed or
 * all fail with a message naming the file; what decodes is within the size limits, and the
 * planes agree with the file's pixels: a gray file's copied to each plane, an RGB file's
 * split into planes and, for one channel, Pillow's luma of them. */
#ifndef TUNEGRAPH_FUZZ_IMAGE_H
#define TUNEGRAPH_FUZZ_IMAGE_H

#include <stdlib.h>
#include <string.h>

#include "datasets/image_decode.h"
#include "tests/fuzz/fuzz_input.h"

typedef int (*fuzz_image_decoder)(const uint8_t *buf, size_t len, const char *name, tg_image *out, tg_err *err);

static inline void fuzz_image_check(const uint8_t *data, size_t size, fuzz_image_decoder decode) {
    /* An exact-size copy, so a read past the end is the sanitizer's to see. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) abort();
    memcpy(buf, data, size);
    tg_image native, one, three;
    tg_err err;
    const int ok = decode(buf, size, "fuzz", &native, &err) == 0;
    FUZZ_ASSERT(ok || (!strncmp(err.msg, "fuzz: ", 6) && !native.pixels), "failed without naming the file: '%s'", err.msg);
    const int ok1 = tg_image_decode(buf, size, "fuzz", 1, &one, &err) == 0;
    const int ok3 = tg_image_decode(buf, size, "fuzz", 3, &three, &err) == 0;
    /* Another format's file may decode through tg_image_decode; for this one the three agree. */
    FUZZ_ASSERT(!ok || (ok1 && ok3), "the decoder took the file, tg_image_decode did not: %s", err.msg);
    if (ok) {
        const int32_t h = native.height, w = native.width;
        const size_t px = (size_t)h * (size_t)w;
        FUZZ_ASSERT((native.channels == 1 || native.channels == 3) && h >= 1 && w >= 1 && w <= TG_IMAGE_MAX_SIDE &&
                        h <= TG_IMAGE_MAX_SIDE && (int64_t)px <= TG_IMAGE_MAX_PIXELS,
                    "decoded %d x %d x %d", native.channels, h, w);
        FUZZ_ASSERT(one.channels == 1 && three.channels == 3 && one.height == h && one.width == w && three.height == h &&
                        three.width == w,
                    "tg_image_decode's shapes %d x %d x %d and %d x %d x %d, the file's %d x %d", one.channels,
                    one.height, one.width, three.channels, three.height, three.width, h, w);
        for (size_t k = 0; k < px; k++) {
            const uint8_t *p = native.pixels + k * (size_t)native.channels;
            const uint8_t r = p[0], g = native.channels == 3 ? p[1] : p[0], b = native.channels == 3 ? p[2] : p[0];
            const uint8_t y = native.channels == 3
                                  ? (uint8_t)(((uint32_t)r * 19595 + (uint32_t)g * 38470 + (uint32_t)b * 7471 + 0x8000) >> 16)
                                  : r;
            FUZZ_ASSERT(three.pixels[k] == r && three.pixels[px + k] == g && three.pixels[2 * px + k] == b,
                        "pixel %zu's planes differ from the file's", k);
            FUZZ_ASSERT(one.pixels[k] == y, "pixel %zu's gray %d, want %d", k, one.pixels[k], y);
        }
    }
    if (ok) tg_image_free(&native);
    if (ok1) tg_image_free(&one);
    if (ok3) tg_image_free(&three);
    free(buf);
}

#endif
