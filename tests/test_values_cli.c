/* The CLI's reported numbers against values known from the run itself: each field of the
 * metrics file of a short CPU run of the demo job (cli/main.c, cli/metrics.c), and the
 * profile table of `run --profile` (cli/profile.c). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "plan/plan_file.h"
#include "tests/harness.h"

enum { MAX_STEPS = 64 };

typedef struct step_row {
    long step, seq;
    double loss, lr, step_ms, tokens_per_s, grad_norm;
} step_row;

typedef struct run_lines {
    int n_steps;
    step_row steps[MAX_STEPS];
    json_t *summary; /* owned */
    json_t *profile_kinds, *profile_ops; /* arrays, owned */
} run_lines;

static void run_lines_free(run_lines *r) {
    json_decref(r->summary);
    json_decref(r->profile_kinds);
    json_decref(r->profile_ops);
}

/* Reads a metrics file: step lines, the summary, the profile's lines. */
static int read_metrics(const char *path, run_lines *r) {
    memset(r, 0, sizeof *r);
    r->profile_kinds = json_array(), r->profile_ops = json_array();
    FILE *f = fopen(path, "r");
    if (!CHECK(f, "no metrics file %s", path)) return 0;
    char line[8192];
    int ok = 1;
    while (ok && fgets(line, sizeof line, f)) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        if (!(ok = CHECK(o, "metrics line is not JSON: %s", line))) break;
        if (json_object_get(o, "summary")) {
            json_decref(r->summary);
            r->summary = o;
        } else if (json_object_get(o, "profile_op")) {
            json_array_append_new(r->profile_kinds, o);
        } else if (json_object_get(o, "profile_op_index")) {
            json_array_append_new(r->profile_ops, o);
        } else if (json_object_get(o, "step") && (ok = CHECK(r->n_steps < MAX_STEPS, "too many step lines"))) {
            step_row *s = &r->steps[r->n_steps++];
            s->step = (long)json_integer_value(json_object_get(o, "step"));
            s->seq = (long)json_integer_value(json_object_get(o, "seq"));
            s->loss = json_number_value(json_object_get(o, "loss"));
            s->lr = json_number_value(json_object_get(o, "lr"));
            s->step_ms = json_number_value(json_object_get(o, "step_ms"));
            s->tokens_per_s = json_number_value(json_object_get(o, "tokens_per_s"));
            s->grad_norm = json_number_value(json_object_get(o, "grad_norm"));
            json_decref(o);
        } else {
            json_decref(o);
        }
    }
    fclose(f);
    return ok && CHECK(r->summary, "no summary line in %s", path);
}

static double num(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    CHECK(json_is_number(v), "summary field %s missing or not a number", key);
    return json_number_value(v);
}

/* The real tokens of a JSONL set's rows truncated to seq, and the rows. */
static int data_tokens(const char *path, int seq, long long *tokens, int *rows) {
    FILE *f = fopen(path, "r");
    if (!CHECK(f, "cannot read %s", path)) return 0;
    char line[16384];
    *tokens = 0, *rows = 0;
    while (fgets(line, sizeof line, f)) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        if (!CHECK(o && json_is_array(json_object_get(o, "input_ids")), "row %d of %s", *rows, path)) {
            json_decref(o);
            fclose(f);
            return 0;
        }
        long long n = (long long)json_array_size(json_object_get(o, "input_ids"));
        *tokens += n < seq ? n : seq;
        (*rows)++;
        json_decref(o);
    }
    fclose(f);
    return 1;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The console's "step k/N loss X" lines, in order. */
static int console_losses(const char *text, double *loss, int max) {
    int n = 0;
    for (const char *s = text; (s = strstr(s, "step ")) && n < max; s++) {
        int k, total;
        double l;
        if ((s == text || s[-1] == '\n') && sscanf(s, "step %d/%d loss %lf", &k, &total, &l) == 3) loss[n++] = l;
    }
    return n;
}

/* One epoch of the demo job over the demo's 400-row eval file (25 batches of 16, every row
 * once whatever the shuffle): the tokens and the padding are known from the data. */
