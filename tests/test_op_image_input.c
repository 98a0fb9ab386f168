/* IMAGE_INPUT on the CPU reference (runtime/cpu/image_input.c, plan/ops.def): stored pixel
 * planes to the channels-last normalised input, as torchvision's ToTensor and Normalize
 * compute it, and in training the augmentation the op draws (RandomCrop with zero padding,
 * then RandomHorizontalFlip):
 *
 * - values worked by hand and every value against the float expression, planes to channels
 *   last, eval mode and an op without augmentation leaving the image as stored;
 * - augmented batches: each image is one of the transforms the padding and flip allow
 *   (found by search over all of them, written here from torchvision's definitions), the
 *   one the op's Philox words name; the draws cover both flips and most windows; the same
 *   bits on 1 and 3 threads, other bits at another step or seed; the padding is zeros
 *   before the normalisation;
 * - the shape rule's refusals. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/philox.h"
#include "plan/op_meta.h"
#include "runtime/cpu/cpu_exec.h"
#include "tests/harness.h"
#include "tests/op_fixtures.h"

static tg_image_input_params params(int64_t n, int64_t c, int64_t size, int64_t crop_pad, int64_t flip) {
    return (tg_image_input_params){.n = n, .c = c, .size = size, .key = 3, .crop_pad = crop_pad, .flip = flip,
                                   .mean0 = 0.485f, .mean1 = 0.456f, .mean2 = 0.406f,
                                   .std0 = 0.229f, .std1 = 0.224f, .std2 = 0.225f};
}

static void run(const tg_image_input_params *p, const uint8_t *px, float step, uint64_t seed, int training,
                float *out, tg_threadpool *tp) {
    tg_op op = tg_test_op(TG_OP_IMAGE_INPUT);
    op.p.image_input = *p;
    float step_counter = step;
    tg_cpu_op_args a = {.op = &op, .in = {(void *)px, &step_counter}, .out = {out}, .seed = seed,
                        .training = training, .threads = tp};
    tg_cpu_op_run(&a);
}

static uint8_t *random_bytes(int64_t n, uint64_t seed) {
    uint8_t *b = malloc((size_t)n);
    if (!b) abort();
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        b[i] = (uint8_t)(s >> 56);
    }
    return b;
}

static float mean_of(const tg_image_input_params *p, int64_t c) { return c == 0 ? p->mean0 : c == 1 ? p->mean1 : p->mean2; }
static float std_of(const tg_image_input_params *p, int64_t c) { return c == 0 ? p->std0 : c == 1 ? p->std1 : p->std2; }

/* torchvision: pad the image by `pad` zeros on every side, take the size x size window at
 * (top, left) of the padded image, mirror it left to right when flipped; then ToTensor's
 * division and Normalize's. The value at channels-last position (y, x, c) of image b. */
static float transformed(const tg_image_input_params *p, const uint8_t *px, int64_t b, int64_t top, int64_t left,
                         int flipped, int64_t y, int64_t x, int64_t c) {
    const int64_t S = p->size, pad = p->crop_pad;
    const int64_t cx = flipped ? S - 1 - x : x; /* the window's column before the mirror */
    const int64_t sy = top + y - pad, sx = left + cx - pad;
    const uint8_t v = sy >= 0 && sy < S && sx >= 0 && sx < S ? px[((b * p->c + c) * S + sy) * S + sx] : 0;
    return ((float)v / 255.0f - mean_of(p, c)) / std_of(p, c);
}

static int image_is(const tg_image_input_params *p, const uint8_t *px, const float *out, int64_t b, int64_t top,
                    int64_t left, int flipped) {
    const int64_t S = p->size, C = p->c;
    for (int64_t y = 0; y < S; y++)
        for (int64_t x = 0; x < S; x++)
            for (int64_t c = 0; c < C; c++)
                if (out[((b * S + y) * S + x) * C + c] != transformed(p, px, b, top, left, flipped, y, x, c)) return 0;
    return 1;
}

