#define ZSTD_STATIC_LINKING_ONLY /* the contexts with a custom allocator */
#include "base/zstd_alloc.h"

#include <stdlib.h>
#include <zstd_errors.h>

#include "base/alloc.h"

static void *zstd_alloc(void *opaque, size_t bytes) { return tg_malloc(bytes); }
static void zstd_release(void *opaque, void *p) { free(p); }
static const ZSTD_customMem k_mem = {zstd_alloc, zstd_release, NULL};

ZSTD_CCtx *tg_zstd_cctx(void) { return ZSTD_createCCtx_advanced(k_mem); }
ZSTD_DCtx *tg_zstd_dctx(void) { return ZSTD_createDCtx_advanced(k_mem); }

size_t tg_zstd_compress(void *dst, size_t cap, const void *src, size_t len, int level) {
    ZSTD_CCtx *c = tg_zstd_cctx();
    if (!c) return (size_t)-ZSTD_error_memory_allocation;
    const size_t n = ZSTD_compressCCtx(c, dst, cap, src, len, level);
    ZSTD_freeCCtx(c);
    return n;
}

size_t tg_zstd_decompress(void *dst, size_t cap, const void *src, size_t len) {
    ZSTD_DCtx *d = tg_zstd_dctx();
    if (!d) return (size_t)-ZSTD_error_memory_allocation;
    const size_t n = ZSTD_decompressDCtx(d, dst, cap, src, len);
    ZSTD_freeDCtx(d);
    return n;
}

int tg_zstd_out_of_memory(size_t result) {
    return ZSTD_isError(result) && ZSTD_getErrorCode(result) == ZSTD_error_memory_allocation;
}
