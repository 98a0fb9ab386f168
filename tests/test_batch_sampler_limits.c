/* Samplers and batch fills at their limits: arguments refused with their messages,
 * allocation failures in turn, seeks outside an epoch, freeing nothing, epochs that roll
 * over, and batch fills asked for more or fewer rows than a batch holds, over rows long
 * enough to be copied with streaming stores. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "datasets/batch_sampler.h"
#include "datasets/dataset.h"
#include "plan/ops.h"
#include "tests/harness.h"

TG_TEST(test_sampler_limits) {
    tg_sampler s;
    tg_err err = {{0}};
    CHECK(tg_sampler_init(&s, 0, 1, &err) == -1 && !strcmp(err.msg, "sampler: the dataset has no examples"), "'%s'",
          err.msg);
    tg_alloc_fail_after(0);
    int rc = tg_sampler_init(&s, 5, 1, &err);
    tg_alloc_fail_after(-1);
    CHECK(rc == -1 && !strcmp(err.msg, "sampler: out of memory for 5 indices") && s.order == NULL, "'%s'", err.msg);
    REQUIRE(tg_sampler_init(&s, 5, 9, &err) == 0, "%s", err.msg);
    const int32_t bad[3][2] = {{-1, 0}, {0, -1}, {0, 6}};
    for (int i = 0; i < 3; i++) {
        char want[200];
        snprintf(want, sizeof want, "sampler: epoch %d, position %d is outside an epoch of 5 examples", bad[i][0], bad[i][1]);
        CHECK(tg_sampler_seek(&s, bad[i][0], bad[i][1], &err) == -1 && !strcmp(err.msg, want), "'%s'", err.msg);
    }
    /* Seeking to the end of epoch 1 then drawing: the first index is epoch 2's first. */
    int32_t order[5], idx[7];
    tg_seeded_order(order, 5, 9, 2, TG_ORDER_EXAMPLES);
    REQUIRE(tg_sampler_seek(&s, 1, 5, &err) == 0, "%s", err.msg);
    tg_sampler_next(&s, idx, 1);
    CHECK(idx[0] == order[0] && s.epoch == 2 && s.pos == 1, "rolled over: %d (want %d), epoch %d", idx[0], order[0], s.epoch);
    /* An epoch is a permutation. */
    REQUIRE(tg_sampler_seek(&s, 3, 0, &err) == 0, "%s", err.msg);
    tg_sampler_next(&s, idx, 5);
    int seen = 0;
    for (int i = 0; i < 5; i++) seen |= 1 << idx[i];
    CHECK(seen == 31 && s.epoch == 3 && s.pos == 5, "epoch 3 is not a permutation");
    tg_sampler_free(&s);
    CHECK(s.order == NULL && s.n == 0, "freed");
    tg_sampler_free(NULL);
}