/* Hand values (mean 0.5, std 0.5: byte 0 -> -1, 255 -> 1, 51 -> -0.6) and every value of a
 * 3-channel batch against the expression, channels last; eval mode likewise with the
 * augmentation asked for. */
TG_TEST(test_op_image_input_values) {
    tg_image_input_params h = {.n = 1, .c = 1, .size = 2, .mean0 = 0.5f, .std0 = 0.5f, .std1 = 1, .std2 = 1};
    const uint8_t hand[4] = {0, 255, 51, 204};
    float got[4];
    run(&h, hand, 0, 1, 1, got, NULL);
    CHECK(got[0] == -1.0f && got[1] == 1.0f && fabsf(got[2] + 0.6f) < 1e-6f && fabsf(got[3] - 0.6f) < 1e-6f,
          "hand values %g %g %g %g", got[0], got[1], got[2], got[3]);
    for (int augment = 0; augment < 2; augment++) {
        const tg_image_input_params p = params(3, 3, 5, augment ? 2 : 0, augment);
        const int64_t n = 3 * 3 * 5 * 5;
        uint8_t *px = random_bytes(n, 11);
        float *out = falloc(n);
        for (int64_t i = 0; i < n; i++) out[i] = NAN;
        run(&p, px, 7, 42, !augment, out, pool3()); /* augmented: in eval mode */
        int stored = 0;
        for (int64_t b = 0; b < 3; b++) stored += image_is(&p, px, out, b, p.crop_pad, p.crop_pad, 0);
        CHECK(stored == 3, "augment %d: %d of 3 images as stored, channels last", augment, stored);
        free(px), free(out);
    }
}

/* 64 RGB images of 6 x 6 with a padding of 2 and flips: every image is exactly the
 * transform its Philox words name (top = r0 % 5, left = r1 % 5, flipped = r2's top bit),
 * and that is a transform the search finds; the batch draws both flips and at least 15 of
 * the 25 windows; 1 and 3 threads agree; another step or seed draws otherwise. */
TG_TEST(test_op_image_input_augments) {
    enum { N = 64, C = 3, S = 6, PAD = 2, SPAN = 2 * PAD + 1 };
    const tg_image_input_params p = params(N, C, S, PAD, 1);
    const int64_t n = (int64_t)N * C * S * S;
    uint8_t *px = random_bytes(n, 5);
    float *out = falloc(n), *one = falloc(n), *other_step = falloc(n), *other_seed = falloc(n);
    run(&p, px, 12, 99, 1, out, pool3());
    run(&p, px, 12, 99, 1, one, NULL);
    run(&p, px, 13, 99, 1, other_step, pool3());
    run(&p, px, 12, 98, 1, other_seed, pool3());
    CHECK(!memcmp(out, one, sizeof(float) * (size_t)n), "3 threads and 1 differ");
    CHECK(memcmp(out, other_step, sizeof(float) * (size_t)n) && memcmp(out, other_seed, sizeof(float) * (size_t)n),
          "another step or seed draws the same batch");
    int named = 0, found = 0, flips = 0, windows[SPAN * SPAN] = {0}, n_windows = 0;
    for (int64_t b = 0; b < N; b++) {
        uint32_t r[4];
        tg_philox_block(99, 12, (uint32_t)p.key, (uint64_t)b, r);
        const int64_t top = r[0] % SPAN, left = r[1] % SPAN;
        const int flipped = (int)(r[2] >> 31);
        named += image_is(&p, px, out, b, top, left, flipped);
        int any = 0;
        for (int64_t t = 0; t < SPAN && !any; t++)
            for (int64_t l = 0; l < SPAN && !any; l++)
                for (int f = 0; f < 2 && !any; f++) any = image_is(&p, px, out, b, t, l, f);
        found += any;
        flips += flipped;
        if (!windows[top * SPAN + left]++) n_windows++;
    }
    CHECK(named == N && found == N, "%d of %d images the transform their draw names, %d one of the allowed", named, N,
          found);
    CHECK(flips > 8 && flips < N - 8 && n_windows >= 15, "%d of %d flipped, %d of %d windows drawn", flips, N,
          n_windows, SPAN * SPAN);
    /* A window at the top-left corner reads padding in its first two rows and columns. */
    int corner = 0;
    for (int64_t b = 0; b < N && !corner; b++) {
        uint32_t r[4];
        tg_philox_block(99, 12, (uint32_t)p.key, (uint64_t)b, r);
        if (r[0] % SPAN || r[1] % SPAN || (r[2] >> 31)) continue;
        corner = 1;
        for (int64_t c = 0; c < C; c++)
            CHECK(out[((b * S + 0) * S + 1) * C + c] == (0.0f - mean_of(&p, c)) / std_of(&p, c),
                  "padding of channel %lld is not byte 0 normalised", (long long)c);
    }
    free(px), free(out), free(one), free(other_step), free(other_seed);
}

