/* tunegraph export, predict and run --save-dir on the command line (cli/export.c): a table
 * of argument lists each refused with its exit status (2: usage, 1: the work failed) and the
 * message naming the option, value or file; an export in bf16 read back; a prediction of the
 * tiny GPT-2 (logits per token, perplexity) on a few examples; a logits file that cannot be
 * written; weights that lack most of the model, listed up to the message's length. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "models/safetensors.h"
#include "runtime/executor.h"
#include "tests/harness.h"

static int sh(const char *cmd) {
    int st = system(cmd);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Runs the CLI with `args` (stderr to a file in dir); returns its status, *said its stderr. */
static int cli(const char *dir, const char *args, char **said) {
    char cmd[8192], path[700];
    snprintf(path, sizeof path, "%s/stderr.txt", dir);
    snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>%s", tg_test_cli(), args, path);
    const int rc = sh(cmd);
    *said = tg_test_read_file(path, NULL);
    return rc;
}

typedef struct cli_case {
    const char *args; /* {dir}: the test's folder; {weights}: the weights */
    int rc;
    const char *want;
} cli_case;

static const char k_job[] = "examples/demo-classify.job";

static const cli_case k_cases[] = {
    /* export's arguments */
    {"export", 2, "missing plan or job file"},
    {"export examples/demo-classify.job other.job", 2, "unexpected argument other.job"},
    {"export examples/demo-classify.job --bogus", 2, "unknown option --bogus"},
    {"export examples/demo-classify.job --device cpu -o {dir}/o --weights {weights}", 2, "unknown option --device"},
    {"export examples/demo-classify.job -o", 2, "-o needs a value"},
    {"export examples/demo-classify.job --weights {weights}", 2, "-o OUTDIR is required"},
    {"export examples/demo-classify.job -o {dir}/o", 2, "--weights FILE.safetensors is required"},
    {"export examples/demo-classify.job -o {dir}/o --weights {weights} --dtype fp16", 2,
     "--dtype must be fp32 or bf16, got 'fp16'"},
    {"export examples/demo-classify.job -o {dir}/o --weights {weights} --set steps", 2, "--set needs key=value, got 'steps'"},
    {"export - -o {dir}/o --weights {weights}", 1, "-: cannot open job file"},
    {"export {dir}/p.tgplan --set bogus=1 -o {dir}/o --weights {weights}", 1, "--set bogus=1: key 'bogus': unknown key"},
    {"export examples/demo-classify.job -o {dir}/o --weights {weights} --dtype fp32 --labels a,b,c", 1,
     "labels: 3 names for a plan of num_labels 2"},
    {"export examples/demo-classify.job -o {dir}/o --weights {dir}/none.safetensors", 1, "none.safetensors: cannot open"},
    {"export examples/demo-classify.job -o {dir}/o --weights {dir}/head.safetensors", 1,
     "head.safetensors: lacks 39 of the plan's parameters, which an export needs: ['bert.embeddings.LayerNorm.bias', "},
    /* predict's arguments */
    {"predict examples/demo-classify.job --weights {weights}", 2, "-o LOGITS.jsonl is required"},
    {"predict examples/demo-classify.job -o {dir}/l.jsonl --device tpu", 2, "--device must be cpu or cuda, got 'tpu'"},
    {"predict examples/demo-classify.job -o {dir}/l.jsonl --threads abc", 2,
     "--threads needs a whole number from 0 to 1024 (0: one per core), got 'abc'"},
    {"predict examples/demo-classify.job -o {dir}/l.jsonl --threads -1", 2, "got '-1'"},
    {"predict examples/demo-classify.job -o {dir}/l.jsonl --threads 1025", 2, "got '1025'"},
    {"predict examples/demo-classify.job -o {dir}/l.jsonl --threads 12x", 2, "got '12x'"},
    /* decimal digits only: no other base's digits, no hexadecimal prefix */
    {"predict examples/demo-classify.job -o {dir}/l.jsonl --threads 1a", 2, "got '1a'"},
    {"predict examples/demo-classify.job -o {dir}/l.jsonl --threads 0x10", 2, "got '0x10'"},
    {"predict examples/demo-classify.job -o {dir}/l.jsonl --threads 99999999999999999999", 2,
     "got '99999999999999999999'"},
    {"predict examples/demo-classify.job -o {dir}/l.jsonl --force", 2, "unknown option --force"},
    {"predict examples/demo-classify.job -o {dir}/l.jsonl --data ''", 1, "key 'eval_data': value is empty"},
    {"predict examples/demo-classify.job -o {dir}/l.jsonl --set data_parallel=2", 1,
     "examples/demo-classify.job: predict runs one replica; compile the job with data_parallel = 1"},
    {"predict {dir}/no-eval.job -o {dir}/l.jsonl --init-missing", 1,
     "no-eval.job: no examples to predict: give --data FILE.jsonl or set eval_data"},
    {"predict examples/demo-classify.job -o {dir}/l.jsonl", 1,
     "examples/demo-classify.job: the model (tiny-bert) has no weights of its own: give --weights FILE.safetensors "
     "(or --init-missing to predict with its initial values)"},
    {"predict examples/demo-classify.job -o examples/demo-classify.job --init-missing", 1,
     "would overwrite the job file examples/demo-classify.job"},
    {"predict examples/demo-classify.job -o {dir}/l.jsonl --device cuda --weights {weights}", 1,
     "this build has no CUDA executor"},
    {"predict examples/demo-classify.job -o {dir}/l.jsonl --weights {dir}/head.safetensors", 1,
     "lacks 39 of the plan's parameters, which a prediction needs: ['bert.embeddings.LayerNorm.bias', "},
    {"predict examples/demo-classify.job -o /proc/tunegraph-logits.jsonl --init-missing", 1,
     "tunegraph: /proc/tunegraph-logits.jsonl: cannot create the logits file: No such file or directory"},
    {"predict examples/demo-classify.job -o /dev/full --weights {weights}", 1,
     "cannot write the logits file: No space left on device"},
    {"predict {dir}/p.tgplan -o {dir}/l.jsonl --set bogus=2", 1, "key 'bogus': unknown key"},
    {"predict examples/demo-classify.job -o {dir}/l.jsonl --threads", 2, "--threads needs a value"},
    /* run --save-dir's arguments */
    {"run examples/demo-classify.job --save-dir", 2, "--save-dir needs a value"},
    {"run examples/demo-classify.job --tokenizer examples", 2,
     "--labels, --tokenizer, --dtype and --force go with --save-dir"},
    {"run examples/demo-classify.job --dtype bf16", 2, "--labels, --tokenizer, --dtype and --force go with --save-dir"},
    {"run examples/demo-classify.job --force", 2, "--labels, --tokenizer, --dtype and --force go with --save-dir"},
    {"run examples/demo-classify.job --save-dir {dir}/s --dtype fp8", 2, "--dtype must be fp32 or bf16, got 'fp8'"},
    {"run examples/demo-classify.job --save-dir {dir}/s --set", 2, "--set needs a value"},
    {"run examples/demo-classify.job --save-dir {dir}/s --labels a,b,c", 1, "labels: 3 names for a plan of num_labels 2"},
    /* checked at the start, refused at the end by the folder it would be made in */
    {"run examples/demo-classify.job --set steps=1 --save-dir /proc/tunegraph-export", 1,
     "/proc/.tunegraph-export.tmp."},
};

