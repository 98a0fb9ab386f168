/* Outputs never destroy inputs or each other (base/output_paths.c, base/atomic_file.c and
 * the CLI's use of them), one test per rule, through the real CLI where the rule is the
 * CLI's: every output is checked against every input and the other outputs before anything
 * is read or trained; temporary names have no fixed length; the temporary file is removed
 * on every exit path (a failing replica, SIGINT, SIGTERM); a FIFO or device is written
 * directly and a symlink's target replaced; a failed run keeps its metrics, ending with
 * the error. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/atomic_file.h"
#include "base/output_paths.h"
#include "include/tunegraph.h"
#include "tests/harness.h"

/* ---- helpers ------------------------------------------------------------------------- */

/* A job in `dir` training tiny-bert for `steps` steps on copies of the demo data there
 * (train.jsonl, eval.jsonl): dir/job.job. `model` is the model line's value. */
static int write_job(const char *dir, const char *model, int steps) {
    char cmd[1400], job[700], text[512];
    snprintf(cmd, sizeof cmd,
             "head -n 64 examples/data/sentiment-train.jsonl > '%s/train.jsonl' && "
             "head -n 16 examples/data/sentiment-eval.jsonl > '%s/eval.jsonl'",
             dir, dir);
    if (system(cmd) != 0) return -1;
    snprintf(job, sizeof job, "%s/job.job", dir);
    snprintf(text, sizeof text,
             "model = %s\ntask = classify\nnum_labels = 2\nbatch = 4\nseq = 16\nsteps = %d\nlr = 1e-3\n"
             "train_data = train.jsonl\neval_data = eval.jsonl\n",
             model, steps);
    return tg_test_write_file(job, text);
}

/* Runs `tunegraph ARGS` in `dir` (cd there first); its exit status (128 + the signal when
 * one ended it; the last command's when ARGS pipe its output on), stderr in dir/stderr.txt,
 * stdout in dir/stdout.txt unless ARGS send it elsewhere. */
static int run_in(const char *dir, const char *args) {
    const char *cli = tg_test_cli();
    char abs_cli[PATH_MAX];
    if (cli[0] != '/' && realpath(cli, abs_cli)) cli = abs_cli;
    size_t len = strlen(dir) * 3 + strlen(cli) + strlen(args) + 100;
    char *cmd = malloc(len);
    if (!cmd) return -1;
    const int own_stdout = !strchr(args, '>') && !strchr(args, '|');
    snprintf(cmd, len, "cd '%s' && { %s %s%s; } 2>'%s/stderr.txt'", dir, cli, args,
             own_stdout ? " >stdout.txt" : "", dir);
    int st = system(cmd);
    free(cmd);
    if (st == -1) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* A string member of a JSON object, "" when it has none. */
static const char *str_of(const json_t *o, const char *key) {
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

static char *stderr_of(const char *dir) {
    char path[700];
    snprintf(path, sizeof path, "%s/stderr.txt", dir);
    char *text = tg_test_read_file(path, NULL);
    return text ? text : strdup("");
}

/* Runs the CLI and expects it refused with status 1 before any training, its message
 * holding each of `want` (NULL-terminated). */
static void expect_refused(const char *dir, const char *args, const char *const *want) {
    int rc = run_in(dir, args);
    char *text = stderr_of(dir);
    CHECK(rc == 1, "'%s': exit status %d, stderr %s", args, rc, text);
    for (int k = 0; want[k]; k++) CHECK(strstr(text, want[k]), "'%s': message lacks '%s': %s", args, want[k], text);
    CHECK(!strstr(text, "ready in"), "'%s': refused only after the run started: %s", args, text);
    free(text);
}

/* Entries of `dir` whose name holds ".tmp." (temporary files left behind). */
static int count_temps(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(d);
    return n;
}

static int same_bytes(const char *a, const char *b) {
    long la = -1, lb = -2;
    char *x = tg_test_read_file(a, &la), *y = tg_test_read_file(b, &lb);
    int same = x && y && la == lb && !memcmp(x, y, (size_t)la);
    free(x), free(y);
    return same;
}

/* Every line of the metrics file is a JSON object; the last is returned (NULL when none
 * or a line is not JSON), with the number of step lines. */
static json_t *metrics_last_line(const char *path, int *steps) {
    char *text = tg_test_read_file(path, NULL);
    if (!text) return NULL;
    json_t *last = NULL;
    *steps = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        json_decref(last);
        last = o;
        if (!o || !json_is_object(o)) {
            json_decref(o);
            last = NULL;
            break;
        }
        *steps += json_object_get(o, "step") != NULL;
    }
    free(text);
    return last;
}

/* ---- 1. every output against every input and the other outputs, up front ------------ */

/* `compile x.job -o x.job` replaced the job with the plan; onto the training data or the
 * model config it would replace those. */
TG_TEST(test_outputs_compile_onto_inputs) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, "tiny-bert", 2) == 0, "cannot write the job");
    char job[700], train[700];
    snprintf(job, sizeof job, "%s/job.job", dir);
    snprintf(train, sizeof train, "%s/train.jsonl", dir);
    char *job_before = tg_test_read_file(job, NULL), *train_before = tg_test_read_file(train, NULL);
    expect_refused(dir, "compile job.job -o job.job",
                   (const char *const[]){"plan (-o) job.job", "would overwrite the job file job.job", NULL});
    expect_refused(dir, "compile job.job -o ./train.jsonl",
                   (const char *const[]){"plan (-o) ./train.jsonl", "training data (train_data)", NULL});
    /* A job named like its default plan. */
    char tgp[700], cmd[1500];
    snprintf(tgp, sizeof tgp, "%s/job.tgp", dir);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", job, tgp);
    REQUIRE(system(cmd) == 0, "cp");
    expect_refused(dir, "compile job.tgp", (const char *const[]){"plan job.tgp", "the job file job.tgp", NULL});
    char *job_after = tg_test_read_file(job, NULL), *train_after = tg_test_read_file(train, NULL);
    CHECK(job_before && job_after && !strcmp(job_before, job_after), "the job changed");
    CHECK(train_before && train_after && !strcmp(train_before, train_after), "the training data changed");
    CHECK(count_temps(dir) == 0, "temporary files left: %d", count_temps(dir));
    free(job_before), free(job_after), free(train_before), free(train_after);
}

