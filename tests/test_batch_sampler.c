/* The run's batch order (datasets/batch_sampler.h): wrap is tg_sampler's stream, pad and
 * drop handle the last batch, length buckets group examples and cut padding, seek finds
 * the place a run had reached. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datasets/batch_sampler.h"
#include "tests/harness.h"

/* The bucket an example of `len` tokens belongs to: the smallest whose seq holds it, the
 * last when none does. */
static int32_t expected_bucket(int32_t len, int n_buckets, const int32_t *seq) {
    for (int b = 0; b + 1 < n_buckets; b++)
        if (len <= seq[b]) return b;
    return n_buckets - 1;
}

/* n lengths from 1 to max_len, uniform. */
static void random_lengths(int32_t *len, int32_t n, int32_t max_len, uint64_t seed) {
    uint64_t rng = seed;
    for (int32_t i = 0; i < n; i++) len[i] = 1 + (int32_t)(tg_test_rand(&rng) % (uint32_t)max_len);
}

/* The batches of one epoch, drawn from a sampler that stands at its start. */
typedef struct epoch_batches {
    int32_t count;
    int32_t *idx;     /* [count][G] */
    int32_t *rows;    /* [count] */
    int32_t *bucket;  /* [count] */
} epoch_batches;

static int draw_epoch(tg_batch_sampler *s, epoch_batches *e) {
    const int32_t G = s->global_batch;
    e->count = s->per_epoch;
    e->idx = calloc((size_t)e->count * (size_t)G, sizeof *e->idx);
    e->rows = calloc((size_t)e->count, sizeof *e->rows);
    e->bucket = calloc((size_t)e->count, sizeof *e->bucket);
    if (!e->idx || !e->rows || !e->bucket) return 0;
    for (int32_t i = 0; i < e->count; i++)
        e->rows[i] = tg_batch_sampler_next(s, e->idx + (int64_t)i * G, &e->bucket[i]);
    return 1;
}

static void epoch_batches_free(epoch_batches *e) {
    free(e->idx);
    free(e->rows);
    free(e->bucket);
    memset(e, 0, sizeof *e);
}

/* How often each example appears in the epoch (times[n]); 0 if an index is out of range. */
static int count_examples(const epoch_batches *e, int32_t G, int32_t n, int32_t *times) {
    memset(times, 0, sizeof *times * (size_t)n);
    for (int32_t i = 0; i < e->count; i++)
        for (int32_t r = 0; r < e->rows[i]; r++) {
            const int32_t x = e->idx[(int64_t)i * G + r];
            if (x < 0 || x >= n) return 0;
            times[x]++;
        }
    return 1;
}

