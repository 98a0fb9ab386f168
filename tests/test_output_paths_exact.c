/* base/output_paths.c to the byte: the allocations tg_output_resolve makes (a link's text
 * is read into one buffer of the size lstat gives; /proc's links, of size 0, double from
 * 256 bytes), the PATH_MAX limit at exactly 4095 and 4096 bytes for a path given, a path
 * whose folder resolves longer, and a link's text joined to its folder, the 40 links the
 * kernel follows, and tg_outputs_check's messages in full: each refusal, paths shown whole
 * up to 199 bytes and by their ends from 200, and which output or input a message names
 * when several could be. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/output_paths.h"
#include "tests/harness.h"

static char root[PATH_MAX]; /* this test's folder, resolved */

static const char *at(const char *name) {
    static char buf[128][2 * PATH_MAX];
    static int k;
    k = (k + 1) % 128;
    snprintf(buf[k], sizeof buf[k], "%s/%s", root, name);
    return buf[k];
}

/* Allocations one tg_output_resolve(path) makes; its result in *rc and *out (freed). */
static long allocations_of(const char *path, int *rc, char *out_copy, size_t cap) {
    char *out = NULL;
    tg_alloc_fail_after(-1);
    *rc = tg_output_resolve(path, &out);
    const long n = tg_alloc_fail_after(-1);
    snprintf(out_copy, cap, "%s", out ? out : "(null)");
    free(out);
    return n;
}

/* Folders under root making up `rel` (a relative name of 'd' + 'a's components, 100 bytes
 * each but the last, `len` bytes in all, no slash at the end); 1 on success. */
static int make_folders(size_t len, char *rel, size_t cap) {
    if (len + 1 > cap || len < 1) return 0;
    size_t n = 0;
    while (n < len) {
        size_t part = len - n < 100 ? len - n : 100;
        if (len - n - part == 1) part--; /* a slash alone would be left: no name after it */
        memset(rel + n, 'a', part);
        rel[n] = 'd';
        rel[n + part] = 0;
        if (mkdir(at(rel), 0755) != 0 && errno != EEXIST) return 0;
        n += part;
        if (n < len) rel[n++] = '/';
    }
    return 1;
}

TG_TEST(test_output_paths_resolve_allocation_counts) {
    REQUIRE(realpath(tg_test_tmpdir(), root), "realpath");
    REQUIRE(tg_test_write_file(at("file"), "x") == 0, "file");
    REQUIRE(symlink("file", at("rel")) == 0 && symlink("rel", at("rel_rel")) == 0, "links");
    REQUIRE(symlink(at("file"), at("abs")) == 0, "absolute link");
    /* Link texts of 300 and 700 bytes: one buffer of their size each. */
    char target[1024];
    REQUIRE(make_folders(299 - 5, target, sizeof target), "folders");
    strcat(target, "/file");
    REQUIRE(strlen(target) == 299 && symlink(target, at("rel299")) == 0, "a 299-byte link");
    char target2[1024];
    REQUIRE(make_folders(695, target2, sizeof target2), "folders");
    strcat(target2, "/file");
    REQUIRE(strlen(target2) == 700 && symlink(target2, at("rel700")) == 0, "a 700-byte link");
    char abs_target[2048];
    snprintf(abs_target, sizeof abs_target, "%s/%s", root, target2);
    REQUIRE(symlink(abs_target, at("abs_long")) == 0, "a long absolute link");
    const struct {
        const char *path;
        long allocations;
        const char *want;
    } cases[] = {
        /* The name, its folder, the joined result. */
        {at("file"), 3, at("file")},
        {at("new"), 3, at("new")},
        /* Then per link: its text, the text joined to the folder, and the next round's two. */
        {at("rel"), 7, at("file")},
        {at("rel299"), 7, at(target)},
        {at("rel700"), 7, at(target2)},
        {at("rel_rel"), 11, at("file")},
        /* An absolute text is the next name as it is. */
        {at("abs"), 6, at("file")},
        {at("abs_long"), 6, abs_target},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc;
        char out[2 * PATH_MAX];
        const long n = allocations_of(cases[i].path, &rc, out, sizeof out);
        CHECK(rc == 0 && !strcmp(out, cases[i].want) && n == cases[i].allocations,
              "case %zu: rc %d, %ld allocations (want %ld), '%.60s'", i, rc, n, cases[i].allocations, out);
    }
    /* /proc/self/fd links report no useful size: the buffer starts at 256 bytes and doubles
     * until the text fits (texts of 255, 256, 511, 512 and 1024 bytes: 1, 2, 2, 3, 4 buffers). */
    const size_t texts[] = {255, 256, 511, 512, 1024};
    const long buffers[] = {1, 2, 2, 3, 4};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        char rel[2048], name[PATH_MAX + 2048], fd_link[64];
        const size_t folders = texts[i] - strlen(root) - 1 - 2; /* root "/" folders "/f" */
        REQUIRE(make_folders(folders, rel, sizeof rel), "folders for %zu", texts[i]);
        snprintf(name, sizeof name, "%s/%s/f", root, rel);
        REQUIRE(strlen(name) == texts[i] && tg_test_write_file(name, "x") == 0, "%zu-byte name", texts[i]);
        const int fd = open(name, O_RDONLY | O_CLOEXEC);
        REQUIRE(fd >= 0, "open: %s", strerror(errno));
        snprintf(fd_link, sizeof fd_link, "/proc/self/fd/%d", fd);
        struct stat st;
        const int sized = lstat(fd_link, &st) == 0 && (size_t)st.st_size < 256;
        int rc;
        char out[2 * PATH_MAX];
        const long n = allocations_of(fd_link, &rc, out, sizeof out);
        close(fd);
        /* strdup, folder, join; the buffers; the next round's folder and join. */
        CHECK(!sized || (rc == 0 && !strcmp(out, name) && n == 3 + buffers[i] + 2),
              "%s, a %zu-byte text: rc %d, %ld allocations (want %ld)", fd_link, texts[i], rc, n, 5 + buffers[i]);
    }
}

