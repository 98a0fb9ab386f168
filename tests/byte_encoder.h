/* A stand-in tokenizer for the converter's tests: one token per byte (id 5 + byte), with
 * [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4, BERT's templates and token types, HF's
 * longest-first truncation, and byte offsets. The GPT-2 flavour adds no template and has
 * id 4 as its end-of-text token; the RoBERTa one uses <s> 2 a </s> 3 </s> 3 b </s> 3. */
#ifndef TUNEGRAPH_TEST_BYTE_ENCODER_H
#define TUNEGRAPH_TEST_BYTE_ENCODER_H

#include <stdlib.h>
#include <string.h>

#include "datasets/text_encoder.h"

#define BYTE_ID(b) (5 + (int32_t)(unsigned char)(b))
#define BYTE_VOCAB 261
#define BYTE_IDENTITY 0x0123456789abcdefull

typedef struct byte_encoder {
    tg_encoding enc;
    tg_tokenizer_family family;
    int calls;
} byte_encoder;

static int byte_encoder_reserve(tg_encoding *e, int32_t n) {
    if (n <= e->cap) return 0;
    int32_t cap = n < 64 ? 64 : n;
    e->ids = realloc(e->ids, (size_t)cap * sizeof *e->ids);
    e->type_ids = realloc(e->type_ids, (size_t)cap * sizeof *e->type_ids);
    e->special = realloc(e->special, (size_t)cap * sizeof *e->special);
    e->start = realloc(e->start, (size_t)cap * sizeof *e->start);
    e->end = realloc(e->end, (size_t)cap * sizeof *e->end);
    e->cap = cap;
    return e->ids && e->type_ids && e->special && e->start && e->end ? 0 : -1;
}

static void byte_encoder_put(tg_encoding *e, int32_t id, int32_t type, int special, int64_t at) {
    int32_t i = e->n++;
    e->ids[i] = id;
    e->type_ids[i] = type;
    e->special[i] = special;
    e->start[i] = special ? -1 : at;
    e->end[i] = special ? -1 : at + 1;
}

static int byte_encode(void *ctx, const char *text, size_t len, const char *pair, size_t pair_len,
                       const tg_encode_options *opt, const tg_encoding **out, tg_err *err) {
    byte_encoder *b = ctx;
    tg_encoding *e = &b->enc;
    b->calls++;
    const int templ = opt->add_special_tokens && b->family != TG_TOKENIZER_BPE_GPT2;
    const int roberta = b->family == TG_TOKENIZER_BPE_ROBERTA;
    int64_t la = (int64_t)len, lb = pair ? (int64_t)pair_len : 0;
    int64_t specials = templ ? (pair ? (roberta ? 4 : 3) : 2) : 0;
    if (opt->max_len > 0) /* longest first: trim the longer, the pair on a tie */
        while (la + lb + specials > opt->max_len && la + lb > 0) {
            if (lb >= la && lb > 0) lb--;
            else la--;
        }
    if (byte_encoder_reserve(e, (int32_t)(la + lb + specials + (opt->pad_to > 0 ? opt->pad_to : 0) + 1)))
        return tg_fail(err, "out of memory");
    e->n = 0;
    if (templ) byte_encoder_put(e, 2, 0, 1, 0);
    for (int64_t i = 0; i < la; i++) byte_encoder_put(e, BYTE_ID(text[i]), 0, 0, i);
    if (templ) byte_encoder_put(e, 3, 0, 1, 0);
    if (pair) {
        if (templ && roberta) byte_encoder_put(e, 3, 0, 1, 0);
        for (int64_t i = 0; i < lb; i++) byte_encoder_put(e, BYTE_ID(pair[i]), roberta ? 0 : 1, 0, i);
        if (templ) byte_encoder_put(e, 3, roberta ? 0 : 1, 1, 0);
    }
    e->n_real = e->n;
    while (opt->pad_to > 0 && e->n < opt->pad_to) byte_encoder_put(e, 0, 0, 1, 0);
    *out = e;
    return 0;
}

static tg_text_encoder byte_encoder_make(byte_encoder *b, tg_tokenizer_family family) {
    memset(b, 0, sizeof *b);
    b->family = family;
    tg_special_ids sp = {.cls = 2, .sep = 3, .pad = 0, .unk = 1, .mask = 4, .bos = -1, .eos = -1};
    if (family == TG_TOKENIZER_BPE_GPT2) sp = (tg_special_ids){-1, -1, -1, -1, -1, 4, 4};
    if (family == TG_TOKENIZER_BPE_ROBERTA) sp = (tg_special_ids){2, 3, 0, 1, 4, 2, 3};
    return (tg_text_encoder){.ctx = b, .encode = byte_encode, .family = family, .special = sp,
                             .vocab_size = BYTE_VOCAB, .identity = BYTE_IDENTITY};
}

static void byte_encoder_free(byte_encoder *b) {
    free(b->enc.ids);
    free(b->enc.type_ids);
    free(b->enc.special);
    free(b->enc.start);
    free(b->enc.end);
    memset(b, 0, sizeof *b);
}

#endif
