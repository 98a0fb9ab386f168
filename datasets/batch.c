/* Fixed-shape batches (the plan's shapes never change) and the seeded sampler. */
#include <stdint.h>
#include "base/alloc.h"
#include <stdlib.h>
#include <string.h>

#include "datasets/dataset.h"
#include "plan/ops.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Row copies into the staging buffers. Those are page-locked memory that the device reads
 * a step later and that the host has not touched since the ring last came round, so
 * ordinary stores would first read every line they write; streaming stores do not
 * (16-byte aligned destinations of 1 KB or more). Returns 1 if it streamed: the caller
 * fences before the batch is handed over. */
static int copy_row(void *dst, const void *src, size_t n) {
#if defined(__SSE2__)
    if (n >= 1024 && ((uintptr_t)dst & 15) == 0) {
        uint8_t *d = dst;
        const uint8_t *s = src;
        size_t i = 0;
        for (; i + 64 <= n; i += 64) {
            const __m128i a = _mm_loadu_si128((const __m128i *)(s + i)), b = _mm_loadu_si128((const __m128i *)(s + i + 16)),
                          c = _mm_loadu_si128((const __m128i *)(s + i + 32)), e = _mm_loadu_si128((const __m128i *)(s + i + 48));
            _mm_stream_si128((__m128i *)(d + i), a);
            _mm_stream_si128((__m128i *)(d + i + 16), b);
            _mm_stream_si128((__m128i *)(d + i + 32), c);
            _mm_stream_si128((__m128i *)(d + i + 48), e);
        }
        if (i < n) memcpy(d + i, s + i, n - i);
        return 1;
    }
#endif
    memcpy(dst, src, n);
    return 0;
}

void tg_batch_fill(const tg_dataset *ds, const int32_t *idx, int32_t n,
                   const tg_batch_shape *shape, tg_batch *out) {
    const int32_t B = shape->batch, T = shape->seq;
    const int roberta = shape->arch == TG_ARCH_ROBERTA;
    const int lm = shape->task == TG_TASK_LM;
    if (n > B) n = B;
    if (n < 0) n = 0;
    out->n_real = n;
    out->n_tokens = 0;
    const int keep_fixed = out->fixed_parts_written;
    int copied_types = 0, streamed = 0;
    /* The examples sit at random places in memory: ask for all of them first, so that
     * their cache misses overlap instead of coming one row at a time. */
    for (int32_t b = 0; b < n; b++) __builtin_prefetch(&ds->examples[idx[b]]);
    for (int32_t b = 0; b < n; b++) {
        const tg_example *ex = &ds->examples[idx[b]];
        for (int32_t t = 0; t < ex->len && t < T; t += 16) __builtin_prefetch(ex->input_ids + t);
    }
    /* Row by row with block copies and fills (the host prepares every batch, so this is
     * on the per-step path). */
    for (int32_t b = 0; b < B; b++) {
        const tg_example *ex = b < n ? &ds->examples[idx[b]] : NULL;
        const int32_t len = ex ? (ex->len < T ? ex->len : T) : 0; /* truncate to T */
        int32_t *ids = out->input_ids + (int64_t)b * T;
        float *mask = out->attention_mask + (int64_t)b * T;
        int32_t *types = out->token_type_ids + (int64_t)b * T;
        int32_t *pos = out->position_ids + (int64_t)b * T;
        const int same_len = keep_fixed && out->row_len && out->row_len[b] == len;
        if (out->row_len) out->row_len[b] = len;
        if (len) streamed |= copy_row(ids, ex->input_ids, sizeof *ids * (size_t)len);
        if (len && ex->token_type_ids) {
            memcpy(types, ex->token_type_ids, sizeof *types * (size_t)len);
            memset(types + len, 0, sizeof *types * (size_t)(T - len));
            copied_types = 1;
        } else if (!keep_fixed) {
            memset(types, 0, sizeof *types * (size_t)T);
        }
        if (!same_len) {
            for (int32_t t = 0; t < len; t++) mask[t] = 1.0f;
            memset(mask + len, 0, sizeof *mask * (size_t)(T - len)); /* all-zero bits are 0.0f */
            for (int32_t t = len; t < T; t++) ids[t] = shape->pad_id;
        }
        /* RoBERTa numbers real tokens from pad_id + 1 (HF's
         * create_position_ids_from_input_ids); padding sits at pad_id. */
        if (roberta && !same_len)
            for (int32_t t = 0; t < T; t++) pos[t] = t < len ? shape->pad_id + 1 + t : shape->pad_id;
        else if (!keep_fixed)
            for (int32_t t = 0; t < T; t++) pos[t] = t;
        /* An instruction's prompt: its tokens are no targets. Such a row is written whole
         * (never left to the step, nor trusted to hold its padding from before). */
        const int32_t prompt = lm && ex && ex->prompt_len > 1 ? ex->prompt_len : 0;
        if (lm && out->mark_label_rows && !prompt) {
            out->labels[(int64_t)b * T] = TG_LABELS_FROM_IDS; /* the step derives the row */
        } else if (lm) {
            /* Token t predicts token t+1, only while t+1 is inside the kept sequence and
             * past the prompt. */
            int32_t *lab = out->labels + (int64_t)b * T;
            const int32_t shifted = len > 1 ? len - 1 : 0;
            const int32_t first = prompt - 1 < shifted ? (prompt > 0 ? prompt - 1 : 0) : shifted;
            for (int32_t t = 0; t < first; t++) lab[t] = TG_IGNORE_INDEX;
            if (shifted > first)
                streamed |= copy_row(lab + first, ex->input_ids + 1 + first, sizeof *lab * (size_t)(shifted - first));
            if (!same_len || prompt)
                for (int32_t t = shifted; t < T; t++) lab[t] = TG_IGNORE_INDEX;
        } else if (shape->task == TG_TASK_MLM) {
            /* The masking op makes mlm's labels on the device; the input stays ignored. */
            if (!same_len)
                for (int32_t t = 0; t < T; t++) out->labels[(int64_t)b * T + t] = TG_IGNORE_INDEX;
        } else if (shape->task == TG_TASK_QA) {
            out->labels[2 * b] = ex ? ex->label : TG_SPAN_NONE;
            out->labels[2 * b + 1] = ex ? ex->label_end : TG_SPAN_NONE;
        } else {
            out->labels[b] = ex ? ex->label : TG_IGNORE_INDEX;
        }
        out->n_tokens += len;
    }
    out->fixed_parts_written = !copied_types;
#if defined(__SSE2__)
    if (streamed) _mm_sfence(); /* streaming stores are weakly ordered: complete before the hand-over */
#else
    (void)streamed;
#endif
}

