/* The plan file container: a 40-byte header (magic, format version, flags, payload sizes,
 * xxh64 of the compressed payload) + the zstd-compressed payload; atomic write, read, sniff.
 * The payload itself is encoded and decoded by plan/plan_codec.c. */
#include "plan/plan_file.h"
#include "base/alloc.h"

#include "base/atomic_file.h"
#include "plan/plan_codec.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Header-only xxHash: no shared library needed where plans are run. */
#define XXH_INLINE_ALL
#include <xxhash.h>
#include <zstd.h>

#include "base/zstd_alloc.h"

static const uint8_t k_magic[8] = {'T', 'G', 'P', 'L', 'A', 'N', 0, 0};
#define HEADER_BYTES 40
#define ZSTD_LEVEL 3

static void put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

int tg_plan_encode(const tg_plan *plan, uint8_t **out, size_t *out_len, tg_err *err) {
    *out = NULL;
    *out_len = 0;
    uint8_t *payload;
    size_t payload_len;
    if (tg_plan_payload_encode(plan, &payload, &payload_len, err)) return -1;
    size_t bound = ZSTD_compressBound(payload_len);
    uint8_t *file = tg_malloc(HEADER_BYTES + bound);
    if (!file) {
        free(payload);
        return tg_fail(err, "plan encode: out of memory");
    }
    size_t csize = tg_zstd_compress(file + HEADER_BYTES, bound, payload, payload_len, ZSTD_LEVEL);
    if (ZSTD_isError(csize)) {
        free(payload);
        free(file);
        /* Only memory can fail: the destination holds ZSTD_compressBound bytes. */
        if (tg_zstd_out_of_memory(csize)) /* GCOVR_EXCL_BR_LINE: see above */
            return tg_fail(err, "plan encode: out of memory for the zstd compressor");
        return tg_fail(err, "plan encode: zstd: %s", ZSTD_getErrorName(csize));
    }
    memcpy(file, k_magic, 8);
    put_le32(file + 8, TG_PLAN_VERSION);
    put_le32(file + 12, 0);
    put_le64(file + 16, payload_len);
    put_le64(file + 24, csize);
    put_le64(file + 32, XXH64(file + HEADER_BYTES, csize, 0));
    free(payload);
    *out = file;
    *out_len = HEADER_BYTES + csize;
    return 0;
}

int tg_plan_decode(const uint8_t *bytes, size_t len, const char *name, tg_plan *plan, tg_err *err) {
    return tg_plan_decode_checked(bytes, len, name, TG_PLAN_CHECK_ALL, plan, err);
}

