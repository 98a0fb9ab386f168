/* datasets/batch.c at two edges. Row copies: with T = 257 the second row of the staging
 * buffer starts 1028 bytes in, off 16-byte alignment, so a long row there is copied plainly;
 * a first row of exactly 1024 bytes streams with no tail. Both must land whole, the rest of
 * each row padded. The sampler's seed: the one seed whose generator state comes out 0 (the
 * xorshift state that stays 0 forever, which would swap every element with the first) must
 * still give a shuffled permutation. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "datasets/dataset.h"
#include "plan/ops.h"
#include "tests/harness.h"

TG_TEST(test_batch_fill_unaligned_long_row_and_exact_streamed_row) {
    enum { T = 257, B = 2 };
    static int32_t ids0[256], ids1[T];
    for (int t = 0; t < 256; t++) ids0[t] = 100 + t;
    for (int t = 0; t < T; t++) ids1[t] = 7000 + t;
    tg_example ex[2] = {{.len = 256, .input_ids = ids0, .label = TG_IGNORE_INDEX},
                        {.len = T, .input_ids = ids1, .label = TG_IGNORE_INDEX}};
    tg_dataset ds = {.n = 2, .examples = ex, .n_tokens = 256 + T};
    tg_batch out = {0};
    const size_t cells = ((size_t)B * T + 3) & ~(size_t)3; /* aligned_alloc wants a multiple of 16 bytes */
    out.input_ids = aligned_alloc(16, sizeof(int32_t) * cells);
    out.attention_mask = aligned_alloc(16, sizeof(float) * cells);
    out.token_type_ids = aligned_alloc(16, sizeof(int32_t) * cells);
    out.position_ids = aligned_alloc(16, sizeof(int32_t) * cells);
    out.labels = aligned_alloc(16, sizeof(int32_t) * cells);
    REQUIRE(out.input_ids && out.attention_mask && out.token_type_ids && out.position_ids && out.labels, "alloc");
    REQUIRE(((uintptr_t)(out.input_ids + T) & 15) != 0, "row 1 is off 16-byte alignment");
    const tg_batch_shape shape = {.batch = B, .seq = T, .task = TG_TASK_LM, .arch = TG_ARCH_BERT, .pad_id = 0};
    const int32_t idx[2] = {0, 1};
    tg_batch_fill(&ds, idx, 2, &shape, &out);
    CHECK(out.n_real == 2 && out.n_tokens == 256 + T, "n_real %d, tokens %lld", out.n_real, (long long)out.n_tokens);
    CHECK(!memcmp(out.input_ids, ids0, sizeof ids0) && out.input_ids[256] == 0, "row 0 (1024 bytes, streamed)");
    CHECK(!memcmp(out.input_ids + T, ids1, sizeof ids1), "row 1 (1028 bytes, unaligned)");
    CHECK(out.labels[0] == 101 && out.labels[254] == 355 && out.labels[255] == TG_IGNORE_INDEX &&
              out.labels[T] == 7001 && out.labels[T + T - 2] == 7000 + T - 1 && out.labels[2 * T - 1] == TG_IGNORE_INDEX,
          "labels: row 0 %d %d %d, row 1 %d %d %d", out.labels[0], out.labels[254], out.labels[255], out.labels[T],
          out.labels[2 * T - 2], out.labels[2 * T - 1]);
    CHECK(out.attention_mask[255] == 1.0f && out.attention_mask[256] == 0.0f && out.attention_mask[2 * T - 1] == 1.0f,
          "mask");
    free(out.input_ids), free(out.attention_mask), free(out.token_type_ids), free(out.position_ids), free(out.labels);
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

TG_TEST(test_seeded_order_seed_whose_state_is_zero) {
    /* splitmix64's mixing maps 0 to 0 and nothing else to 0: the key is minus its increment. */
    const uint64_t key = 0 - 0x9E3779B97F4A7C15ull;
    REQUIRE(splitmix64(key) == 0, "the key gives state 0");
    const uint64_t seed = key ^ splitmix64(0 + 1); /* epoch 0, the examples' stream */
    enum { N = 16 };
    int32_t order[N], seen[N] = {0};
    tg_seeded_order(order, N, seed, 0, TG_ORDER_EXAMPLES);
    int perm = 1, stuck = 1;
    for (int i = 0; i < N; i++) {
        perm &= order[i] >= 0 && order[i] < N && !seen[order[i]]++;
        stuck &= order[i] == (i + 1) % N; /* what a generator stuck at 0 gives */
    }
    CHECK(perm, "a permutation of 0..%d", N - 1);
    CHECK(!stuck, "not the order of a generator stuck at 0");
    int32_t again[N];
    tg_seeded_order(again, N, seed, 0, TG_ORDER_EXAMPLES);
    CHECK(!memcmp(order, again, sizeof order), "the same order again");
}