/* A name of exactly `len` bytes: root "/" then "./" repeated, then "n" or "nn". */
static void dotted_name(size_t len, char *out) {
    size_t n = (size_t)snprintf(out, PATH_MAX + 8, "%s/", root);
    while (len - n > 2) out[n++] = '.', out[n++] = '/';
    while (n < len) out[n++] = 'n';
    out[n] = 0;
}

TG_TEST(test_output_paths_path_max_edges) {
    REQUIRE(realpath(tg_test_tmpdir(), root), "realpath");
    char *out = NULL;
    static char name[PATH_MAX + 8];
    tg_err err;
    /* A name given: 4095 bytes resolve, 4096 are too long (the check, then the message). */
    dotted_name(PATH_MAX - 1, name);
    REQUIRE(strlen(name) == PATH_MAX - 1, "a %zu-byte name", strlen(name));
    int rc = tg_output_resolve(name, &out);
    CHECK(rc == 0 && out && !strncmp(out, root, strlen(root)) && out[strlen(root)] == '/' &&
              strspn(out + strlen(root) + 1, "n") == strlen(out + strlen(root) + 1),
          "4095 bytes: rc %d '%s'", rc, out ? out : "(null)");
    free(out);
    memset(&err, 0, sizeof err);
    const tg_named_path ok_out = {name, "metrics"};
    CHECK(tg_outputs_check(&ok_out, 1, NULL, 0, &err) == 0, "a 4095-byte output: %s", err.msg);
    dotted_name(PATH_MAX, name);
    REQUIRE(strlen(name) == PATH_MAX, "a %zu-byte name", strlen(name));
    out = (char *)"unset";
    CHECK(tg_output_resolve(name, &out) == ENAMETOOLONG && out == NULL, "4096 bytes resolved");
    const tg_named_path long_out = {name, "metrics"};
    char want[600];
    snprintf(want, sizeof want,
             "metrics %.80s...%s (4096 bytes): the path is longer than the system accepts (4095 bytes at most, 255 "
             "for each name in it)",
             name, name + PATH_MAX - 80);
    CHECK(tg_outputs_check(&long_out, 1, NULL, 0, &err) == -1 && !strcmp(err.msg, want), "'%s'\n    want '%s'",
          err.msg, want);

    /* Folders making root/F 4000 bytes long, and a short link "s" to them. */
    static char rel[PATH_MAX];
    const size_t folder_len = 4000 - strlen(root) - 1;
    REQUIRE(make_folders(folder_len, rel, sizeof rel), "folders");
    REQUIRE(symlink(rel, at("s")) == 0, "symlink");
    for (size_t total = PATH_MAX - 1; total <= PATH_MAX; total++) {
        const size_t base_len = total - 4001; /* root/F "/" base */
        char base[256], via_link[PATH_MAX], text[PATH_MAX], full[PATH_MAX + 8];
        memset(base, 'b', base_len);
        base[base_len] = 0;
        snprintf(full, sizeof full, "%s/%s/%s", root, rel, base);
        REQUIRE(strlen(full) == total, "%zu bytes", strlen(full));
        /* The folder resolves longer than the path given. */
        snprintf(via_link, sizeof via_link, "%s/s/%s", root, base);
        out = NULL;
        rc = tg_output_resolve(via_link, &out);
        if (total < PATH_MAX)
            CHECK(rc == 0 && out && !strcmp(out, full), "through the folder link, %zu bytes: rc %d", total, rc);
        else CHECK(rc == ENAMETOOLONG && out == NULL, "through the folder link, %zu bytes: rc %d", total, rc);
        if (!rc) free(out);
        /* A link whose text, joined to its folder, makes the name. */
        snprintf(text, sizeof text, "%s/%s", rel, base);
        char link_name[32];
        snprintf(link_name, sizeof link_name, "to%zu", total);
        REQUIRE(symlink(text, at(link_name)) == 0, "symlink %zu", total);
        out = NULL;
        rc = tg_output_resolve(at(link_name), &out);
        if (total < PATH_MAX)
            CHECK(rc == 0 && out && !strcmp(out, full), "a link's text, %zu bytes: rc %d", total, rc);
        else CHECK(rc == ENAMETOOLONG && out == NULL, "a link's text, %zu bytes: rc %d", total, rc);
        if (!rc) free(out);
    }
}

