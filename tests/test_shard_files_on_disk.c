/* A written shard set as files: under umask 022 its folders are 0755 and its shards and
 * manifest 0644; each frame of a shard is a zstd frame that carries its content size and
 * a content checksum, so a byte changed after the set was opened (its whole-file xxh64
 * already checked) is still refused when the frame is decoded. Then a cursor that failed
 * to open one shard goes back to another: the shard it had open is opened again, not read
 * through a closed descriptor. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "datasets/shard_reader.h"
#include "datasets/shard_writer.h"
#include "tests/harness.h"

#define SEQ 6
#define VOCAB 40

/* n LM records of lengths 1..SEQ, ids (i + t) % VOCAB, in 64-byte frames and shards. */
static int write_set(const char *out, int64_t n, tg_err *err) {
    const tg_shard_set_desc d = {.task = TG_SHARD_LM, .seq = SEQ, .tokenizer_identity = 7, .tokenizer_family = "wordpiece",
                                 .vocab_size = VOCAB, .command = "cmd", .frame_bytes = 64, .shard_bytes = 64};
    tg_shard_writer *w;
    if (tg_shard_writer_open(out, &d, &w, err)) return -1;
    for (int64_t i = 0; i < n; i++) {
        int32_t ids[SEQ];
        const int32_t len = 1 + (int32_t)(i % SEQ);
        for (int32_t t = 0; t < len; t++) ids[t] = (int32_t)((i + t) % VOCAB);
        if (tg_shard_writer_add(w, TG_SPLIT_TRAIN, &(tg_shard_record){.len = len, .input_ids = ids}, err)) {
            tg_shard_writer_abort(w);
            return -1;
        }
    }
    return tg_shard_writer_commit(w, err);
}

static int record_is(const tg_shard_record *r, int64_t i) {
    if (r->len != 1 + (int32_t)(i % SEQ) || r->token_type_ids) return 0;
    for (int32_t t = 0; t < r->len; t++)
        if (r->input_ids[t] != (int32_t)((i + t) % VOCAB)) return 0;
    return 1;
}

static int read_bytes(const char *path, uint64_t at, void *buf, size_t n) {
    const int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    const ssize_t got = pread(fd, buf, n, (off_t)at);
    close(fd);
    return got == (ssize_t)n ? 0 : -1;
}

static int write_byte(const char *path, uint64_t at, uint8_t b) {
    const int fd = open(path, O_WRONLY);
    if (fd < 0) return -1;
    const ssize_t put = pwrite(fd, &b, 1, (off_t)at);
    close(fd);
    return put == 1 ? 0 : -1;
}

TG_TEST(test_shard_files_modes_and_zstd_frame_checksums) {
    char out[700];
    snprintf(out, sizeof out, "%s/set", tg_test_tmpdir());
    tg_err err = {{0}};
    const mode_t old_mask = umask(022);
    const int rc = write_set(out, 40, &err);
    umask(old_mask);
    REQUIRE(rc == 0, "%s", err.msg);
    /* the set's folder and its split folder 0755, the manifest 0644 */
    const char *const entries[] = {"", "/train", "/manifest.json"};
    const unsigned want_mode[] = {040755, 040755, 0100644};
    for (int i = 0; i < 3; i++) {
        char path[800];
        struct stat st;
        snprintf(path, sizeof path, "%s%s", out, entries[i]);
        CHECK(stat(path, &st) == 0 && (st.st_mode & (S_IFMT | 07777)) == want_mode[i], "%s: mode %o, want %o", path,
              (unsigned)(st.st_mode & (S_IFMT | 07777)), want_mode[i]);
    }
    tg_shard_set set;
    REQUIRE(tg_shard_set_open(out, TG_SPLIT_TRAIN, &set, &err) == 0, "%s", err.msg);
    REQUIRE(set.n_files >= 2 && set.n_records == 40, "%d files, %lld records", set.n_files, (long long)set.n_records);
    int32_t frames = 0;
    for (int32_t f = 0; f < set.n_files; f++) {
        struct stat st;
        REQUIRE(stat(set.files[f].path, &st) == 0, "stat %s", set.files[f].path);
        CHECK(S_ISREG(st.st_mode) && (st.st_mode & 07777) == 0644, "%s: mode %o, want 644", set.files[f].path,
              (unsigned)(st.st_mode & 07777));
        for (int32_t k = 0; k < set.files[f].n_frames; k++, frames++) {
            const tg_shard_frame *fr = &set.files[f].frames[k];
            uint8_t head[5];
            REQUIRE(fr->csize > 9 && read_bytes(set.files[f].path, fr->offset, head, sizeof head) == 0, "read frame");
            /* magic 0xFD2FB528 (little-endian), then the frame header descriptor: bit 2 is
             * Content_Checksum_flag; bits 7-6 (Frame_Content_Size_flag) or bit 5
             * (Single_Segment_flag) put the content size in the header. */
            CHECK(head[0] == 0x28 && head[1] == 0xB5 && head[2] == 0x2F && head[3] == 0xFD, "%s frame %d: no zstd magic",
                  set.files[f].path, k);
            CHECK(head[4] & 0x04, "%s frame %d: descriptor %02x has no content checksum", set.files[f].path, k, head[4]);
            CHECK((head[4] & 0xC0) || (head[4] & 0x20), "%s frame %d: descriptor %02x has no content size",
                  set.files[f].path, k, head[4]);
        }
    }
    CHECK(frames >= set.n_files, "%d frames in %d files", frames, set.n_files);

    /* Past the open's whole-file check: a changed checksum byte (a frame's last 4) is
     * refused by the decoder, naming the file and frame; the frames before it still read. */
    const tg_shard_file *f0 = &set.files[0];
    const tg_shard_frame *fr = &f0->frames[0];
    const uint64_t at = fr->offset + fr->csize - 1;
    uint8_t b;
    REQUIRE(read_bytes(f0->path, at, &b, 1) == 0 && write_byte(f0->path, at, (uint8_t)(b ^ 0x5A)) == 0, "flip");
    tg_shard_cursor cur;
    REQUIRE(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg);
    tg_shard_record r;
    char want[1200];
    snprintf(want, sizeof want,
             "%s: frame 0 (records 0 to %lld, at byte %llu) does not decompress: Restored data doesn't match checksum "
             "(file corrupt)",
             f0->path, (long long)(fr->count - 1), (unsigned long long)fr->offset);
    CHECK(tg_shard_cursor_get(&cur, 0, &r, &err) == -1 && !strcmp(err.msg, want), "'%s', want '%s'", err.msg, want);
    const int64_t later = f0->records; /* the first record of the second shard */
    CHECK(tg_shard_cursor_get(&cur, later, &r, &err) == 0 && record_is(&r, later), "record %lld: %s", (long long)later,
          err.msg);
    tg_shard_cursor_close(&cur);
    tg_shard_set_close(&set);
    /* Opened again, the whole-file xxh64 refuses the shard. */
    CHECK(tg_shard_set_open(out, TG_SPLIT_TRAIN, &set, &err) == -1 && strstr(err.msg, "checksum mismatch") &&
              strstr(err.msg, "00000.tgshard"),
          "'%s'", err.msg);
}