TG_TEST(test_batch_sampler_wrap_is_sampler_stream) {
    static const int32_t cases[][2] = {{10, 3}, {7, 7}, {5, 12}, {97, 32}, {1, 4}, {64, 16}};
    tg_err err = {{0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int32_t n = cases[c][0], G = cases[c][1];
        tg_batch_sampler s;
        tg_sampler ref;
        REQUIRE(tg_batch_sampler_init(&s, NULL, n, G, TG_LAST_BATCH_WRAP, 1, NULL, 1234, &err) == 0, "init: %s",
                err.msg);
        REQUIRE(tg_sampler_init(&ref, n, 1234, &err) == 0, "sampler: %s", err.msg);
        CHECK(s.per_epoch == (n + G - 1) / G, "n %d G %d: per_epoch %d", n, G, s.per_epoch);
        int32_t got[64], want[64];
        /* Four epochs' worth of examples, and then some. */
        const int32_t batches = (4 * n + G - 1) / G + 2;
        int same = 1, full = 1, place = 1;
        for (int32_t k = 0; k < batches; k++) {
            int32_t bucket = -1;
            const int32_t rows = tg_batch_sampler_next(&s, got, &bucket);
            tg_sampler_next(&ref, want, G);
            full &= rows == G && bucket == 0;
            same &= memcmp(got, want, sizeof *got * (size_t)G) == 0;
            place &= s.epoch == ref.epoch && s.pos == ref.pos;
        }
        CHECK(same, "n %d G %d: wrap yields tg_sampler's stream", n, G);
        CHECK(full, "n %d G %d: every wrap batch is full, in bucket 0", n, G);
        CHECK(place, "n %d G %d: (epoch, pos) follow tg_sampler's", n, G);
        CHECK(s.epoch >= 4, "n %d G %d: crossed into epoch %d", n, G, s.epoch);
        tg_batch_sampler_free(&s);
        tg_sampler_free(&ref);
    }
}

TG_TEST(test_batch_sampler_pad_and_drop) {
    tg_err err = {{0}};
    static const int32_t cases[][2] = {{103, 16}, {96, 16}, {5, 8}, {33, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int32_t n = cases[c][0], G = cases[c][1];
        tg_batch_sampler s;
        REQUIRE(tg_batch_sampler_init(&s, NULL, n, G, TG_LAST_BATCH_PAD, 0, NULL, 99, &err) == 0, "pad: %s",
                err.msg);
        CHECK(s.per_epoch == (n + G - 1) / G, "pad n %d G %d: per_epoch %d", n, G, s.per_epoch);
        int32_t *times = malloc(sizeof *times * (size_t)n), *order = malloc(sizeof *order * (size_t)n);
        REQUIRE(times && order, "alloc");
        for (int32_t ep = 0; ep < 4; ep++) {
            epoch_batches e;
            REQUIRE(draw_epoch(&s, &e), "alloc");
            REQUIRE(count_examples(&e, G, n, times), "pad n %d G %d epoch %d: an index out of range", n, G, ep);
            int once = 1, shape = 1, ordered = 1;
            for (int32_t x = 0; x < n; x++) once &= times[x] == 1;
            for (int32_t i = 0; i < e.count; i++)
                shape &= e.rows[i] == (i + 1 < e.count ? G : n - i * G) && e.bucket[i] == 0;
            /* The epoch's examples in tg_sampler's order for that epoch. */
            tg_seeded_order(order, n, 99, ep, TG_ORDER_EXAMPLES);
            for (int32_t i = 0; i < e.count; i++)
                for (int32_t r = 0; r < e.rows[i]; r++) ordered &= e.idx[(int64_t)i * G + r] == order[i * G + r];
            CHECK(once, "pad n %d G %d epoch %d: every example exactly once", n, G, ep);
            CHECK(shape, "pad n %d G %d epoch %d: full batches but the last", n, G, ep);
            CHECK(ordered, "pad n %d G %d epoch %d: the epoch's shuffle, batch i its [i*G, (i+1)*G)", n, G, ep);
            epoch_batches_free(&e);
        }
        tg_batch_sampler_free(&s);
        free(times);
        free(order);
    }

    /* drop: floor(n / G) full batches; the n mod G left out change with the shuffle. */
    const int32_t n = 103, G = 16;
    tg_batch_sampler s;
    REQUIRE(tg_batch_sampler_init(&s, NULL, n, G, TG_LAST_BATCH_DROP, 1, NULL, 99, &err) == 0, "drop: %s", err.msg);
    CHECK(s.per_epoch == n / G, "drop: per_epoch %d", s.per_epoch);
    int32_t times[103], left_out[4][103];
    for (int32_t ep = 0; ep < 4; ep++) {
        epoch_batches e;
        REQUIRE(draw_epoch(&s, &e), "alloc");
        REQUIRE(count_examples(&e, G, n, times), "drop epoch %d: an index out of range", ep);
        int at_most_once = 1, full = 1, missing = 0;
        for (int32_t x = 0; x < n; x++) {
            at_most_once &= times[x] <= 1;
            missing += times[x] == 0;
            left_out[ep][x] = times[x] == 0;
        }
        for (int32_t i = 0; i < e.count; i++) full &= e.rows[i] == G;
        CHECK(at_most_once && full, "drop epoch %d: full batches, no example twice", ep);
        CHECK(missing == n % G && missing <= G - 1, "drop epoch %d: %d left out", ep, missing);
        epoch_batches_free(&e);
    }
    int differ = 0;
    for (int32_t ep = 1; ep < 4; ep++) differ += memcmp(left_out[0], left_out[ep], sizeof left_out[0]) != 0;
    CHECK(differ == 3, "drop: the examples left out differ between epochs (%d of 3 differ from epoch 0's)", differ);
    tg_batch_sampler_free(&s);
}

/* Checks one epoch of a bucketed sampler; pad: every example once, drop: none twice and
 * n mod G left out. Writes the epoch's bucket sequence into seq_out. */
static void check_bucket_epoch(tg_batch_sampler *s, const int32_t *len, int32_t n, const int32_t *bucket_seq,
                               int n_buckets, int drop, int32_t ep, int32_t *seq_out) {
    const int32_t G = s->global_batch;
    epoch_batches e;
    int32_t *times = malloc(sizeof *times * (size_t)n);
    if (!CHECK(times && draw_epoch(s, &e), "alloc")) {
        free(times);
        return;
    }
    int64_t count[TG_MAX_BUCKETS] = {0}, full_in[TG_MAX_BUCKETS] = {0};
    for (int32_t x = 0; x < n; x++) count[expected_bucket(len[x], n_buckets, bucket_seq)]++;
    if (CHECK(count_examples(&e, G, n, times), "epoch %d: an index out of range", ep)) {
        int right = 1, missing = 0;
        for (int32_t x = 0; x < n; x++) {
            right &= drop ? times[x] <= 1 : times[x] == 1;
            missing += times[x] == 0;
        }
        CHECK(right, "%s epoch %d: every example %s", drop ? "drop" : "pad", ep,
              drop ? "at most once" : "exactly once");
        CHECK(missing == (drop ? n % G : 0), "%s epoch %d: %d left out", drop ? "drop" : "pad", ep, missing);
    }
    int holds = 1, short_batches = 0;
    for (int32_t i = 0; i < e.count; i++) {
        int32_t top = 0;
        for (int32_t r = 0; r < e.rows[i]; r++) {
            const int32_t b = expected_bucket(len[e.idx[(int64_t)i * G + r]], n_buckets, bucket_seq);
            if (b > top) top = b;
        }
        holds &= e.bucket[i] == top;
        short_batches += e.rows[i] < G;
        if (e.rows[i] == G) full_in[e.bucket[i]]++;
        seq_out[i] = e.bucket[i];
    }
    CHECK(holds, "epoch %d: each batch runs in the bucket of its longest example", ep);
    CHECK(short_batches <= (drop ? 0 : 1), "epoch %d: %d short batches", ep, short_batches);
    for (int b = 0; b < n_buckets; b++)
        CHECK(full_in[b] >= count[b] / G, "epoch %d bucket %d: %lld full batches for %lld examples", ep, b,
              (long long)full_in[b], (long long)count[b]);
    epoch_batches_free(&e);
    free(times);
}

TG_TEST(test_batch_sampler_buckets) {
    enum { N = 301, G = 8, EPOCHS = 3 };
    static const int32_t bucket_seq[] = {16, 32, 64, 128};
    int32_t len[N];
    random_lengths(len, N, 160, 5); /* some past the last bucket: truncated there */
    tg_err err = {{0}};
    for (int drop = 0; drop <= 1; drop++) {
        const int mode = drop ? TG_LAST_BATCH_DROP : TG_LAST_BATCH_PAD;
        tg_batch_sampler s, same, other;
        REQUIRE(tg_batch_sampler_init(&s, len, N, G, mode, 4, bucket_seq, 7, &err) == 0, "init: %s", err.msg);
        REQUIRE(tg_batch_sampler_init(&same, len, N, G, mode, 4, bucket_seq, 7, &err) == 0, "init: %s", err.msg);
        REQUIRE(tg_batch_sampler_init(&other, len, N, G, mode, 4, bucket_seq, 8, &err) == 0, "init: %s", err.msg);
        const int32_t per_epoch = drop ? N / G : (N + G - 1) / G;
        CHECK(s.per_epoch == per_epoch, "per_epoch %d, expected %d", s.per_epoch, per_epoch);
        int32_t seqs[EPOCHS][(N + G - 1) / G];
        for (int32_t ep = 0; ep < EPOCHS; ep++) check_bucket_epoch(&s, len, N, bucket_seq, 4, drop, ep, seqs[ep]);
        int sorted = 1;
        for (int32_t i = 1; i < per_epoch; i++) sorted &= seqs[0][i - 1] <= seqs[0][i];
        CHECK(!sorted, "the batches' buckets come in a random order, not ascending");
        CHECK(memcmp(seqs[0], seqs[1], sizeof *seqs[0] * (size_t)per_epoch) != 0 &&
                  memcmp(seqs[1], seqs[2], sizeof *seqs[1] * (size_t)per_epoch) != 0,
              "the order of buckets varies between epochs");

        /* Deterministic for a seed, different for another. */
        int32_t a[G], b[G], o[G];
        int identical = 1, differs = 0;
        tg_batch_sampler_free(&s);
        REQUIRE(tg_batch_sampler_init(&s, len, N, G, mode, 4, bucket_seq, 7, &err) == 0, "init: %s", err.msg);
        for (int32_t k = 0; k < 2 * per_epoch; k++) {
            int32_t ba, bb, bo;
            const int32_t ra = tg_batch_sampler_next(&s, a, &ba), rb = tg_batch_sampler_next(&same, b, &bb),
                          ro = tg_batch_sampler_next(&other, o, &bo);
            identical &= ra == rb && ba == bb && memcmp(a, b, sizeof *a * (size_t)ra) == 0;
            differs |= ra != ro || ba != bo || memcmp(a, o, sizeof *a * (size_t)ra) != 0;
        }
        CHECK(identical, "%s: the same seed gives the same batches", drop ? "drop" : "pad");
        CHECK(differs, "%s: another seed gives other batches", drop ? "drop" : "pad");
        tg_batch_sampler_free(&s);
        tg_batch_sampler_free(&same);
        tg_batch_sampler_free(&other);
    }
}

/* For each mode: a sampler that seeks to a place a drawing one reached yields the same
 * next batches; positions outside an epoch are refused. */
TG_TEST(test_batch_sampler_seek) {
    enum { N = 77, G = 8, EPOCHS = 4, MAX_BATCHES = EPOCHS * 11 + 8 };
    static const int32_t bucket_seq[] = {10, 40, 100};
    int32_t len[N];
    random_lengths(len, N, 120, 11);
    static const struct {
        int mode, n_buckets;
    } modes[] = {{TG_LAST_BATCH_PAD, 1}, {TG_LAST_BATCH_DROP, 1}, {TG_LAST_BATCH_WRAP, 1},
                 {TG_LAST_BATCH_PAD, 3}, {TG_LAST_BATCH_DROP, 3}};
    tg_err err = {{0}};
    uint64_t rng = 0xABCDEF;
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        const int mode = modes[m].mode, nb = modes[m].n_buckets;
        tg_batch_sampler ref, s;
        REQUIRE(tg_batch_sampler_init(&ref, len, N, G, mode, nb, bucket_seq, 3, &err) == 0, "init: %s", err.msg);
        REQUIRE(tg_batch_sampler_init(&s, len, N, G, mode, nb, bucket_seq, 3, &err) == 0, "init: %s", err.msg);
        /* The reference's place after each batch and the batches themselves. */
        int32_t at_epoch[MAX_BATCHES + 1], at_pos[MAX_BATCHES + 1], rows[MAX_BATCHES], bucket[MAX_BATCHES];
        int32_t idx[MAX_BATCHES][G];
        at_epoch[0] = ref.epoch;
        at_pos[0] = ref.pos;
        for (int k = 0; k < MAX_BATCHES; k++) {
            rows[k] = tg_batch_sampler_next(&ref, idx[k], &bucket[k]);
            at_epoch[k + 1] = ref.epoch;
            at_pos[k + 1] = ref.pos;
        }
        /* Random places (each epoch's end among them), in a random order: s has built
         * other epochs in between. */
        int same = 1, tried = 0;
        for (int t = 0; t < 40; t++) {
            const int k = t < EPOCHS ? (t + 1) * s.per_epoch : (int)(tg_test_rand(&rng) % (MAX_BATCHES - 3));
            if (k > MAX_BATCHES - 3) continue;
            if (!CHECK(tg_batch_sampler_seek(&s, at_epoch[k], at_pos[k], &err) == 0, "mode %s seek (%d, %d): %s",
                       tg_last_batch_name(mode), at_epoch[k], at_pos[k], err.msg))
                continue;
            tried++;
            for (int j = k; j < k + 3; j++) {
                int32_t got[G], b;
                const int32_t r = tg_batch_sampler_next(&s, got, &b);
                same &= r == rows[j] && b == bucket[j] && memcmp(got, idx[j], sizeof *got * (size_t)r) == 0;
            }
        }
        CHECK(same && tried > 0, "mode %s buckets %d: a seek then yields the drawing sampler's next batches",
              tg_last_batch_name(mode), nb);

        const int32_t limit = mode == TG_LAST_BATCH_WRAP ? N : s.per_epoch;
        const char *unit = mode == TG_LAST_BATCH_WRAP ? "examples" : "batches";
        const int32_t bad[][2] = {{0, limit + 1}, {0, -1}, {-1, 0}, {2, 1 << 30}};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            err.msg[0] = 0;
            char want[160];
            snprintf(want, sizeof want, "epoch %d, position %d is outside an epoch of %d %s", bad[i][0], bad[i][1],
                     limit, unit);
            CHECK(tg_batch_sampler_seek(&s, bad[i][0], bad[i][1], &err) == -1 && strstr(err.msg, want),
                  "mode %s: seek (%d, %d) refused with '%s', got '%s'", tg_last_batch_name(mode), bad[i][0],
                  bad[i][1], want, err.msg);
        }
        tg_batch_sampler_free(&ref);
        tg_batch_sampler_free(&s);
    }
}

