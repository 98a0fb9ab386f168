/* UTF-8 as RFC 3629 defines it; SQuAD's answer_start counts code points (Python's str
 * indices), so answers are found by walking code points. */
#include "datasets/utf8.h"

/* The length of the well-formed sequence starting at s[0], or 0. */
static size_t sequence_length(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF; /* the second byte's range */
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if (c >= 0xE1 && c <= 0xEC) len = 3;
    else if (c == 0xED) len = 3, hi = 0x9F; /* no surrogates */
    else if (c >= 0xEE && c <= 0xEF) len = 3;
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) len = 4, hi = 0x8F; /* nothing past U+10FFFF */
    else return 0;
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return len;
}

int64_t tg_utf8_invalid_at(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        size_t len = sequence_length(u + i, n - i);
        if (!len) return (int64_t)i;
        i += len;
    }
    return -1;
}

int64_t tg_utf8_byte_offset(const char *s, size_t n, int64_t chars) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    for (int64_t c = 0; c < chars; c++) {
        if (i >= n) return -1;
        size_t len = sequence_length(u + i, n - i);
        i += len ? len : 1;
    }
    return (int64_t)i;
}
