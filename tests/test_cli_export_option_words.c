/* export's and predict's words (cli/export.c parse), each refusal whole on stderr with its
 * command's usage after it (exit 2, nothing on stdout): an option is one of the command's
 * own words exactly (not a prefix, not longer, not the other command's), every valued one
 * needs its value, a lone "-" is the input; the value checks that follow (-o, --weights,
 * --dtype, --device, --threads from 0 to 1024 in decimal digits). In this process
 * (tests/cli_in_process.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/cli_in_process.h"
#include "tests/harness.h"

static const char k_export_usage[] =
    "usage: tunegraph export PLAN|JOB --weights FILE.safetensors -o OUTDIR [--tokenizer PATH] [--labels a,b,...]\n"
    "                        [--dtype fp32|bf16] [--force] [--set key=value]...\n";
static const char k_predict_usage[] =
    "usage: tunegraph predict PLAN|JOB -o LOGITS.jsonl [--weights FILE.safetensors] [--data FILE.jsonl]\n"
    "                         [--device cpu|cuda] [--threads N] [--init-missing] [--set key=value]...\n";

#define J "examples/demo-classify.job"

TG_TEST(test_cli_export_option_words_refused) {
    const char *dir = tg_test_tmpdir();
    static const struct {
        const char *line, *message;
    } cases[] = {
        {"export", "missing plan or job file"},
        {"export --force", "missing plan or job file"},
        {"export " J " --weight w", "unknown option --weight"},
        {"export " J " --weightss w", "unknown option --weightss"},
        {"export " J " --forcex", "unknown option --forcex"},
        {"export " J " --init-missing", "unknown option --init-missing"},
        {"export " J " --data d", "unknown option --data"},
        {"export " J " --device cpu", "unknown option --device"},
        {"export " J " --threads 1", "unknown option --threads"},
        {"export " J " -", "unexpected argument -"},
        {"export - " J, "unexpected argument " J},
        {"export " J " -o", "-o needs a value"},
        {"export " J " --weights", "--weights needs a value"},
        {"export " J " --tokenizer", "--tokenizer needs a value"},
        {"export " J " --labels", "--labels needs a value"},
        {"export " J " --dtype", "--dtype needs a value"},
        {"export " J " --set", "--set needs a value"},
        {"export " J " --set a=1 --set b", "--set needs key=value, got 'b'"},
        {"export " J " --force --weights w", "-o OUTDIR is required"},
        {"export " J " -o out --force", "--weights FILE.safetensors is required"},
        {"export " J " -o out --weights w --dtype FP32", "--dtype must be fp32 or bf16, got 'FP32'"},
        {"export " J " -o out --weights w --dtype bf", "--dtype must be fp32 or bf16, got 'bf'"},
        {"predict", "missing plan or job file"},
        {"predict " J " --init", "unknown option --init"},
        {"predict " J " --init-missingx", "unknown option --init-missingx"},
        {"predict " J " --force", "unknown option --force"},
        {"predict " J " --tokenizer t", "unknown option --tokenizer"},
        {"predict " J " --labels a", "unknown option --labels"},
        {"predict " J " --dtype fp32", "unknown option --dtype"},
        {"predict " J " --weights", "--weights needs a value"},
        {"predict " J " --data", "--data needs a value"},
        {"predict " J " --device", "--device needs a value"},
        {"predict " J " --init-missing --weights w", "-o LOGITS.jsonl is required"},
        {"predict " J " -o out --device gpu", "--device must be cpu or cuda, got 'gpu'"},
        {"predict " J " -o out --device cpu --threads 1025", "--threads needs a whole number from 0 to 1024 (0: one per core), got '1025'"},
        {"predict " J " -o out --threads +1", "--threads needs a whole number from 0 to 1024 (0: one per core), got '+1'"},
        {"predict " J " -o out --threads ", "--threads needs a whole number from 0 to 1024 (0: one per core), got ''"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int predict = !strncmp(cases[k].line, "predict", 7);
        char want[2048];
        snprintf(want, sizeof want, "tunegraph: %s\n%s", cases[k].message, predict ? k_predict_usage : k_export_usage);
        char *argv[32];
        char words[1024];
        int argc = 0;
        argv[argc++] = "tunegraph";
        snprintf(words, sizeof words, "%s", cases[k].line);
        /* split at single blanks: "  " gives an empty word */
        for (char *w = words, *next; w; w = next) {
            next = strchr(w, ' ');
            if (next) *next++ = 0;
            argv[argc++] = w;
        }
        argv[argc] = NULL;
        tg_cli_run r = tg_test_cli_argv(dir, argc, argv, NULL);
        CHECK(r.status == 2 && r.out && !r.out[0] && r.err && !strcmp(r.err, want), "%s: exit %d, stderr\n%s\nwant\n%s",
              cases[k].line, r.status, r.err ? r.err : "(none)", want);
        tg_cli_run_free(&r);
    }
}

/* The valued options taken (the last of a repeated one counts) and --threads at its bounds:
 * what follows is the work, refused here for want of weights, or done. */
TG_TEST(test_cli_export_option_words_taken) {
    const char *dir = tg_test_tmpdir();
    char line[2048], out[800], data[800];
    snprintf(out, sizeof out, "%s/l.jsonl", dir);
    snprintf(data, sizeof data, "%s/two.jsonl", dir);
    REQUIRE(tg_test_write_file(data, "{\"input_ids\": [2, 5, 3], \"label\": 0}\n{\"input_ids\": [2, 6, 3], \"label\": 1}\n") == 0,
            "%s", data);
    static const char *const threads[] = {"0", "1024", "007", "9"};
    for (int t = 0; t < 4; t++) {
        snprintf(line, sizeof line, "predict " J " -o %s/other.jsonl -o %s --data %s --device cpu --threads %s --init-missing",
                 dir, out, data, threads[t]);
        tg_cli_run r = tg_test_cli_line(dir, line, NULL);
        char head[1200];
        snprintf(head, sizeof head, "predicted 2 examples on cpu: loss ");
        const char *at = r.err ? strstr(r.err, head) : NULL;
        char tail[900];
        snprintf(tail, sizeof tail, "; logits in %s\n", out);
        CHECK(r.status == 0 && at && strlen(at) > strlen(tail) && !strcmp(at + strlen(at) - strlen(tail), tail),
              "--threads %s: exit %d: %s", threads[t], r.status, r.err ? r.err : "");
        tg_cli_run_free(&r);
        char *text = tg_test_read_file(out, NULL);
        int lines = 0;
        for (const char *c = text; c && *c; c++) lines += *c == '\n';
        CHECK(lines == 2, "--threads %s: %d lines in %s", threads[t], lines, out);
        free(text);
        snprintf(line, sizeof line, "%s/other.jsonl", dir);
        CHECK(tg_test_read_file(line, NULL) == NULL, "the first -o was written");
    }
    /* a model without weights of its own, and no --weights: refused after the words */
    snprintf(line, sizeof line, "predict " J " -o %s --data %s", out, data);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 1 && r.err &&
              !strcmp(r.err, "tunegraph: " J ": the model (tiny-bert) has no weights of its own: give --weights "
                             "FILE.safetensors (or --init-missing to predict with its initial values)\n"),
          "no weights: exit %d: %s", r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
}