/* Buckets cut the padded token slots of a long-tailed length distribution to under half
 * of one bucket at the longest length. */
TG_TEST(test_batch_sampler_bucket_padding) {
    enum { N = 4096, G = 32 };
    static const int32_t bucket_seq[] = {64, 128, 256, 512};
    static int32_t len[N];
    uint64_t rng = 0x5EED;
    for (int32_t i = 0; i < N; i++) {
        const double u = tg_test_rand(&rng) / 4294967296.0;
        len[i] = (int32_t)lround(5.0 * pow(100.0, u)); /* log-uniform over 5 .. 500 */
    }
    tg_err err = {{0}};
    tg_batch_sampler s;
    REQUIRE(tg_batch_sampler_init(&s, len, N, G, TG_LAST_BATCH_PAD, 4, bucket_seq, 1, &err) == 0, "init: %s",
            err.msg);
    int64_t slots_bucketed = 0, slots_flat = 0, tokens = 0, rows_total = 0;
    int fits = 1;
    for (int32_t k = 0; k < s.per_epoch; k++) {
        int32_t idx[G], b;
        const int32_t rows = tg_batch_sampler_next(&s, idx, &b);
        slots_bucketed += (int64_t)rows * bucket_seq[b];
        slots_flat += (int64_t)rows * 512;
        rows_total += rows;
        for (int32_t r = 0; r < rows; r++) {
            tokens += len[idx[r]];
            fits &= len[idx[r]] <= bucket_seq[b];
        }
    }
    CHECK(rows_total == N && fits, "one epoch of %lld rows, every example within its batch's bucket",
          (long long)rows_total);
    CHECK(slots_bucketed * 2 < slots_flat,
          "bucketed slots %lld (padding %.3f) should be under half of %lld without buckets (padding %.3f)",
          (long long)slots_bucketed, 1.0 - (double)tokens / (double)slots_bucketed, (long long)slots_flat,
          1.0 - (double)tokens / (double)slots_flat);
    tg_batch_sampler_free(&s);
}

