/* An eval between training steps (runtime/trainer.c, tg_trainer_eval) uses a staging
 * buffer that holds no upcoming training batch: the steps after it see the batches, and
 * give the losses, of a run without the eval, whether the batches are filled ahead on the
 * loader's thread or on the caller's. */
#include <stdio.h>
#include <string.h>

#include "api/front.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

/* tiny-bert classifying 8 training rows, batch 2, seq 8, and 3 other eval rows. */
static int compile_job(tg_plan *plan) {
    const char *dir = tg_test_tmpdir();
    char path[800];
    snprintf(path, sizeof path, "%s/train.jsonl", dir);
    if (tg_test_write_file(path, "{\"input_ids\": [5, 6, 7], \"label\": 0}\n{\"input_ids\": [8, 9], \"label\": 1}\n"
                                 "{\"input_ids\": [10, 11, 12, 13], \"label\": 1}\n{\"input_ids\": [14], \"label\": 0}\n"
                                 "{\"input_ids\": [15, 16], \"label\": 1}\n{\"input_ids\": [17, 18, 19], \"label\": 0}\n"
                                 "{\"input_ids\": [20], \"label\": 1}\n{\"input_ids\": [21, 22, 23, 24, 25], \"label\": 0}\n"))
        return 0;
    snprintf(path, sizeof path, "%s/eval.jsonl", dir);
    if (tg_test_write_file(path, "{\"input_ids\": [30, 31, 32, 33, 34, 35, 36], \"label\": 1}\n"
                                 "{\"input_ids\": [40, 41, 42, 43, 44, 45], \"label\": 0}\n"
                                 "{\"input_ids\": [50, 51, 52, 53, 54], \"label\": 1}\n"))
        return 0;
    snprintf(path, sizeof path, "%s/job.job", dir);
    tg_err err;
    return tg_test_write_file(path, "model = tiny-bert\ntask = classify\nbatch = 2\nseq = 8\nsteps = 12\n"
                                    "train_data = train.jsonl\neval_data = eval.jsonl\n") == 0 &&
           CHECK(tg_front_compile_file(path, NULL, 0, plan, &err) == 0, "%s", err.msg);
}

TG_TEST(test_trainer_eval_between_steps_leaves_the_batches) {
    tg_plan plan;
    if (!compile_job(&plan)) return;
    enum { STEPS = 9 };
    for (int thread = 0; thread < 2; thread++) {
        float loss[2][STEPS];
        int32_t tokens[2][STEPS];
        for (int with_eval = 0; with_eval < 2; with_eval++) {
            tg_trainer t;
            tg_err err = {{0}};
            const tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1,
                                          .no_loader_thread = !thread};
            REQUIRE(tg_trainer_open(&t, &plan, &o, &err) == 0, "%s", err.msg);
            for (int s = 0; s < STEPS; s++) {
                if (with_eval && (s == 2 || s == 3 || s == 7)) {
                    tg_eval_stats e;
                    CHECK(tg_trainer_eval(&t, &e, &err) == 0 && e.examples == 3 && e.counted == 3,
                          "loader thread %d, eval before step %d: %s", thread, s + 1, err.msg);
                }
                tg_step_stats st;
                CHECK(tg_trainer_step(&t, &st, &err) == 0 && st.step == s + 1, "loader thread %d, step %d: %s", thread,
                      s + 1, err.msg);
                loss[with_eval][s] = st.loss;
                tokens[with_eval][s] = (int32_t)st.tokens;
            }
            tg_trainer_close(&t);
        }
        for (int s = 0; s < STEPS; s++)
            CHECK(loss[0][s] == loss[1][s] && tokens[0][s] == tokens[1][s],
                  "loader thread %d, step %d: loss %.9g (%d tokens) without evals, %.9g (%d tokens) with", thread, s + 1,
                  loss[0][s], tokens[0][s], loss[1][s], tokens[1][s]);
    }
    tg_plan_free(&plan);
}
