/* The temporary folder of an export (runtime/hf_export.c) beside an output folder whose name
 * is as long as a name can be (NAME_MAX bytes): its name keeps the first NAME_MAX - 40
 * bytes of the folder's, so that ".<name>.tmp.<pid>.<n>" fits, and the export succeeds with
 * nothing left beside the folder. The temporary name is read from the message of an
 * export stopped out of memory once it had made its folder. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "runtime/hf_export.h"
#include "tests/harness.h"

TG_TEST(test_runtime_hf_export_temp_name_of_a_longest_name) {
    tg_plan p;
    if (!tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, &p)) return;
    tg_weights_image img;
    tg_err err = {{0}};
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
    tg_weights_init(&img, 4);
    const char *root = tg_test_tmpdir();
    char name[NAME_MAX + 1], out[PATH_MAX];
    for (int i = 0; i < NAME_MAX; i++) name[i] = (char)('a' + i % 26);
    name[NAME_MAX] = 0;
    snprintf(out, sizeof out, "%s/%s", root, name);
    const tg_hf_export_options o = {out, NULL, NULL, 0, 0, 0};

    /* the temporary name, from the first message that shows it */
    char prefix[PATH_MAX];
    snprintf(prefix, sizeof prefix, "%s/.%.*s.tmp.", root, NAME_MAX - 40, name);
    const char *tmp = NULL;
    long k = 0;
    for (; k < 3000 && !tmp; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = tg_hf_export(&img, &o, &err);
        tg_alloc_fail_after(-1);
        REQUIRE(rc == -1, "export with allocation %ld failing succeeded", k);
        tmp = strstr(err.msg, "/.");
        if (tmp) tmp = strstr(err.msg, prefix);
        CHECK(tmp || !strstr(err.msg, "/.ab"), "a temporary name other than '%s...': '%s'", prefix, err.msg);
        CHECK(tg_test_count_files(root) == 0, "allocation %ld failing: %d entries left", k,
              tg_test_count_files(root));
    }
    REQUIRE(tmp, "no temporary name in the messages of %ld exports", k);
    long pid = -1;
    unsigned serial = 0;
    int used = 0;
    CHECK(sscanf(tmp + strlen(prefix), "%ld.%u%n", &pid, &serial, &used) == 2 && pid == (long)getpid() &&
              tmp[strlen(prefix) + (size_t)used] == '/',
          "temporary name in '%s'", err.msg);
    const size_t tmp_name_len = strlen(prefix) - strlen(root) - 1 + (size_t)used;
    CHECK(tmp_name_len <= NAME_MAX, "a temporary name of %zu bytes", tmp_name_len);

    /* and the export itself */
    memset(&err, 0, sizeof err);
    CHECK(tg_hf_export(&img, &o, &err) == 0, "%s", err.msg);
    CHECK(tg_test_count_files(out) == 2 && tg_test_count_files(root) == 1, "%d entries in the folder, %d beside it",
          tg_test_count_files(out), tg_test_count_files(root));
    tg_weights_image_free(&img);
    tg_plan_free(&p);
}
