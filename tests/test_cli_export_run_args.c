/* `tunegraph run`'s export options taken out of its command line (run_export_args in
 * cli/export.c, linked in through tests/test_cli_metrics.c): what is taken, what is left
 * for run in order, the values of run's own options never read as export options, and each
 * refusal with its status 2 and message on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/export.h"
#include "tests/harness.h"

/* run_export_args on the words of `line` (split at spaces) with stderr captured into *said
 * (malloc'd); the words left are joined with spaces into left. */
static int take(const char *line, run_export *ex, char *left, size_t cap, char **said) {
    static char words[2048];
    char *argv[64];
    int argc = 0;
    snprintf(words, sizeof words, "%s", line);
    for (char *w = strtok(words, " "); w && argc < 63; w = strtok(NULL, " ")) argv[argc++] = w;
    argv[argc] = NULL;
    char err_path[700];
    snprintf(err_path, sizeof err_path, "%s/run-args-err.txt", tg_test_tmpdir());
    fflush(stderr);
    int saved = dup(2);
    FILE *f = fopen(err_path, "w");
    if (saved < 0 || !f) return -100;
    dup2(fileno(f), 2);
    fclose(f);
    const int rc = run_export_args(&argc, argv, ex);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    *said = tg_test_read_file(err_path, NULL);
    size_t n = 0;
    left[0] = 0;
    for (int i = 0; i < argc && n < cap; i++) n += (size_t)snprintf(left + n, cap - n, i ? " %s" : "%s", argv[i]);
    return rc;
}

TG_TEST(test_cli_run_export_args_taken) {
    static const struct {
        const char *line, *left, *save_dir, *labels, *tokenizer;
        int force, bf16, n_labels;
    } cases[] = {
        {"job.job --set steps=1", "job.job --set steps=1", NULL, NULL, NULL, 0, 0, 0},
        {"job.job --save-dir out --force --dtype bf16 --labels a,,b --tokenizer t.json -o p.tgp", "job.job -o p.tgp",
         "out", "a,,b", "t.json", 1, 1, 3},
        {"--dtype fp32 --save-dir d job.job", "job.job", "d", NULL, NULL, 0, 0, 0},
        /* run's valued options keep their values, even ones spelled like ours */
        {"job.job --save-dir d -o --force", "job.job -o --force", "d", NULL, NULL, 0, 0, 0},
        {"job.job --save-dir d --set --labels --metrics --tokenizer", "job.job --set --labels --metrics --tokenizer", "d",
         NULL, NULL, 0, 0, 0},
        {"job.job --save-dir d --device --dtype --threads --save-dir --save --force --in-flight --labels",
         "job.job --device --dtype --threads --save-dir --save --force --in-flight --labels", "d", NULL, NULL, 0, 0, 0},
        /* a valued option of run's at the end keeps nothing after it */
        {"job.job --save-dir d --threads", "job.job --threads", "d", NULL, NULL, 0, 0, 0},
        /* the last of a repeated option wins */
        {"job.job --save-dir a --save-dir b --labels x --labels y,z", "job.job", "b", "y,z", NULL, 0, 0, 2},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        run_export ex;
        char left[2048], *said = NULL;
        const int rc = take(cases[k].line, &ex, left, sizeof left, &said);
        CHECK(rc == 0 && said && !said[0], "'%s': returned %d, said '%s'", cases[k].line, rc, said ? said : "(nothing)");
        CHECK(!strcmp(left, cases[k].left), "'%s': left '%s', want '%s'", cases[k].line, left, cases[k].left);
#define SAME(a, b) ((a) == NULL ? (b) == NULL : (b) != NULL && !strcmp((a), (b)))
        CHECK(SAME(ex.save_dir, cases[k].save_dir) && SAME(ex.labels_text, cases[k].labels) &&
                  SAME(ex.tokenizer, cases[k].tokenizer),
              "'%s': save_dir %s labels %s tokenizer %s", cases[k].line, ex.save_dir ? ex.save_dir : "-",
              ex.labels_text ? ex.labels_text : "-", ex.tokenizer ? ex.tokenizer : "-");
        CHECK(ex.force == cases[k].force && ex.bf16 == cases[k].bf16 && ex.n_labels == cases[k].n_labels &&
                  (ex.labels != NULL) == (cases[k].n_labels > 0),
              "'%s': force %d bf16 %d n_labels %d", cases[k].line, ex.force, ex.bf16, ex.n_labels);
        free(said);
        run_export_free(&ex);
        CHECK(!ex.save_dir && !ex.labels && !ex.n_labels && !ex.force, "run_export_free left fields set");
    }
    /* the labels split at every comma, empty names kept */
    run_export ex;
    char left[256], *said = NULL;
    REQUIRE(take("j --save-dir d --labels neg,,pos,", &ex, left, sizeof left, &said) == 0, "labels");
    CHECK(ex.n_labels == 4 && !strcmp(ex.labels[0], "neg") && !strcmp(ex.labels[1], "") &&
              !strcmp(ex.labels[2], "pos") && !strcmp(ex.labels[3], ""),
          "%d labels", ex.n_labels);
    free(said);
    run_export_free(&ex);
}

TG_TEST(test_cli_run_export_args_refused) {
    static const char usage[] =
        "usage: tunegraph run PLAN|JOB ... --save-dir DIR [--labels a,b,...] [--tokenizer PATH] [--dtype fp32|bf16] "
        "[--force]\n";
    static const struct {
        const char *line, *message;
    } cases[] = {
        {"job.job --save-dir", "--save-dir needs a value"},
        {"job.job --save-dir d --labels", "--labels needs a value"},
        {"job.job --save-dir d --tokenizer", "--tokenizer needs a value"},
        {"job.job --save-dir d --dtype", "--dtype needs a value"},
        {"job.job --labels a,b", "--labels, --tokenizer, --dtype and --force go with --save-dir"},
        {"job.job --tokenizer t", "--labels, --tokenizer, --dtype and --force go with --save-dir"},
        {"job.job --dtype fp32", "--labels, --tokenizer, --dtype and --force go with --save-dir"},
        {"job.job --force", "--labels, --tokenizer, --dtype and --force go with --save-dir"},
        /* run's -o takes --save-dir as its value: no --save-dir is left for --force */
        {"job.job -o --save-dir d --force", "--labels, --tokenizer, --dtype and --force go with --save-dir"},
        {"job.job --save-dir d --dtype fp16", "--dtype must be fp32 or bf16, got 'fp16'"},
        {"job.job --save-dir d --dtype BF16", "--dtype must be fp32 or bf16, got 'BF16'"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        run_export ex;
        char left[2048], *said = NULL, want[512];
        const int rc = take(cases[k].line, &ex, left, sizeof left, &said);
        snprintf(want, sizeof want, "tunegraph: %s\n%s", cases[k].message, usage);
        CHECK(rc == 2 && said && !strcmp(said, want), "'%s': returned %d, said '%s', want '%s'", cases[k].line, rc,
              said ? said : "(nothing)", want);
        free(said);
        run_export_free(&ex);
    }
}