TG_TEST(test_shard_cursor_reopens_a_shard_after_a_failed_open) {
    char out[700];
    snprintf(out, sizeof out, "%s/set", tg_test_tmpdir());
    tg_err err = {{0}};
    REQUIRE(write_set(out, 40, &err) == 0, "%s", err.msg);
    tg_shard_set set;
    REQUIRE(tg_shard_set_open(out, TG_SPLIT_TRAIN, &set, &err) == 0, "%s", err.msg);
    REQUIRE(set.n_files >= 3, "%d files", set.n_files);
    tg_shard_cursor cur;
    REQUIRE(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg);
    tg_shard_record r;
    const int64_t in1 = set.files[1].first, in2 = set.files[2].first;
    REQUIRE(tg_shard_cursor_get(&cur, 0, &r, &err) == 0 && record_is(&r, 0), "record 0: %s", err.msg);
    /* The second shard moved away after the set was opened: its open fails. */
    char moved[800];
    snprintf(moved, sizeof moved, "%s.moved", set.files[1].path);
    REQUIRE(rename(set.files[1].path, moved) == 0, "rename");
    char want[1000];
    snprintf(want, sizeof want, "%s: cannot open the shard: No such file or directory", set.files[1].path);
    CHECK(tg_shard_cursor_get(&cur, in1, &r, &err) == -1 && !strcmp(err.msg, want), "'%s', want '%s'", err.msg, want);
    /* Back to the first shard (it had been open): opened again and read. */
    for (int64_t i = 0; i < in1; i++)
        CHECK(tg_shard_cursor_get(&cur, i, &r, &err) == 0 && record_is(&r, i), "record %lld: %s", (long long)i, err.msg);
    CHECK(tg_shard_cursor_get(&cur, in2, &r, &err) == 0 && record_is(&r, in2), "record %lld: %s", (long long)in2,
          err.msg);
    /* The failed shard again, then the one before it: the same two outcomes. */
    CHECK(tg_shard_cursor_get(&cur, in1, &r, &err) == -1 && !strcmp(err.msg, want), "'%s'", err.msg);
    CHECK(tg_shard_cursor_get(&cur, in2, &r, &err) == 0 && record_is(&r, in2), "record %lld again: %s", (long long)in2,
          err.msg);
    /* Put back: read where it stands. */
    REQUIRE(rename(moved, set.files[1].path) == 0, "rename back");
    CHECK(tg_shard_cursor_get(&cur, in1, &r, &err) == 0 && record_is(&r, in1), "record %lld: %s", (long long)in1,
          err.msg);
    tg_shard_cursor_close(&cur);
    tg_shard_set_close(&set);
}

static int open_descriptors(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the listing's own */
}

