/* The checkpoint folder (runtime/checkpoint.c) out of memory: listing a folder of more
 * checkpoints than the listing's first room (16) fails at its first or its second
 * allocation without leaking the first (ASan), and each caller names the cause; a save that
 * cannot name its step file or `latest` says which file it was naming, and in which folder. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "runtime/checkpoint.h"
#include "tests/harness.h"

TG_TEST(test_checkpoint_folder_listing_out_of_memory) {
    const char *dir = tg_test_tmpdir();
    char name[800], want[1000];
    for (int step = 1; step <= 20; step++) {
        snprintf(name, sizeof name, "%s/step-%06d.tgckpt", dir, step);
        REQUIRE(tg_test_write_file(name, "x") == 0, "%s", name);
    }
    int32_t newest = 0;
    tg_alloc_fail_after(-1);
    CHECK(tg_checkpoint_dir_newest(dir, &newest) == 0 && newest == 20, "newest %d", newest);
    CHECK(tg_alloc_fail_after(-1) == 2, "the listing of 20 grows its room once");
    tg_checkpoint ck;
    tg_checkpoint_init(&ck);
    ck.state = (tg_checkpoint_state){.step = 21, .total_steps = 30, .replicas = 1};
    for (long k = 0; k < 2; k++) {
        newest = 5;
        errno = 0;
        tg_alloc_fail_after(k);
        const int rc = tg_checkpoint_dir_newest(dir, &newest);
        const int e = errno;
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && e == ENOMEM && newest == -1, "allocation %ld failing: rc %d, errno %d, newest %d", k, rc, e,
              newest);

        tg_err err = {{0}};
        tg_alloc_fail_after(k);
        char *path = (char *)"unset";
        const int saved = tg_checkpoint_save_in_dir(&ck, dir, 1, &path, &err);
        tg_alloc_fail_after(-1);
        snprintf(want, sizeof want, "%s: cannot list the checkpoint folder: %s", dir, strerror(ENOMEM));
        CHECK(saved == -1 && path == NULL && !strcmp(err.msg, want), "save, allocation %ld failing: '%s'", k, err.msg);

        tg_alloc_fail_after(k + 1); /* after naming `latest`, which is not there */
        path = (char *)"unset";
        const int located = tg_checkpoint_locate(dir, &path, &err);
        tg_alloc_fail_after(-1);
        snprintf(want, sizeof want, "%s: cannot list the folder: %s", dir, strerror(ENOMEM));
        CHECK(located == -1 && path == NULL && !strcmp(err.msg, want), "locate, allocation %ld failing: '%s'", k,
              err.msg);
    }
    CHECK(tg_test_count_files(dir) == 20, "%d files after the refusals", tg_test_count_files(dir));
    tg_checkpoint_free(&ck);
}

TG_TEST(test_checkpoint_save_out_of_memory_naming) {
    const char *dir = tg_test_tmpdir();
    tg_checkpoint ck;
    tg_checkpoint_init(&ck);
    ck.state = (tg_checkpoint_state){.step = 42, .total_steps = 50, .replicas = 1};
    char want[1000];
    snprintf(want, sizeof want, "checkpoint folder %s: out of memory naming step file step-000042.tgckpt", dir);
    /* An empty folder is listed without allocating: the first allocation names the step
     * file, the second `latest`. */
    for (long k = 0; k < 2; k++) {
        tg_err err = {{0}};
        char *path = (char *)"unset";
        tg_alloc_fail_after(k);
        const int rc = tg_checkpoint_save_in_dir(&ck, dir, 2, &path, &err);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && path == NULL && !strcmp(err.msg, want), "allocation %ld failing: rc %d, '%s'", k, rc,
              err.msg);
        CHECK(tg_test_count_files(dir) == 0, "allocation %ld failing: %d files left", k, tg_test_count_files(dir));
    }
    tg_err err = {{0}};
    char *path = NULL;
    CHECK(tg_checkpoint_save_in_dir(&ck, dir, 2, &path, &err) == 0 && path, "%s", err.msg);
    char at[900];
    snprintf(at, sizeof at, "%s/step-000042.tgckpt", dir);
    CHECK(path && !strcmp(path, at), "saved at %s", path ? path : "(none)");
    free(path);
    tg_checkpoint_free(&ck);
}

/* A save that fails after naming its file (the step file's name taken by a folder, or
 * `latest` a folder) gives back no path and prunes nothing. */
TG_TEST(test_checkpoint_save_failure_gives_no_path) {
    const char *dir = tg_test_tmpdir();
    char taken[800], old[800];
    snprintf(old, sizeof old, "%s/step-000001.tgckpt", dir);
    REQUIRE(tg_test_write_file(old, "x") == 0, "%s", old);
    snprintf(taken, sizeof taken, "%s/step-000002.tgckpt", dir);
    REQUIRE(mkdir(taken, 0755) == 0, "mkdir %s", taken);
    tg_checkpoint ck;
    tg_checkpoint_init(&ck);
    ck.state = (tg_checkpoint_state){.step = 2, .total_steps = 5, .replicas = 1};
    tg_err err = {{0}};
    char *path = (char *)"unset";
    CHECK(tg_checkpoint_save_in_dir(&ck, dir, 1, &path, &err) == -1 && path == NULL &&
              strstr(err.msg, "step-000002.tgckpt"),
          "the step file a folder: path %s, '%s'", path ? path : "(null)", err.msg);
    rmdir(taken);
    char latest[800];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    REQUIRE(mkdir(latest, 0755) == 0, "mkdir %s", latest);
    snprintf(taken, sizeof taken, "%s/latest/inside", dir);
    REQUIRE(tg_test_write_file(taken, "x") == 0, "%s", taken);
    path = (char *)"unset";
    CHECK(tg_checkpoint_save_in_dir(&ck, dir, 1, &path, &err) == -1 && path == NULL && strstr(err.msg, latest),
          "latest a folder: path %s, '%s'", path ? path : "(null)", err.msg);
    struct stat st;
    CHECK(stat(old, &st) == 0, "step 1 was pruned after a failed save");
    tg_checkpoint_free(&ck);
}
