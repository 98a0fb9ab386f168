#include "datasets/idx.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/checked.h"

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

/* The header: magic, type, dimensions; *data_at is where the values start. */
static int header(const uint8_t *buf, size_t len, const char *name, const char *what, int dims, uint32_t *dim,
                  size_t *data_at, tg_err *err) {
    if (len < 4) return tg_fail(err, "%s: %zu bytes, too short for an IDX header (4 bytes)", name, len);
    if (buf[0] != 0 || buf[1] != 0)
        return tg_fail(err, "%s: magic bytes %02x %02x, an IDX file starts with 00 00 (gzip'd files start 1f 8b: "
                            "gunzip it first)",
                       name, buf[0], buf[1]);
    if (buf[2] != 0x08) return tg_fail(err, "%s: value type 0x%02x, the %s file must hold unsigned bytes (0x08)", name, buf[2], what);
    if (buf[3] != dims)
        return tg_fail(err, "%s: %u dimensions, an IDX %s file has %d (magic 0x%08x)", name, buf[3], what, dims,
                       0x800u + (unsigned)dims);
    const size_t at = 4 + 4 * (size_t)dims;
    if (len < at) return tg_fail(err, "%s: %zu bytes, too short for the %d dimensions of its header", name, len, dims);
    uint64_t values = 1;
    for (int d = 0; d < dims; d++) {
        dim[d] = be32(buf + 4 + 4 * d);
        if (tg_mul_u64(values, dim[d], &values)) return tg_fail(err, "%s: the dimensions overflow", name);
    }
    uint64_t want;
    if (tg_add_u64(values, at, &want)) return tg_fail(err, "%s: the dimensions overflow", name);
    if (want != (uint64_t)len)
        return tg_fail(err, "%s: the header's dimensions need %llu bytes, the file has %zu", name,
                       (unsigned long long)want, len);
    *data_at = at;
    return 0;
}

int tg_idx_parse_images(const uint8_t *buf, size_t len, const char *name, tg_idx_images *out, tg_err *err) {
    memset(out, 0, sizeof *out);
    uint32_t dim[3];
    size_t at;
    if (header(buf, len, name, "images", 3, dim, &at, err)) return -1;
    if (dim[0] < 1 || dim[0] > INT32_MAX) return tg_fail(err, "%s: image count %u is outside 1 to %d", name, dim[0], INT32_MAX);
    if (dim[1] < 1 || dim[1] > 65536) return tg_fail(err, "%s: rows %u is outside 1 to 65536", name, dim[1]);
    if (dim[2] < 1 || dim[2] > 65536) return tg_fail(err, "%s: columns %u is outside 1 to 65536", name, dim[2]);
    *out = (tg_idx_images){(int32_t)dim[0], (int32_t)dim[1], (int32_t)dim[2], buf + at};
    return 0;
}

int tg_idx_parse_labels(const uint8_t *buf, size_t len, const char *name, int32_t *n, const uint8_t **labels,
                        tg_err *err) {
    *n = 0;
    *labels = NULL;
    uint32_t dim[1];
    size_t at;
    if (header(buf, len, name, "labels", 1, dim, &at, err)) return -1;
    if (dim[0] < 1 || dim[0] > INT32_MAX) return tg_fail(err, "%s: label count %u is outside 1 to %d", name, dim[0], INT32_MAX);
    *n = (int32_t)dim[0];
    *labels = buf + at;
    return 0;
}

int tg_idx_labels_beside(const char *images_path, char *out, size_t cap) {
    static const char *const from[] = {"images-idx3-ubyte", "images.idx3-ubyte"};
    static const char *const to[] = {"labels-idx1-ubyte", "labels.idx1-ubyte"};
    const char *base = strrchr(images_path, '/');
    base = base ? base + 1 : images_path;
    for (int k = 0; k < 2; k++) {
        const char *hit = strstr(base, from[k]);
        if (!hit) continue;
        int n = snprintf(out, cap, "%.*s%s%s", (int)(hit - images_path), images_path, to[k], hit + strlen(from[k]));
        return n >= 0 && (size_t)n < cap ? 0 : -1;
    }
    return -1;
}

void tg_image_resize_bilinear(const uint8_t *src, int32_t channels, int32_t h, int32_t w, uint8_t *dst, int32_t oh,
                              int32_t ow) {
    const float sy = (float)h / (float)oh, sx = (float)w / (float)ow;
    for (int32_t c = 0; c < channels; c++) {
        const uint8_t *s = src + (size_t)c * h * w;
        uint8_t *d = dst + (size_t)c * oh * ow;
        for (int32_t y = 0; y < oh; y++) {
            float fy = sy * ((float)y + 0.5f) - 0.5f;
            if (fy < 0) fy = 0;
            const int32_t y0 = (int32_t)fy, y1 = y0 < h - 1 ? y0 + 1 : y0;
            const float ly = fy - (float)y0, hy = 1.0f - ly;
            for (int32_t x = 0; x < ow; x++) {
                float fx = sx * ((float)x + 0.5f) - 0.5f;
                if (fx < 0) fx = 0;
                const int32_t x0 = (int32_t)fx, x1 = x0 < w - 1 ? x0 + 1 : x0;
                const float lx = fx - (float)x0, hx = 1.0f - lx;
                const float v = hy * (hx * s[(size_t)y0 * w + x0] + lx * s[(size_t)y0 * w + x1]) +
                                ly * (hx * s[(size_t)y1 * w + x0] + lx * s[(size_t)y1 * w + x1]);
                float r = nearbyintf(v);
                d[(size_t)y * ow + x] = (uint8_t)(r < 0 ? 0 : r > 255 ? 255 : r);
            }
        }
    }
}
