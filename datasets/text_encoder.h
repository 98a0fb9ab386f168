/* Text to ids as `data convert` needs it, behind a function pointer: the CLI wraps a
 * tg_tokenizer (datasets/tokenizer.h), tests use a small encoder of their own. The
 * encoding follows tg_tokenizer_encode: ids, type ids and byte offsets of each token. */
#ifndef TUNEGRAPH_TEXT_ENCODER_H
#define TUNEGRAPH_TEXT_ENCODER_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "datasets/tokenizer.h"

typedef struct tg_text_encoder {
    void *ctx;
    /* Encodes text (and pair when not NULL) as tg_tokenizer_encode does; *out belongs to
     * the encoder and stays valid until its next call. */
    int (*encode)(void *ctx, const char *text, size_t len, const char *pair, size_t pair_len,
                  const tg_encode_options *opt, const tg_encoding **out, tg_err *err);
    tg_tokenizer_family family;
    tg_special_ids special;
    int32_t vocab_size;
    uint64_t identity;        /* tg_tokenizer_identity */
} tg_text_encoder;

#endif