TG_TEST(test_batch_sampler_errors) {
    static const int32_t lens[10] = {3, 9, 1, 4, 7, 2, 8, 5, 6, 10};
    static const int32_t ascending[] = {4, 8}, descending[] = {8, 4}, equal[] = {4, 4}, zero[] = {0, 4};
    static const int32_t nine[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    const struct {
        const int32_t *lengths;
        int32_t n, G;
        int mode, n_buckets;
        const int32_t *seq;
        const char *want;
    } cases[] = {
        {lens, 0, 4, TG_LAST_BATCH_PAD, 1, NULL, "the dataset has no examples"},
        {lens, 10, 32, TG_LAST_BATCH_DROP, 1, NULL, "last_batch = drop leaves no batch: 10 examples, global batch 32"},
        {lens, 10, 32, TG_LAST_BATCH_DROP, 2, ascending,
         "last_batch = drop leaves no batch: 10 examples, global batch 32"},
        {lens, 10, 4, TG_LAST_BATCH_WRAP, 2, ascending, "last_batch = wrap cannot be used with length buckets"},
        {lens, 10, 0, TG_LAST_BATCH_PAD, 1, NULL, "global batch 0 must be at least 1"},
        {lens, 10, -3, TG_LAST_BATCH_WRAP, 1, NULL, "global batch -3 must be at least 1"},
        {lens, 10, 4, TG_LAST_BATCH_PAD, TG_MAX_BUCKETS + 1, nine, "9 length buckets, more than the 8 allowed"},
        {lens, 10, 4, TG_LAST_BATCH_PAD, 2, descending, "bucket_seq is not ascending (bucket_seq[1] = 4 after 8)"},
        {lens, 10, 4, TG_LAST_BATCH_DROP, 2, equal, "bucket_seq is not ascending (bucket_seq[1] = 4 after 4)"},
        {lens, 10, 4, TG_LAST_BATCH_PAD, 2, zero, "bucket_seq[0] = 0 must be at least 1"},
        {NULL, 10, 4, TG_LAST_BATCH_PAD, 2, ascending, "need their lengths and the examples' lengths"},
        {lens, 10, 4, TG_LAST_BATCH_COUNT, 1, NULL, "last_batch 3 is not pad, drop or wrap"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tg_err err = {{0}};
        tg_batch_sampler s;
        const int rc = tg_batch_sampler_init(&s, cases[c].lengths, cases[c].n, cases[c].G, cases[c].mode,
                                             cases[c].n_buckets, cases[c].seq, 1, &err);
        CHECK(rc == -1 && strstr(err.msg, "batch sampler: ") == err.msg && strstr(err.msg, cases[c].want),
              "case %zu: want '%s', got rc %d '%s'", c, cases[c].want, rc, err.msg);
        tg_batch_sampler_free(&s); /* a failed init leaves nothing to free, and free is safe */
    }
    /* pad with fewer examples than a batch is fine: one short batch. */
    tg_err err = {{0}};
    tg_batch_sampler s;
    REQUIRE(tg_batch_sampler_init(&s, lens, 10, 32, TG_LAST_BATCH_PAD, 2, ascending, 1, &err) == 0, "pad: %s",
            err.msg);
    int32_t idx[32], b;
    CHECK(s.per_epoch == 1 && tg_batch_sampler_next(&s, idx, &b) == 10 && b == 1, "pad n 10 G 32: one batch of 10");
    tg_batch_sampler_free(&s);
}
