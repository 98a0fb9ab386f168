/* The permissions of an exported folder (runtime/hf_export.c): the folder is made under a
 * temporary name with mode 0777 less the umask and renamed into place, so the output folder
 * has that mode whether it was absent, an empty folder of another mode, or (force) a full
 * one; its files are 0644 less the umask (base/atomic_file.c). Nothing is left beside it.
 * The modes are read with stat, which root's permissions do not change. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/hf_export.h"
#include "tests/harness.h"

static unsigned mode_of(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? (unsigned)(sb.st_mode & 07777) : 0xffffu;
}

/* Exports into out under `mask`; checks the folder's and its files' modes. */
static void export_with_umask(const tg_weights_image *img, const char *out, int force, mode_t mask, const char *what) {
    const tg_hf_export_options o = {out, NULL, NULL, 0, force, 0};
    tg_err err = {{0}};
    const mode_t was = umask(mask);
    const int rc = tg_hf_export(img, &o, &err);
    umask(was);
    REQUIRE(rc == 0, "%s: %s", what, err.msg);
    char config[900], weights[900];
    snprintf(config, sizeof config, "%s/config.json", out);
    snprintf(weights, sizeof weights, "%s/model.safetensors", out);
    const unsigned want_dir = 0777u & ~(unsigned)mask, want_file = 0644u & ~(unsigned)mask;
    CHECK(mode_of(out) == want_dir, "%s: folder mode %04o, want %04o", what, mode_of(out), want_dir);
    CHECK(mode_of(config) == want_file && mode_of(weights) == want_file, "%s: file modes %04o %04o, want %04o", what,
          mode_of(config), mode_of(weights), want_file);
    CHECK(tg_test_count_files(out) == 2, "%s: %d entries in the folder", what, tg_test_count_files(out));
}

TG_TEST(test_runtime_hf_export_folder_mode) {
    tg_plan p;
    if (!tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, &p)) return;
    tg_weights_image img;
    tg_err err = {{0}};
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
    tg_weights_init(&img, 2);
    const char *root = tg_test_tmpdir();
    char out[800];
    snprintf(out, sizeof out, "%s/out", root);

    export_with_umask(&img, out, 0, 027, "a new folder, umask 027");

    /* an empty folder of mode 0700 is replaced: the export's mode, not the old folder's */
    char cmd[1000];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
    REQUIRE(system(cmd) == 0 && mkdir(out, 0700) == 0 && chmod(out, 0700) == 0, "an empty folder");
    export_with_umask(&img, out, 0, 0, "over an empty folder, umask 0");

    /* the full folder replaced with force */
    export_with_umask(&img, out, 1, 022, "over a full folder with force, umask 022");
    CHECK(tg_test_count_files(root) == 1, "%d entries beside the folder", tg_test_count_files(root));

    tg_weights_image_free(&img);
    tg_plan_free(&p);
}
