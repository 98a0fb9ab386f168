/* The plan's io roles by name: an io index outside the tensor table is refused naming the
 * role, for every field of tg_plan_io in its order (the list below is written apart from
 * plan/validate.c's). */
#include <stdio.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "plan/validate.h"
#include "tests/harness.h"

TG_TEST(test_plan_validate_io_names_each_role) {
    static const char *const roles[] = {
        "input_ids", "attention_mask", "token_type_ids", "position_ids", "labels", "logits", "loss",
        "step", "total_steps", "lr", "grad_norm", "params_all", "grads_all", "m_all", "v_all",
        "params_bf16_all", "loss_norm", "loss_scale", "loss_scale_growth", "mlm_stream", "pixel_values"};
    _Static_assert(sizeof roles / sizeof roles[0] == sizeof(tg_plan_io) / sizeof(int32_t), "a role per io field");
    tg_job job;
    tg_err err = {{0}};
    REQUIRE(tg_job_parse_text("model = tiny-bert\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = t\nprecision = fp16\n",
                              "j.job", "", NULL, 0, &job, &err) == 0,
            "%s", err.msg);
    tg_plan p;
    REQUIRE(tg_compile(&job, &p, &err) == 0, "%s", err.msg);
    for (size_t k = 0; k < sizeof roles / sizeof roles[0]; k++) {
        int32_t *io = (int32_t *)&p.io; /* tg_plan_io is all int32, in this order */
        const int32_t saved = io[k];
        for (int bad = 0; bad < 2; bad++) {
            io[k] = bad ? -2 : p.n_tensors;
            char want[96];
            snprintf(want, sizeof want, "p: io %s refers to tensor %d of %d", roles[k], io[k], p.n_tensors);
            memset(&err, 0, sizeof err);
            CHECK(tg_plan_validate_tables(&p, "p", &err) == -1 && !strcmp(err.msg, want), "%s: '%s', want '%s'",
                  roles[k], err.msg, want);
        }
        io[k] = saved;
    }
    CHECK(tg_plan_validate_tables(&p, "p", &err) == 0, "%s", err.msg);
    tg_plan_free(&p);
}
