/* The example parameter name in tg_graph_check_freeze's refusal (compiler/graph.c) when the
 * graph has no parameter at all: '?', looked for among exactly the graph's tensors even
 * when they fill the tensor table to its last entry (256, the table's first size). */
#include <stdio.h>
#include <string.h>

#include "compiler/graph.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "tests/harness.h"

TG_TEST(test_compiler_graph_freeze_hint_without_parameters) {
    tg_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.source, sizeof cfg.source, "hand-built");
    tg_job job;
    tg_job_defaults(&job);
    snprintf(job.path, sizeof job.path, "job.txt");
    snprintf(job.freeze, sizeof job.freeze, "enc.*");
    const int counts[] = {1, 255, 256};
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
        tg_err err = {{0}};
        tg_graph g;
        tg_graph_init(&g, &cfg, &job, &err);
        while (g.n_tensors < counts[i]) tg_act(&g, "act", 1, 2, 0, 0, 0);
        REQUIRE(!g.failed && g.n_tensors == counts[i], "%d tensors: %s", counts[i], err.msg);
        CHECK(g.n_tensors < 256 || g.cap_tensors == 256, "the table holds %d", g.cap_tensors);
        CHECK(tg_graph_check_freeze(&g) == -1 &&
                  !strcmp(err.msg, "job.txt (default): key 'freeze': pattern 'enc.*' matches no parameter of model 'hand-built' "
                                   "(patterns match Hugging Face parameter names such as '?')"),
              "%d tensors: '%s'", counts[i], err.msg);
        tg_graph_free(&g);
    }
}