/* --metrics onto the training or eval data, also through a symlink or a hard link. */
TG_TEST(test_outputs_metrics_onto_data) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, "tiny-bert", 2) == 0, "cannot write the job");
    char train[700], eval[700], link_path[700], hard[700];
    snprintf(train, sizeof train, "%s/train.jsonl", dir);
    snprintf(eval, sizeof eval, "%s/eval.jsonl", dir);
    snprintf(link_path, sizeof link_path, "%s/link.jsonl", dir);
    snprintf(hard, sizeof hard, "%s/hard.jsonl", dir);
    REQUIRE(symlink("eval.jsonl", link_path) == 0 && link(train, hard) == 0, "links");
    char *before = tg_test_read_file(train, NULL);
    expect_refused(dir, "run job.job --device cpu --metrics train.jsonl",
                   (const char *const[]){"metrics (--metrics) train.jsonl", "would overwrite the training data", NULL});
    expect_refused(dir, "run job.job --device cpu --metrics link.jsonl",
                   (const char *const[]){"metrics (--metrics) link.jsonl", "eval data (eval_data)", NULL});
    expect_refused(dir, "run job.job --device cpu --metrics hard.jsonl",
                   (const char *const[]){"metrics (--metrics) hard.jsonl", "training data", NULL});
    char *after = tg_test_read_file(train, NULL);
    CHECK(before && after && !strcmp(before, after), "the training data changed");
    struct stat st;
    CHECK(lstat(link_path, &st) == 0 && S_ISLNK(st.st_mode), "the symlink was replaced");
    free(before), free(after);
}

