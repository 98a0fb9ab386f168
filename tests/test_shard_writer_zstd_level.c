/* A shard's frames are zstd level 3 with a content checksum and the content size: the
 * bytes of a frame are exactly what ZSTD_compress2 at those settings makes of its block,
 * so a shard set written twice, or by another build, is the same file. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>

#include "datasets/shard_format.h"
#include "datasets/shard_writer.h"
#include "tests/harness.h"

#define SEQ 64
#define VOCAB 30000

static uint8_t *file_bytes(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = n > 0 ? malloc((size_t)n) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) free(b), b = NULL;
    fclose(f);
    *len = (size_t)n;
    return b;
}

TG_TEST(test_shard_writer_frames_are_zstd_level_3) {
    char out[700], path[800];
    snprintf(out, sizeof out, "%s/set", tg_test_tmpdir());
    const tg_shard_set_desc d = {.task = TG_SHARD_LM, .seq = SEQ, .tokenizer_identity = 7, .tokenizer_family = "bpe",
                                 .vocab_size = VOCAB, .command = "cmd", .frame_bytes = 1 << 20, .shard_bytes = 1 << 26};
    tg_shard_writer *w;
    tg_err err = {{0}};
    REQUIRE(tg_shard_writer_open(out, &d, &w, &err) == 0, "%s", err.msg);
    /* text-like ids: phrases of a small vocabulary repeated with variations */
    uint32_t state = 12345;
    for (int i = 0; i < 3000; i++) {
        int32_t ids[SEQ];
        for (int t = 0; t < SEQ; t++) {
            state = state * 1103515245u + 12345u;
            const uint32_t r = state >> 16;
            ids[t] = (r & 3) ? (int32_t)((r >> 2) % 200) : (int32_t)(r % VOCAB);
        }
        REQUIRE(tg_shard_writer_add(w, TG_SPLIT_TRAIN, &(tg_shard_record){.len = SEQ, .input_ids = ids}, &err) == 0,
                "%s", err.msg);
    }
    REQUIRE(tg_shard_writer_commit(w, &err) == 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/train/00000.tgshard", out);
    size_t len = 0;
    uint8_t *file = file_bytes(path, &len);
    REQUIRE(file && len > TG_SHARD_HEADER_BYTES + TG_SHARD_FOOTER_BYTES, "read %s", path);
    const uint8_t *footer = file + len - TG_SHARD_FOOTER_BYTES;
    const uint64_t index_at = tg_get_le64(footer), frames = tg_get_le64(footer + 8);
    CHECK(frames >= 1 && index_at + frames * TG_SHARD_INDEX_ENTRY_BYTES + TG_SHARD_FOOTER_BYTES == len,
          "frames %llu, index at %llu, file %zu", (unsigned long long)frames, (unsigned long long)index_at, len);
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    REQUIRE(cctx, "cctx");
    for (uint64_t f = 0; f < frames && index_at + (f + 1) * TG_SHARD_INDEX_ENTRY_BYTES <= len; f++) {
        const uint8_t *e = file + index_at + f * TG_SHARD_INDEX_ENTRY_BYTES;
        const uint64_t at = tg_get_le64(e);
        const uint32_t csize = tg_get_le32(e + 8), ubytes = tg_get_le32(e + 12);
        REQUIRE(at + csize <= index_at, "frame %llu out of the file", (unsigned long long)f);
        uint8_t *block = malloc(ubytes), *again = malloc(ZSTD_compressBound(ubytes));
        REQUIRE(block && again, "memory");
        CHECK(ZSTD_decompress(block, ubytes, file + at, csize) == ubytes, "frame %llu decodes", (unsigned long long)f);
        ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
        ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, 3);
        ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
        ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1);
        const size_t n = ZSTD_compress2(cctx, again, ZSTD_compressBound(ubytes), block, ubytes);
        CHECK(!ZSTD_isError(n) && n == csize && !memcmp(again, file + at, csize),
              "frame %llu: %u bytes, level 3 makes %zu", (unsigned long long)f, csize, n);
        free(block);
        free(again);
    }
    ZSTD_freeCCtx(cctx);
    free(file);
}