TG_TEST(test_batch_sampler_refusals) {
    const int32_t lengths[6] = {3, 9, 4, 12, 1, 7}, seqs[2] = {4, 16};
    const struct {
        const int32_t *lengths;
        int last_batch, n_buckets;
        const int32_t *seqs;
        const char *want;
    } cases[] = {
        {lengths, -1, 1, NULL, "batch sampler: last_batch -1 is not pad, drop or wrap"},
        {lengths, TG_LAST_BATCH_COUNT, 1, NULL, "batch sampler: last_batch 3 is not pad, drop or wrap"},
        {NULL, TG_LAST_BATCH_PAD, 2, seqs, "batch sampler: 2 length buckets need their lengths and the examples' lengths"},
        {lengths, TG_LAST_BATCH_PAD, 2, NULL, "batch sampler: 2 length buckets need their lengths and the examples' lengths"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tg_batch_sampler s;
        tg_err err = {{0}};
        CHECK(tg_batch_sampler_init(&s, cases[i].lengths, 6, 2, cases[i].last_batch, cases[i].n_buckets, cases[i].seqs, 1,
                                    &err) == -1 &&
                  !strcmp(err.msg, cases[i].want),
              "case %zu: '%s'", i, err.msg);
        CHECK(s.order == NULL && s.built_epoch == -1, "case %zu: state", i);
    }
    tg_batch_sampler_free(NULL);
}

/* Seeks refused by the batch sampler itself, whole messages: under wrap (which counts
 * examples and says so), pad and drop (which count batches); the place stays where it was. */
TG_TEST(test_batch_sampler_seek_refusal_messages) {
    const int32_t lengths[6] = {3, 9, 4, 12, 1, 7};
    static const struct {
        int last_batch;
        int32_t epoch, pos;
        const char *want;
    } cases[] = {
        {TG_LAST_BATCH_WRAP, 0, -1,
         "batch sampler: epoch 0, position -1 is outside an epoch of 6 examples (last_batch = wrap counts examples)"},
        {TG_LAST_BATCH_WRAP, -1, 0,
         "batch sampler: epoch -1, position 0 is outside an epoch of 6 examples (last_batch = wrap counts examples)"},
        {TG_LAST_BATCH_WRAP, 1, 7,
         "batch sampler: epoch 1, position 7 is outside an epoch of 6 examples (last_batch = wrap counts examples)"},
        {TG_LAST_BATCH_PAD, 0, -1, "batch sampler: epoch 0, position -1 is outside an epoch of 2 batches"},
        {TG_LAST_BATCH_PAD, -2, 0, "batch sampler: epoch -2, position 0 is outside an epoch of 2 batches"},
        {TG_LAST_BATCH_PAD, 0, 3, "batch sampler: epoch 0, position 3 is outside an epoch of 2 batches"},
        {TG_LAST_BATCH_DROP, 0, -1, "batch sampler: epoch 0, position -1 is outside an epoch of 1 batches"},
        {TG_LAST_BATCH_DROP, 0, 2, "batch sampler: epoch 0, position 2 is outside an epoch of 1 batches"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tg_batch_sampler s;
        tg_err err = {{0}};
        REQUIRE(tg_batch_sampler_init(&s, lengths, 6, 4, cases[i].last_batch, 1, NULL, 1, &err) == 0, "%s", err.msg);
        const int32_t epoch = s.epoch, pos = s.pos, stream_pos = s.stream.pos;
        CHECK(tg_batch_sampler_seek(&s, cases[i].epoch, cases[i].pos, &err) == -1 && !strcmp(err.msg, cases[i].want),
              "case %zu: '%s'", i, err.msg);
        CHECK(s.epoch == epoch && s.pos == pos && s.stream.pos == stream_pos, "case %zu: the place moved", i);
        /* The limits themselves are places. */
        const int32_t end = cases[i].last_batch == TG_LAST_BATCH_WRAP ? 6 : s.per_epoch;
        CHECK(tg_batch_sampler_seek(&s, 2, end, &err) == 0 && s.epoch == 2 && s.pos == end, "case %zu: seek to the end: %s",
              i, err.msg);
        CHECK(tg_batch_sampler_seek(&s, 0, 0, &err) == 0 && s.epoch == 0 && s.pos == 0, "case %zu: seek to 0: %s", i,
              err.msg);
        tg_batch_sampler_free(&s);
    }
}

/* The seeded orders themselves, as this version draws them: a run resumed by a later
 * build (from a checkpoint's seed, epoch and position) must draw the same batches, so the
 * permutations of each (seed, epoch, stream) are fixed values. */
TG_TEST(test_seeded_order_values) {
    static const struct {
        uint64_t seed;
        int32_t epoch;
        int stream;
        int32_t want[12];
    } cases[] = {
        {42, 0, TG_ORDER_EXAMPLES, {2, 8, 7, 5, 1, 10, 4, 9, 6, 3, 11, 0}},
        {42, 1, TG_ORDER_EXAMPLES, {2, 10, 4, 7, 9, 0, 3, 1, 5, 6, 8, 11}},
        {42, 7, TG_ORDER_EXAMPLES, {9, 8, 0, 7, 10, 11, 5, 3, 1, 2, 6, 4}},
        {0, 0, TG_ORDER_EXAMPLES, {0, 9, 5, 2, 11, 6, 7, 1, 8, 3, 10, 4}},
        {42, 0, TG_ORDER_BATCHES, {5, 4, 10, 0, 3, 8, 7, 9, 6, 1, 2, 11}},
        {42, 3, TG_ORDER_BATCHES, {0, 7, 6, 3, 4, 5, 10, 2, 1, 11, 8, 9}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int32_t got[12];
        tg_seeded_order(got, 12, cases[c].seed, cases[c].epoch, cases[c].stream);
        CHECK(!memcmp(got, cases[c].want, sizeof got), "seed %llu epoch %d stream %d: %d %d %d %d ...",
              (unsigned long long)cases[c].seed, cases[c].epoch, cases[c].stream, got[0], got[1], got[2], got[3]);
    }
    /* the sampler draws epoch 1 of seed 42 as that order */
    tg_sampler s;
    tg_err err = {{0}};
    REQUIRE(tg_sampler_init(&s, 12, 42, &err) == 0 && tg_sampler_seek(&s, 1, 0, &err) == 0, "%s", err.msg);
    int32_t idx[12];
    tg_sampler_next(&s, idx, 12);
    CHECK(!memcmp(idx, cases[1].want, sizeof idx), "the sampler's epoch 1: %d %d %d ...", idx[0], idx[1], idx[2]);
    tg_sampler_free(&s);
}

/* Each allocation of an init failing in turn: pad with buckets (five arrays), wrap (the
 * example stream). */
TG_TEST(test_batch_sampler_out_of_memory) {
    const int32_t lengths[6] = {3, 9, 4, 12, 1, 7}, seqs[2] = {4, 16};
    const struct {
        int last_batch, n_buckets;
        long allocations;
        const char *want[5];
    } cases[] = {
        {TG_LAST_BATCH_PAD, 2, 5,
         {"batch sampler: out of memory for the example order (12 entries)", "batch sampler: out of memory for the batch starts (3 entries)",
          "batch sampler: out of memory for the batch rows (3 entries)", "batch sampler: out of memory for the batch buckets (3 entries)",
          "batch sampler: out of memory for the example buckets (6 entries)"}},
        {TG_LAST_BATCH_DROP, 1, 4,
         {"batch sampler: out of memory for the example order (6 entries)", "batch sampler: out of memory for the batch starts (3 entries)",
          "batch sampler: out of memory for the batch rows (3 entries)", "batch sampler: out of memory for the batch buckets (3 entries)"}},
        {TG_LAST_BATCH_WRAP, 1, 1, {"sampler: out of memory for 6 indices"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tg_batch_sampler s;
        tg_err err = {{0}};
        tg_alloc_fail_after(-1);
        REQUIRE(tg_batch_sampler_init(&s, lengths, 6, 2, cases[i].last_batch, cases[i].n_buckets, seqs, 1, &err) == 0, "%s",
                err.msg);
        const long total = tg_alloc_fail_after(-1);
        tg_batch_sampler_free(&s);
        CHECK(total == cases[i].allocations, "case %zu: %ld allocations", i, total);
        for (long k = 0; k < total && k < 5; k++) {
            memset(&err, 0, sizeof err);
            tg_alloc_fail_after(k);
            int rc = tg_batch_sampler_init(&s, lengths, 6, 2, cases[i].last_batch, cases[i].n_buckets, seqs, 1, &err);
            tg_alloc_fail_after(-1);
            CHECK(rc == -1 && !strcmp(err.msg, cases[i].want[k]), "case %zu, allocation %ld: rc %d '%s'", i, k, rc, err.msg);
            CHECK(s.order == NULL && s.start == NULL && s.example_bucket == NULL && s.stream.order == NULL,
                  "case %zu, allocation %ld: not freed", i, k);
        }
    }
}

/* Rows of 260 tokens (1040 bytes: streamed, with a 16-byte tail); fills of 3 examples
 * into a batch of 2, and of -1. */
TG_TEST(test_batch_fill_row_counts) {
    enum { T = 260, B = 2 };
    static int32_t ids0[T], ids1[T / 2];
    for (int t = 0; t < T; t++) ids0[t] = 1000 + t;
    for (int t = 0; t < T / 2; t++) ids1[t] = 5000 + t;
    tg_example ex[2] = {{.len = T, .input_ids = ids0, .label = TG_IGNORE_INDEX},
                        {.len = T / 2, .input_ids = ids1, .label = TG_IGNORE_INDEX}};
    tg_dataset ds = {.n = 2, .examples = ex, .n_tokens = T + T / 2};
    tg_batch out = {0};
    out.input_ids = aligned_alloc(16, sizeof(int32_t) * B * T);
    out.attention_mask = aligned_alloc(16, sizeof(float) * B * T);
    out.token_type_ids = aligned_alloc(16, sizeof(int32_t) * B * T);
    out.position_ids = aligned_alloc(16, sizeof(int32_t) * B * T);
    out.labels = aligned_alloc(16, sizeof(int32_t) * B * T);
    const tg_batch_shape shape = {.batch = B, .seq = T, .task = TG_TASK_LM, .arch = TG_ARCH_BERT, .pad_id = 0};
    const int32_t idx[3] = {0, 1, 0};
    tg_batch_fill(&ds, idx, 3, &shape, &out);
    CHECK(out.n_real == 2 && out.n_tokens == T + T / 2, "n_real %d, tokens %lld", out.n_real, (long long)out.n_tokens);
    CHECK(!memcmp(out.input_ids, ids0, sizeof ids0) && !memcmp(out.input_ids + T, ids1, sizeof ids1) &&
              out.input_ids[T + T / 2] == 0 && out.input_ids[2 * T - 1] == 0,
          "rows");
    CHECK(out.labels[0] == 1001 && out.labels[T - 2] == 1000 + T - 1 && out.labels[T - 1] == TG_IGNORE_INDEX &&
              out.labels[T + T / 2 - 2] == 5000 + T / 2 - 1 && out.labels[T + T / 2 - 1] == TG_IGNORE_INDEX,
          "labels");
    CHECK(out.attention_mask[T - 1] == 1.0f && out.attention_mask[T + T / 2 - 1] == 1.0f &&
              out.attention_mask[T + T / 2] == 0.0f && out.position_ids[T + 7] == 7,
          "mask and positions");
    out.fixed_parts_written = 0;
    tg_batch_fill(&ds, idx, -1, &shape, &out);
    int pad_ids = 0, ignored = 0;
    for (int i = 0; i < B * T; i++) pad_ids += out.input_ids[i] == 0, ignored += out.labels[i] == TG_IGNORE_INDEX;
    CHECK(out.n_real == 0 && out.n_tokens == 0 && pad_ids == B * T && ignored == B * T && out.attention_mask[0] == 0.0f,
          "all padding: n_real %d, %d pad ids, %d ignored labels", out.n_real, pad_ids, ignored);
    free(out.input_ids), free(out.attention_mask), free(out.token_type_ids), free(out.position_ids), free(out.labels);
}