TG_TEST(test_values_cli_metrics_fields) {
    const char *dir = tg_test_tmpdir();
    const char *data = "examples/data/sentiment-eval.jsonl";
    char cmd[2048], metrics[600], err_path[600];
    snprintf(metrics, sizeof metrics, "%s/m.jsonl", dir);
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", dir);
    snprintf(cmd, sizeof cmd,
             "%s run examples/demo-classify.job --set epochs=1 --set log_every=1 "
             "--set train_data=%s/%s --metrics %s >/dev/null 2>%s",
             tg_test_cli(), getenv("PWD") ? getenv("PWD") : ".", data, metrics, err_path);
    REQUIRE(system(cmd) == 0, "CLI run failed: %s", cmd);
    long long tokens = 0;
    int rows = 0;
    REQUIRE(data_tokens(data, 48, &tokens, &rows) && rows == 400, "%d rows in %s", rows, data);
    const int n = rows / 16;

    run_lines r;
    if (!read_metrics(metrics, &r)) {
        run_lines_free(&r);
        return;
    }
    json_t *s = r.summary;
    /* The step lines: 1..N, seq the plan's, the warmup's learning rates. */
    CHECK(r.n_steps == n, "%d step lines, want %d", r.n_steps, n);
    double tokens_from_steps = 0, times[MAX_STEPS];
    for (int i = 0; i < r.n_steps; i++) {
        step_row *st = &r.steps[i];
        CHECK(st->step == i + 1, "step line %d numbered %ld", i, st->step);
        CHECK(st->seq == 48, "step %ld: seq %ld, the plan's is 48", st->step, st->seq);
        CHECK(st->step_ms > 0 && st->tokens_per_s > 0 && isfinite(st->loss) && st->grad_norm > 0,
              "step %ld: step_ms %g tokens_per_s %g loss %g grad_norm %g", st->step, st->step_ms, st->tokens_per_s,
              st->loss, st->grad_norm);
        /* warmup_steps = 20, lr = 1e-3: step s (1-based) uses lr * (s - 1) / 20. */
        if (i < 20) CHECK(fabs(st->lr - 1e-3 * i / 20) < 1e-9, "step %ld: lr %.9g, warmup says %.9g", st->step, st->lr, 1e-3 * i / 20);
        tokens_from_steps += st->tokens_per_s * st->step_ms / 1e3;
        times[i] = st->step_ms;
    }
    CHECK(fabs(tokens_from_steps - (double)tokens) < 1e-3 * (double)tokens,
          "the step lines' tokens_per_s x step_ms add up to %.1f tokens, the data holds %lld", tokens_from_steps, tokens);

    /* The summary against the step lines and the data. */
    CHECK(json_integer_value(json_object_get(s, "steps")) == r.n_steps, "summary steps %lld, %d step lines",
          (long long)json_integer_value(json_object_get(s, "steps")), r.n_steps);
    CHECK(r.n_steps && fabs(num(s, "first_loss") - r.steps[0].loss) <= 1e-6 * fabs(r.steps[0].loss),
          "first_loss %.9g, step 1's loss %.9g", num(s, "first_loss"), r.steps[0].loss);
    CHECK(r.n_steps && fabs(num(s, "final_loss") - r.steps[r.n_steps - 1].loss) <= 1e-6 * fabs(r.steps[r.n_steps - 1].loss),
          "final_loss %.9g, the last step's loss %.9g", num(s, "final_loss"), r.steps[r.n_steps - 1].loss);
    double train_s = num(s, "train_s"), tps = num(s, "tokens_per_s");
    CHECK(train_s > 0 && num(s, "warmup_s") > 0, "train_s %g warmup_s %g", train_s, num(s, "warmup_s"));
    /* train_s is printed to the millisecond: tokens_per_s = tokens / train_s within that. */
    CHECK(tps >= tokens / (train_s + 0.0005) - 0.05 && tps <= tokens / (train_s - 0.0005) + 0.05,
          "tokens_per_s %.1f, tokens %lld / train_s %.3f = %.1f", tps, tokens, train_s, tokens / train_s);
    double steps_sum = 0;
    for (int i = 0; i < r.n_steps; i++) steps_sum += times[i];
    CHECK(train_s * 1e3 >= steps_sum - 1.0, "train_s %.3f s shorter than its steps' %.3f ms", train_s, steps_sum);
    double pad = num(s, "padding_fraction"), want_pad = 1.0 - (double)tokens / ((double)rows * 48);
    CHECK(pad >= 0 && pad < 1 && fabs(pad - want_pad) <= 5e-5, "padding_fraction %.4f, the data says %.6f", pad, want_pad);
    /* The median of the steps after the first (upper middle for an even count). */
    qsort(times + 1, (size_t)(r.n_steps - 1), sizeof *times, cmp_double);
    double median = times[1 + (r.n_steps - 1) / 2];
    CHECK(fabs(num(s, "median_step_ms") - median) <= 5e-5 + 1e-6 * median, "median_step_ms %.4f, the step lines' %.4f",
          num(s, "median_step_ms"), median);
    CHECK(num(s, "batch_wait_s") >= 0 && num(s, "batch_wait_share") >= 0 && num(s, "batch_wait_share") < 1,
          "batch_wait_s %g share %g", num(s, "batch_wait_s"), num(s, "batch_wait_share"));
    CHECK(num(s, "host_cpu_us_per_step") > 0 && num(s, "loop_cpu_us_per_step") > 0,
          "host_cpu_us_per_step %g loop_cpu_us_per_step %g", num(s, "host_cpu_us_per_step"),
          num(s, "loop_cpu_us_per_step"));
    CHECK(json_integer_value(json_object_get(s, "replicas")) == 1, "replicas");
    const char *device = json_string_value(json_object_get(s, "device"));
    CHECK(device && !strcmp(device, tg_test_device() ? "cuda" : "cpu"), "device %s", device ? device : "(none)");
    CHECK(num(s, "planned_peak_bytes") > 0 && num(s, "memory_estimate_bytes") >= num(s, "planned_peak_bytes"),
          "planned_peak_bytes %g memory_estimate_bytes %g", num(s, "planned_peak_bytes"), num(s, "memory_estimate_bytes"));

    /* The console says the same: its step losses, and the eval line's numbers. */
    char *console = tg_test_read_file(err_path, NULL);
    REQUIRE(console, "no console output");
    double losses[MAX_STEPS];
    int logged = console_losses(console, losses, MAX_STEPS);
    CHECK(logged == r.n_steps, "%d console step lines, %d metrics step lines", logged, r.n_steps);
    for (int i = 0; i < logged && i < r.n_steps; i++)
        CHECK(fabs(losses[i] - r.steps[i].loss) <= 5e-5, "step %d: console loss %.4f, metrics %.9g", i + 1, losses[i],
              r.steps[i].loss);
    const char *ev = strstr(console, "eval on ");
    int ev_n = 0;
    double ev_loss = NAN, ev_acc = NAN;
    CHECK(ev && sscanf(ev, "eval on %d examples: loss %lf, accuracy %lf", &ev_n, &ev_loss, &ev_acc) == 3,
          "eval line: %s", ev ? ev : "(none)");
    CHECK(json_integer_value(json_object_get(s, "eval_examples")) == ev_n && ev_n == 400, "eval_examples %lld, console %d",
          (long long)json_integer_value(json_object_get(s, "eval_examples")), ev_n);
    CHECK(fabs(num(s, "eval_loss") - ev_loss) <= 5e-5 && fabs(num(s, "eval_accuracy") - ev_acc) <= 5e-5,
          "eval_loss %.6g accuracy %.6g, console %.4f %.4f", num(s, "eval_loss"), num(s, "eval_accuracy"), ev_loss, ev_acc);
    /* The accuracy is a count of 400. */
    double correct = num(s, "eval_accuracy") * 400;
    CHECK(fabs(correct - round(correct)) < 1e-3, "eval_accuracy %.6g is not k/400", num(s, "eval_accuracy"));
    free(console);
    run_lines_free(&r);
}

