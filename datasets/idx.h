/* MNIST's IDX files (an images file of unsigned bytes, n x rows x columns, and a labels
 * file of n bytes), read strictly, and the bilinear resize `data convert --format idx`
 * applies to them.
 *
 * An IDX file: magic 0x00 0x00, a type byte (0x08: unsigned byte, the only one read), the
 * number of dimensions (3 for images, 1 for labels), each dimension as a big-endian u32,
 * then the values. The file must be exactly that long. */
#ifndef TUNEGRAPH_IDX_H
#define TUNEGRAPH_IDX_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef struct tg_idx_images {
    int32_t n, height, width;
    const uint8_t *pixels; /* into the parsed buffer: n images of height x width, row by row */
} tg_idx_images;

/* `name` names the file in messages ("NAME: ..."). Images: at least one, each dimension
 * 1 to 65536. */
int tg_idx_parse_images(const uint8_t *buf, size_t len, const char *name, tg_idx_images *out, tg_err *err);
/* Labels: n values, n >= 1. */
int tg_idx_parse_labels(const uint8_t *buf, size_t len, const char *name, int32_t *n, const uint8_t **labels,
                        tg_err *err);

/* The labels file MNIST names beside an images file: "...images-idx3-ubyte" ->
 * "...labels-idx1-ubyte", "...images.idx3-ubyte" -> "...labels.idx1-ubyte" (in the file's
 * name, not its folder). 0, or -1 when the name has neither form or out is too small. */
int tg_idx_labels_beside(const char *images_path, char *out, size_t cap);

/* Bilinear resize of `channels` planes of h x w bytes to oh x ow, as torchvision's Resize
 * on a uint8 tensor with antialias off: float32 arithmetic, align_corners=False (a
 * destination pixel's centre maps to (d + 0.5) x in / out - 0.5 in the source, clamped at
 * 0 from below; the neighbour past the last pixel is the last pixel), then rounded half to
 * even and clamped to 0..255. */
void tg_image_resize_bilinear(const uint8_t *src, int32_t channels, int32_t h, int32_t w, uint8_t *dst, int32_t oh,
                              int32_t ow);

#endif
