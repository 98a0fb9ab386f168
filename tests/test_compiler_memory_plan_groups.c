/* The parameter layout (compiler/memory_plan.c) on hand-built graphs at two edges: a
 * packed group whose second member passes the pool limit is refused like a loose
 * parameter, naming the size reached there, and a parameter with two views of different widths is given room for the
 * wider, whichever comes first. */
#include <stdio.h>
#include <string.h>

#include "compiler/graph.h"
#include "compiler/job.h"
#include "compiler/memory_plan.h"
#include "models/model_config.h"
#include "tests/harness.h"

/* A parameter of 9 TiB, then a packed group of three 4 TiB members: the group fits a pool
 * alone, its second member passes the limit, and the third is not placed. */
TG_TEST(test_memory_plan_packed_group_past_the_pool) {
    tg_model_config cfg;
    tg_job job;
    tg_err err = {{0}};
    tg_graph g;
    REQUIRE(tg_model_config_load("tiny-bert", &cfg, &err) == 0, "%s", err.msg);
    tg_job_defaults(&job);
    tg_graph_init(&g, &cfg, &job, &err);
    const int64_t n = (int64_t)(4ull << 40) / 4;
    tg_param(&g, "big", 1, (int64_t)(9ull << 40) / 4, 0, TG_INIT_ZEROS, 0);
    const int members[3] = {tg_param(&g, "m1", 1, n, 0, TG_INIT_ZEROS, 0), tg_param(&g, "m2", 1, n, 0, TG_INIT_ZEROS, 0),
                            tg_param(&g, "m3", 1, n, 0, TG_INIT_ZEROS, 0)};
    const int pk = tg_param_pack(&g, "pk", members, 3, 1, 3 * n, 0);
    REQUIRE(!g.failed && pk >= 0, "%s", err.msg);
    CHECK(tg_plan_param_layout(&g) == -1 && strstr(err.msg, "the params pool needs at least 17") &&
              strstr(err.msg, "one pool may hold"),
          "'%s'", err.msg);
    tg_graph_free(&g);
}

/* b (100 f32) with views of 120 and then 110 elements, or the other way round: b's block
 * holds the 480 bytes of the wider either way, so params_all ends at 512. */
TG_TEST(test_memory_plan_widest_of_two_views) {
    for (int narrow_first = 0; narrow_first < 2; narrow_first++) {
        tg_model_config cfg;
        tg_job job;
        tg_err err = {{0}};
        tg_graph g;
        REQUIRE(tg_model_config_load("tiny-bert", &cfg, &err) == 0, "%s", err.msg);
        tg_job_defaults(&job);
        tg_graph_init(&g, &cfg, &job, &err);
        const int b = tg_param(&g, "b", 1, 100, 0, TG_INIT_ZEROS, 0);
        const int64_t widths[2] = {narrow_first ? 110 : 120, narrow_first ? 120 : 110};
        for (int k = 0; k < 2; k++) {
            const int v = tg_graph_tensor(&g, k ? "b.second" : "b.first", TG_F32, TG_POOL_PARAMS, 1, &widths[k]);
            if (v >= 0) g.tensors[v].flags |= TG_TENSOR_VIEW, g.tensors[v].master = b;
        }
        REQUIRE(!g.failed && tg_plan_param_layout(&g) == 0, "%s", err.msg);
        const tg_tensor *all = &g.tensors[g.io.params_all];
        CHECK(g.tensors[b].offset == 0 && all->bytes == 512, "narrow first %d: b at %llu, params_all %llu bytes",
              narrow_first, (unsigned long long)g.tensors[b].offset, (unsigned long long)all->bytes);
        tg_graph_free(&g);
    }
}