/* ---- exit codes ---------------------------------------------------------------------- */

/* A command line run in dir: its exit status (-1 when it did not exit), stderr in dir/e.txt. */
static int cli_status(const char *dir, const char *args) {
    char cli[4096], cmd[8192];
    if (!realpath(tg_test_cli(), cli)) return -1;
    snprintf(cmd, sizeof cmd, "cd %s && %s %s >o.txt 2>e.txt </dev/null", dir, cli, args);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

typedef struct exit_case {
    const char *args;
    int want;          /* 2 usage, 1 a bad job, plan, data or file, 0 success */
    const char *says;  /* what stderr holds (NULL: nothing asked) */
} exit_case;

/* Every command's failure classes, in an order where each success makes what later rows
 * read (plan, weights, shard set). */
TG_TEST(test_values_cli_exit_codes) {
    const char *dir = tg_test_tmpdir();
    char path[1024], *demo = tg_test_read_file("examples/demo-classify.job", NULL);
    REQUIRE(demo, "no demo job");
    /* The demo job with its data paths made absolute. */
    char job[8192] = "", cwd[1024];
    REQUIRE(getcwd(cwd, sizeof cwd), "getcwd");
    for (char *s = demo, *at; *s; s = at + 5) {
        if (!(at = strstr(s, "data/"))) {
            strcat(job, s);
            break;
        }
        strncat(job, s, (size_t)(at - s));
        strcat(job, cwd), strcat(job, "/examples/data/");
    }
    free(demo);
    static const struct { const char *name, *text; } files[] = {
        {"good.job", NULL},
        {"bad.job", "model = tiny-bert\nbogus_key = 1\n"},
        {"bad.jsonl", "not json\n"},
        {"vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n,\n!\n"},
        {"in.jsonl", "{\"text\": \"hello world\", \"label\": 0}\n{\"text\": \"world hello !\", \"label\": 1}\n"},
        {"text.txt", "hello world\n"},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i].name);
        REQUIRE(tg_test_write_file(path, files[i].text ? files[i].text : job) == 0, "%s", files[i].name);
    }
    static const exit_case cases[] = {
        {"", 2, "usage:"},
        {"bogus", 2, "unknown command 'bogus'"},
        {"version", 0, NULL},
        {"version --bogus", 2, "version takes no arguments (got '--bogus')"},
        /* compile */
        {"compile", 2, "missing input file"},
        {"compile good.job --bogus", 2, "unknown option --bogus"},
        {"compile good.job --set", 2, "--set needs a value"},
        {"compile good.job --set lr", 2, "--set needs key=value"},
        {"compile missing.job", 1, "cannot open job file"},
        {"compile bad.job", 1, "key 'bogus_key': unknown key"},
        {"compile good.job --set lr=-1", 1, "lr"},
        {"compile good.job -o p.tgp", 0, NULL},
        {"compile good.job -o half.tgp", 0, NULL}, /* cut to half below */
        /* inspect */
        {"inspect", 2, "missing input file"},
        {"inspect p.tgp --bogus", 2, "unknown option --bogus"},
        {"inspect missing.tgp", 1, "missing.tgp"},
        {"inspect good.job", 1, "good.job"},
        {"inspect half.tgp", 1, "half.tgp"},
        {"inspect p.tgp", 0, NULL},
        {"inspect p.tgp --json", 0, NULL},
        /* run */
        {"run", 2, "missing input file"},
        {"run p.tgp --threads x", 2, "--threads needs a whole number"},
        {"run p.tgp --in-flight 99", 2, "--in-flight needs a whole number"},
        {"run p.tgp --device gpu", 2, "--device must be cpu or cuda"},
        {"run p.tgp extra", 2, "unexpected argument extra"},
        {"run missing.tgp", 1, "missing.tgp"},
        {"run half.tgp", 1, "half.tgp"},
        {"run bad.job", 1, "unknown key"},
        {"run p.tgp --set lr=0.1", 1, "recompile"},
        {"run good.job --set train_data=bad.jsonl", 1, "invalid JSON"},
        {"run p.tgp --set train_data=missing.jsonl", 1, "missing.jsonl"},
        {"run p.tgp --set steps=2 --save w.safetensors", 0, "eval on 400 examples"},
        /* predict */
        {"predict p.tgp", 2, "-o LOGITS.jsonl is required"},
        {"predict p.tgp -o l.jsonl --bogus", 2, "unknown option --bogus"},
        {"predict half.tgp -o l.jsonl --weights w.safetensors", 1, "half.tgp"},
        {"predict p.tgp -o l.jsonl --weights missing.safetensors", 1, "missing.safetensors"},
        {"predict p.tgp -o l.jsonl --data bad.jsonl --weights w.safetensors", 1, "invalid JSON"},
        {"predict p.tgp -o l.jsonl --weights w.safetensors", 0, "predicted 400 examples"},
        /* export */
        {"export p.tgp", 2, "-o OUTDIR is required"},
        {"export p.tgp -o ex --bogus", 2, "unknown option --bogus"},
        {"export p.tgp --weights missing.safetensors -o ex", 1, "missing.safetensors"},
        {"export half.tgp --weights w.safetensors -o ex", 1, "half.tgp"},
        {"export p.tgp --weights bad.jsonl -o ex", 1, "bad.jsonl"},
        {"export p.tgp --weights w.safetensors -o ex", 0, NULL},
        /* tokenize */
        {"tokenize", 2, "--tokenizer PATH is required"},
        {"tokenize --tokenizer vocab.txt --bogus", 2, NULL},
        {"tokenize --tokenizer missing.txt", 1, "missing.txt"},
        {"tokenize --tokenizer bad.jsonl", 1, "bad.jsonl"},
        {"tokenize --tokenizer vocab.txt", 0, NULL},
        /* data convert */
        {"data", 2, NULL},
        {"data bogus", 2, "unknown data subcommand 'bogus'"},
        {"data convert", 2, "missing INPUT"},
        {"data convert in.jsonl -o set --tokenizer vocab.txt --bogus", 2, NULL},
        {"data convert in.jsonl -o set --tokenizer missing.txt", 1, "missing.txt"},
        {"data convert bad.jsonl -o set --tokenizer vocab.txt", 1, "invalid JSON"},
        {"data convert missing.jsonl -o set --tokenizer vocab.txt", 1, "missing.jsonl"},
        {"data convert in.jsonl -o set --tokenizer vocab.txt", 0, "wrote set"},
        /* data dump */
        {"data dump", 2, "missing SET"},
        {"data dump set --bogus", 2, NULL},
        {"data dump missing", 1, "missing"},
        {"data dump bad.jsonl", 1, "bad.jsonl"},
        {"data dump set -o d.jsonl", 0, "dumped 2 records"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const exit_case *c = &cases[i];
        int got = cli_status(dir, c->args);
        snprintf(path, sizeof path, "%s/e.txt", dir);
        char *err = tg_test_read_file(path, NULL);
        CHECK(got == c->want, "tunegraph %s: exit %d, want %d: %s", c->args, got, c->want, err ? err : "");
        if (c->says) CHECK(err && strstr(err, c->says), "tunegraph %s: stderr lacks '%s': %s", c->args, c->says, err ? err : "");
        free(err);
        if (!strcmp(c->args, "compile good.job -o half.tgp")) { /* a plan cut to half its length */
            snprintf(path, sizeof path, "%s/half.tgp", dir);
            long len = 0;
            char *plan = tg_test_read_file(path, &len);
            FILE *f = plan ? fopen(path, "wb") : NULL;
            REQUIRE(f && fwrite(plan, 1, (size_t)len / 2, f) == (size_t)len / 2 && fclose(f) == 0, "cut %s", path);
            free(plan);
        }
    }
}

