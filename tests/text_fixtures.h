/* Small parser inputs more than one test file reads: a SQuAD v2.0 file and a byte-level
 * BPE vocabulary with its merges (tests/text_fixtures.c). */
#ifndef TUNEGRAPH_TEST_TEXT_FIXTURES_H
#define TUNEGRAPH_TEST_TEXT_FIXTURES_H

/* SQuAD v2.0: an answerable question (answer "1901" at character 21 of a context with a
 * non-ASCII character before it), an unanswerable one with a plausible answer, and a
 * second article whose question id is a number. */
extern const char tg_test_squad_v2[];

/* The byte-level BPE vocabulary (vocab.json text, malloc'd): the 256 byte characters as ids
 * 0-255 in byte order, the merges' tokens from 256 ("he" .. "Ġworld", 256-264),
 * "<|endoftext|>" 265, then `extra` (", \"tok\": id" entries, or ""). */
char *tg_test_bpe_vocab_json(const char *extra);
/* Its merges.txt. */
extern const char tg_test_bpe_merges[];

/* Writes text into dir/name with every ' turned into " (JSON written readably in C
 * strings); returns the path, which stays valid for the next three calls. */
const char *tg_test_write_quoted(const char *dir, const char *name, const char *text);

#endif