/* The weights of a 1-step run (evaluated on 4 examples), a plan file, a job without eval
 * data, and a checkpoint of the classifier head alone. */
static int setup(const char *dir, char *weights, size_t cap) {
    snprintf(weights, cap, "%s/w.safetensors", dir);
    char cmd[4096], cwd[PATH_MAX];
    if (!CHECK(getcwd(cwd, sizeof cwd) != NULL, "getcwd")) return 0;
    snprintf(cmd, sizeof cmd,
             "head -n 4 examples/data/sentiment-eval.jsonl >%s/four.jsonl && "
             "%s run %s --set steps=1 --set eval_data=%s/four.jsonl --save %s >/dev/null 2>&1 && "
             "%s compile %s -o %s/p.tgplan >/dev/null 2>&1",
             dir, tg_test_cli(), k_job, dir, weights, tg_test_cli(), k_job, dir);
    if (!CHECK(sh(cmd) == 0, "setup failed: %s", cmd)) return 0;
    char job[800], text[1200];
    snprintf(job, sizeof job, "%s/no-eval.job", dir);
    snprintf(text, sizeof text, "model = tiny-bert\ntask = classify\nnum_labels = 2\nbatch = 2\nseq = 16\nsteps = 1\n"
                                "train_data = %s/examples/data/sentiment-train.jsonl\n", cwd);
    if (!CHECK(tg_test_write_file(job, text) == 0, "job")) return 0;
    tg_safetensors st;
    tg_err err;
    if (!CHECK(tg_st_open(weights, &st, &err) == 0, "%s", err.msg)) return 0;
    const tg_st_entry *w = tg_st_find(&st, "classifier.weight"), *b = tg_st_find(&st, "classifier.bias");
    int ok = w && b;
    if (ok) {
        const tg_st_item items[] = {{w->name, TG_ST_F32, w->ndim, w->shape, st.data + w->begin},
                                    {b->name, TG_ST_F32, b->ndim, b->shape, st.data + b->begin}};
        char head[800];
        snprintf(head, sizeof head, "%s/head.safetensors", dir);
        ok = tg_st_write(head, items, 2, &err) == 0;
    }
    tg_st_close(&st);
    return CHECK(ok, "head checkpoint");
}