/* A cursor holds one shard open at a time: none before its first read, one while it reads
 * (across a move to another shard), none once closed; closing it twice is harmless. */
TG_TEST(test_shard_cursor_descriptors) {
    char out[700];
    snprintf(out, sizeof out, "%s/set", tg_test_tmpdir());
    tg_err err = {{0}};
    REQUIRE(write_set(out, 40, &err) == 0, "%s", err.msg);
    tg_shard_set set;
    REQUIRE(tg_shard_set_open(out, TG_SPLIT_TRAIN, &set, &err) == 0, "%s", err.msg);
    REQUIRE(set.n_files >= 3, "%d files", set.n_files);
    const int before = open_descriptors();
    REQUIRE(before > 0, "/proc/self/fd");
    tg_shard_cursor cur;
    REQUIRE(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg);
    CHECK(open_descriptors() == before && cur.fd == -1, "an open cursor holds no shard: %d, fd %d", open_descriptors() - before,
          cur.fd);
    tg_shard_record r;
    REQUIRE(tg_shard_cursor_get(&cur, 0, &r, &err) == 0 && record_is(&r, 0), "record 0: %s", err.msg);
    CHECK(open_descriptors() == before + 1 && cur.fd >= 0, "reading: %d more", open_descriptors() - before);
    for (int f = 1; f < set.n_files; f++) {
        const int64_t i = set.files[f].first;
        REQUIRE(tg_shard_cursor_get(&cur, i, &r, &err) == 0 && record_is(&r, i), "record %lld: %s", (long long)i, err.msg);
        CHECK(open_descriptors() == before + 1, "shard %d: %d more", f, open_descriptors() - before);
    }
    const int fd = cur.fd;
    tg_shard_cursor_close(&cur);
    CHECK(open_descriptors() == before && fcntl(fd, F_GETFD) == -1 && cur.fd == -1, "closed: %d more",
          open_descriptors() - before);
    tg_shard_cursor_close(&cur);
    CHECK(open_descriptors() == before, "closed twice");
    tg_shard_set_close(&set);
}

/* A shard of more than the 1 MiB piece its whole-file xxh64 is read in: it opens and its
 * last record reads back; a byte changed past the first MiB is refused at the open. */
TG_TEST(test_shard_hash_covers_past_the_first_mib) {
    enum { N = 1500, LEN = 512, V = 30000 };
    char out[700];
    snprintf(out, sizeof out, "%s/big", tg_test_tmpdir());
    const tg_shard_set_desc d = {.task = TG_SHARD_LM, .seq = LEN, .tokenizer_identity = 7, .tokenizer_family = "wordpiece",
                                 .vocab_size = V, .command = "cmd"};
    tg_shard_writer *w;
    tg_err err = {{0}};
    REQUIRE(tg_shard_writer_open(out, &d, &w, &err) == 0, "%s", err.msg);
    uint64_t rng = 0xb16;
    int32_t ids[LEN], last[LEN];
    for (int i = 0; i < N; i++) {
        for (int t = 0; t < LEN; t++) ids[t] = (int32_t)(tg_test_rand(&rng) % V);
        if (i == N - 1) memcpy(last, ids, sizeof last);
        if (tg_shard_writer_add(w, TG_SPLIT_TRAIN, &(tg_shard_record){.len = LEN, .input_ids = ids}, &err)) {
            tg_shard_writer_abort(w);
            REQUIRE(0, "%s", err.msg);
        }
    }
    REQUIRE(tg_shard_writer_commit(w, &err) == 0, "%s", err.msg);
    tg_shard_set set;
    REQUIRE(tg_shard_set_open(out, TG_SPLIT_TRAIN, &set, &err) == 0, "%s", err.msg);
    REQUIRE(set.n_files == 1, "%d files", set.n_files);
    char path[1000];
    snprintf(path, sizeof path, "%s", set.files[0].path);
    struct stat sb;
    const int st = stat(path, &sb);
    REQUIRE(st == 0 && sb.st_size > (3 << 19), "%s: a shard of %lld bytes (stat %d)", path, (long long)sb.st_size, st);
    tg_shard_cursor cur;
    REQUIRE(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg);
    tg_shard_record r;
    CHECK(tg_shard_cursor_get(&cur, N - 1, &r, &err) == 0 && r.len == LEN && !memcmp(r.input_ids, last, sizeof last),
          "the last record: %s", err.msg);
    tg_shard_cursor_close(&cur);
    tg_shard_set_close(&set);
    /* a byte of the first frame past 1 MiB + 100 changed */
    uint8_t b;
    const uint64_t at = (1 << 20) + 100;
    REQUIRE(read_bytes(path, at, &b, 1) == 0 && write_byte(path, at, (uint8_t)(b ^ 0x5A)) == 0, "flip");
    CHECK(tg_shard_set_open(out, TG_SPLIT_TRAIN, &set, &err) == -1 && strstr(err.msg, "checksum mismatch") &&
              strstr(err.msg, "00000.tgshard"),
          "'%s'", err.msg);
}
