/* Whole gzip files inflated in memory (zlib), for inputs distributed gzip'd, as MNIST's
 * IDX files are (train-images-idx3-ubyte.gz). */
#ifndef TUNEGRAPH_GUNZIP_H
#define TUNEGRAPH_GUNZIP_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

/* 1 when buf starts with gzip's magic bytes 1f 8b. */
int tg_is_gzip(const uint8_t *buf, size_t len);

/* Inflates a gzip file (one member or several, concatenated, as gunzip reads them) into
 * *out (malloc'd, *out_len bytes, at most max_out). Strict: a stream cut short, a bad
 * header, corrupt data, a CRC or length check that fails, or bytes after the last member
 * that are not another member are errors naming the file ("NAME: ..."). */
int tg_gunzip(const uint8_t *buf, size_t len, const char *name, size_t max_out, uint8_t **out, size_t *out_len,
              tg_err *err);

#endif