/* --save onto the job, the plan, the model's weights or config. */
TG_TEST(test_outputs_save_onto_inputs) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, "tiny-bert", 1) == 0, "cannot write the job");
    char cmd[1500], model[700];
    snprintf(model, sizeof model, "%s/model", dir);
    REQUIRE(mkdir(model, 0755) == 0, "mkdir %s", model);
    snprintf(cmd, sizeof cmd, "cp models/presets/tiny-bert/config.json '%s/config.json'", model);
    REQUIRE(system(cmd) == 0, "cp config");
    REQUIRE(run_in(dir, "run job.job --device cpu --save model/model.safetensors") == 0, "first save failed");
    REQUIRE(write_job(dir, "model", 1) == 0, "cannot write the job");
    REQUIRE(run_in(dir, "compile job.job -o job.tgp") == 0, "compile failed");
    char weights[700], plan[700];
    snprintf(weights, sizeof weights, "%s/model.safetensors", model);
    snprintf(plan, sizeof plan, "%s/job.tgp", dir);
    char *w_before = tg_test_read_file(weights, NULL), *p_before = tg_test_read_file(plan, NULL);
    expect_refused(dir, "run job.job --device cpu --save job.job",
                   (const char *const[]){"weights (--save) job.job", "would overwrite the job file job.job", NULL});
    expect_refused(dir, "run job.tgp --device cpu --save job.tgp",
                   (const char *const[]){"weights (--save) job.tgp", "the plan file job.tgp", NULL});
    expect_refused(dir, "run job.tgp --device cpu --save model/model.safetensors",
                   (const char *const[]){"weights (--save) model/model.safetensors", "the model weights", NULL});
    expect_refused(dir, "run job.job --device cpu --metrics model/config.json",
                   (const char *const[]){"metrics (--metrics) model/config.json", "the model config", NULL});
    char *w_after = tg_test_read_file(weights, NULL), *p_after = tg_test_read_file(plan, NULL);
    CHECK(w_before && w_after && !strcmp(w_before, w_after), "the weights changed");
    CHECK(p_before && p_after && !strcmp(p_before, p_after), "the plan changed");
    free(w_before), free(w_after), free(p_before), free(p_after);
}

/* `--metrics out --save out` printed "saved out" and left only the metrics; two outputs
 * are refused as one file by name when neither exists, and through a symlink. */
TG_TEST(test_outputs_onto_each_other) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, "tiny-bert", 1) == 0, "cannot write the job");
    expect_refused(dir, "run job.job --device cpu --metrics out --save out",
                   (const char *const[]){"metrics (--metrics) out and weights (--save) out are the same file", NULL});
    char sub[700];
    snprintf(sub, sizeof sub, "%s/sub", dir);
    REQUIRE(mkdir(sub, 0755) == 0, "mkdir");
    expect_refused(dir, "run job.job --device cpu --metrics ./sub/../out --save out",
                   (const char *const[]){"are the same file", NULL});
    char link_path[700];
    snprintf(link_path, sizeof link_path, "%s/alias", dir);
    REQUIRE(symlink("out", link_path) == 0, "symlink");
    expect_refused(dir, "run job.job --device cpu --metrics alias --save out",
                   (const char *const[]){"metrics (--metrics) alias and weights (--save) out are the same file", NULL});
    struct stat st;
    CHECK(stat(link_path, &st) != 0, "an output was written");
    /* Character devices hold nothing to destroy: /dev/null takes both (through links of
     * the test's own, so that a regression replaces those rather than the machine's). */
    char null_a[700], null_b[700];
    snprintf(null_a, sizeof null_a, "%s/null-a", dir);
    snprintf(null_b, sizeof null_b, "%s/null-b", dir);
    REQUIRE(symlink("/dev/null", null_a) == 0 && symlink("/dev/null", null_b) == 0, "symlinks");
    CHECK(run_in(dir, "run job.job --device cpu --metrics null-a --save null-b") == 0, "/dev/null twice refused");
    CHECK(lstat(null_a, &st) == 0 && S_ISLNK(st.st_mode) && lstat(null_b, &st) == 0 && S_ISLNK(st.st_mode),
          "a link to /dev/null was replaced");
}

/* A bad output is refused before the weights and data are read, not after the training
 * (which deleted the finished run's metrics): a missing folder, a folder, a name ending in
 * '/', and (not as root) a folder that is not writable. */
TG_TEST(test_outputs_bad_folder_up_front) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, "tiny-bert", 1) == 0, "cannot write the job");
    expect_refused(dir, "run job.job --device cpu --metrics m.jsonl --save missing/dir/x.safetensors",
                   (const char *const[]){"weights (--save) missing/dir/x.safetensors",
                                         "the folder missing/dir does not exist", NULL});
    char sub[700];
    snprintf(sub, sizeof sub, "%s/sub", dir);
    REQUIRE(mkdir(sub, 0755) == 0, "mkdir");
    expect_refused(dir, "run job.job --device cpu --metrics m.jsonl --save sub",
                   (const char *const[]){"weights (--save) sub: is a folder", NULL});
    expect_refused(dir, "run job.job --device cpu --save w.safetensors --metrics new/",
                   (const char *const[]){"metrics (--metrics) new/: names a folder", NULL});
    expect_refused(dir, "compile job.job -o sub", (const char *const[]){"plan (-o) sub: is a folder", NULL});
    if (geteuid() != 0) {
        REQUIRE(chmod(sub, 0555) == 0, "chmod");
        expect_refused(dir, "run job.job --device cpu --metrics sub/m.jsonl",
                       (const char *const[]){"cannot create files in the folder", NULL});
        chmod(sub, 0755);
    } else {
        printf("    not run as root: a folder without write permission\n");
    }
    char m[700];
    snprintf(m, sizeof m, "%s/m.jsonl", dir);
    struct stat st;
    CHECK(stat(m, &st) != 0, "a metrics file was written for a refused run");
    CHECK(count_temps(dir) == 0, "temporary files left: %d", count_temps(dir));
}

