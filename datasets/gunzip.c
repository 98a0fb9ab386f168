#include "datasets/gunzip.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "base/alloc.h"

int tg_is_gzip(const uint8_t *buf, size_t len) { return len >= 2 && buf[0] == 0x1f && buf[1] == 0x8b; }

/* zlib counts in uInt: feed and drain at most this much per call. */
#define STEP ((size_t)1 << 30)

int tg_gunzip(const uint8_t *buf, size_t len, const char *name, size_t max_out, uint8_t **out, size_t *out_len,
              tg_err *err) {
    *out = NULL;
    *out_len = 0;
    if (!tg_is_gzip(buf, len)) return tg_fail(err, "%s: not a gzip file (it does not start with 1f 8b)", name);
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    /* 16 + MAX_WBITS: a gzip wrapper (header, CRC-32 and length checked), not zlib's. */
    if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) return tg_fail(err, "%s: out of memory for zlib", name);
    size_t cap = len < max_out / 4 ? 4 * len : max_out, used = 0, at = 0;
    if (cap < 4096 && max_out >= 4096) cap = 4096;
    uint8_t *o = tg_malloc(cap ? cap : 1);
    int rc = o ? 0 : tg_fail(err, "%s: out of memory for %zu gunzipped bytes", name, cap);
    while (!rc) {
        if (used == cap) {
            if (cap == max_out) {
                rc = tg_fail(err, "%s: gunzipped, it is more than %zu bytes", name, max_out);
                break;
            }
            size_t grown = cap <= max_out / 2 ? 2 * cap : max_out;
            uint8_t *g = tg_realloc(o, grown);
            if (!g) {
                rc = tg_fail(err, "%s: out of memory for %zu gunzipped bytes", name, grown);
                break;
            }
            o = g, cap = grown;
        }
        const size_t feed = len - at < STEP ? len - at : STEP, room = cap - used < STEP ? cap - used : STEP;
        zs.next_in = (Bytef *)(buf + at), zs.avail_in = (uInt)feed;
        zs.next_out = o + used, zs.avail_out = (uInt)room;
        const int z = inflate(&zs, Z_NO_FLUSH);
        at += feed - zs.avail_in;
        used += room - zs.avail_out;
        if (z == Z_STREAM_END) {
            if (at == len) break;
            /* Another member may follow, as gunzip reads them; anything else is refused. */
            if (!tg_is_gzip(buf + at, len - at)) {
                rc = tg_fail(err, "%s: %zu bytes after the end of the gzip data (at byte %zu), which are not another "
                                  "gzip member",
                             name, len - at, at);
                break;
            }
            inflateReset(&zs);
        } else if (z == Z_DATA_ERROR) {
            rc = tg_fail(err, "%s: corrupt gzip data near byte %zu: %s", name, at, zs.msg ? zs.msg : "invalid data");
        } else if (z == Z_MEM_ERROR) {
            rc = tg_fail(err, "%s: out of memory for zlib", name);
        } else if ((z == Z_OK || z == Z_BUF_ERROR) && zs.avail_out) {
            /* Room left over, so inflate wants input: there is none, or it could not use it. */
            if (at == len) rc = tg_fail(err, "%s: truncated: the gzip data ends after %zu bytes, before its end", name, len);
            else if (z == Z_BUF_ERROR) rc = tg_fail(err, "%s: gzip data zlib cannot read (no progress at byte %zu)", name, at);
        } else if (z != Z_OK && z != Z_BUF_ERROR) {
            rc = tg_fail(err, "%s: gzip data zlib cannot read (error %d)", name, z);
        }
    }
    inflateEnd(&zs);
    if (rc) {
        free(o);
        return -1;
    }
    *out = o;
    *out_len = used;
    return 0;
}