/* Flips alone (no padding): each image is itself or its mirror, and some of each. */
TG_TEST(test_op_image_input_flip_only) {
    enum { N = 32, C = 1, S = 7 };
    const tg_image_input_params p = params(N, C, S, 0, 1);
    const int64_t n = (int64_t)N * C * S * S;
    uint8_t *px = random_bytes(n, 8);
    float *out = falloc(n);
    run(&p, px, 3, 7, 1, out, pool3());
    int same = 0, mirrored = 0;
    for (int64_t b = 0; b < N; b++) {
        same += image_is(&p, px, out, b, 0, 0, 0);
        mirrored += image_is(&p, px, out, b, 0, 0, 1);
    }
    CHECK(same + mirrored == N && same > 4 && mirrored > 4, "%d as stored, %d mirrored of %d", same, mirrored, N);
    free(px), free(out);
}

/* The shape rule refuses a channel count past 3, a padding as large as the image, a zero
 * std, a non-finite mean, a flip flag past 1 and an augmentation without its step counter. */
TG_TEST(test_op_image_input_rule_refusals) {
    tg_tensor t[3] = {{.name = "px", .dtype = TG_U8, .ndim = 4, .shape = {2, 3, 4, 4}},
                      {.name = "step", .dtype = TG_F32, .ndim = 1, .shape = {1}},
                      {.name = "x", .dtype = TG_F32, .ndim = 4, .shape = {2, 4, 4, 3}}};
    for (int k = 0; k < 3; k++) t[k].bytes = (uint64_t)tg_tensor_numel(&t[k]) * (uint64_t)tg_dtype_size(t[k].dtype);
    static const struct {
        int what;
        const char *want;
    } cases[] = {{0, NULL},
                 {1, "C outside [1, 3]"},
                 {2, "crop_pad outside [0, S)"},
                 {3, "a channel's std is not positive and finite"},
                 {4, "a channel's mean is not finite"},
                 {5, "flip is not 0 or 1"},
                 {6, "in[1]: an augmentation needs the step counter (a scalar)"},
                 {7, "in[0] must be u8, is f32"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        tg_op op = tg_test_op(TG_OP_IMAGE_INPUT);
        op.in[0] = 0, op.in[1] = 1, op.out[0] = 2;
        op.p.image_input = params(2, 3, 4, 1, 1);
        tg_tensor u[3];
        memcpy(u, t, sizeof u);
        switch (cases[k].what) {
        case 1: op.p.image_input.c = 4; break;
        case 2: op.p.image_input.crop_pad = 4; break;
        case 3: op.p.image_input.std1 = 0; break;
        case 4: op.p.image_input.mean2 = NAN; break;
        case 5: op.p.image_input.flip = 2; break;
        case 6: op.in[1] = -1; break;
        case 7: u[0].dtype = TG_F32, u[0].bytes *= 4; break;
        }
        char why[256] = "";
        const tg_op_check_ctx ctx = {.tensors = u, .n_tensors = 3, .replicas = 1};
        const int rc = tg_op_check(&ctx, &op, why, sizeof why);
        if (!cases[k].want)
            CHECK(rc == 0, "a valid op refused: %s", why);
        else
            CHECK(rc != 0 && strstr(why, cases[k].want), "case %d: '%s', want '%s'", cases[k].what, why, cases[k].want);
    }
}
