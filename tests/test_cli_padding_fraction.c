/* The padding a run reports (the summary's padding_fraction and the "batches:" line) against
 * the data: one epoch over 8 examples of known lengths, in 2 batches of 4 x 8 slots, so the
 * real tokens are the examples' lengths cut to 8, whatever the order. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tests/cli_in_process.h"
#include "tests/harness.h"

TG_TEST(test_cli_padding_fraction_of_an_epoch) {
    const char *dir = tg_test_tmpdir();
    static const int lengths[8] = {3, 4, 5, 6, 7, 8, 9, 12}; /* 9 and 12 are cut to 8 */
    char path[600], line[1500];
    snprintf(path, sizeof path, "%s/train.jsonl", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f, "cannot write %s", path);
    int real = 0;
    for (int e = 0; e < 8; e++) {
        fprintf(f, "{\"input_ids\": [1");
        for (int i = 1; i < lengths[e] - 1; i++) fprintf(f, ", %d", 5 + (e * 7 + i) % 100);
        fprintf(f, ", 2], \"label\": %d}\n", e % 2);
        real += lengths[e] < 8 ? lengths[e] : 8;
    }
    fclose(f);
    snprintf(path, sizeof path, "%s/job.job", dir);
    f = fopen(path, "w");
    REQUIRE(f, "cannot write %s", path);
    fprintf(f, "model = tiny-bert\nbatch = 4\nseq = 8\nepochs = 1\ntrain_data = train.jsonl\n");
    fclose(f);
    snprintf(line, sizeof line, "run %s/job.job --device cpu --metrics %s/m.jsonl", dir, dir);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    const double want = 1.0 - real / 64.0; /* 49 of 64 slots real */
    char said[96];
    snprintf(said, sizeof said, "batches: %.1f%% of the token slots padding", want * 100);
    CHECK(r.status == 0 && r.err && strstr(r.err, said), "status %d, want '%s' in: %s", r.status, said,
          r.err ? r.err : "");
    tg_cli_run_free(&r);
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    f = fopen(path, "r");
    REQUIRE(f, "no metrics");
    char buf[8192];
    double got = -1;
    int steps = -1;
    while (fgets(buf, sizeof buf, f)) {
        json_t *o = json_loads(buf, 0, NULL);
        if (o && json_is_true(json_object_get(o, "summary")))
            got = json_number_value(json_object_get(o, "padding_fraction")),
            steps = (int)json_integer_value(json_object_get(o, "steps"));
        json_decref(o);
    }
    fclose(f);
    CHECK(real == 49 && steps == 2 && fabs(got - want) < 5e-5, "padding_fraction %.6f, want %.6f (%d steps)", got, want,
          steps);
}
