/* How an export (runtime/hf_export.c) takes the place of a full output folder with force
 * where the file system cannot exchange two folders (renameat2 refused, as before Linux
 * 3.15 or on some FUSE and network file systems; tests/libc_faults.h): the old folder steps
 * aside, the export moves in, the old one is removed. Where moving the old folder aside
 * fails, where moving the export in then fails (the old folder is put back), where naming
 * the old folder's place runs out of memory, and where the first move of the export fails
 * with an error other than "not empty", the export fails with the cause and leaves the old
 * folder as it was and nothing beside it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "runtime/hf_export.h"
#include "tests/harness.h"
#include "tests/libc_faults.h"

static int ends_with(const char *s, const char *tail) {
    const size_t n = strlen(s), m = strlen(tail);
    return n >= m && !strcmp(s + n - m, tail);
}

/* The old folder moved aside: "<dir>/out" to "<temporary name>.old". */
static int move_aside(const char *from, const char *to) { return ends_with(from, "/out") && ends_with(to, ".old"); }

/* The export moved in once the old folder is aside (its "<temporary name>.old" exists). */
static int move_in_after_aside(const char *from, const char *to) {
    char old[1200];
    snprintf(old, sizeof old, "%s.old", from);
    return strstr(from, "/.out.tmp.") && ends_with(to, "/out") && access(old, F_OK) == 0;
}

/* Any move of the export into place. */
static int move_in(const char *from, const char *to) { return strstr(from, "/.out.tmp.") && ends_with(to, "/out"); }

typedef struct setup {
    tg_plan plan;
    tg_weights_image img;
    char root[700], out[800], old_file[900];
} setup;

/* tiny-bert with initialised weights; root/out holds old.txt ("old"). */
static int open_setup(setup *s) {
    if (!tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, &s->plan)) return 0;
    tg_err err = {{0}};
    if (!CHECK(tg_weights_image_alloc(&s->plan, &s->img, &err) == 0, "%s", err.msg)) {
        tg_plan_free(&s->plan);
        return 0;
    }
    tg_weights_init(&s->img, 3);
    snprintf(s->root, sizeof s->root, "%s", tg_test_tmpdir());
    snprintf(s->out, sizeof s->out, "%s/out", s->root);
    snprintf(s->old_file, sizeof s->old_file, "%s/old.txt", s->out);
    return CHECK(mkdir(s->out, 0755) == 0 && tg_test_write_file(s->old_file, "old") == 0, "setup");
}

static void close_setup(setup *s) {
    tg_weights_image_free(&s->img);
    tg_plan_free(&s->plan);
}

/* The old folder as it was, alone in root. */
static void check_old_kept(const setup *s, const char *what) {
    char *text = tg_test_read_file(s->old_file, NULL);
    CHECK(text && !strcmp(text, "old") && tg_test_count_files(s->out) == 1 && tg_test_count_files(s->root) == 1,
          "%s: old.txt '%s', %d entries in the folder, %d beside it", what, text ? text : "(none)",
          tg_test_count_files(s->out), tg_test_count_files(s->root));
    free(text);
}

TG_TEST(test_runtime_hf_export_replaces_without_exchange) {
    setup s;
    if (!open_setup(&s)) return;
    const tg_hf_export_options o = {s.out, NULL, NULL, 0, 1, 0};
    tg_err err = {{0}};
    tg_test_fail_renameat2(1, EINVAL);
    const int rc = tg_hf_export(&s.img, &o, &err);
    tg_test_fail_renameat2(0, 0);
    char config[900];
    snprintf(config, sizeof config, "%s/config.json", s.out);
    CHECK(rc == 0, "export over a full folder without exchange: %s", err.msg);
    CHECK(access(s.old_file, F_OK) != 0 && access(config, F_OK) == 0 && tg_test_count_files(s.out) == 2 &&
              tg_test_count_files(s.root) == 1,
          "after the replacement: old.txt %s, %d entries in the folder, %d beside it",
          access(s.old_file, F_OK) == 0 ? "kept" : "gone", tg_test_count_files(s.out), tg_test_count_files(s.root));
    close_setup(&s);
}