/* The library refuses the same: a plan or weights saved over a file the plan reads. */
TG_TEST(test_outputs_library_save_onto_inputs) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, "tiny-bert", 1) == 0, "cannot write the job");
    char job[700], train[700], eval[700];
    snprintf(job, sizeof job, "%s/job.job", dir);
    snprintf(train, sizeof train, "%s/train.jsonl", dir);
    snprintf(eval, sizeof eval, "%s/eval.jsonl", dir);
    char *before = tg_test_read_file(train, NULL);
    tunegraph_plan *plan = NULL;
    REQUIRE(tunegraph_compile_file(job, NULL, 0, &plan) == 0, "%s", tunegraph_last_error());
    CHECK(tunegraph_plan_save(plan, train) == -1, "plan saved over the training data");
    CHECK(strstr(tunegraph_last_error(), "training data"), "message: %s", tunegraph_last_error());
    tunegraph_trainer *tr = NULL;
    REQUIRE(tunegraph_trainer_open(plan, NULL, &tr) == 0, "%s", tunegraph_last_error());
    CHECK(tunegraph_trainer_save_weights(tr, eval) == -1, "weights saved over the eval data");
    CHECK(strstr(tunegraph_last_error(), "weights") && strstr(tunegraph_last_error(), "eval data"), "message: %s",
          tunegraph_last_error());
    tunegraph_trainer_close(tr);
    tunegraph_plan_free(plan);
    char *after = tg_test_read_file(train, NULL);
    CHECK(before && after && !strcmp(before, after), "the training data changed");
    free(before), free(after);
}

/* ---- 2. temporary names without fixed buffers --------------------------------------- */

/* A 600-byte -o path and a --metrics path of 600 bytes (the old buffers cut them at 511
 * and 543 bytes, and the cut name overwrote the file of that name) work in full, leaving
 * the file named by their first 511 bytes alone; a 5,000-byte path is refused by name. */
TG_TEST(test_outputs_long_paths) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, "tiny-bert", 1) == 0, "cannot write the job");
    char deep[1200];
    int n = snprintf(deep, sizeof deep, "%s", dir);
    while (n < 480) { /* a chain of folders, each name well under NAME_MAX */
        n += snprintf(deep + n, sizeof deep - (size_t)n, "/%0100d", 0);
        REQUIRE(mkdir(deep, 0755) == 0 || errno == EEXIST, "mkdir %s", deep);
    }
    char plan_path[1200], metrics_path[1200], victim[1200];
    snprintf(plan_path, sizeof plan_path, "%s/", deep);
    while (strlen(plan_path) < 600) strcat(plan_path, "p");
    snprintf(metrics_path, sizeof metrics_path, "%.595s.jsonl", plan_path);
    /* The file an old 512-byte buffer would have written: the path's first 511 bytes. */
    snprintf(victim, sizeof victim, "%.511s", plan_path);
    REQUIRE(tg_test_write_file(victim, "keep me") == 0, "cannot write %s", victim);
    char args[3000];
    snprintf(args, sizeof args, "compile job.job -o %s", plan_path);
    CHECK(run_in(dir, args) == 0, "compile -o a %zu-byte path failed", strlen(plan_path));
    snprintf(args, sizeof args, "run job.job --device cpu --metrics %s", metrics_path);
    CHECK(run_in(dir, args) == 0, "run --metrics a %zu-byte path failed", strlen(metrics_path));
    struct stat st;
    CHECK(stat(plan_path, &st) == 0 && st.st_size > 100, "no plan at the full path");
    CHECK(stat(metrics_path, &st) == 0 && st.st_size > 100, "no metrics at the full path");
    char *kept = tg_test_read_file(victim, NULL);
    CHECK(kept && !strcmp(kept, "keep me"), "the file at the path's first 511 bytes changed");
    free(kept);
    CHECK(count_temps(deep) == 0, "temporary files left: %d", count_temps(deep));

    /* Longer than PATH_MAX: refused, naming the limit. */
    char *huge = malloc(5100);
    REQUIRE(huge, "out of memory");
    n = snprintf(huge, 5100, "%s", dir);
    while (n < 5000) n += snprintf(huge + n, 5100 - (size_t)n, "/%0200d", 7);
    char *huge_args = malloc(5300);
    REQUIRE(huge_args, "out of memory");
    snprintf(huge_args, 5300, "compile job.job -o %s", huge);
    expect_refused(dir, huge_args, (const char *const[]){"plan (-o)", "longer than the system accepts", NULL});
    snprintf(huge_args, 5300, "run job.job --device cpu --metrics %s", huge);
    expect_refused(dir, huge_args,
                   (const char *const[]){"metrics (--metrics)", "longer than the system accepts", NULL});
    free(huge), free(huge_args);
}