/* tmpl with {dir} and {weights} replaced (positional printf arguments would do, but a
 * fortified printf refuses a format that skips one). */
static void expand(const char *tmpl, const char *dir, const char *weights, char *out, size_t cap) {
    size_t n = 0;
    for (const char *p = tmpl; *p && n + 1 < cap;) {
        const char *with = !strncmp(p, "{dir}", 5) ? dir : !strncmp(p, "{weights}", 9) ? weights : NULL;
        if (with) {
            n += (size_t)snprintf(out + n, cap - n, "%s", with);
            p += with == dir ? 5 : 9;
        } else {
            out[n++] = *p++;
        }
    }
    out[n < cap ? n : cap - 1] = 0;
}

TG_TEST(test_cli_export_predict_refused_args) {
    const char *dir = tg_test_tmpdir();
    char weights[700];
    if (!setup(dir, weights, sizeof weights)) return;
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        char args[2048];
        /* A CUDA build runs a prediction there rather than refuse it. */
        if (tg_cuda_built() && strstr(k_cases[i].args, "--device cuda")) continue;
        expand(k_cases[i].args, dir, weights, args, sizeof args);
        char *said = NULL;
        const int rc = cli(dir, args, &said);
        CHECK(rc == k_cases[i].rc && said && strstr(said, k_cases[i].want), "%s: exit %d (want %d), said '%.400s'",
              args, rc, k_cases[i].rc, said ? said : "(nothing)");
        free(said);
        said = NULL;
    }
    /* 65 --set options: one more than export takes */
    char args[4096];
    size_t len = (size_t)snprintf(args, sizeof args, "export %s -o %s/o --weights %s", k_job, dir, weights);
    for (int i = 0; i < 65; i++) len += (size_t)snprintf(args + len, sizeof args - len, " --set seed=%d", i);
    char *said = NULL;
    CHECK(cli(dir, args, &said) == 2 && said && strstr(said, "too many --set options (64 at most)"), "65 sets: %s",
          said ? said : "(nothing)");
    free(said);
    said = NULL;
    CHECK(access("-", F_OK) != 0, "a file named '-' appeared");

    /* weights that lack most parameters: the list is cut at the message's room */
    snprintf(args, sizeof args, "export %s -o %s/o --weights %s/head.safetensors", k_job, dir, dir);
    said = NULL;
    REQUIRE(cli(dir, args, &said) == 1 && said, "export of the head alone");
    const char *list = strstr(said, ": ['");
    CHECK(list && strstr(said, "'bert.encoder.layer.0.") && !strstr(said, "classifier.") && said[strlen(said) - 1] == '\n',
          "said '%s'", said);
    free(said);
    said = NULL;

    /* an export in bf16, read back; a prediction of the tiny GPT-2 on three examples with
     * its initial values and two threads: one line per example, logits per token, a
     * perplexity */
    char path[800];
    snprintf(args, sizeof args, "export %s -o %s/o --weights %s --dtype bf16 --labels neg,pos --force", k_job, dir,
             weights);
    REQUIRE(cli(dir, args, &said) == 0 && said, "export: %s", said ? said : "(nothing)");
    CHECK(strstr(said, "/o: BertForSequenceClassification, 41 tensors (bf16)\n"), "export said: %s", said);
    free(said);
    said = NULL;
    snprintf(path, sizeof path, "%s/o/model.safetensors", dir);
    tg_safetensors st;
    tg_err err;
    REQUIRE(tg_st_open(path, &st, &err) == 0, "%s", err.msg);
    const tg_st_entry *e = tg_st_find(&st, "classifier.weight");
    CHECK(e && e->dtype == TG_ST_BF16 && st.n == 41, "export dtype %s, %d tensors", e ? tg_st_dtype_name(e->dtype) : "-",
          st.n);
    tg_st_close(&st);

    /* a classifier of weights and biases near float's largest: logits past its range are
     * written as null */
    REQUIRE(tg_st_open(weights, &st, &err) == 0, "%s", err.msg);
    static tg_st_item all[64];
    static float huge[4096];
    for (int i = 0; i < 4096; i++) huge[i] = 3e38f;
    int n = 0;
    for (int i = 0; i < st.n && n < 64; i++) {
        const tg_st_entry *e = &st.entries[i];
        const int big = !strncmp(e->name, "classifier.", 11) && tg_st_numel(e) <= 4096;
        all[n++] = (tg_st_item){e->name, e->dtype, e->ndim, e->shape, big ? (const void *)huge : st.data + e->begin};
    }
    snprintf(path, sizeof path, "%s/huge.safetensors", dir);
    const int wrote = tg_st_write(path, all, n, &err);
    tg_st_close(&st);
    REQUIRE(wrote == 0, "%s", err.msg);
    snprintf(args, sizeof args, "predict %s -o %s/inf.jsonl --data %s/four.jsonl --weights %s", k_job, dir, dir, path);
    REQUIRE(cli(dir, args, &said) == 0, "huge predict: %s", said ? said : "(nothing)");
    free(said);
    said = NULL;
    snprintf(path, sizeof path, "%s/inf.jsonl", dir);
    char *inf = tg_test_read_file(path, NULL);
    CHECK(inf && strstr(inf, "\"logits\": [null, null]") && !strstr(inf, "inf"), "logits: %.300s", inf ? inf : "(none)");
    free(inf);

    /* pairs with token types: each line gives them back */
    snprintf(path, sizeof path, "%s/pairs.jsonl", dir);
    REQUIRE(tg_test_write_file(path, "{\"input_ids\": [2, 10, 3, 11, 3], \"token_type_ids\": [0, 0, 0, 1, 1], "
                                     "\"label\": 1}\n") == 0,
            "pairs");
    snprintf(args, sizeof args, "predict %s -o %s/pairs-logits.jsonl --data %s --weights %s --device cpu", k_job, dir, path, weights);
    REQUIRE(cli(dir, args, &said) == 0 && said, "pairs predict: %s", said ? said : "(nothing)");
    CHECK(strstr(said, "predicted 1 examples on cpu: loss ") && strstr(said, ", accuracy "), "said: %s", said);
    free(said);
    said = NULL;
    snprintf(path, sizeof path, "%s/pairs-logits.jsonl", dir);
    char *pairs = tg_test_read_file(path, NULL);
    CHECK(pairs && !strncmp(pairs, "{\"index\": 0, \"input_ids\": [2, 10, 3, 11, 3], \"token_type_ids\": [0, 0, 0, 1, 1], "
                                   "\"label\": 1, \"logits\": [", 103),
          "pairs logits: %s", pairs ? pairs : "(none)");
    free(pairs);

    snprintf(path, sizeof path, "%s/three.jsonl", dir);
    REQUIRE(tg_test_write_file(path, "{\"input_ids\": [1, 5, 9, 13]}\n{\"input_ids\": [2, 4]}\n"
                                     "{\"input_ids\": [7, 7, 7, 7, 7, 7]}\n") == 0,
            "data");
    snprintf(args, sizeof args, "predict examples/demo-lm.job -o %s/lm.jsonl --data %s --init-missing --threads 2 "
             "--device cpu", dir, path);
    REQUIRE(cli(dir, args, &said) == 0 && said, "lm predict: %s", said ? said : "(nothing)");
    CHECK(strstr(said, "predicted 3 examples on cpu: loss ") && strstr(said, ", perplexity ") &&
              !strstr(said, "accuracy"),
          "predict said: %s", said);
    free(said);
    said = NULL;
    snprintf(path, sizeof path, "%s/lm.jsonl", dir);
    char *text = tg_test_read_file(path, NULL);
    REQUIRE(text, "logits");
    int lines = 0;
    for (char *c = text; *c; c++) lines += *c == '\n';
    CHECK(lines == 3 && !strncmp(text, "{\"index\": 0, \"input_ids\": [1, 5, 9, 13], \"logits\": [[", 52) &&
              !strstr(text, "token_type_ids") && !strstr(text, "\"label\""),
          "lm logits: %.200s", text);
    /* the second line: 2 tokens, each a row of the 128-token vocabulary (127 commas), and 3
     * commas between its fields */
    const char *second = strstr(text, "{\"index\": 1, \"input_ids\": [2, 4], \"logits\": [[");
    int rows = 0, commas = 0;
    for (const char *c = second; c && *c && *c != '\n'; c++) rows += *c == '[', commas += *c == ',';
    CHECK(second && rows == 4 && commas == 3 + 2 * 127 + 1, "second line: %d brackets, %d commas", rows, commas);
    free(text);
}

