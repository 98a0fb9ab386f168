/* tg_checkpoint_add_tensor owns the data it is given from the call on: refused (a bad
 * name, replica, dtype or shape) or out of memory, it frees the data itself and says why;
 * added, the checkpoint frees it. The leak checks of the ASan build see a lost block. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/checkpoint.h"
#include "tests/harness.h"

static float *six_floats(void) {
    float *d = malloc(6 * sizeof *d);
    if (d)
        for (int i = 0; i < 6; i++) d[i] = (float)i;
    return d;
}

TG_TEST(test_checkpoint_add_tensor_frees_what_it_refuses) {
    const int64_t shape[2] = {2, 3};
    tg_checkpoint ck;
    tg_checkpoint_init(&ck);
    tg_err err = {{0}};
    /* every allocation the first add makes, failed in turn */
    int failures = 0;
    for (long k = 0; k < 8; k++) {
        float *d = six_floats();
        REQUIRE(d, "memory");
        memset(&err, 0, sizeof err);
        tg_alloc_fail_only(k);
        const int rc = tg_checkpoint_add_tensor(&ck, "w", -1, TG_F32, 2, shape, d, &err);
        const long failed = tg_alloc_fail_after(-1) > k;
        if (rc == 0) {
            CHECK(!failed && ck.n_tensors == 1 && ck.tensors[0].bytes == 24, "added after %ld", k);
            break;
        }
        failures++;
        CHECK(!strcmp(err.msg, "checkpoint: out of memory adding tensor 'w'") && ck.n_tensors == 0,
              "allocation %ld: '%s', %d tensors", k, err.msg, ck.n_tensors);
    }
    CHECK(failures >= 1, "no allocation of the first add failed");
    /* refused: the data freed all the same */
    static const char *const want = "checkpoint: tensor 'x' has a bad name, replica, dtype or shape";
    float *d = six_floats();
    REQUIRE(d, "memory");
    CHECK(tg_checkpoint_add_tensor(&ck, "x", -2, TG_F32, 2, shape, d, &err) == -1 && !strcmp(err.msg, want), "%s",
          err.msg);
    tg_checkpoint_free(&ck);
}
