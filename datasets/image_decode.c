/* The dispatch by the file's first bytes, and interleaved gray or RGB to the planes of the
 * channel count asked for. */
#include "datasets/image_decode.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"

void tg_image_free(tg_image *im) {
    free(im->pixels);
    memset(im, 0, sizeof *im);
}

/* Pillow's convert("L"): ITU-R 601-2 luma in 16-bit fixed point, rounded. */
static uint8_t luma(const uint8_t *rgb) {
    return (uint8_t)(((uint32_t)rgb[0] * 19595 + (uint32_t)rgb[1] * 38470 + (uint32_t)rgb[2] * 7471 + 0x8000) >> 16);
}

int tg_image_decode(const uint8_t *buf, size_t len, const char *name, int32_t channels, tg_image *out, tg_err *err) {
    memset(out, 0, sizeof *out);
    if (channels != 1 && channels != 3) return tg_fail(err, "%s: %d channels asked for, 1 or 3 are", name, channels);
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    tg_image im;
    if (len >= 8 && !memcmp(buf, png_sig, 8)) {
        if (tg_png_decode(buf, len, name, &im, err)) return -1;
    } else if (len >= 3 && buf[0] == 0xff && buf[1] == 0xd8 && buf[2] == 0xff) {
        if (tg_jpeg_decode(buf, len, name, &im, err)) return -1;
    } else if (len == 0) {
        return tg_fail(err, "%s: an empty file, not a PNG or JPEG image", name);
    } else {
        char start[3 * 8 + 1] = {0};
        for (size_t i = 0; i < len && i < 8; i++) {
            static const char hex[] = "0123456789abcdef";
            start[3 * i] = hex[buf[i] >> 4], start[3 * i + 1] = hex[buf[i] & 15], start[3 * i + 2] = ' ';
        }
        start[3 * (len < 8 ? len : 8) - 1] = 0;
        return tg_fail(err, "%s: not a PNG or JPEG file (it starts with %s)", name, start);
    }
    const size_t px = (size_t)im.height * (size_t)im.width;
    uint8_t *planes = tg_malloc(px * (size_t)channels);
    if (!planes) {
        tg_image_free(&im);
        return tg_fail(err, "%s: out of memory for %d x %d x %d pixels", name, channels, im.height, im.width);
    }
    const uint8_t *s = im.pixels;
    if (im.channels == 1)
        for (int32_t c = 0; c < channels; c++) memcpy(planes + (size_t)c * px, s, px);
    else if (channels == 3)
        for (size_t k = 0; k < px; k++)
            planes[k] = s[3 * k], planes[px + k] = s[3 * k + 1], planes[2 * px + k] = s[3 * k + 2];
    else
        for (size_t k = 0; k < px; k++) planes[k] = luma(s + 3 * k);
    *out = (tg_image){channels, im.height, im.width, planes};
    tg_image_free(&im);
    return 0;
}