/* A file name at the system's limit still gets a temporary name beside it (shortened). */
TG_TEST(test_outputs_longest_name) {
    const char *dir = tg_test_tmpdir();
    char path[700];
    int n = snprintf(path, sizeof path, "%s/", dir);
    for (int i = 0; i < NAME_MAX; i++) path[n++] = 'n';
    path[n] = 0;
    tg_err err = {{0}};
    const tg_chunk chunk = {"data", 4};
    CHECK(tg_write_file_atomic(path, &chunk, 1, "test file", &err) == 0, "%s", err.msg);
    CHECK(tg_test_count_files(dir) == 1, "%d files", tg_test_count_files(dir));
    strcat(path, "n"); /* NAME_MAX + 1 */
    CHECK(tg_write_file_atomic(path, &chunk, 1, "test file", &err) == -1, "a name past NAME_MAX written");
    CHECK(strstr(err.msg, "cannot create the test file"), "%s", err.msg);
}

/* ---- 3. the temporary file goes on every exit path ---------------------------------- */

/* A failing data-parallel replica ended the process before the main thread removed the
 * metrics' temporary file (left behind on most runs): the error now ends the metrics
 * file, in place, whichever replica fails first. */
TG_TEST(test_outputs_failed_replica_leaves_no_temp) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, "tiny-bert", 6) == 0, "cannot write the job");
    char metrics[700];
    snprintf(metrics, sizeof metrics, "%s/dp.jsonl", dir);
    for (int k = 0; k < 3; k++) {
        int rc = run_in(dir, "run job.job --device cpu --set data_parallel=2 --set lr=1e30 --set skip_nonfinite=false --metrics dp.jsonl "
                             "--save dp.safetensors");
        char *text = stderr_of(dir);
        CHECK(rc == 1 && strstr(text, "diverged"), "run %d: exit %d, stderr %s", k, rc, text);
        free(text);
        CHECK(count_temps(dir) == 0, "run %d: temporary files left: %d", k, count_temps(dir));
        int steps = 0;
        json_t *last = metrics_last_line(metrics, &steps);
        CHECK(last && !strcmp(str_of(last, "event"), "error") &&
                  strstr(str_of(last, "message"), "diverged") &&
                  json_is_integer(json_object_get(last, "replica")),
              "run %d: the metrics do not end with the error", k);
        json_decref(last);
        remove(metrics);
    }
}

/* Starts the CLI in `dir` with argv (argv[0] unused), stdout and stderr into
 * dir/stderr.txt; its pid. */
static pid_t start_cli(const char *dir, char *const *argv) {
    char abs_cli[PATH_MAX], out[700];
    const char *cli = tg_test_cli();
    if (realpath(cli, abs_cli)) cli = abs_cli;
    snprintf(out, sizeof out, "%s/stderr.txt", dir);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || chdir(dir) != 0) _exit(127);
        dup2(fd, 1), dup2(fd, 2);
        execv(cli, argv);
        _exit(127);
    }
    return pid;
}

/* The size of the first temporary file in `dir`, or -1 when there is none. */
static long temp_size(const char *dir) {
    DIR *d = opendir(dir);
    long size = -1;
    for (struct dirent *e; d && size < 0 && (e = readdir(d));) {
        struct stat st;
        char path[1000];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (strstr(e->d_name, ".tmp.") && stat(path, &st) == 0) size = (long)st.st_size;
    }
    if (d) closedir(d);
    return size;
}

/* SIGTERM or SIGINT in the middle of training: the handler removes the temporary files
 * and the process ends by the signal, leaving no metrics file (it was never in place). */