/* A run ended by SIGTERM or SIGINT (no checkpoint asked for) ends by that signal, not as a
 * success or a failure code, and leaves its outputs as they were: no metrics file, no
 * temporary file beside it (cli/main.c's on_ending_signal). */
static void run_killed_by(int sig) {
    const char *dir = tg_test_tmpdir();
    char cli[4096], err_path[1024], metrics[1024];
    REQUIRE(realpath(tg_test_cli(), cli), "no CLI");
    snprintf(err_path, sizeof err_path, "%s/e.txt", dir);
    snprintf(metrics, sizeof metrics, "%s/m.jsonl", dir);
    pid_t pid = fork();
    REQUIRE(pid >= 0, "fork");
    if (pid == 0) {
        if (!freopen(err_path, "w", stderr) || !freopen("/dev/null", "w", stdout)) _exit(127);
        execl(cli, cli, "run", "examples/demo-classify.job", "--set", "steps=100000", "--set", "log_every=1",
              "--metrics", metrics, (char *)NULL);
        _exit(127);
    }
    /* Waits for the first step line (the handler is set by then), 20 s at most. */
    int started = 0;
    for (int i = 0; i < 2000 && !started; i++) {
        char *text = tg_test_read_file(err_path, NULL);
        started = text && strstr(text, "step 1/");
        free(text);
        if (!started) usleep(10000);
    }
    kill(pid, started ? sig : SIGKILL);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid, "waitpid");
    REQUIRE(started, "the run printed no step");
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == sig, "%s: status %#x, want the signal", strsignal(sig), status);
    CHECK(access(metrics, F_OK) != 0 && tg_test_count_files(dir) == 1, "%s: %d files in %s, want e.txt alone",
          strsignal(sig), tg_test_count_files(dir), dir);
}

