/* Each allocation of a safetensors open (models/safetensors.c, tg_st_open) failed in turn,
 * alone and with every later one: the header's JSON parse (jansson allocating through the
 * hook) ends in "<path>: out of memory parsing the header", the entry table, each tensor's
 * name and the tiling check's order in "<path>: out of memory", and nothing is left open. */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "models/safetensors.h"
#include "tests/harness.h"

TG_TEST(test_models_safetensors_open_each_allocation) {
    char path[700];
    snprintf(path, sizeof path, "%s/three.safetensors", tg_test_tmpdir());
    static const float vals[6] = {1, 2, 3, 4, 5, 6};
    const int64_t two[] = {2};
    const tg_st_item items[] = {{"embeddings.word.weight", TG_ST_F32, 1, two, vals},
                                {"b", TG_ST_F32, 1, two, vals + 2},
                                {"encoder.layer.0.bias", TG_ST_F32, 1, two, vals + 4}};
    const char *const meta[] = {"format", "pt"};
    tg_err err = {{0}};
    REQUIRE(tg_st_write_with_metadata(path, items, 3, meta, 1, &err) == 0, "%s", err.msg);

    tg_safetensors st;
    tg_alloc_fail_after(-1);
    REQUIRE(tg_st_open(path, &st, &err) == 0, "%s", err.msg);
    const long total = tg_alloc_fail_after(-1);
    tg_st_close(&st);
    /* the parse first, then the entry table, the three names and the order of the tiling check */
    const long parse = total - 1 - 3 - 1;
    REQUIRE(parse > 0, "%ld allocations in all", total);

    char parsing[800], plain[800];
    snprintf(parsing, sizeof parsing, "%s: out of memory parsing the header", path);
    snprintf(plain, sizeof plain, "%s: out of memory", path);
    for (int only = 0; only < 2; only++)
        for (long k = 0; k < total; k++) {
            memset(&err, 0, sizeof err);
            if (only) tg_alloc_fail_only(k);
            else tg_alloc_fail_after(k);
            const int rc = tg_st_open(path, &st, &err);
            tg_alloc_fail_after(-1);
            const char *want = k < parse ? parsing : plain;
            CHECK(rc == -1 && !strcmp(err.msg, want), "allocation %ld of %ld failing%s: rc %d, '%s'\n    want '%s'", k,
                  total, only ? " alone" : "", rc, err.msg, want);
            CHECK(st.n == 0 && st.entries == NULL && st.map == NULL && st.data == NULL,
                  "allocation %ld failing: state left behind", k);
        }

    /* and with no failure armed the same file opens whole */
    REQUIRE(tg_st_open(path, &st, &err) == 0, "%s", err.msg);
    float got[2] = {0};
    const tg_st_entry *e = tg_st_find(&st, "encoder.layer.0.bias");
    CHECK(st.n == 3 && e && tg_st_read_f32(&st, e, got, 2, &err) == 0 && got[0] == 5 && got[1] == 6, "read back");
    tg_st_close(&st);
}
