/* libFuzzer target: one JPEG file through libjpeg-turbo (datasets/jpeg_decode.c) and the
 * image decoder's channel conversion; the invariants are tests/fuzz/fuzz_image.h's. */
#include "tests/fuzz/fuzz_image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_image_check(data, size, tg_jpeg_decode);
    return 0;
}