TG_TEST(test_values_cli_run_killed_sigterm) { run_killed_by(SIGTERM); }
TG_TEST(test_values_cli_run_killed_sigint) { run_killed_by(SIGINT); }

/* ---- run --profile ---------------------------------------------------------------------- */

static int kind_named(const char *name) {
    for (int k = 0; k < TG_OP_COUNT; k++)
        if (!strcmp(tg_op_name(k), name)) return k;
    return -1;
}

/* `tunegraph run --profile` on the demo job: the console's table and the metrics' profile
 * lines count each op kind as the plan holds it, every op once in order, their times add
 * up, and the slowest ops are the slowest of the per-op lines. */
TG_TEST(test_values_cli_profile) {
    const char *dir = tg_test_tmpdir();
    tg_job job;
    tg_plan plan;
    tg_err err = {{0}};
    REQUIRE(tg_job_load("examples/demo-classify.job", NULL, 0, &job, &err) == 0, "%s", err.msg);
    REQUIRE(tg_compile(&job, &plan, &err) == 0, "%s", err.msg);
    int plan_n[TG_OP_COUNT] = {0};
    for (int o = 0; o < plan.n_ops; o++) plan_n[plan.ops[o].kind]++;

    char cmd[2048], metrics[600], err_path[600];
    snprintf(metrics, sizeof metrics, "%s/m.jsonl", dir);
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", dir);
    snprintf(cmd, sizeof cmd, "%s run examples/demo-classify.job --set steps=3 --profile --metrics %s >/dev/null 2>%s",
             tg_test_cli(), metrics, err_path);
    if (!CHECK(system(cmd) == 0, "CLI run failed: %s", cmd)) {
        tg_plan_free(&plan);
        return;
    }
    run_lines r;
    char *console = tg_test_read_file(err_path, NULL);
    if (!read_metrics(metrics, &r) || !CHECK(console, "no console output")) goto out;

    /* The console's head line: the ops, their total, the captured step's median. */
    const char *head = strstr(console, "profile (ops launched one by one, mean of ");
    int repeats = 0, n_ops = 0;
    double total = 0, step_ms = 0, phase[3] = {0};
    CHECK(head && sscanf(head, "profile (ops launched one by one, mean of %d steps): %lf ms in %d ops; the captured step took %lf ms",
                         &repeats, &total, &n_ops, &step_ms) == 4,
          "profile head: %s", head ? head : "(none)");
    CHECK(repeats == 5 && n_ops == plan.n_ops, "profile of %d ops over %d steps; the plan has %d ops", n_ops, repeats,
          plan.n_ops);
    CHECK(fabs(step_ms - num(r.summary, "median_step_ms")) <= 6e-4, "captured step %.3f ms, median_step_ms %.4f",
          step_ms, num(r.summary, "median_step_ms"));
    const char *ph = head ? strstr(head, "\n  forward ") : NULL;
    CHECK(ph && sscanf(ph, "\n  forward %lf ms, backward %lf ms, optimizer %lf ms", &phase[0], &phase[1], &phase[2]) == 3,
          "phase line: %s", ph ? ph : "(none)");
    CHECK(fabs(phase[0] + phase[1] + phase[2] - total) <= 2e-3, "phases %.3f + %.3f + %.3f, total %.3f", phase[0],
          phase[1], phase[2], total);

    /* The console's table: one line per kind the plan uses, its count, slowest first. */
    const char *row = ph ? strstr(ph, "  op ") : NULL;
    int table_n[TG_OP_COUNT] = {0}, rows = 0;
    double table_ms[TG_OP_COUNT] = {0}, prev = INFINITY, ms_sum = 0, share_sum = 0;
    int table_kind[TG_OP_COUNT];
    for (row = row ? strchr(row, '\n') : NULL; row && strncmp(row + 1, "  slowest ops:", 14); row = strchr(row + 1, '\n')) {
        char name[64];
        int count;
        double ms, share;
        if (!CHECK(sscanf(row + 1, " %63s %d %lf %lf%%", name, &count, &ms, &share) == 4, "table row: %.80s", row + 1)) break;
        int k = kind_named(name);
        if (!CHECK(k >= 0 && rows < TG_OP_COUNT, "table row of unknown kind %s", name)) break;
        table_n[k] = count, table_ms[k] = ms, table_kind[rows++] = k;
        CHECK(ms <= prev, "table not slowest first at %s (%.3f after %.3f)", name, ms, prev);
        prev = ms, ms_sum += ms, share_sum += share;
    }
    for (int k = 0; k < TG_OP_COUNT; k++)
        CHECK(table_n[k] == plan_n[k], "%s: the table counts %d, the plan holds %d", tg_op_name(k), table_n[k], plan_n[k]);
    CHECK(fabs(ms_sum - total) <= 1e-3 * rows && fabs(share_sum - 100) <= 0.1 * rows, "the table's ms add up to %.3f of %.3f, shares to %.1f%%",
          ms_sum, total, share_sum);

    /* The metrics' per-kind lines: the table's kinds, counts, times and order. */
    size_t nk = json_array_size(r.profile_kinds);
    CHECK((int)nk == rows, "%zu profile_op lines, %d table rows", nk, rows);
    for (size_t i = 0; i < nk && (int)i < rows; i++) {
        json_t *o = json_array_get(r.profile_kinds, i);
        const char *name = json_string_value(json_object_get(o, "profile_op"));
        int k = name ? kind_named(name) : -1;
        CHECK(k == table_kind[i], "profile_op line %zu is %s, table row %s", i, name ? name : "(none)",
              tg_op_name(table_kind[i]));
        if (k < 0) continue;
        CHECK(json_integer_value(json_object_get(o, "count")) == plan_n[k], "profile_op %s: count %lld, the plan holds %d",
              name, (long long)json_integer_value(json_object_get(o, "count")), plan_n[k]);
        CHECK(fabs(json_number_value(json_object_get(o, "ms")) - table_ms[k]) <= 5.5e-4, "profile_op %s: %.4f ms, table %.3f",
              name, json_number_value(json_object_get(o, "ms")), table_ms[k]);
    }

    /* The per-op lines: every op once, in order, named as the plan names it, their times
     * adding up to each kind's; the matmuls with their shapes. */
    size_t no = json_array_size(r.profile_ops);
    CHECK((int)no == plan.n_ops, "%zu profile_op_index lines, %d ops", no, plan.n_ops);
    double kind_sum[TG_OP_COUNT] = {0}, op_ms[1024] = {0};
    for (size_t i = 0; i < no && (int)i < plan.n_ops && i < 1024; i++) {
        json_t *o = json_array_get(r.profile_ops, i);
        const tg_op *op = &plan.ops[i];
        const char *name = json_string_value(json_object_get(o, "op"));
        const char *tensor = json_string_value(json_object_get(o, "tensor"));
        int t = op->out[0] >= 0 ? op->out[0] : op->in[0];
        CHECK(json_integer_value(json_object_get(o, "profile_op_index")) == (json_int_t)i && name &&
                  !strcmp(name, tg_op_name(op->kind)) && tensor && !strcmp(tensor, plan.tensors[t].name),
              "per-op line %zu: %s %s, the plan's op is %s %s", i, name ? name : "?", tensor ? tensor : "?",
              tg_op_name(op->kind), plan.tensors[t].name);
        op_ms[i] = json_number_value(json_object_get(o, "ms"));
        kind_sum[op->kind] += op_ms[i];
        if (op->kind == TG_OP_MATMUL)
            CHECK(json_integer_value(json_object_get(o, "M")) == op->p.matmul.m &&
                      json_integer_value(json_object_get(o, "N")) == op->p.matmul.n &&
                      json_integer_value(json_object_get(o, "K")) == op->p.matmul.k &&
                      json_integer_value(json_object_get(o, "batch")) == op->p.matmul.batch,
                  "per-op line %zu: matmul shape", i);
    }
    double phase_sum[3] = {0};
    for (int o = 0; o < plan.n_ops && o < 1024; o++) phase_sum[plan.ops[o].phase] += op_ms[o];
    for (int q = 0; q < 3; q++)
        CHECK(fabs(phase_sum[q] - phase[q]) <= 6e-4 + 5e-5 * plan.n_ops, "%s: its ops add up to %.4f ms, the console says %.3f",
              tg_phase_name(q), phase_sum[q], phase[q]);
    for (int k = 0; k < TG_OP_COUNT; k++)
        CHECK(fabs(kind_sum[k] - table_ms[k]) <= 6e-4 + 5e-5 * plan_n[k], "%s: its ops add up to %.4f ms, the table says %.3f",
              tg_op_name(k), kind_sum[k], table_ms[k]);

    /* The slowest ops: 8 lines naming ops by index, slowest first, none faster than an op
     * left out. */
    const char *slow = strstr(console, "  slowest ops:\n");
    int listed = 0;
    double last_ms = INFINITY;
    char listed_op[1024] = {0};
    for (const char *l = slow ? strchr(slow, '\n') : NULL; l && listed < 8; l = strchr(l + 1, '\n')) {
        int idx;
        char name[64];
        double ms;
        if (sscanf(l + 1, " %d %63s %lf ms", &idx, name, &ms) != 3) break;
        if (!CHECK(idx >= 0 && idx < plan.n_ops && idx < 1024 && !strcmp(name, tg_op_name(plan.ops[idx].kind)),
                   "slowest op line: %.80s", l + 1))
            break;
        CHECK(ms <= last_ms && fabs(ms - op_ms[idx]) <= 5.5e-4, "slowest op %d: %.3f ms, its line %.4f", idx, ms, op_ms[idx]);
        last_ms = ms, listed_op[idx] = 1, listed++;
    }
    CHECK(listed == 8, "%d slowest ops listed, want 8", listed);
    for (int o = 0; o < plan.n_ops && o < 1024; o++)
        CHECK(listed_op[o] || op_ms[o] <= last_ms + 1e-3, "op %d (%.4f ms) left out of the slowest, the last listed %.3f",
              o, op_ms[o], last_ms);
out:
    free(console);
    run_lines_free(&r);
    tg_plan_free(&plan);
}

