/* The CLI's own allocations failed (base/alloc.h's hook), in this process
 * (tests/cli_in_process.h): data convert and tokenize with each allocation failed in turn
 * end with exit 1 and one line naming the shortage (or ENOMEM's text, where a file's
 * stream could not be had), leaving no set behind; export's and
 * run's label list and predict's --data setting, failed alone, end with exit 1 and
 * "tunegraph: out of memory", writing nothing. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "cli/export.h"
#include "tests/cli_in_process.h"
#include "tests/harness.h"

static int one_line(const char *s) { return s && strchr(s, '\n') == s + strlen(s) - 1; }

TG_TEST(test_cli_data_convert_each_allocation_fails) {
    const char *dir = tg_test_tmpdir();
    char path[800], line[2048], set[800];
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    REQUIRE(tg_test_write_file(path, "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n") == 0, "vocab");
    snprintf(path, sizeof path, "%s/rows.csv", dir);
    REQUIRE(tg_test_write_file(path, "text,label\nhello world,a\nworld,b\n") == 0, "rows");
    snprintf(set, sizeof set, "%s/set", dir);
    snprintf(line, sizeof line, "data convert %s/rows.csv -o %s --tokenizer %s/vocab.txt --seq 8", dir, set, dir);
    int failures = 0, names = 0, command = 0, done = 0;
    for (long k = 0; k < 20000 && !done; k++) {
        tg_alloc_fail_after(k);
        tg_cli_run r = tg_test_cli_line(dir, line, NULL);
        tg_alloc_fail_after(-1);
        struct stat st;
        if (r.status == 0) {
            done = 1;
            char want[1000];
            snprintf(want, sizeof want, "tunegraph: wrote %s: classify with 2 labels, 2 train records (7 tokens) from 2 rows\n",
                     set);
            CHECK(r.err && !strcmp(r.err, want), "allocation %ld: said '%s'", k, r.err ? r.err : "(nothing)");
        } else {
            failures++;
            names += r.err && !strcmp(r.err, "tunegraph: out of memory for the input names\n");
            command += r.err && !strcmp(r.err, "tunegraph: out of memory for the command line\n");
            CHECK(r.status == 1 && one_line(r.err) && !strncmp(r.err, "tunegraph: ", 11) &&
                      (strstr(r.err, "out of memory") || strstr(r.err, ": Cannot allocate memory\n")),
                  "allocation %ld: exit %d, said '%s'", k, r.status, r.err ? r.err : "(nothing)");
            CHECK(stat(set, &st) != 0, "allocation %ld: a failed convert left %s", k, set);
        }
        tg_cli_run_free(&r);
    }
    CHECK(done && failures > 10, "%d failures, done %d", failures, done);
    CHECK(names == 1 && command == 1, "the input names failed %d times, the command line %d times (want 1 and 1)", names,
          command);
}

/* `tunegraph tokenize ARGS` with stdin the file `in`. */
static tg_cli_run tokenize_from(const char *dir, const char *args, const char *in) {
    char line[2048];
    snprintf(line, sizeof line, "tokenize %s", args);
    fflush(stdin);
    int saved = dup(STDIN_FILENO), fd = open(in, O_RDONLY);
    if (saved < 0 || fd < 0) return (tg_cli_run){-1, NULL, NULL};
    dup2(fd, STDIN_FILENO);
    close(fd);
    fseek(stdin, 0, SEEK_SET); /* drops what an earlier run left in the stream's buffer */
    clearerr(stdin);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    dup2(saved, STDIN_FILENO);
    close(saved);
    clearerr(stdin);
    return r;
}