TG_TEST(test_runtime_hf_export_replace_failures) {
    setup s;
    if (!open_setup(&s)) return;
    const tg_hf_export_options o = {s.out, NULL, NULL, 0, 1, 0};
    tg_err err = {{0}};
    char want[1200];

    /* The old folder cannot step aside. */
    tg_test_fail_renameat2(1, EINVAL);
    tg_test_fail_rename(move_aside, EBUSY);
    int rc = tg_hf_export(&s.img, &o, &err);
    tg_test_fail_rename(NULL, 0);
    tg_test_fail_renameat2(0, 0);
    snprintf(want, sizeof want, "output folder %s: cannot move it aside to replace it: %s", s.out, strerror(EBUSY));
    CHECK(rc == -1 && !strcmp(err.msg, want), "moving aside refused: rc %d, '%s'", rc, err.msg);
    check_old_kept(&s, "moving aside refused");

    /* The export cannot move in: the old folder goes back. */
    memset(&err, 0, sizeof err);
    tg_test_fail_renameat2(1, EINVAL);
    tg_test_fail_rename(move_in_after_aside, EXDEV);
    rc = tg_hf_export(&s.img, &o, &err);
    tg_test_fail_rename(NULL, 0);
    tg_test_fail_renameat2(0, 0);
    snprintf(want, sizeof want, "output folder %s: cannot move %s/.out.tmp.", s.out, s.root);
    char cause[200];
    snprintf(cause, sizeof cause, " into place: %s", strerror(EXDEV));
    CHECK(rc == -1 && !strncmp(err.msg, want, strlen(want)) && ends_with(err.msg, cause), "moving in refused: rc %d, '%s'",
          rc, err.msg);
    check_old_kept(&s, "moving in refused");

    /* The first move fails for another cause than a full folder: over the full folder with
     * force, and where there was no folder. */
    memset(&err, 0, sizeof err);
    tg_test_fail_rename(move_in, EXDEV);
    rc = tg_hf_export(&s.img, &o, &err);
    tg_test_fail_rename(NULL, 0);
    CHECK(rc == -1 && !strncmp(err.msg, want, strlen(want)) && ends_with(err.msg, cause),
          "the first move refused: rc %d, '%s'", rc, err.msg);
    check_old_kept(&s, "the first move refused");
    REQUIRE(unlink(s.old_file) == 0 && rmdir(s.out) == 0, "remove the folder");
    const tg_hf_export_options fresh = {s.out, NULL, NULL, 0, 0, 0};
    memset(&err, 0, sizeof err);
    tg_test_fail_rename(move_in, EXDEV);
    rc = tg_hf_export(&s.img, &fresh, &err);
    tg_test_fail_rename(NULL, 0);
    CHECK(rc == -1 && !strncmp(err.msg, want, strlen(want)) && ends_with(err.msg, cause),
          "the first move into no folder refused: rc %d, '%s'", rc, err.msg);
    CHECK(tg_test_count_files(s.root) == 0, "%d entries left where there was no folder", tg_test_count_files(s.root));
    REQUIRE(mkdir(s.out, 0755) == 0 && tg_test_write_file(s.old_file, "old") == 0, "the folder again");

    /* The export's last allocations fail in turn; the very last names the old folder's
     * place. */
    tg_test_fail_renameat2(1, EINVAL);
    tg_alloc_fail_after(-1);
    rc = tg_hf_export(&s.img, &o, &err);
    const long total = tg_alloc_fail_after(-1);
    tg_test_fail_renameat2(0, 0);
    REQUIRE(rc == 0 && total > 20, "the counted export: %s (%ld allocations)", err.msg, total);
    REQUIRE(tg_test_write_file(s.old_file, "old") == 0, "old.txt again");
    REQUIRE(tg_test_count_files(s.out) == 3, "%d entries", tg_test_count_files(s.out));
    for (long k = total - 8; k < total; k++) {
        memset(&err, 0, sizeof err);
        tg_test_fail_renameat2(1, EINVAL);
        tg_alloc_fail_after(k);
        rc = tg_hf_export(&s.img, &o, &err);
        tg_alloc_fail_after(-1);
        tg_test_fail_renameat2(0, 0);
        CHECK(rc == -1 && (strstr(err.msg, "out of memory") || strstr(err.msg, strerror(ENOMEM))), "allocation %ld of %ld failing: rc %d, '%s'", k, total, rc,
              err.msg);
        CHECK(k < total - 1 || !strcmp(err.msg, "out of memory"), "the last allocation failing: '%s'", err.msg);
        CHECK(tg_test_count_files(s.out) == 3 && tg_test_count_files(s.root) == 1,
              "allocation %ld failing: %d entries in the folder, %d beside it", k, tg_test_count_files(s.out),
              tg_test_count_files(s.root));
    }
    close_setup(&s);
}

/* The first move refused with EEXIST (POSIX's other answer for a folder that is not empty):
 * taken as the full folder it is, replaced with force by the exchange. */
TG_TEST(test_runtime_hf_export_first_move_eexist_is_a_full_folder) {
    setup s;
    if (!open_setup(&s)) return;
    const tg_hf_export_options o = {s.out, NULL, NULL, 0, 1, 0};
    tg_err err = {{0}};
    tg_test_fail_rename(move_in, EEXIST);
    const int rc = tg_hf_export(&s.img, &o, &err);
    tg_test_fail_rename(NULL, 0);
    char config[900];
    snprintf(config, sizeof config, "%s/config.json", s.out);
    CHECK(rc == 0, "EEXIST, then the exchange: %s", err.msg);
    CHECK(access(s.old_file, F_OK) != 0 && access(config, F_OK) == 0 && tg_test_count_files(s.root) == 1,
          "after the exchange: old.txt %s, config.json %s, %d entries beside it",
          access(s.old_file, F_OK) == 0 ? "kept" : "gone", access(config, F_OK) == 0 ? "there" : "absent",
          tg_test_count_files(s.root));
    close_setup(&s);
}
