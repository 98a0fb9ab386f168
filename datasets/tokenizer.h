/* Text to token ids, matching Hugging Face `tokenizers` token for token.
 *
 * Two models: WordPiece as BERT uses it (vocab.txt, or tokenizer.json with a WordPiece
 * model) and byte-level BPE as GPT-2, RoBERTa and Llama 3 use it (vocab.json + merges.txt,
 * or tokenizer.json with a BPE model; Llama 3's pre-tokenizer is a Split pattern, taken
 * from the file, and its template the file's TemplateProcessing). tg_tokenizer_open takes
 * any of: a vocab.txt, a folder holding vocab.json + merges.txt (GPT-2's encoder.json +
 * vocab.bpe are accepted under those names too), a tokenizer.json, or a Hugging Face model
 * folder (tokenizer.json first, then vocab.txt, then vocab.json + merges.txt;
 * tokenizer_config.json and config.json there say lower-casing and the model family when
 * no tokenizer.json does, and Llama's bos, eos and pad tokens).
 *
 * A tokenizer keeps a BPE merge cache and scratch buffers that encoding writes, so a
 * handle is used by one thread at a time; open one per thread to tokenize in parallel. */
#ifndef TUNEGRAPH_TOKENIZER_H
#define TUNEGRAPH_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef struct tg_tokenizer tg_tokenizer;

typedef enum tg_tokenizer_family {
    TG_TOKENIZER_WORDPIECE = 1,  /* BERT: [CLS] a [SEP] (b [SEP]) */
    TG_TOKENIZER_BPE_GPT2 = 2,   /* GPT-2: no special tokens added */
    TG_TOKENIZER_BPE_ROBERTA = 3, /* RoBERTa: <s> a </s> (</s> b </s>) */
    /* Llama 3: a tokenizer.json's TemplateProcessing that starts with a bos token and
     * adds no <s> of RoBERTa's: <|begin_of_text|> a (<|begin_of_text|> b) */
    TG_TOKENIZER_BPE_LLAMA = 4
} tg_tokenizer_family;

/* The ids a family's templates use; -1 where the vocabulary has no such token. Llama 3:
 * bos the template's first token, eos <|end_of_text|>, pad none, unless the
 * tokenizer_config.json beside its tokenizer.json names them (bos_token, eos_token,
 * pad_token); no cls, sep, unk or mask. */
typedef struct tg_special_ids {
    int32_t cls, sep, pad, unk, mask, bos, eos;
} tg_special_ids;

int tg_tokenizer_open(const char *path, tg_tokenizer **out, tg_err *err);
void tg_tokenizer_free(tg_tokenizer *tok);

tg_tokenizer_family tg_tokenizer_family_of(const tg_tokenizer *tok);
int32_t tg_tokenizer_vocab_size(const tg_tokenizer *tok);
tg_special_ids tg_tokenizer_special_ids(const tg_tokenizer *tok);
/* The id of one vocabulary entry spelled exactly as in the vocabulary, or -1. */
int32_t tg_tokenizer_token_id(const tg_tokenizer *tok, const char *token);
/* The vocabulary entry of an id (an added token's content, or the model's token as the
 * vocabulary spells it, byte-level characters and "##" included), or NULL. */
const char *tg_tokenizer_id_to_token(const tg_tokenizer *tok, int32_t id);
/* How many special tokens the template adds to one text (pair 0) or a pair (pair 1):
 * 2 and 3 for BERT, 2 and 4 for RoBERTa, 0 for GPT-2, 1 and 2 for Llama 3. */
int32_t tg_tokenizer_added_count(const tg_tokenizer *tok, int pair);
/* xxh64 over the files that define the tokenizer's output (vocabulary, merges, settings):
 * what a shard manifest records so data made by another tokenizer is refused. */
uint64_t tg_tokenizer_identity(const tg_tokenizer *tok);

/* How an encoding is finished. max_len 0: no truncation. Truncation is HF's
 * longest-first over the pair, counting the special tokens the template adds. pad_to 0:
 * no padding; else pad with the pad id (type id 0, attention 0) up to pad_to. A
 * tokenizer.json's own "truncation" and "padding" settings are not applied: these are.
 * NULL options: add_special_tokens 1, no truncation, no padding. */
typedef struct tg_encode_options {
    int32_t add_special_tokens; /* 1: the family's template ([CLS] a [SEP], <s> a </s>) */
    int32_t max_len;
    int32_t pad_to;
} tg_encode_options;

/* One encoded text or pair. Arrays grow as needed and are reused across calls;
 * tg_encoding_free releases them. */
typedef struct tg_encoding {
    int32_t n;                /* tokens, padding included */
    int32_t n_real;           /* tokens before padding */
    int32_t cap;
    int32_t *ids;
    int32_t *type_ids;        /* as the template says: BERT 0 for the first text and its
                                 specials, 1 for the pair's; RoBERTa 0 throughout */
    int32_t *special;         /* 1 where a template token or padding */
    int64_t *start, *end;     /* byte offsets into the text (or pair, where sequence is 1)
                                 of each real token; -1 for template tokens and padding */
    int32_t *sequence;        /* 0: the token comes from the text, 1: from the pair,
                                 -1: a template token or padding */
} tg_encoding;

/* Encodes UTF-8 text (len bytes; need not be NUL-terminated) and, when pair is not NULL,
 * a second text. Invalid UTF-8 is an error naming the byte offset. Added tokens written
 * in the text ("[SEP]", "<|endoftext|>") are those tokens, as in HF. */
int tg_tokenizer_encode(tg_tokenizer *tok, const char *text, size_t len, const char *pair,
                        size_t pair_len, const tg_encode_options *opt, tg_encoding *out,
                        tg_err *err);
void tg_encoding_free(tg_encoding *enc);

#endif
