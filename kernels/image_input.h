/* One image of IMAGE_INPUT (plan/ops.def), header-only so the CPU reference and the CUDA
 * kernel give the same bits: the augmentation an image draws (from Philox block `image` of
 * stream (seed, step, key), kernels/philox.h, never the thread layout) and the value of a
 * pixel as torchvision's ToTensor and Normalize make it. */
#ifndef TUNEGRAPH_IMAGE_INPUT_H
#define TUNEGRAPH_IMAGE_INPUT_H

#include <stdint.h>

#include "kernels/philox.h"
#include "plan/ops.h"

/* Where image `image`'s window starts in the padded image (0 .. 2 crop_pad each way) and
 * whether it is flipped; in eval mode (training 0), or without augmentation, the image as
 * stored: a window at (crop_pad, crop_pad), not flipped. */
typedef struct tg_image_draw {
    int32_t dy, dx;
    int flipped;
} tg_image_draw;

TG_HOST_DEVICE static inline tg_image_draw tg_image_draw_of(const tg_image_input_params *p, uint64_t seed,
                                                            uint64_t step, int training, int64_t image) {
    tg_image_draw d = {(int32_t)p->crop_pad, (int32_t)p->crop_pad, 0};
    if (!training || (p->crop_pad == 0 && !p->flip)) return d;
    uint32_t r[4];
    tg_philox_block(seed, step, (uint32_t)p->key, (uint64_t)image, r);
    const uint32_t span = 2u * (uint32_t)p->crop_pad + 1u;
    d.dy = (int32_t)(r[0] % span);
    d.dx = (int32_t)(r[1] % span);
    d.flipped = p->flip && (r[2] >> 31);
    return d;
}

/* Channel ch's mean and std (ch < 3). */
TG_HOST_DEVICE static inline float tg_image_mean(const tg_image_input_params *p, int64_t ch) {
    return ch == 0 ? p->mean0 : ch == 1 ? p->mean1 : p->mean2;
}
TG_HOST_DEVICE static inline float tg_image_std(const tg_image_input_params *p, int64_t ch) {
    return ch == 0 ? p->std0 : ch == 1 ? p->std1 : p->std2;
}

/* Pixel byte v of a channel: v / 255 (ToTensor's division), then (x - mean) / std
 * (Normalize's subtraction and division), each rounded to float. */
TG_HOST_DEVICE static inline float tg_image_value(uint8_t v, float mean, float std) {
#if defined(__CUDA_ARCH__)
    return __fdiv_rn(__fsub_rn(__fdiv_rn((float)v, 255.0f), mean), std);
#else
    return ((float)v / 255.0f - mean) / std;
#endif
}

/* The stored byte at output position (y, x) of an image drawn as d (0 outside the image:
 * RandomCrop's fill), its planes at `planes` (c planes of size x size). */
TG_HOST_DEVICE static inline uint8_t tg_image_source(const uint8_t *plane, int64_t size, int64_t crop_pad,
                                                     tg_image_draw d, int64_t y, int64_t x) {
    const int64_t xs = d.flipped ? size - 1 - x : x;
    const int64_t sy = y + d.dy - crop_pad, sx = xs + d.dx - crop_pad;
    return sy >= 0 && sy < size && sx >= 0 && sx < size ? plane[sy * size + sx] : (uint8_t)0;
}

#endif
