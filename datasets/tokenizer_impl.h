/* The tokenizer's parts shared by its files: tokenizer.c (loading, added tokens,
 * templates, truncation, padding), wordpiece.c (BERT's normaliser, pre-tokenizer and
 * WordPiece) and bpe.c (byte-level BPE). Nothing outside datasets/tokenizer*.c,
 * wordpiece.c and bpe.c includes it. */
#ifndef TUNEGRAPH_TOKENIZER_IMPL_H
#define TUNEGRAPH_TOKENIZER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "datasets/tokenizer.h"

/* ---- vocabulary: bytes -> id hash map, and id -> bytes ------------------------------ */

typedef struct tok_entry {
    uint64_t hash;
    uint32_t off, len; /* in tok_vocab.text */
    int32_t id;
} tok_entry;

typedef struct tok_vocab {
    char *text; /* every entry's bytes back to back, each NUL-terminated */
    size_t text_len, text_cap;
    tok_entry *entries;
    int32_t n, cap;
    int32_t *slots; /* open addressing: entry index, or -1 */
    uint32_t mask;
    int32_t *by_id; /* id -> entry index (-1: none); built by tok_vocab_index_ids */
    int32_t n_ids;  /* largest id + 1 */
    uint32_t max_len;
} tok_vocab;

uint64_t tok_hash(const void *s, size_t len);
/* Maps s to id; an existing entry takes the new id (a later duplicate wins, as HF's maps). */
int tok_vocab_put(tok_vocab *v, const char *s, size_t len, int32_t id, tg_err *err);
int32_t tok_vocab_get_hashed(const tok_vocab *v, const char *s, size_t len, uint64_t hash);
static inline int32_t tok_vocab_get(const tok_vocab *v, const char *s, size_t len) {
    return tok_vocab_get_hashed(v, s, len, tok_hash(s, len));
}
/* Builds by_id; returns -1 when memory runs out. */
int tok_vocab_index_ids(tok_vocab *v, tg_err *err);
/* The bytes of id (NUL-terminated), or NULL. */
const char *tok_vocab_token(const tok_vocab *v, int32_t id, uint32_t *len);
void tok_vocab_free(tok_vocab *v);

/* ---- token lists: one sequence's tokens before the template ------------------------ */

typedef struct tok_list {
    int32_t *ids;
    int64_t *start, *end; /* byte offsets into the sequence's text */
    uint8_t *added;       /* 1: an added token matched in the text */
    int32_t n, cap;
} tok_list;

int tok_list_reserve(tok_list *l, int64_t extra, tg_err *err);
static inline void tok_list_push(tok_list *l, int32_t id, int64_t start, int64_t end, int added) {
    l->ids[l->n] = id;
    l->start[l->n] = start;
    l->end[l->n] = end;
    l->added[l->n] = (uint8_t)added;
    l->n++;
}
void tok_list_free(tok_list *l);

/* ---- added tokens (HF's AddedVocabulary) --------------------------------------------- */

typedef struct tok_added {
    char *content;
    uint32_t len;
    int32_t id;
    uint8_t special, lstrip, rstrip, single_word, normalized;
} tok_added;

/* A piece of text after splitting on added tokens: [start, end) is an added token when
 * id >= 0, else text for the model. */
typedef struct tok_split {
    int64_t start, end;
    int32_t id;
} tok_split;

typedef struct tok_splits {
    tok_split *s;
    int32_t n, cap;
} tok_splits;

/* ---- templates (HF's post-processors) ----------------------------------------------- */

enum { TOK_PIECE_SPECIAL = 0, TOK_PIECE_A = 1, TOK_PIECE_B = 2 };
#define TOK_TEMPLATE_MAX 16
#define TOK_TEMPLATE_IDS 64

typedef struct tok_piece {
    int32_t kind, type_id;
    int32_t first, n_ids; /* TOK_PIECE_SPECIAL: its ids in tok_template.ids */
} tok_piece;

typedef struct tok_template {
    tok_piece single[TOK_TEMPLATE_MAX], pair[TOK_TEMPLATE_MAX];
    int32_t n_single, n_pair;
    int32_t ids[TOK_TEMPLATE_IDS];
    int32_t n_ids;
    /* ByteLevel / RoBERTa offset trimming of the leading and trailing spaces of tokens. */
    int32_t trim_offsets, trim_add_prefix_space;
} tok_template;

/* ---- the models ----------------------------------------------------------------------- */

typedef struct tok_wordpiece {
    tok_vocab vocab;
    int32_t unk_id;         /* -1: the vocabulary has no unk token */
    char unk_token[64];
    char prefix[32];        /* continuing-subword prefix, "##" */
    uint32_t prefix_len;
    int32_t max_chars;      /* longer words (in characters) become the unk token */
    /* BertNormalizer; has_normalizer 0: none. */
    int32_t has_normalizer, clean_text, chinese, strip_accents, lowercase;
    /* Scratch for one segment: the normalized text, and for each of its bytes the
     * original byte range of the character it came from. */
    char *norm;
    int64_t *norm_start, *norm_end;
    int64_t norm_cap;
    char *word; /* prefix + word, for lookups */
    int64_t word_cap;
    struct tok_nchar *pending; /* accent stripping: characters awaiting canonical order, */
    int32_t pending_cap;
    int64_t *fifo;             /* and the original ranges they will take, in order */
    int64_t fifo_cap;
} tok_wordpiece;

