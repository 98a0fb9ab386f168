/* PNG and JPEG files written with libpng and libjpeg, and the bytes of IDX files, for the
 * image decoding and conversion tests (tests/image_fixtures.c). */
#ifndef TUNEGRAPH_TEST_IMAGE_FIXTURES_H
#define TUNEGRAPH_TEST_IMAGE_FIXTURES_H

#include <stddef.h>
#include <stdint.h>

#include "plan/plan.h"
#include "runtime/trainer.h"

typedef struct tg_test_png {
    int32_t width, height;
    int color_type;           /* PNG_COLOR_TYPE_* */
    int bit_depth;            /* 1, 2, 4, 8 or 16 */
    const uint8_t *rows;      /* height rows as libpng takes them (16-bit values big-endian) */
    const uint8_t *palette;   /* palette images: n_palette RGB triples */
    int n_palette;
    const uint8_t *trns;      /* a tRNS chunk's alpha values, or NULL */
    int n_trns;
    int interlace;            /* 1: Adam7 */
} tg_test_png;

/* 0, or -1 when libpng or the file failed. */
int tg_test_write_png(const char *path, const tg_test_png *png);

/* components 1 (gray), 3 (RGB, stored as YCbCr) or 4 (CMYK); interleaved pixels. */
int tg_test_write_jpeg(const char *path, int32_t width, int32_t height, int components, const uint8_t *pixels,
                       int quality, int progressive);

/* v big-endian into p[0..3] (IDX headers). */
void tg_test_put_be32(uint8_t *p, uint32_t v);
/* n bytes into a new file at path: 0, or -1 when it could not be written. */
int tg_test_write_bytes(const char *path, const uint8_t *b, size_t n);

/* Random pixel bytes for an image plan's batch (every image of io.pixel_values), the same
 * for the same seed on every run and executor; labels are the caller's. */
void tg_test_fill_pixels(tg_trainer *tr, const tg_plan *p, uint64_t seed);

#endif
