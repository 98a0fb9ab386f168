#include "tests/image_fixtures.h"

#include <png.h>
#include <stdio.h>
#include <stdlib.h>

#include <jpeglib.h>

int tg_test_write_png(const char *path, const tg_test_png *p) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    png_bytep *rows = malloc((size_t)p->height * sizeof *rows);
    if (!info || !rows || setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(png ? &png : NULL, info ? &info : NULL);
        free(rows);
        fclose(f);
        return -1;
    }
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)p->width, (png_uint_32)p->height, p->bit_depth, p->color_type,
                 p->interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    if (p->palette) {
        png_color pal[256];
        for (int i = 0; i < p->n_palette; i++)
            pal[i] = (png_color){p->palette[3 * i], p->palette[3 * i + 1], p->palette[3 * i + 2]};
        png_set_PLTE(png, info, pal, p->n_palette);
    }
    if (p->trns) png_set_tRNS(png, info, p->trns, p->n_trns, NULL);
    png_write_info(png, info);
    const size_t stride = png_get_rowbytes(png, info);
    for (int32_t y = 0; y < p->height; y++) rows[y] = (png_bytep)p->rows + (size_t)y * stride;
    png_write_image(png, rows);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    free(rows);
    return fclose(f) == 0 ? 0 : -1;
}

int tg_test_write_jpeg(const char *path, int32_t width, int32_t height, int components, const uint8_t *pixels,
                       int quality, int progressive) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr jerr;
    c.err = jpeg_std_error(&jerr); /* the fixtures are well-formed: libjpeg's exit on an error is fine */
    jpeg_create_compress(&c);
    jpeg_stdio_dest(&c, f);
    c.image_width = (JDIMENSION)width, c.image_height = (JDIMENSION)height;
    c.input_components = components;
    c.in_color_space = components == 1 ? JCS_GRAYSCALE : components == 3 ? JCS_RGB : JCS_CMYK;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, quality, TRUE);
    if (progressive) jpeg_simple_progression(&c);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = (JSAMPROW)pixels + (size_t)c.next_scanline * (size_t)width * (size_t)components;
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    return fclose(f) == 0 ? 0 : -1;
}

void tg_test_put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

int tg_test_write_bytes(const char *path, const uint8_t *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(b, 1, n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

void tg_test_fill_pixels(tg_trainer *tr, const tg_plan *p, uint64_t seed) {
    uint8_t *px = tg_trainer_input(tr, p->io.pixel_values);
    const int64_t n = tg_tensor_numel(&p->tensors[p->io.pixel_values]);
    uint64_t s = 0x9e3779b9ull + seed * 7919;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        px[i] = (uint8_t)(s >> 56);
    }
}