/* run --save-dir with every export option: the folder holds the tokenizer file, in bf16. */
TG_TEST(test_cli_run_save_dir_options) {
    const char *dir = tg_test_tmpdir();
    char tok[800], args[2048], *said = NULL, path[800];
    snprintf(tok, sizeof tok, "%s/vocab.txt", dir);
    REQUIRE(tg_test_write_file(tok, "[PAD]\n[UNK]\n") == 0, "vocab");
    snprintf(args, sizeof args, "head -n 4 examples/data/sentiment-eval.jsonl >%s/four.jsonl", dir);
    REQUIRE(sh(args) == 0, "eval data");
    snprintf(args, sizeof args, "run %s --set steps=1 --set eval_data=%s/four.jsonl --metrics %s/m.jsonl --save-dir %s/s "
             "--tokenizer %s --dtype bf16 --labels neg,pos --force", k_job, dir, dir, dir, tok);
    REQUIRE(cli(dir, args, &said) == 0, "run: %s", said ? said : "(nothing)");
    free(said);
    said = NULL;
    snprintf(path, sizeof path, "%s/s/vocab.txt", dir);
    char *text = tg_test_read_file(path, NULL);
    CHECK(text && !strcmp(text, "[PAD]\n[UNK]\n"), "tokenizer in the folder: %s", text ? text : "(none)");
    free(text);
    snprintf(path, sizeof path, "%s/s/model.safetensors", dir);
    tg_safetensors st;
    tg_err err;
    REQUIRE(tg_st_open(path, &st, &err) == 0, "%s", err.msg);
    const tg_st_entry *e = tg_st_find(&st, "bert.pooler.dense.weight");
    CHECK(e && e->dtype == TG_ST_BF16, "dtype %s", e ? tg_st_dtype_name(e->dtype) : "-");
    tg_st_close(&st);
    snprintf(path, sizeof path, "%s/s/config.json", dir);
    text = tg_test_read_file(path, NULL);
    CHECK(text && strstr(text, "\"neg\": 0"), "config: %.200s", text ? text : "(none)");
    free(text);
}