TG_TEST(test_cli_tokenize_each_allocation_fails) {
    const char *dir = tg_test_tmpdir();
    char vocab[800], in[800], args[1024];
    snprintf(vocab, sizeof vocab, "%s/vocab.txt", dir);
    snprintf(in, sizeof in, "%s/in.txt", dir);
    REQUIRE(tg_test_write_file(vocab, "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n") == 0, "vocab");
    REQUIRE(tg_test_write_file(in, "hello world\tworld\nworld\thello x\n") == 0, "input");
    snprintf(args, sizeof args, "--tokenizer %s --pair --offsets", vocab);
    static const char want[] = "2:- 5:0-5 6:6-11 3:- 6:0-5 3:-\n2:- 6:0-5 3:- 5:0-5 1:6-7 3:-\n";
    int failures = 0, buffer = 0, done = 0;
    for (long k = 0; k < 20000 && !done; k++) {
        tg_alloc_fail_after(k);
        tg_cli_run r = tokenize_from(dir, args, in);
        tg_alloc_fail_after(-1);
        if (r.status == 0) {
            done = 1;
            CHECK(r.out && !strcmp(r.out, want) && r.err && !r.err[0], "allocation %ld: stdout '%s', said '%s'", k,
                  r.out ? r.out : "(none)", r.err ? r.err : "(nothing)");
        } else {
            failures++;
            buffer += r.err && !strcmp(r.err, "tunegraph tokenize: out of memory\n");
            CHECK(r.status == 1 && one_line(r.err) && !strncmp(r.err, "tunegraph tokenize: ", 20) &&
                      strstr(r.err, "out of memory"),
                  "allocation %ld: exit %d, said '%s'", k, r.status, r.err ? r.err : "(nothing)");
            /* lines before the failing one are written whole */
            CHECK(r.out && (!r.out[0] || !strncmp(r.out, want, strlen(r.out))), "allocation %ld: stdout '%s'", k,
                  r.out ? r.out : "(none)");
        }
        tg_cli_run_free(&r);
    }
    CHECK(done && failures > 5 && buffer == 1, "%d failures (%d of the output buffer), done %d", failures, buffer, done);
}

/* The first allocation of `line` (from index `from`) whose failure alone makes the command
 * say exactly "tunegraph: out of memory\n"; -1 when none up to `upto` does. Each run
 * must fail with exit 1 and one line, or succeed. */
static long exact_out_of_memory(const char *dir, const char *line, long from, long upto, const char *output) {
    for (long k = from; k < upto; k++) {
        tg_alloc_fail_only(k);
        tg_cli_run r = tg_test_cli_line(dir, line, NULL);
        tg_alloc_fail_after(-1);
        const int exact = r.status == 1 && r.err && !strcmp(r.err, "tunegraph: out of memory\n");
        CHECK(r.status == 0 || (r.status == 1 && one_line(r.err)), "%s, allocation %ld: exit %d, said '%s'", line, k,
              r.status, r.err ? r.err : "(nothing)");
        struct stat st;
        if (r.status) CHECK(stat(output, &st) != 0, "%s, allocation %ld: a failed command left %s", line, k, output);
        tg_cli_run_free(&r);
        remove(output);
        if (exact) return k;
    }
    return -1;
}

TG_TEST(test_cli_export_labels_and_data_out_of_memory) {
    const char *dir = tg_test_tmpdir();
    char line[2048], out[800], weights[800];
    REQUIRE(tg_test_cli_demo_weights(dir, "", weights, sizeof weights), "the demo's weights");
    tg_cli_run r = {0};

    /* export: the label list after the plan is read */
    snprintf(out, sizeof out, "%s/hf", dir);
    snprintf(line, sizeof line, "export %s/p.tgp --weights %s -o %s --labels neg,pos", dir, weights, out);
    CHECK(exact_out_of_memory(dir, line, 0, 400, out) >= 0, "%s: no allocation failed as the label list", line);
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 0 && r.err && strstr(r.err, "/hf: BertForSequenceClassification, 41 tensors (fp32)\n"),
          "export: exit %d, said '%s'", r.status, r.err ? r.err : "(nothing)");
    tg_cli_run_free(&r);

    /* predict: the eval_data setting that --data makes */
    snprintf(out, sizeof out, "%s/logits.jsonl", dir);
    snprintf(line, sizeof line, "predict %s/p.tgp --weights %s -o %s --data examples/data/sentiment-eval.jsonl", dir,
             weights, out);
    CHECK(exact_out_of_memory(dir, line, 0, 400, out) >= 0, "%s: no allocation failed as the --data setting", line);

    /* run's own split of --labels */
    char *argv[] = {"p.tgp", "--save-dir", "d", "--labels", "a,b", NULL};
    int argc = 5;
    run_export ex;
    char err_path[800];
    snprintf(err_path, sizeof err_path, "%s/labels-err.txt", dir);
    fflush(stderr);
    int saved = dup(STDERR_FILENO), fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(saved >= 0 && fd >= 0, "%s", err_path);
    dup2(fd, STDERR_FILENO);
    close(fd);
    tg_alloc_fail_after(0);
    const int rc = run_export_args(&argc, argv, &ex);
    tg_alloc_fail_after(-1);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    char *said = tg_test_read_file(err_path, NULL);
    CHECK(rc == 1 && ex.labels == NULL && said && !strcmp(said, "tunegraph: out of memory\n"), "run --labels: %d, said '%s'",
          rc, said ? said : "(nothing)");
    free(said);
    run_export_free(&ex);
}