typedef struct tok_merge {
    uint64_t key; /* left id << 32 | right id; UINT64_MAX: empty slot */
    int32_t rank, new_id;
} tok_merge;

/* The merge cache: a piece's bytes -> its tokens (ids and byte lengths), bounded: when
 * full it is emptied. */
typedef struct tok_cache_entry {
    uint64_t hash;
    uint32_t key_off, key_len, val_off, n;
} tok_cache_entry;

typedef struct tok_bpe {
    tok_vocab vocab;
    tok_merge *merges;
    uint32_t merges_mask;
    int32_t n_merges;
    int32_t byte_id[256];  /* id of each byte's byte-level character; -1 when absent */
    int32_t unk_id;        /* -1: none (bytes without an id are dropped, as HF does) */
    int32_t fuse_unk, ignore_merges;
    int32_t add_prefix_space;
    void *re;              /* pcre2_code_8 */
    void *match_data;      /* pcre2_match_data_8 */
    /* cache */
    tok_cache_entry *cache;
    int32_t *cache_slots;
    uint32_t cache_mask;
    int32_t cache_n;
    char *cache_arena;
    size_t cache_arena_len, cache_arena_cap;
    /* scratch for one word's merges: symbols (id, neighbours, byte span), the heap of
     * candidate merges, the word's tokens as (id, start, end) triples */
    int32_t *sym_id, *sym_prev, *sym_next, *sym_span;
    int64_t *heap;
    int32_t *out_ids;
    int64_t sym_cap;
    char *prefixed; /* " " + segment when add_prefix_space */
    int64_t prefixed_cap;
    char *level; /* a word's byte-level characters, for ignore_merges lookups */
    int64_t level_cap;
} tok_bpe;

struct tg_tokenizer {
    tg_tokenizer_family family;
    tok_wordpiece wp; /* family TG_TOKENIZER_WORDPIECE */
    tok_bpe bpe;      /* the BPE families */
    tok_added *added;
    int32_t n_added, cap_added;
    int32_t has_normalized_added; /* any added token with normalized set */
    uint8_t added_first[2][256];  /* [normalized][byte]: some added token starts with it */
    tok_template tmpl;
    tg_special_ids special;
    /* Llama's family: the bos, eos and pad a tokenizer_config.json beside the
     * tokenizer.json names (-1: none), or -2 where it says nothing */
    int32_t config_bos, config_eos, config_pad;
    int32_t vocab_size;
    uint64_t identity;
    /* scratch reused across calls */
    tok_list seq[2];
    tok_splits raw_splits, norm_splits;
};

/* Splits text[0, len) on the added tokens whose `normalized` flag equals `normalized`,
 * as HF's AddedVocabulary does (leftmost-longest, then single_word, lstrip, rstrip). The
 * splits' offsets are relative to text. */
int tok_split_added(const tg_tokenizer *t, const char *text, int64_t len, int normalized, tok_splits *out,
                    tg_err *err);

/* Appends the tokens of text[start, end) (a piece between added tokens) to out, with
 * offsets into text. */
int tok_wordpiece_encode(tg_tokenizer *t, const char *text, int64_t start, int64_t end, tok_list *out,
                         tg_err *err);
int tok_bpe_encode(tg_tokenizer *t, const char *text, int64_t start, int64_t end, tok_list *out, tg_err *err);

/* Byte-level BPE: compiles the pre-tokenisation pattern and finds each byte's id (after
 * the vocabulary and merges are in). */
int tok_bpe_prepare(tok_bpe *b, tg_err *err);
/* A Split pre-tokenizer's pattern (Oniguruma's syntax, as HF reads it; len bytes of valid
 * UTF-8) in place of GPT-2's: taken into PCRE2's syntax and compiled, or refused with a
 * message naming `where` (the file and field) and the construct. */
int tok_bpe_set_pattern(tok_bpe *b, const char *pattern, size_t len, const char *where, tg_err *err);
int tok_bpe_add_merge(tok_bpe *b, int32_t left, int32_t right, int32_t rank, int32_t new_id, tg_err *err);
void tok_bpe_free(tok_bpe *b);
void tok_wordpiece_free(tok_wordpiece *w);

/* The byte-level alphabet: GPT-2's map of the 256 bytes to printable characters. */
uint32_t tok_byte_char(uint8_t b);

/* UTF-8 of valid text: the code point at s (advancing *i), and its encoding (returns
 * the byte count). */
static inline uint32_t tok_utf8_next(const unsigned char *s, int64_t *i) {
    const unsigned char c = s[*i];
    if (c < 0x80) {
        (*i)++;
        return c;
    }
    if (c < 0xE0) {
        const uint32_t cp = ((uint32_t)(c & 0x1F) << 6) | (s[*i + 1] & 0x3F);
        *i += 2;
        return cp;
    }
    if (c < 0xF0) {
        const uint32_t cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[*i + 1] & 0x3F) << 6) | (s[*i + 2] & 0x3F);
        *i += 3;
        return cp;
    }
    const uint32_t cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[*i + 1] & 0x3F) << 12) |
                        ((uint32_t)(s[*i + 2] & 0x3F) << 6) | (s[*i + 3] & 0x3F);
    *i += 4;
    return cp;
}

static inline int tok_utf8_put(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Unicode's White_Space property (Rust's char::is_whitespace, which HF uses). */
int tok_is_whitespace(uint32_t cp);

#endif