static void interrupt_run(int sig, const char *replicas) {
    const char *dir = tg_test_tmpdir();
    if (!CHECK(write_job(dir, "tiny-bert", 1000000) == 0, "cannot write the job")) return;
    char set_dp[64];
    snprintf(set_dp, sizeof set_dp, "data_parallel=%s", replicas);
    char *argv[] = {"tunegraph", "run", "job.job", "--device", "cpu", "--set", set_dp, "--metrics", "m.jsonl",
                    "--save", "w.safetensors", NULL};
    pid_t pid = start_cli(dir, argv);
    if (!CHECK(pid > 0, "fork failed")) return;
    /* Until steps are being written (the file is buffered: some steps in). */
    int status = 0, ended = 0;
    for (int i = 0; i < 6000 && temp_size(dir) <= 0; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid) {
            ended = 1;
            break;
        }
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    }
    if (ended) {
        char *text = stderr_of(dir);
        CHECK(0, "the run ended before the signal (status %#x): %s", status, text);
        free(text);
    }
    if (!ended) {
        CHECK(temp_size(dir) > 0, "no metrics written in 120 s");
        kill(pid, sig);
        waitpid(pid, &status, 0);
    }
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == sig, "%s, replicas %s: status %#x, not the signal's",
          strsignal(sig), replicas, status);
    CHECK(count_temps(dir) == 0, "%s: temporary files left: %d", strsignal(sig), count_temps(dir));
    char m[700];
    snprintf(m, sizeof m, "%s/m.jsonl", dir);
    struct stat st;
    CHECK(stat(m, &st) != 0, "%s: a metrics file in place", strsignal(sig));
}

TG_TEST(test_outputs_sigterm_removes_temps) { interrupt_run(SIGTERM, "1"); }
TG_TEST(test_outputs_sigint_removes_temps) { interrupt_run(SIGINT, "1"); }
TG_TEST(test_outputs_sigterm_data_parallel_removes_temps) { interrupt_run(SIGTERM, "2"); }

/* tg_atomic_remove_temps (the handler's work) removes a file being written, and only the
 * temporary one. */
TG_TEST(test_outputs_remove_temps_in_process) {
    const char *dir = tg_test_tmpdir();
    pid_t pid = fork();
    REQUIRE(pid >= 0, "fork");
    if (pid == 0) { /* the registry ends with the process that uses it */
        char path[700];
        snprintf(path, sizeof path, "%s/out.bin", dir);
        tg_atomic_file *f;
        tg_err err;
        if (tg_test_write_file(path, "old") || tg_atomic_begin(path, "test file", &f, &err)) _exit(2);
        if (write(tg_atomic_fd(f), "new", 3) != 3 || tg_test_count_files(dir) != 2) _exit(3);
        tg_atomic_remove_temps();
        _exit(tg_test_count_files(dir) == 1 ? 0 : 4);
    }
    int status;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %#x", status);
    char path[700];
    snprintf(path, sizeof path, "%s/out.bin", dir);
    char *text = tg_test_read_file(path, NULL);
    CHECK(text && !strcmp(text, "old"), "the target changed: %s", text ? text : "(none)");
    free(text);
}

/* ---- 4. FIFOs and devices written directly; symlinks followed ------------------------ */

typedef struct fifo_reader {
    char path[700];
    char *bytes;
    size_t len;
} fifo_reader;