TG_TEST(test_output_paths_forty_links) {
    REQUIRE(realpath(tg_test_tmpdir(), root), "realpath");
    REQUIRE(tg_test_write_file(at("file"), "x") == 0, "file");
    /* Chains c<n>_0 -> c<n>_1 -> ... -> c<n>_<n-1> -> file, of 40 and 41 links. */
    for (int n = 40; n <= 41; n++) {
        for (int k = 0; k < n; k++) {
            char link[32], next[32];
            snprintf(link, sizeof link, "c%d_%d", n, k);
            snprintf(next, sizeof next, k + 1 < n ? "c%d_%d" : "file", n, k + 1);
            REQUIRE(symlink(next, at(link)) == 0, "symlink %s", link);
        }
        char first[32];
        snprintf(first, sizeof first, "c%d_0", n);
        char *out = NULL;
        const int rc = tg_output_resolve(at(first), &out);
        struct stat st;
        errno = 0;
        const int kernel = stat(at(first), &st) == 0 ? 0 : errno;
        if (n == 40) CHECK(rc == 0 && out && !strcmp(out, at("file")) && kernel == 0, "40 links: rc %d, kernel %d", rc, kernel);
        else CHECK(rc == ELOOP && out == NULL && kernel == ELOOP, "41 links: rc %d, kernel %d", rc, kernel);
        if (!rc) free(out);
    }
}

/* tg_outputs_check's message for one refused set, in full. */
static void expect_message(const tg_named_path *outs, int n_outs, const tg_named_path *ins, int n_ins,
                           const char *want, const char *what) {
    tg_err err;
    memset(&err, 0, sizeof err);
    const int rc = tg_outputs_check(outs, n_outs, ins, n_ins, &err);
    CHECK(rc == -1 && !strcmp(err.msg, want), "%s: rc %d\n    got  '%s'\n    want '%s'", what, rc, err.msg, want);
}

