/* Every float key of a job file (compiler/job.c) at the edges of its range: the value just
 * inside each bound is taken as it is written (an open bound refuses the bound itself, a
 * closed one takes it), the bound or the value just outside is refused with the whole
 * message; the fp16 loss-scale keys take powers of two within their bounds only. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "compiler/job.h"
#include "tests/harness.h"

#define BASE "model = tiny-bert\ntrain_data = t.jsonl\nsteps = 1\n"

/* Key lines (line 4) refused: the exact message. */
TG_TEST(test_job_float_key_bounds_refused) {
    static const struct {
        const char *line, *want;
    } cases[] = {
        {"lr = 0", "key 'lr': 0 is out of range (must be > 0)"},
        {"lr = -1e-30", "key 'lr': -1e-30 is out of range (must be > 0)"},
        {"eps = 0", "key 'eps': 0 is out of range (must be > 0)"},
        {"eps = -0.0", "key 'eps': -0.0 is out of range (must be > 0)"},
        {"weight_decay = -1e-30", "key 'weight_decay': -1e-30 is out of range (must be >= 0)"},
        {"grad_clip = -1e-30", "key 'grad_clip': -1e-30 is out of range (must be >= 0)"},
        {"beta1 = -1e-30", "key 'beta1': -1e-30 is out of range (must be in [0, 1))"},
        {"beta1 = 1", "key 'beta1': 1 is out of range (must be in [0, 1))"},
        {"beta2 = 1.5", "key 'beta2': 1.5 is out of range (must be in [0, 1))"},
        {"beta3 = 1", "key 'beta3': 1 is out of range (must be in [0, 1))"},
        {"beta3 = -0.5", "key 'beta3': -0.5 is out of range (must be in [0, 1))"},
        {"mlm_probability = 0", "key 'mlm_probability': 0 is out of range (must be in (0, 1))"},
        {"mlm_probability = -0.25", "key 'mlm_probability': -0.25 is out of range (must be in (0, 1))"},
        {"mlm_probability = 1", "key 'mlm_probability': 1 is out of range (must be in (0, 1))"},
        {"mlm_probability = 2", "key 'mlm_probability': 2 is out of range (must be in (0, 1))"},
        {"mlm_probability = 0.99999999",
         "key 'mlm_probability': 0.99999999 is out of range as a 32-bit float (it rounds to 1) (must be in (0, 1))"},
        {"mlm_probability = 1e-39",
         "key 'mlm_probability': 1e-39 is too small for a 32-bit float (smallest nonzero 1.17549e-38)"},
        {"qa_null_threshold = inf", "key 'qa_null_threshold': inf is not a finite 32-bit float (largest 3.40282e+38)"},
        {"qa_null_threshold = -1e39",
         "key 'qa_null_threshold': -1e39 is not a finite 32-bit float (largest 3.40282e+38)"},
        {"loss_scale_init = 2.98023223876953125e-08",
         "key 'loss_scale_init': 2.98023223876953125e-08 is out of range (must be in [5.96046e-08, 1.84467e+19])"},
        {"loss_scale_init = 36893488147419103232",
         "key 'loss_scale_init': 36893488147419103232 is out of range (must be in [5.96046e-08, 1.84467e+19])"},
        {"loss_scale_init = 3", "key 'loss_scale_init': 3 is not a power of two (such as 2 or 4)"},
        {"loss_scale_init = 0.75", "key 'loss_scale_init': 0.75 is not a power of two (such as 0.5 or 1)"},
        {"loss_scale_growth_factor = 1", "key 'loss_scale_growth_factor': 1 is out of range (must be in [2, 65536])"},
        {"loss_scale_growth_factor = 131072",
         "key 'loss_scale_growth_factor': 131072 is out of range (must be in [2, 65536])"},
        {"loss_scale_growth_factor = 3", "key 'loss_scale_growth_factor': 3 is not a power of two (such as 2 or 4)"},
        {"loss_scale_backoff = 1", "key 'loss_scale_backoff': 1 is out of range (must be in [1.52588e-05, 0.5])"},
        {"loss_scale_backoff = 7.62939453125e-06",
         "key 'loss_scale_backoff': 7.62939453125e-06 is out of range (must be in [1.52588e-05, 0.5])"},
        {"loss_scale_backoff = 0.375", "key 'loss_scale_backoff': 0.375 is not a power of two (such as 0.25 or 0.5)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[512], want[512];
        snprintf(text, sizeof text, BASE "%s\n", cases[i].line);
        snprintf(want, sizeof want, "j.job:4: %s", cases[i].want);
        tg_job job;
        tg_err err = {{0}};
        const int rc = tg_job_parse_text(text, "j.job", "d", NULL, 0, &job, &err);
        CHECK(rc == -1 && !strcmp(err.msg, want), "'%s': rc %d, '%s', want '%s'", cases[i].line, rc, err.msg, want);
        /* The same through --set ("key=value"): only the prefix differs. */
        char set_line[256];
        snprintf(set_line, sizeof set_line, "%s", cases[i].line);
        char *eq = strstr(set_line, " = ");
        if (!CHECK(eq != NULL, "'%s' has no ' = '", cases[i].line)) continue;
        eq[0] = '=', memmove(eq + 1, eq + 3, strlen(eq + 3) + 1);
        const char *set[1] = {set_line};
        snprintf(want, sizeof want, "--set %s: %s", set_line, cases[i].want);
        memset(&err, 0, sizeof err);
        const int set_rc = tg_job_parse_text(BASE, "j.job", "d", set, 1, &job, &err);
        CHECK(set_rc == -1 && !strcmp(err.msg, want), "--set %s: rc %d, '%s', want '%s'", set_line, set_rc, err.msg,
              want);
    }
}

/* Values at the edges inside each range, each stored as the float written. */
TG_TEST(test_job_float_key_bounds_accepted) {
    tg_job j;
    tg_err err = {{0}};
    REQUIRE(tg_job_parse_text(BASE "lr = 1.2e-38\neps = 3.4e38\nweight_decay = 0\ngrad_clip = 0\nbeta1 = 0\n"
                                   "beta2 = 0.99999994\n",
                              "j.job", "d", NULL, 0, &j, &err) == 0,
            "adamw edges: %s", err.msg);
    CHECK(j.lr == 1.2e-38f && j.eps == 3.4e38f && j.weight_decay == 0 && j.grad_clip == 0 && j.beta1 == 0 &&
              j.beta2 == 0.99999994f && j.beta2 < 1,
          "lr %g eps %g wd %g clip %g beta1 %g beta2 %.9g", j.lr, j.eps, j.weight_decay, j.grad_clip, j.beta1, j.beta2);
    REQUIRE(tg_job_parse_text(BASE "optimizer = adan\nbeta3 = 0\n", "j.job", "d", NULL, 0, &j, &err) == 0, "adan: %s",
            err.msg);
    CHECK(j.beta3 == 0 && j.beta1 == 0.98f && j.beta2 == 0.92f, "beta3 %g (beta1 %g beta2 %g)", j.beta3, j.beta1, j.beta2);
    REQUIRE(tg_job_parse_text(BASE "optimizer = adan\nbeta3 = 0.99999994\n", "j.job", "d", NULL, 0, &j, &err) == 0,
            "adan: %s", err.msg);
    CHECK(j.beta3 == 0.99999994f, "beta3 %.9g", j.beta3);
    static const char *const mlm[] = {"1.2e-38", "0.99999994", "0.5"};
    static const float mlm_want[] = {1.2e-38f, 0.99999994f, 0.5f};
    for (int i = 0; i < 3; i++) {
        char text[256];
        snprintf(text, sizeof text, BASE "task = mlm\nmlm_probability = %s\n", mlm[i]);
        REQUIRE(tg_job_parse_text(text, "j.job", "d", NULL, 0, &j, &err) == 0, "mlm_probability %s: %s", mlm[i],
                err.msg);
        CHECK(j.mlm_probability == mlm_want[i], "mlm_probability %s: %.9g", mlm[i], j.mlm_probability);
    }
    REQUIRE(tg_job_parse_text(BASE "qa_null_threshold = -3.4e38\n", "j.job", "d", NULL, 0, &j, &err) == 0, "qa: %s",
            err.msg);
    CHECK(j.qa_null_threshold == -3.4e38f, "qa_null_threshold %g", j.qa_null_threshold);
    REQUIRE(tg_job_parse_text(BASE "precision = fp16\nloss_scale_init = 5.9604644775390625e-08\n"
                                   "loss_scale_growth_factor = 2\nloss_scale_backoff = 1.52587890625e-05\n",
                              "j.job", "d", NULL, 0, &j, &err) == 0,
            "fp16 lower edges: %s", err.msg);
    CHECK(j.loss_scale_init == 0x1p-24f && j.loss_scale_growth_factor == 2.0f && j.loss_scale_backoff == 0x1p-16f,
          "init %g growth %g backoff %g", j.loss_scale_init, j.loss_scale_growth_factor, j.loss_scale_backoff);
    REQUIRE(tg_job_parse_text(BASE "precision = fp16\nloss_scale_init = 18446744073709551616\n"
                                   "loss_scale_growth_factor = 65536\nloss_scale_backoff = 0.5\n",
                              "j.job", "d", NULL, 0, &j, &err) == 0,
            "fp16 upper edges: %s", err.msg);
    CHECK(j.loss_scale_init == 0x1p64f && j.loss_scale_growth_factor == 65536.0f && j.loss_scale_backoff == 0.5f,
          "init %g growth %g backoff %g", j.loss_scale_init, j.loss_scale_growth_factor, j.loss_scale_backoff);
}
