/* UTF-8 checks and code-point offsets for the text inputs of `data convert`. */
#ifndef TUNEGRAPH_UTF8_H
#define TUNEGRAPH_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* The offset of the first byte of s[0..n) that is not well-formed UTF-8 (RFC 3629: no
 * overlong forms, no surrogates, nothing past U+10FFFF), or -1 when all of it is. */
int64_t tg_utf8_invalid_at(const char *s, size_t n);

/* The byte offset of code point number `chars` (0-based; `chars` equal to the count gives
 * n) in well-formed UTF-8 s[0..n), or -1 when s holds fewer code points. */
int64_t tg_utf8_byte_offset(const char *s, size_t n, int64_t chars);

#endif
