/* tg_checkpoint_read (runtime/checkpoint.c) when read(2) fails (tests/libc_faults.h): an
 * I/O error refuses the file, naming it and the error, and releases what it read; a read
 * interrupted by a signal (EINTR) is tried again and the checkpoint comes back whole.
 * Every read closes the file it opened: read whole, refused as no file, or out of memory. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/checkpoint.h"
#include "tests/harness.h"
#include "tests/libc_faults.h"

TG_TEST(test_checkpoint_read_faults) {
    char path[800];
    snprintf(path, sizeof path, "%s/c.tgckpt", tg_test_tmpdir());
    tg_checkpoint ck;
    tg_checkpoint_init(&ck);
    ck.state = (tg_checkpoint_state){.step = 3, .total_steps = 9, .replicas = 1, .plan_fingerprint = 0x5eed,
                                     .sampler_examples = 4, .sampler_pos = 1};
    tg_err err = {{0}};
    float *w = malloc(64 * sizeof *w);
    REQUIRE(w, "malloc");
    for (int i = 0; i < 64; i++) w[i] = (float)i * 0.5f;
    const int64_t shape[1] = {64};
    REQUIRE(tg_checkpoint_add_field(&ck, "seed", "7", &err) == 0 &&
                tg_checkpoint_add_tensor(&ck, "w", -1, TG_F32, 1, shape, w, &err) == 0 &&
                tg_checkpoint_write(&ck, path, &err) == 0,
            "%s", err.msg);

    tg_checkpoint back;
    char want[1000];
    snprintf(want, sizeof want, "%s: read error: %s", path, strerror(EIO));
    tg_test_fail_read(1, EIO);
    int rc = tg_checkpoint_read(path, &back, &err);
    tg_test_fail_read(0, 0);
    CHECK(rc == -1 && !strcmp(err.msg, want), "EIO: rc %d, '%s'", rc, err.msg);

    for (int interrupts = 1; interrupts <= 3; interrupts += 2) {
        memset(&err, 0, sizeof err);
        tg_test_fail_read(interrupts, EINTR);
        rc = tg_checkpoint_read(path, &back, &err);
        tg_test_fail_read(0, 0);
        const tg_checkpoint_tensor *t = rc == 0 ? tg_checkpoint_find(&back, "w", -1) : NULL;
        CHECK(rc == 0 && back.state.step == 3 && back.state.plan_fingerprint == 0x5eed &&
                  !strcmp(tg_checkpoint_field_value(&back, "seed"), "7") && t && t->bytes == 64 * sizeof(float) &&
                  !memcmp(t->data, w, 64 * sizeof(float)),
              "%d EINTR: rc %d '%s'", interrupts, rc, err.msg);
        if (rc == 0) tg_checkpoint_free(&back);
    }
    tg_checkpoint_free(&ck);
}

/* Entries of /proc/self/fd: the files this process holds open (and the listing's own). */
static int open_files(void) {
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

TG_TEST(test_checkpoint_read_closes_its_file) {
    const char *dir = tg_test_tmpdir();
    char path[800];
    snprintf(path, sizeof path, "%s/c.tgckpt", dir);
    tg_checkpoint ck;
    tg_checkpoint_init(&ck);
    ck.state = (tg_checkpoint_state){.step = 1, .total_steps = 2, .replicas = 1, .sampler_examples = 4};
    tg_err err = {{0}};
    REQUIRE(tg_checkpoint_add_field(&ck, "seed", "7", &err) == 0 && tg_checkpoint_write(&ck, path, &err) == 0, "%s",
            err.msg);
    tg_checkpoint_free(&ck);
    const int before = open_files();
    REQUIRE(before > 0, "no /proc/self/fd");
    CHECK(tg_checkpoint_read(path, &ck, &err) == 0 && open_files() == before, "read whole: %s, %d files open, %d before",
          err.msg, open_files(), before);
    tg_checkpoint_free(&ck);
    CHECK(tg_checkpoint_read(dir, &ck, &err) == -1 && strstr(err.msg, ": not a checkpoint file") &&
              open_files() == before,
          "a folder: '%s', %d files open, %d before", err.msg, open_files(), before);
    char want[900];
    snprintf(want, sizeof want, "%s: out of memory for ", path);
    tg_alloc_fail_after(0);
    const int rc = tg_checkpoint_read(path, &ck, &err);
    tg_alloc_fail_after(-1);
    CHECK(rc == -1 && !strncmp(err.msg, want, strlen(want)) && open_files() == before,
          "out of memory: '%s', %d files open, %d before", err.msg, open_files(), before);
}