/* `compile`'s summary line gives the plan's own numbers: its op and tensor counts, its
 * planned peak in MiB and its GFLOP per step, as the plan file written beside it holds them. */
TG_TEST(test_values_cli_compile_summary) {
    const char *dir = tg_test_tmpdir();
    char root[4096], args[8192], plan_path[600];
    REQUIRE(getcwd(root, sizeof root), "cwd");
    snprintf(plan_path, sizeof plan_path, "%s/p.tgp", dir);
    snprintf(args, sizeof args, "compile %s/examples/demo-classify.job -o %s", root, plan_path);
    REQUIRE(cli_status(dir, args) == 0, "compile failed");
    char out_path[700];
    snprintf(out_path, sizeof out_path, "%s/o.txt", dir);
    char *out = tg_test_read_file(out_path, NULL);
    REQUIRE(out, "no output");
    const char *at = strstr(out, ": ");
    int ops = -1, tensors = -1;
    double mib = -1, gflop = -1;
    const int got = at ? sscanf(at, ": %d ops, %d tensors, planned peak %lf MiB, %lf GFLOP/step", &ops, &tensors,
                                &mib, &gflop)
                       : 0;
    tg_plan p;
    tg_err err;
    if (CHECK(got == 4, "summary: %s", out) && CHECK(tg_plan_read(plan_path, &p, &err) == 0, "%s", err.msg)) {
        CHECK(ops == p.n_ops && tensors == p.n_tensors, "%d ops %d tensors, the plan %d %d", ops, tensors, p.n_ops,
              p.n_tensors);
        CHECK(fabs(mib - (double)p.peak_bytes / 1048576.0) <= 0.05 && p.peak_bytes > 1048576,
              "peak %.1f MiB, the plan %.3f MiB", mib, (double)p.peak_bytes / 1048576.0);
        CHECK(fabs(gflop - p.flops_per_step / 1e9) <= 0.005 && p.flops_per_step > 1e7, "%.2f GFLOP, the plan %.4f",
              gflop, p.flops_per_step / 1e9);
        tg_plan_free(&p);
    }
    free(out);
}