static void *read_fifo(void *arg) {
    fifo_reader *r = arg;
    FILE *f = fopen(r->path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16;
    r->bytes = malloc(cap);
    for (size_t n; r->bytes && (n = fread(r->bytes + r->len, 1, cap - r->len, f)) > 0;) {
        r->len += n;
        if (r->len == cap) r->bytes = realloc(r->bytes, cap *= 2);
    }
    fclose(f);
    return NULL;
}

/* `-o` a FIFO: the plan goes through it (the same bytes as a plan file), and the FIFO
 * stays a FIFO; standard output into a pipe likewise, the "compiled" line going to stderr,
 * and a character device (/dev/null) is written, not replaced. Standard output and
 * /dev/null are reached through links of the test's own, as /dev/stdout reaches fd 1: a
 * regression replaces those, never the machine's. */
TG_TEST(test_outputs_fifo_and_device) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, "tiny-bert", 2) == 0, "cannot write the job");
    REQUIRE(run_in(dir, "compile job.job -o plain.tgp") == 0, "compile failed");
    fifo_reader r = {.len = 0};
    snprintf(r.path, sizeof r.path, "%s/plan.fifo", dir);
    REQUIRE(mkfifo(r.path, 0644) == 0, "mkfifo");
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, read_fifo, &r) == 0, "thread");
    CHECK(run_in(dir, "compile job.job -o plan.fifo") == 0, "compile -o a FIFO failed");
    /* Lets the reader end even when nothing opened the FIFO for writing. */
    int fd = open(r.path, O_WRONLY | O_NONBLOCK);
    if (fd >= 0) close(fd);
    pthread_join(th, NULL);
    char plain[700];
    snprintf(plain, sizeof plain, "%s/plain.tgp", dir);
    long plain_len = 0;
    char *want = tg_test_read_file(plain, &plain_len);
    CHECK(want && r.bytes && (long)r.len == plain_len && !memcmp(want, r.bytes, r.len),
          "the FIFO carried %zu bytes, the plan file has %ld", r.len, plain_len);
    free(r.bytes);
    free(want);
    struct stat st;
    CHECK(lstat(r.path, &st) == 0 && S_ISFIFO(st.st_mode), "the FIFO was replaced");
    CHECK(count_temps(dir) == 0, "temporary files left: %d", count_temps(dir));

    /* Standard output into a pipe. */
    char out_link[700], null_link[700];
    snprintf(out_link, sizeof out_link, "%s/stdout", dir);
    snprintf(null_link, sizeof null_link, "%s/null", dir);
    REQUIRE(symlink("/proc/self/fd/1", out_link) == 0 && symlink("/dev/null", null_link) == 0, "symlinks");
    run_in(dir, "compile job.job -o stdout | cat > piped.tgp"); /* the status is cat's */
    char piped[700];
    snprintf(piped, sizeof piped, "%s/piped.tgp", dir);
    CHECK(same_bytes(piped, plain), "the plan through standard output differs from the plan file");
    char *text = stderr_of(dir);
    CHECK(strstr(text, "compiled job.job -> stdout"), "the compiled line: %s", text);
    free(text);
    CHECK(lstat(out_link, &st) == 0 && S_ISLNK(st.st_mode), "the link to standard output was replaced");
    CHECK(run_in(dir, "compile job.job -o null") == 0, "compile -o /dev/null failed");
    CHECK(lstat(null_link, &st) == 0 && S_ISLNK(st.st_mode) && stat(null_link, &st) == 0 && S_ISCHR(st.st_mode),
          "the link to /dev/null was replaced");
    run_in(dir, "run job.job --device cpu --metrics stdout | cat > lines.jsonl");
    char lines[700];
    snprintf(lines, sizeof lines, "%s/lines.jsonl", dir);
    int steps = 0;
    json_t *last = metrics_last_line(lines, &steps);
    CHECK(last && json_is_true(json_object_get(last, "summary")) && steps == 2, "metrics through a pipe: %d steps",
          steps);
    json_decref(last);
}

/* A symlink to a regular file: the target is replaced atomically (keeping its mode) and
 * the link stays a link; a dangling link creates the file it names. */
TG_TEST(test_outputs_symlink_target) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, "tiny-bert", 1) == 0, "cannot write the job");
    char real_path[700], link_path[700], sub[700];
    snprintf(sub, sizeof sub, "%s/plans", dir);
    REQUIRE(mkdir(sub, 0755) == 0, "mkdir");
    snprintf(real_path, sizeof real_path, "%s/plans/real.tgp", dir);
    snprintf(link_path, sizeof link_path, "%s/current.tgp", dir);
    REQUIRE(tg_test_write_file(real_path, "old contents") == 0 && chmod(real_path, 0600) == 0, "write");
    REQUIRE(symlink("plans/real.tgp", link_path) == 0, "symlink");
    CHECK(run_in(dir, "compile job.job -o current.tgp") == 0, "compile through a symlink failed");
    struct stat st;
    CHECK(lstat(link_path, &st) == 0 && S_ISLNK(st.st_mode), "the symlink was replaced by a file");
    CHECK(stat(real_path, &st) == 0 && st.st_size > 100 && (st.st_mode & 07777) == 0600,
          "target: %lld bytes, mode %o", (long long)st.st_size, (unsigned)(st.st_mode & 07777));
    CHECK(count_temps(dir) == 0 && count_temps(sub) == 0, "temporary files left");
    /* Metrics through a link, and a dangling link. */
    char m_link[700], dangling[700], made[700];
    snprintf(m_link, sizeof m_link, "%s/m.jsonl", dir);
    snprintf(dangling, sizeof dangling, "%s/w.safetensors", dir);
    snprintf(made, sizeof made, "%s/plans/w.safetensors", dir);
    REQUIRE(symlink("plans/m-real.jsonl", m_link) == 0 && symlink("plans/w.safetensors", dangling) == 0, "symlinks");
    CHECK(run_in(dir, "run job.job --device cpu --metrics m.jsonl --save w.safetensors") == 0, "run failed");
    CHECK(lstat(m_link, &st) == 0 && S_ISLNK(st.st_mode) && lstat(dangling, &st) == 0 && S_ISLNK(st.st_mode),
          "a symlink was replaced");
    CHECK(stat(made, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 100, "the dangling link's file was not made");
    int steps = 0;
    json_t *last = metrics_last_line(m_link, &steps);
    CHECK(last && json_is_true(json_object_get(last, "summary")), "metrics through the link");
    json_decref(last);
}