TG_TEST(test_outputs_check_exact_messages) {
    REQUIRE(realpath(tg_test_tmpdir(), root), "realpath");
    REQUIRE(tg_test_write_file(at("file"), "x") == 0 && tg_test_write_file(at("train.jsonl"), "{}\n") == 0 &&
                tg_test_write_file(at("eval.jsonl"), "{}\n") == 0 && mkdir(at("sub"), 0755) == 0,
            "setup");
    REQUIRE(symlink("nowhere/x", at("to_missing_dir")) == 0 && symlink("to_missing_dir", at("to_to_missing_dir")) == 0,
            "dangling links");
    REQUIRE(symlink("train.jsonl", at("to_train")) == 0 && symlink("loop_b", at("loop_a")) == 0 &&
                symlink("loop_a", at("loop_b")) == 0 && link(at("eval.jsonl"), at("hard_eval")) == 0,
            "links");
    static char too_long[PATH_MAX + 8], long_component[400];
    memset(too_long, 'b', sizeof too_long - 1);
    memset(long_component, 'n', 300);
    char long_name[PATH_MAX];
    snprintf(long_name, sizeof long_name, "%s/%s", root, long_component);
    const char *limit = "the path is longer than the system accepts (4095 bytes at most, 255 for each name in it)";
    char want[1400], msg[64];
    const tg_named_path in[] = {{at("train.jsonl"), "training data"}, {NULL, "weights"}, {"", "config"},
                                {at("eval.jsonl"), "eval data"}};
    const struct {
        const char *path, *what, *want_fmt; /* %1$s: the path shown, %2$s: the root */
    } cases[] = {
        {"", "plan (-o)", "plan (-o): the path is empty"},
        {NULL, "metrics", "metrics: the path is empty"},
        {at("sub"), "plan (-o)", "plan (-o) %1$s: is a folder; name a file"},
        {at("sub/"), "save", "save %1$s: is a folder; name a file"},
        {at("new/"), "plan (-o)", "plan (-o) %1$s: names a folder; name a file"},
        {at("new/."), "plan (-o)", "plan (-o) %1$s: names a folder; name a file"},
        {at("sub/.."), "plan (-o)", "plan (-o) %1$s: is a folder; name a file"},
        {at("nowhere/x"), "metrics", "metrics %1$s: the folder %2$s/nowhere does not exist"},
        /* A link into a missing folder: the link's own folder exists. */
        {at("to_missing_dir"), "metrics", "metrics %1$s: is a link into a folder that does not exist"},
        {at("to_to_missing_dir"), "metrics", "metrics %1$s: is a link into a folder that does not exist"},
        {at("file/x"), "metrics", "metrics %1$s: Not a directory"},
        {at("loop_a"), "metrics", "metrics %1$s: Too many levels of symbolic links"},
        {at("train.jsonl"), "plan (-o)", "plan (-o) %1$s: would overwrite the training data %2$s/train.jsonl (the same file)"},
        {at("to_train"), "weights (-o)", "weights (-o) %1$s: would overwrite the training data %2$s/train.jsonl (the same file)"},
        {at("hard_eval"), "plan (-o)", "plan (-o) %1$s: would overwrite the eval data %2$s/eval.jsonl (the same file)"},
        {at("sub/../eval.jsonl"), "plan (-o)", "plan (-o) %1$s: would overwrite the eval data %2$s/eval.jsonl (the same file)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(want, sizeof want, cases[i].want_fmt, cases[i].path ? cases[i].path : "", root);
        snprintf(msg, sizeof msg, "case %zu", i);
        const tg_named_path o = {cases[i].path, cases[i].what};
        expect_message(&o, 1, in, 4, want, msg);
    }
    /* Too long as a whole, and in one of its names. */
    snprintf(want, sizeof want, "plan (-o) %.80s...%s (%zu bytes): %s", too_long, too_long + strlen(too_long) - 80,
             strlen(too_long), limit);
    expect_message(&(tg_named_path){too_long, "plan (-o)"}, 1, NULL, 0, want, "too long");
    snprintf(want, sizeof want, "metrics %.80s...%s (%zu bytes): %s", long_name, long_name + strlen(long_name) - 80,
             strlen(long_name), limit);
    expect_message(&(tg_named_path){long_name, "metrics"}, 1, NULL, 0, want, "a name over 255 bytes");

    /* Paths of 199 bytes are shown whole, of 200 by their first and last 80. */
    for (size_t len = 198; len <= 201; len++) {
        char path[256], shown[256], dir[256];
        snprintf(dir, sizeof dir, "%s/nowhere", root);
        size_t n = (size_t)snprintf(path, sizeof path, "%s/", dir);
        memset(path + n, 'x', len - n);
        path[len] = 0;
        if (len < 200) snprintf(shown, sizeof shown, "%s", path);
        else snprintf(shown, sizeof shown, "%.80s...%s (%zu bytes)", path, path + len - 80, len);
        snprintf(want, sizeof want, "log %s: the folder %s does not exist", shown, dir);
        snprintf(msg, sizeof msg, "a %zu-byte path", len);
        expect_message(&(tg_named_path){path, "log"}, 1, NULL, 0, want, msg);
    }

    /* Several refusals: the first output's, checked alone before any pair. */
    const tg_named_path two_bad[] = {{at("sub"), "a"}, {"", "b"}};
    snprintf(want, sizeof want, "a %s: is a folder; name a file", at("sub"));
    expect_message(two_bad, 2, NULL, 0, want, "two bad outputs");
    const tg_named_path bad_late[] = {{at("train.jsonl"), "a"}, {"", "b"}};
    expect_message(bad_late, 2, in, 4, "b: the path is empty", "an empty second output before the pairs");
    /* An output over an input, and another over the first: the input is named first. */
    const tg_named_path three[] = {{at("one"), "plan (-o)"}, {at("eval.jsonl"), "metrics"}, {at("sub/../one"), "save"}};
    snprintf(want, sizeof want, "metrics %s: would overwrite the eval data %s (the same file)", at("eval.jsonl"),
             at("eval.jsonl"));
    expect_message(three, 3, in, 4, want, "an output over an input");
    snprintf(want, sizeof want, "plan (-o) %s and save %s are the same file: each output needs a file of its own",
             at("one"), at("sub/../one"));
    expect_message(three, 3, NULL, 0, want, "the third output over the first");
    const tg_named_path pair_later[] = {{at("p"), "a"}, {at("q"), "b"}, {at("q"), "c"}, {at("p"), "d"}};
    snprintf(want, sizeof want, "b %s and c %s are the same file: each output needs a file of its own", at("q"), at("q"));
    expect_message(pair_later, 4, NULL, 0, want, "the first pair found");
    /* Nothing to check, and outputs apart from every input. */
    tg_err err;
    memset(&err, 0, sizeof err);
    CHECK(tg_outputs_check(NULL, 0, NULL, 0, &err) == 0 && !err.msg[0], "nothing: %s", err.msg);
    const tg_named_path apart[] = {{at("p"), "a"}, {at("q"), "b"}, {at("file"), "c"}};
    CHECK(tg_outputs_check(apart, 3, in, 4, &err) == 0 && !err.msg[0], "apart: %s", err.msg);
    /* Out of memory for the ids: the counts named. */
    for (long k = 0; k < 2; k++) {
        tg_alloc_fail_only(k);
        memset(&err, 0, sizeof err);
        const int rc = tg_outputs_check(apart, 3, in, 4, &err);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && !strcmp(err.msg, "out of memory checking 3 output and 4 input paths"), "allocation %ld: '%s'",
              k, err.msg);
    }
    /* The output's folder out of memory (allocation 2: the folder of its resolved name). */
    const tg_named_path one_new = {at("p"), "metrics"};
    tg_alloc_fail_after(-1);
    tg_outputs_check(&one_new, 1, NULL, 0, &err);
    const long total = tg_alloc_fail_after(-1);
    CHECK(total == 6, "one new output: %ld allocations (2 id tables, 3 to resolve, 1 folder)", total);
    tg_alloc_fail_only(total - 1);
    memset(&err, 0, sizeof err);
    const int rc = tg_outputs_check(&one_new, 1, NULL, 0, &err);
    tg_alloc_fail_after(-1);
    snprintf(want, sizeof want, "metrics %s: out of memory", at("p"));
    CHECK(rc == -1 && !strcmp(err.msg, want), "the folder's allocation: '%s'\n    want '%s'", err.msg, want);
}
