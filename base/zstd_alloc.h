/* zstd contexts whose memory comes through base/alloc.h, so that the allocation fault tests
 * fail zstd's allocations too (a plain ZSTD_createCCtx or ZSTD_decompress takes libc's). */
#ifndef TUNEGRAPH_ZSTD_ALLOC_H
#define TUNEGRAPH_ZSTD_ALLOC_H

#include <stddef.h>
#include <zstd.h>

ZSTD_CCtx *tg_zstd_cctx(void);
ZSTD_DCtx *tg_zstd_dctx(void);

/* ZSTD_compress and ZSTD_decompress on such a context: a context that cannot be made gives
 * zstd's memory-allocation error. */
size_t tg_zstd_compress(void *dst, size_t cap, const void *src, size_t len, int level);
size_t tg_zstd_decompress(void *dst, size_t cap, const void *src, size_t len);

/* Whether a zstd result is its memory-allocation error. */
int tg_zstd_out_of_memory(size_t result);

#endif
