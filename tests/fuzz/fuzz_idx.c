/* libFuzzer target: MNIST's IDX files (datasets/idx.h), plain or gzip'd (datasets/gunzip.h).
 * The first byte picks what the rest is: bit 0 clear, an images file; set, a labels file;
 * bit 1 set, the file gzip'd, gunzipped first (up to 1 MiB), which must fail with a message
 * naming it or give at most that many bytes. What parses must honour the file: the
 * values lie inside the input and fill it exactly, every dimension in range. A parsed
 * images file's first image is then resized (bilinear) to a size the second byte picks,
 * which must keep every output pixel between the image's smallest and largest pixel. */
#include <stdlib.h>
#include <string.h>

#include "datasets/gunzip.h"
#include "datasets/idx.h"
#include "tests/fuzz/fuzz_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const int labels = data[0] & 1, gzipped = data[0] & 2;
    const uint8_t out_side = (uint8_t)(1 + data[1] % 16);
    data += 2, size -= 2;
    /* An exact-size copy, so a read past the end is the sanitizer's to see. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) abort();
    memcpy(buf, data, size);
    tg_err err;
    if (gzipped) {
        uint8_t *plain;
        size_t plain_len;
        const size_t limit = (size_t)1 << 20;
        const int rc = tg_gunzip(buf, size, "fuzz.gz", limit, &plain, &plain_len, &err);
        free(buf);
        if (rc) {
            FUZZ_ASSERT(!strncmp(err.msg, "fuzz.gz: ", 9) && !plain, "failed without naming the file: '%s'", err.msg);
            return 0;
        }
        FUZZ_ASSERT(plain_len <= limit, "gunzipped %zu bytes, over the limit", plain_len);
        /* Again exact-size, for the parser. */
        buf = malloc(plain_len ? plain_len : 1);
        if (!buf) abort();
        memcpy(buf, plain, plain_len);
        free(plain);
        size = plain_len;
    }
    if (labels) {
        int32_t n;
        const uint8_t *lab;
        if (tg_idx_parse_labels(buf, size, "fuzz", &n, &lab, &err) == 0) {
            FUZZ_ASSERT(n >= 1 && lab == buf + 8 && (size_t)n + 8 == size, "labels: %d values in %zu bytes", n, size);
        } else {
            FUZZ_ASSERT(err.msg[0], "failed without a message");
        }
    } else {
        tg_idx_images im;
        if (tg_idx_parse_images(buf, size, "fuzz", &im, &err) == 0) {
            FUZZ_ASSERT(im.n >= 1 && im.height >= 1 && im.height <= 65536 && im.width >= 1 && im.width <= 65536,
                        "dimensions %d x %d x %d", im.n, im.height, im.width);
            const size_t px = (size_t)im.height * (size_t)im.width;
            FUZZ_ASSERT(im.pixels == buf + 16 && 16 + (size_t)im.n * px == size, "images do not fill the file");
            uint8_t lo = 255, hi = 0;
            for (size_t k = 0; k < px; k++) {
                if (im.pixels[k] < lo) lo = im.pixels[k];
                if (im.pixels[k] > hi) hi = im.pixels[k];
            }
            uint8_t out[16 * 16];
            tg_image_resize_bilinear(im.pixels, 1, im.height, im.width, out, out_side, out_side);
            for (int k = 0; k < out_side * out_side; k++)
                FUZZ_ASSERT(out[k] >= lo && out[k] <= hi, "resized pixel %d = %d outside %d to %d", k, out[k], lo, hi);
        } else {
            FUZZ_ASSERT(err.msg[0], "failed without a message");
        }
    }
    free(buf);
    return 0;
}