void tg_batch_derive_label_rows(int32_t *labels, const int32_t *ids, const float *mask, int32_t rows, int32_t seq) {
    for (int64_t b = 0; b < rows; b++) {
        int32_t *lab = labels + b * seq;
        if (lab[0] != TG_LABELS_FROM_IDS) continue;
        const int32_t *id = ids + b * seq;
        const float *m = mask + b * seq;
        for (int32_t t = 0; t < seq; t++) lab[t] = t + 1 < seq && m[t + 1] != 0.0f ? id[t + 1] : TG_IGNORE_INDEX;
    }
}

/* ---- sampler ---- */

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t xorshift64s(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* Each epoch's order depends only on (seed, epoch, stream), so a resumed run can rebuild
 * it. The example stream keeps the generator state it always had, so runs keep their
 * batches; another stream mixes its number in once more. */
void tg_seeded_order(int32_t *order, int32_t n, uint64_t seed, int32_t epoch, int stream) {
    uint64_t key = seed ^ splitmix64((uint64_t)epoch + 1);
    if (stream != TG_ORDER_EXAMPLES) key = splitmix64(key) ^ splitmix64(0xD1B54A32D192ED03ull * (uint64_t)stream);
    uint64_t state = splitmix64(key);
    if (state == 0) state = 0x9E3779B97F4A7C15ull; /* xorshift's one bad state */
    for (int32_t i = 0; i < n; i++) order[i] = i;
    for (int32_t i = n - 1; i > 0; i--) {
        /* Multiply-shift instead of modulo: unbiased enough and the same everywhere. */
        int32_t j = (int32_t)(((xorshift64s(&state) >> 32) * (uint64_t)(i + 1)) >> 32);
        int32_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

static void shuffle(tg_sampler *s) { tg_seeded_order(s->order, s->n, s->seed, s->epoch, TG_ORDER_EXAMPLES); }

int tg_sampler_init(tg_sampler *s, int32_t n, uint64_t seed, tg_err *err) {
    memset(s, 0, sizeof *s);
    if (n <= 0) return tg_fail(err, "sampler: the dataset has no examples");
    s->order = tg_malloc((size_t)n * sizeof *s->order);
    if (!s->order) return tg_fail(err, "sampler: out of memory for %d indices", n);
    s->n = n;
    s->seed = seed;
    shuffle(s);
    return 0;
}

int tg_sampler_seek(tg_sampler *s, int32_t epoch, int32_t pos, tg_err *err) {
    if (epoch < 0 || pos < 0 || pos > s->n)
        return tg_fail(err, "sampler: epoch %d, position %d is outside an epoch of %d examples", epoch, pos, s->n);
    s->epoch = epoch;
    s->pos = pos;
    shuffle(s);
    return 0;
}

void tg_sampler_next(tg_sampler *s, int32_t *idx, int32_t count) {
    for (int32_t i = 0; i < count; i++) {
        if (s->pos == s->n) {
            s->epoch++;
            s->pos = 0;
            shuffle(s);
        }
        idx[i] = s->order[s->pos++];
    }
}

void tg_sampler_free(tg_sampler *s) {
    if (!s) return;
    free(s->order);
    memset(s, 0, sizeof *s);
}