int tg_plan_decode_checked(const uint8_t *bytes, size_t len, const char *name, tg_plan_checks checks, tg_plan *plan,
                           tg_err *err) {
    memset(plan, 0, sizeof *plan);
    if (!name) name = "plan";
    /* Magic before length, so a short non-plan file is called what it is. */
    if (len > 0 && memcmp(bytes, k_magic, len < 8 ? len : 8) != 0)
        return tg_fail(err, "%s: not a tunegraph plan (bad magic)", name);
    if (len < HEADER_BYTES)
        return tg_fail(err, "%s: truncated: file has %zu bytes, the plan header alone is %d",
                       name, len, HEADER_BYTES);
    uint32_t version = get_le32(bytes + 8);
    if (version != TG_PLAN_VERSION)
        return tg_fail(err, "%s: plan format version %u, this build reads version %d "
                            "(recompile the job)",
                       name, version, TG_PLAN_VERSION);
    uint32_t flags = get_le32(bytes + 12);
    if (flags != 0)
        return tg_fail(err, "%s: unknown header flags 0x%x (file corrupt or from a newer build)",
                       name, flags);
    uint64_t usize = get_le64(bytes + 16);
    uint64_t csize = get_le64(bytes + 24);
    uint64_t sum = get_le64(bytes + 32);
    size_t have = len - HEADER_BYTES;
    if (csize > have)
        return tg_fail(err, "%s: truncated: header says %llu compressed bytes, file has %zu",
                       name, (unsigned long long)csize, have);
    if (csize < have)
        return tg_fail(err, "%s: %zu unexpected bytes after the %llu-byte payload (file corrupt)",
                       name, have - (size_t)csize, (unsigned long long)csize);
    const uint8_t *payload = bytes + HEADER_BYTES;
    if (XXH64(payload, (size_t)csize, 0) != sum)
        return tg_fail(err, "%s: checksum mismatch (file corrupt)", name);
    /* The header's size is outside the checksum; the frame's own size is inside it. */
    unsigned long long fsize = ZSTD_getFrameContentSize(payload, (size_t)csize);
    if (fsize == ZSTD_CONTENTSIZE_ERROR || fsize == ZSTD_CONTENTSIZE_UNKNOWN || fsize != usize)
        return tg_fail(err, "%s: header says %llu payload bytes, the compressed frame does not "
                            "agree (file corrupt)",
                       name, (unsigned long long)usize);
    /* A zstd block yields at most 128 KiB from at least 4 bytes (an RLE block), so no frame
     * expands more than 32768-fold: a larger size is a damaged or hostile frame header and
     * must not drive the allocation below. */
    if (usize > SIZE_MAX / 2 || usize == 0 || usize / 32768 > csize)
        return tg_fail(err, "%s: payload size %llu is impossible (file corrupt)", name,
                       (unsigned long long)usize);
    uint8_t *buf = tg_malloc((size_t)usize);
    if (!buf)
        return tg_fail(err, "%s: out of memory for a %llu-byte payload", name,
                       (unsigned long long)usize);
    size_t got = tg_zstd_decompress(buf, (size_t)usize, payload, (size_t)csize);
    if (tg_zstd_out_of_memory(got)) {
        free(buf);
        return tg_fail(err, "%s: out of memory for the zstd decompressor", name);
    }
    /* GCOVR_EXCL_BR_START: a frame that decompresses yields its header's size, which is usize */
    if (ZSTD_isError(got) || got != usize) {
        free(buf);
        return tg_fail(err, "%s: payload does not decompress: %s (file corrupt)", name,
                       ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short");
    }
    /* GCOVR_EXCL_BR_STOP */
    int rc = tg_plan_payload_decode(buf, (size_t)usize, name, checks, plan, err);
    free(buf);
    if (rc) {
        tg_plan_free(plan);
        memset(plan, 0, sizeof *plan);
    }
    return rc;
}

/* ---- files ------------------------------------------------------------------- */

int tg_plan_write(const tg_plan *plan, const char *path, tg_err *err) {
    uint8_t *bytes;
    size_t len;
    if (tg_plan_encode(plan, &bytes, &len, err)) return tg_fail_context(err, "%s", path);
    tg_chunk chunk = {bytes, len};
    int rc = tg_write_file_atomic(path, &chunk, 1, "plan file", err);
    free(bytes);
    return rc;
}

int tg_plan_read(const char *path, tg_plan *plan, tg_err *err) {
    memset(plan, 0, sizeof *plan);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tg_fail(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st)) { /* GCOVR_EXCL_BR_LINE: fstat of a descriptor just opened does not fail */
        int e = errno;
        close(fd);
        return tg_fail(err, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tg_fail(err, "%s: not a regular file", path);
    }
    size_t len = (size_t)st.st_size;
    uint8_t *buf = tg_malloc(len); /* an empty file still gets a buffer: tg_malloc(0) gives one byte */
    if (!buf) {
        close(fd);
        return tg_fail(err, "%s: out of memory for %zu bytes", path, len);
    }
    size_t got = 0;
    /* GCOVR_EXCL_BR_START: read(2) of a regular file fails or ends early only on I/O errors or a concurrent
     * truncation, which a test cannot cause */
    while (got < len) {
        ssize_t n = read(fd, buf + got, len - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return tg_fail(err, "%s: read failed: %s", path, strerror(e));
        }
        if (n == 0) break; /* shrank under us: decode what is there, it will say truncated */
        got += (size_t)n;
    }
    /* GCOVR_EXCL_BR_STOP */
    close(fd);
    int rc = tg_plan_decode(buf, got, path, plan, err);
    free(buf);
    return rc;
}

int tg_plan_file_sniff(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    uint8_t head[8];
    ssize_t n = read(fd, head, sizeof head);
    close(fd);
    return n == (ssize_t)sizeof head && memcmp(head, k_magic, sizeof head) == 0;
}
