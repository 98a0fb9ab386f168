/* When the plan uses the fused attention op (tg_fused_attention, compiler/model_build.c):
 * attention = fused and a head dimension of at most TG_FUSED_ATTENTION_MAX_HEAD_DIM; a
 * config without heads (which the config loader refuses) is answered without dividing
 * by zero. */
#include <string.h>

#include "compiler/job.h"
#include "compiler/model_build.h"
#include "models/model_config.h"
#include "tests/harness.h"

TG_TEST(test_compiler_model_build_fused_attention_choice) {
    tg_job job;
    tg_job_defaults(&job);
    tg_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    static const struct {
        int attention, hidden, heads, want;
    } cases[] = {
        {TG_ATTENTION_FUSED, 64, 2, 1},
        {TG_ATTENTION_FUSED, 2 * TG_FUSED_ATTENTION_MAX_HEAD_DIM, 2, 1},
        {TG_ATTENTION_FUSED, 2 * TG_FUSED_ATTENTION_MAX_HEAD_DIM + 2, 2, 0},
        {TG_ATTENTION_UNFUSED, 64, 2, 0},
        {TG_ATTENTION_FUSED, 64, 0, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        job.attention = cases[k].attention;
        cfg.hidden = cases[k].hidden, cfg.heads = cases[k].heads;
        CHECK(tg_fused_attention(&job, &cfg) == cases[k].want, "attention %d, hidden %d, heads %d: %d, want %d",
              cases[k].attention, cases[k].hidden, cases[k].heads, tg_fused_attention(&job, &cfg), cases[k].want);
    }
}
