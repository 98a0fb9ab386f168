/* PNG through libpng's progressive-free read API, from memory. libpng reports errors by
 * longjmp: everything the jump must see lives in a heap-allocated reader, so no local
 * changes between setjmp and the jump. */
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "datasets/image_decode.h"

typedef struct png_reader {
    const uint8_t *data;
    size_t len, at;
    char msg[256];   /* the error, as said after "NAME: " */
    uint8_t *pixels; /* freed by the caller on an error */
    png_bytep *rows;
    int32_t channels, height, width;
} png_reader;

static void on_error(png_structp png, png_const_charp msg) {
    png_reader *r = png_get_error_ptr(png);
    if (!r->msg[0]) snprintf(r->msg, sizeof r->msg, "corrupt PNG: %s", msg);
    png_longjmp(png, 1);
}

/* Warnings are about ancillary chunks libpng drops (a bad CRC, an unknown sRGB profile):
 * the pixels are unaffected. */
static void on_warning(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg;
}

static void read_bytes(png_structp png, png_bytep to, size_t n) {
    png_reader *r = png_get_io_ptr(png);
    if (n > r->len - r->at) {
        snprintf(r->msg, sizeof r->msg, "truncated PNG: the file ends after %zu bytes, inside its data", r->len);
        png_longjmp(png, 1);
    }
    memcpy(to, r->data + r->at, n);
    r->at += n;
}

static void fail(png_structp png, png_reader *r, const char *msg) {
    snprintf(r->msg, sizeof r->msg, "%s", msg);
    png_longjmp(png, 1);
}

/* Everything libpng may jump out of. */
static void decode(png_structp png, png_infop info, png_reader *r) {
    png_set_read_fn(png, r, read_bytes);
    png_read_info(png, info);
    const png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    if ((int64_t)w * h > TG_IMAGE_MAX_PIXELS || w > TG_IMAGE_MAX_SIDE || h > TG_IMAGE_MAX_SIDE) {
        snprintf(r->msg, sizeof r->msg, "%u x %u pixels, more than the %lld (and %d a side) an image may have", w, h,
                 (long long)TG_IMAGE_MAX_PIXELS, TG_IMAGE_MAX_SIDE);
        png_longjmp(png, 1);
    }
    const int type = png_get_color_type(png, info);
    if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (type == PNG_COLOR_TYPE_GRAY && png_get_bit_depth(png, info) < 8) png_set_expand_gray_1_2_4_to_8(png);
    png_set_scale_16(png);
    png_set_strip_alpha(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    const int channels = png_get_channels(png, info);
    if (png_get_bit_depth(png, info) != 8 || (channels != 1 && channels != 3))
        fail(png, r, "corrupt PNG: its pixels do not come out as 8-bit gray or RGB"); /* libpng's transforms promise it */
    const size_t stride = (size_t)w * (size_t)channels;
    if (png_get_rowbytes(png, info) != stride) fail(png, r, "corrupt PNG: unexpected row length");
    r->pixels = tg_malloc(stride * h);
    r->rows = tg_malloc(h * sizeof *r->rows);
    if (!r->pixels || !r->rows) fail(png, r, "out of memory for its pixels");
    for (png_uint_32 y = 0; y < h; y++) r->rows[y] = r->pixels + (size_t)y * stride;
    png_read_image(png, r->rows);
    png_read_end(png, NULL); /* the chunks after the image: a file cut before IEND is refused */
    r->channels = channels, r->height = (int32_t)h, r->width = (int32_t)w;
}

int tg_png_decode(const uint8_t *buf, size_t len, const char *name, tg_image *out, tg_err *err) {
    memset(out, 0, sizeof *out);
    if (len < 8 || png_sig_cmp(buf, 0, 8)) return tg_fail(err, "%s: not a PNG file (no PNG signature)", name);
    png_reader *r = tg_calloc(1, sizeof *r);
    if (!r) return tg_fail(err, "%s: out of memory", name);
    r->data = buf, r->len = len;
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, r, on_error, on_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_read_struct(png ? &png : NULL, NULL, NULL);
        free(r);
        return tg_fail(err, "%s: out of memory for libpng", name);
    }
    int rc = 0;
    if (setjmp(png_jmpbuf(png))) {
        rc = tg_fail(err, "%s: %s", name, r->msg);
        free(r->pixels);
    } else {
        decode(png, info, r);
        *out = (tg_image){r->channels, r->height, r->width, r->pixels};
    }
    png_destroy_read_struct(&png, &info, NULL);
    free(r->rows);
    free(r);
    return rc;
}