/* ---- 5. a failed run keeps its metrics, ending with the error ------------------------ */

TG_TEST(test_outputs_failed_run_keeps_metrics) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, "tiny-bert", 6) == 0, "cannot write the job");
    int rc = run_in(dir, "run job.job --device cpu --set lr=1e30 --set skip_nonfinite=false --metrics m.jsonl --save w.safetensors");
    char *text = stderr_of(dir);
    CHECK(rc == 1 && strstr(text, "diverged"), "exit %d: %s", rc, text);
    free(text);
    char m[700], w[700];
    snprintf(m, sizeof m, "%s/m.jsonl", dir);
    snprintf(w, sizeof w, "%s/w.safetensors", dir);
    int steps = 0;
    json_t *last = metrics_last_line(m, &steps);
    REQUIRE(last, "no metrics file in place, or a line that is not JSON");
    CHECK(!strcmp(str_of(last, "event"), "error") &&
              strstr(str_of(last, "message"), "diverged") &&
              !json_object_get(last, "replica"),
          "the last line is not the error");
    CHECK(steps >= 1, "the steps before the failure are gone (%d)", steps);
    json_decref(last);
    struct stat st;
    CHECK(stat(w, &st) != 0, "weights saved by a failed run");
    CHECK(count_temps(dir) == 0, "temporary files left: %d", count_temps(dir));

    /* A run that fails before its first step (its data is missing) says so too. */
    rc = run_in(dir, "run job.job --device cpu --set train_data=missing.jsonl --metrics m2.jsonl");
    CHECK(rc == 1, "exit %d", rc);
    snprintf(m, sizeof m, "%s/m2.jsonl", dir);
    last = metrics_last_line(m, &steps);
    CHECK(last && steps == 0 && strstr(str_of(last, "message"), "missing.jsonl"),
          "metrics of a run that failed to start");
    json_decref(last);
}

/* ---- base/output_paths.c on its own ---------------------------------------------------- */

/* The resolved name: folder made absolute, symlinks on the last name followed. */
TG_TEST(test_outputs_resolve) {
    const char *dir = tg_test_tmpdir();
    char real_dir[PATH_MAX], link_path[700], want[PATH_MAX + 20];
    REQUIRE(realpath(dir, real_dir), "realpath");
    snprintf(link_path, sizeof link_path, "%s/a", dir);
    REQUIRE(symlink("b", link_path) == 0, "symlink");
    char *out = NULL;
    CHECK(tg_output_resolve(link_path, &out) == 0, "resolve");
    snprintf(want, sizeof want, "%s/b", real_dir);
    CHECK(out && !strcmp(out, want), "%s, want %s", out ? out : "(none)", want);
    free(out);
    char loop[700];
    snprintf(loop, sizeof loop, "%s/loop", dir);
    REQUIRE(symlink("loop", loop) == 0, "symlink");
    CHECK(tg_output_resolve(loop, &out) == ELOOP, "a symlink loop");
    snprintf(loop, sizeof loop, "%s/none/x", dir);
    CHECK(tg_output_resolve(loop, &out) == ENOENT, "a missing folder");
    CHECK(tg_output_resolve("x/", &out) == EISDIR && tg_output_resolve("..", &out) == EISDIR, "folder names");
    const tg_named_path outs[] = {{"", "thing"}};
    tg_err err = {{0}};
    CHECK(tg_outputs_check(outs, 1, NULL, 0, &err) == -1 && strstr(err.msg, "thing: the path is empty"), "%s",
          err.msg);
}
