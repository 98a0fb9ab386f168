/* PNG and JPEG files decoded to 8-bit pixels (libpng, libjpeg-turbo) for
 * `data convert --format images`.
 *
 * What the decoders give is what torchvision's ImageFolder gets from Pillow with
 * convert("RGB") or convert("L"): palettes expanded, bit depths under 8 expanded and 16
 * scaled to 8 (v x 255 / 65535, rounded), alpha (and a tRNS transparency) dropped, not
 * composited, no gamma correction; RGB to one channel by Pillow's weights
 * (L = (19595 R + 38470 G + 7471 B + 32768) >> 16); gray to three channels by copying it.
 * Files are read strictly: a file cut short, a CRC that fails, corrupt compressed data or
 * any warning of libjpeg's is an error naming the file ("NAME: ..."). */
#ifndef TUNEGRAPH_IMAGE_DECODE_H
#define TUNEGRAPH_IMAGE_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

/* The largest image decoded: width x height pixels (a 8192 x 8192 photo), and each side. */
#define TG_IMAGE_MAX_PIXELS ((int64_t)1 << 26)
#define TG_IMAGE_MAX_SIDE 65535

typedef struct tg_image {
    int32_t channels, height, width;
    uint8_t *pixels; /* malloc'd; interleaved (HWC) from a decoder, planes (CHW) from tg_image_decode */
} tg_image;

/* PNG (signature 89 50 4e 47 0d 0a 1a 0a) or JPEG (ff d8 ff), told by the first bytes, to
 * `channels` (1 or 3) planes of height x width bytes. Anything else: "NAME: not a PNG or
 * JPEG file (it starts with ...)". */
int tg_image_decode(const uint8_t *buf, size_t len, const char *name, int32_t channels, tg_image *out, tg_err *err);

/* The decoders alone: interleaved pixels, 1 channel (gray) or 3 (RGB) as the file has. */
int tg_png_decode(const uint8_t *buf, size_t len, const char *name, tg_image *out, tg_err *err);
int tg_jpeg_decode(const uint8_t *buf, size_t len, const char *name, tg_image *out, tg_err *err);

void tg_image_free(tg_image *im);

#endif
