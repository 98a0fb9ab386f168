/* The command line's dispatch, option errors and failure classes (cli/main.c), run in this
 * process through the CLI that tests/test_cli_metrics.c compiles in (its main renamed
 * tunegraph_cli_main): each case asserts the exit status and what stderr or stdout says.
 * Paths that end the process (_exit, a signal) run the CLI binary instead. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/version.h"
#include "runtime/executor.h"
#include "tests/cli_in_process.h"
#include "runtime/comm.h"
#include "tests/harness.h"

int tunegraph_cli_main(int argc, char **argv);

#define DEMO "examples/demo-classify.job"
#define DEMO_LM "examples/demo-lm.job"
#define TRAIN_DATA "examples/data/sentiment-train.jsonl"

/* The running test's folder (tg_test_tmpdir gives a fresh one per call). */
static const char *test_dir;

/* The command line `line` (with %s replaced by the test's folder, up to 4 times) must exit
 * with `status`, its stderr holding `says` (NULL: not asked). */
static void expect(const char *line, int status, const char *says) {
    char full[4096];
    const char *dir = test_dir;
    snprintf(full, sizeof full, line, dir, dir, dir, dir);
    tg_cli_run r = tg_test_cli_line(test_dir, full, NULL);
    CHECK(r.status == status, "tunegraph %s: exit %d, want %d: %s", full, r.status, status, r.err ? r.err : "");
    if (says)
        CHECK(r.err && strstr(r.err, says), "tunegraph %s: stderr lacks '%s': %s", full, says, r.err ? r.err : "(none)");
    tg_cli_run_free(&r);
}

typedef struct cli_case {
    const char *line;
    int status;
    const char *says;
} cli_case;

static void expect_all(const cli_case *cases, size_t n) {
    for (size_t i = 0; i < n; i++) expect(cases[i].line, cases[i].status, cases[i].says);
}

/* These tests run the CLI of this process (tunegraph_cli_main) and expect what a build
 * without the CUDA executor does ("--device cuda" refused, data parallelism in threads on
 * the CPU): a CUDA build passes over them (its own suite runs the CLI on the GPU). */
static int cpu_build_only(void) { return tg_cuda_built(); }

/* The usage text, whole: every command and option the CLI takes. */
static const char k_usage[] =
    "usage:\n"
    "  tunegraph compile JOB [-o PLAN] [--set key=value]...\n"
    "  tunegraph inspect PLAN [--json]\n"
    "  tunegraph inspect PLAN|JOB --predict [--gpu h100|h200|cpu|auto] [--threads N] [--calibration FILE]\n"
    "                [--top N] [--set key=value]...\n"
    "  tunegraph calibrate [--device cpu|cuda] [--threads N] [--repeats N] [-o FILE]\n"
    "  tunegraph run PLAN|JOB [--set key=value]... [--metrics FILE.jsonl] [--device cpu|cuda]\n"
    "                [--threads N] [--save FILE.safetensors] [--profile] [--in-flight N]\n"
    "                [--save-dir DIR [--labels a,b,...] [--tokenizer PATH] [--dtype fp32|bf16] [--force]]\n"
    "                [--checkpoint-dir DIR] [--resume DIR|FILE.tgckpt] [--artifact DIR] [--nproc N]\n"
    "  tunegraph data convert INPUT... -o OUTDIR --tokenizer PATH [options]  (tunegraph data help)\n"
    "  tunegraph data dump SET [-o FILE.jsonl]\n"
    "  tunegraph tokenize --tokenizer PATH [--pair] [--max-len N] [--no-special] [--offsets]\n"
    "  tunegraph export PLAN|JOB --weights FILE.safetensors -o OUTDIR [--tokenizer PATH] [--labels a,b,...]\n"
    "                [--dtype fp32|bf16] [--force] [--set key=value]...\n"
    "  tunegraph predict PLAN|JOB -o LOGITS.jsonl [--weights FILE.safetensors] [--data FILE.jsonl]\n"
    "                [--device cpu|cuda] [--threads N] [--init-missing] [--set key=value]...\n"
    "  tunegraph plot METRICS.jsonl -o DIR\n"
    "  tunegraph sweep JOB --grid key=v1,v2,... [--grid ...]... -o DIR [--weights throughput=W,memory=W,energy=W,cost=W]\n"
    "                [--steps N] [--warmup N] [--device cpu|cuda] [--threads N] [--set key=value]... [--artifact DIR]\n"
    "  tunegraph compare A B   (two artifact folders, metrics files or sweep results)\n"
    "  tunegraph version\n"
    "Job files are `key = value` text; see README.md for the keys.\n";

TG_TEST(test_cli_main_dispatch) {
    if (cpu_build_only()) return;
    test_dir = tg_test_tmpdir();
    tg_cli_run r = tg_test_cli_line(test_dir, "", NULL);
    CHECK(r.status == 2 && r.err && !strcmp(r.err, k_usage) && r.out && !r.out[0], "no command: %d, stderr %s",
          r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
    static const char *const helps[] = {"help", "--help", "-h"};
    for (int i = 0; i < 3; i++) {
        r = tg_test_cli_line(test_dir, helps[i], NULL);
        CHECK(r.status == 0 && r.out && !strcmp(r.out, k_usage) && r.err && !r.err[0], "%s: %d, stdout %s", helps[i],
              r.status, r.out ? r.out : "");
        tg_cli_run_free(&r);
    }
    static const char *const versions[] = {"version", "--version"};
    for (int i = 0; i < 2; i++) {
        r = tg_test_cli_line(test_dir, versions[i], NULL);
        char want[64];
        snprintf(want, sizeof want, "%s\n", TG_VERSION_STRING);
        CHECK(r.status == 0 && r.out && !strcmp(r.out, want), "%s: %d, stdout '%s'", versions[i], r.status,
              r.out ? r.out : "");
        tg_cli_run_free(&r);
    }
    static const cli_case cases[] = {
        {"--version extra", 2, "tunegraph: version takes no arguments (got 'extra')"},
        {"Compile", 2, "tunegraph: unknown command 'Compile'"},
        {"data", 2, "tunegraph: data needs a subcommand: convert or dump"},
        {"data --bogus", 2, "unknown data subcommand '--bogus' (there are: convert, dump)"},
        {"tokenize", 2, "--tokenizer PATH is required"},
        {"export " DEMO, 2, "-o OUTDIR is required"},
        {"predict " DEMO, 2, "-o LOGITS.jsonl is required"},
    };
    expect_all(cases, sizeof cases / sizeof cases[0]);
    static const char *const data_helps[] = {"data help", "data --help", "data -h"};
    for (int i = 0; i < 3; i++) {
        r = tg_test_cli_line(test_dir, data_helps[i], NULL);
        CHECK(r.status == 0 && r.out && strstr(r.out, "tunegraph data convert INPUT...") && strstr(r.out, "data dump SET"),
              "%s: %d, stdout %s", data_helps[i], r.status, r.out ? r.out : "");
        tg_cli_run_free(&r);
    }
}

TG_TEST(test_cli_main_option_errors) {
    if (cpu_build_only()) return;
    test_dir = tg_test_tmpdir();
    static const cli_case cases[] = {
        {"compile", 2, "tunegraph: missing input file"},
        {"compile " DEMO " -o", 2, "tunegraph: -o needs a value"},
        {"compile " DEMO " --set", 2, "tunegraph: --set needs a value"},
        {"compile " DEMO " --set lr", 2, "tunegraph: --set needs key=value, got 'lr'"},
        {"compile " DEMO " other.job", 2, "tunegraph: unexpected argument other.job"},
        {"compile " DEMO " --json", 2, "tunegraph: unknown option --json"},
        {"compile " DEMO " --metrics m.jsonl", 2, "tunegraph: unknown option --metrics"},
        {"inspect", 2, "tunegraph: missing input file"},
        {"inspect a.tgp b.tgp", 2, "tunegraph: unexpected argument b.tgp"},
        {"inspect a.tgp -o x", 2, "tunegraph: unknown option -o"},
        {"run", 2, "tunegraph: missing input file"},
        {"run " DEMO " --device", 2, "tunegraph: --device needs a value"},
        {"run " DEMO " --device CPU", 2, "tunegraph: --device must be cpu or cuda, got 'CPU'"},
        {"run " DEMO " --threads", 2, "tunegraph: --threads needs a value"},
        {"run " DEMO " --threads 1025", 2, "--threads needs a whole number from 0 to 1024 (0: one per core), got '1025'"},
        {"run " DEMO " --in-flight 0", 2, "--in-flight needs a whole number from 1 to 14, got '0'"},
        {"run " DEMO " --metrics", 2, "tunegraph: --metrics needs a value"},
        {"run " DEMO " --save", 2, "tunegraph: --save needs a value"},
        {"run " DEMO " --resume", 2, "tunegraph: --resume needs a value"},
        {"run " DEMO " --checkpoint-dir", 2, "tunegraph: --checkpoint-dir needs a value"},
        {"run " DEMO " --json", 2, "tunegraph: unknown option --json"},
        {"run " DEMO " -o x", 2, "tunegraph: unknown option -o"},
    };
    expect_all(cases, sizeof cases / sizeof cases[0]);
    /* 64 --set options are taken, the 65th is refused. */
    char line[4096] = "compile " DEMO " -o %s/p.tgp";
    for (int i = 0; i < 64; i++) strcat(line, " --set seed=1");
    expect(line, 0, NULL);
    strcat(line, " --set seed=2");
    expect(line, 2, "tunegraph: too many --set options (64 at most)");
    setenv("TUNEGRAPH_STEP_GROUP", "15", 1);
    expect("run " DEMO, 2, "TUNEGRAPH_STEP_GROUP needs a whole number from 0 to 14 (0: the executor's choice), got '15'");
    unsetenv("TUNEGRAPH_STEP_GROUP");
}

/* compile's default plan path: the job's name with its extension (after the last '/')
 * replaced by .tgp. */
TG_TEST(test_cli_main_compile_outputs) {
    if (cpu_build_only()) return;
    test_dir = tg_test_tmpdir();
    const char *dir = test_dir;
    char *job = tg_test_read_file(DEMO, NULL);
    REQUIRE(job, DEMO);
    char cwd[600], text[8192], path[800];
    REQUIRE(getcwd(cwd, sizeof cwd), "getcwd");
    /* The demo job with absolute data paths, so that it compiles from any folder. */
    snprintf(text, sizeof text, "model = tiny-bert\nnum_labels = 2\nbatch = 4\nseq = 16\nsteps = 1\n"
                                "train_data = %s/" TRAIN_DATA "\n", cwd);
    free(job);
    snprintf(path, sizeof path, "%s/sub.d", dir);
    REQUIRE(mkdir(path, 0755) == 0, "%s", path);
    static const struct { const char *job, *plan; } names[] = {
        {"a.job", "a.tgp"}, {"noext", "noext.tgp"}, {"sub.d/job", "sub.d/job.tgp"}, {"two.dots.job", "two.dots.tgp"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i].job);
        REQUIRE(tg_test_write_file(path, text) == 0, "%s", path);
        char line[2048];
        snprintf(line, sizeof line, "compile %s", path);
        tg_cli_run r = tg_test_cli_line(test_dir, line, NULL);
        char want[1600];
        snprintf(want, sizeof want, "compiled %s -> %s/%s: ", path, dir, names[i].plan);
        CHECK(r.status == 0 && r.out && !strncmp(r.out, want, strlen(want)), "%s: %d, stdout %s stderr %s", line,
              r.status, r.out ? r.out : "", r.err ? r.err : "");
        tg_cli_run_free(&r);
        snprintf(path, sizeof path, "%s/%s", dir, names[i].plan);
        struct stat st;
        CHECK(stat(path, &st) == 0 && st.st_size > 1000, "%s not written", path);
    }
    static const cli_case cases[] = {
        /* Never over an input of the plan, nor the job itself. */
        {"compile %s/a.job -o " TRAIN_DATA, 1, "sentiment-train.jsonl"},
        {"compile %s/a.job -o %s/a.job", 1, "a.job"},
        {"compile %s/a.job -o %s/no/such/p.tgp", 1, "no/such"},
        {"inspect %s/a.tgp --json", 0, NULL},
        {"inspect %s/a.job", 1, "a.job"},
    };
    expect_all(cases, sizeof cases / sizeof cases[0]);
}

/* run's refusals before training: outputs over inputs, checkpoint folders, run keys. */
TG_TEST(test_cli_main_run_refusals) {
    if (cpu_build_only()) return;
    test_dir = tg_test_tmpdir();
    const char *dir = test_dir;
    char path[800];
    snprintf(path, sizeof path, "%s/file", dir);
    REQUIRE(tg_test_write_file(path, "x\n") == 0, "%s", path);
    static const cli_case cases[] = {
        {"compile " DEMO " -o %s/p.tgp --set steps=2 --set batch=4 --set seq=16", 0, NULL},
        {"run %s/p.tgp --set lr=0.1", 1, "recompile"},
        {"run %s/p.tgp --metrics " TRAIN_DATA, 1, "sentiment-train.jsonl"},
        {"run %s/p.tgp --save %s/p.tgp", 1, "p.tgp"},
        {"run %s/p.tgp --metrics %s/no/such/m.jsonl", 1, "no/such"},
        {"run %s/p.tgp --save-dir " TRAIN_DATA, 1, "sentiment-train.jsonl"},
        {"run %s/p.tgp --set checkpoint_every=1", 1,
         "p.tgp: key 'checkpoint_every' (1) needs a folder for the checkpoints: key 'checkpoint_dir' or --checkpoint-dir"},
        {"run %s/p.tgp --checkpoint-dir %s/file/ck", 1, "file"},
        {"run %s/p.tgp --resume %s/none", 1, "none"},
        {"run %s/p.tgp --device cuda", 1, NULL},
        {"run %s/missing.tgp", 1, "missing.tgp"},
    };
    expect_all(cases, sizeof cases / sizeof cases[0]);
}

/* Started by a launcher as one of several ranks, run refuses what a rank cannot do before
 * any communicator is made: CPU ranks from torchrun (they meet through MPI), --nproc
 * inside a rank, a plan with another replica count than the world's; a world of one runs;
 * a launcher's variables in part or out of range are refused naming the variable. */
TG_TEST(test_cli_main_run_launched_ranks) {
    test_dir = tg_test_tmpdir();
    static const struct {
        const char *set[4];
        const char *extra;
        int status;
        const char *says;
    } cases[] = {
        {{"RANK=1", "WORLD_SIZE=4", "LOCAL_RANK=1", NULL}, "", 1,
         "tunegraph: started as rank 1 of 4 by torchrun on the CPU: CPU ranks meet through MPI, so start them with "
         "mpirun -np 4 (or run --nproc 4 --device cpu); torchrun starts GPU ranks (--device cuda)"},
        {{"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_RANK=0", NULL}, " --nproc 2", 1,
         "tunegraph: --nproc starts the rank processes itself, and this process is already rank 0 of 2 (started by "
         "mpirun): leave --nproc out"},
        {{"SLURM_PROCID=3", "SLURM_NTASKS=8", "SLURM_LOCALID=3", "SLURM_JOB_NODELIST=n[1-2]"}, " --set data_parallel=2",
         1, "tunegraph: --set data_parallel=2, and srun started 8 ranks (one replica each): set data_parallel to 8, or "
            "leave it out"},
        {{"RANK=0", "LOCAL_RANK=0", NULL, NULL}, "", 1, "environment variable WORLD_SIZE is not set, but RANK is"},
        {{"RANK=0", "WORLD_SIZE=1", "LOCAL_RANK=0", "MASTER_PORT=0"}, "", 1, "MASTER_PORT='0'"},
        {{"RANK=0", "WORLD_SIZE=1", "LOCAL_RANK=0", NULL}, "", 0, NULL},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        for (int v = 0; v < 4 && cases[k].set[v]; v++) putenv((char *)cases[k].set[v]);
        char line[512];
        snprintf(line, sizeof line, "run " DEMO " --set steps=1 --set batch=4 --set seq=16 --device cpu%s", cases[k].extra);
        expect(line, cases[k].status, cases[k].says);
        for (int v = 0; v < 4 && cases[k].set[v]; v++) {
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)strcspn(cases[k].set[v], "="), cases[k].set[v]);
            unsetenv(name);
        }
    }
    /* --nproc on the CPU without MPI, or on GPUs the machine lacks. */
    if (!tg_cpu_comm_mpi_built())
        expect("run " DEMO " --set steps=1 --nproc 2 --device cpu", 1,
               "tunegraph: --nproc 2 --device cpu runs the ranks under MPI, which this build lacks (install "
               "libopenmpi-dev and openmpi-bin, then rebuild); --set data_parallel=2 runs the replicas as threads of "
               "one process");
    if (!tg_cuda_built()) {
        expect("run " DEMO " --set steps=1 --nproc 2 --device cuda", 1,
               "tunegraph: --nproc 2 starts a rank process per GPU, and 0 GPUs are visible");
        putenv("RANK=1"), putenv("WORLD_SIZE=2"), putenv("LOCAL_RANK=1");
        expect("run " DEMO " --set steps=1 --device cuda", 1, "tunegraph: rank 1 of 2: no GPU visible");
        unsetenv("RANK"), unsetenv("WORLD_SIZE"), unsetenv("LOCAL_RANK");
    }
    /* mpirun not on PATH: the message says so, naming the PATH. */
    if (tg_cpu_comm_mpi_built()) {
        char *const path = getenv("PATH") ? tg_strdup(getenv("PATH")) : NULL;
        setenv("PATH", test_dir, 1);
        char want[1200];
        snprintf(want, sizeof want, "tunegraph: --nproc 2 --device cpu runs the ranks under mpirun, which cannot be run: "
                 "No such file or directory (PATH %s; Open MPI's openmpi-bin has it)\n", test_dir);
        tg_cli_run r = tg_test_cli_line(test_dir, "run " DEMO " --set steps=1 --nproc 2 --device cpu", NULL);
        if (path) setenv("PATH", path, 1);
        free(path);
        CHECK(r.status == 1 && r.err && !strcmp(r.err, want), "mpirun not on PATH: %d, %s", r.status, r.err ? r.err : "");
        tg_cli_run_free(&r);
    }
    expect("run " DEMO " --nproc 0", 2, "--nproc needs a whole number from 1 to 64 (rank processes, one per GPU), got '0'");
    expect("run " DEMO " --nproc", 2, "--nproc needs a value");
}

/* A run with checkpoints: each written, the folder then refused for a fresh run, resumed
 * from, and refused when resumed from an older step than it holds. */
TG_TEST(test_cli_main_run_checkpoints) {
    if (cpu_build_only()) return;
    test_dir = tg_test_tmpdir();
    static const cli_case cases[] = {
        {"compile " DEMO " -o %s/p.tgp --set steps=2 --set batch=4 --set seq=16 ", 0, NULL},
        {"run %s/p.tgp --checkpoint-dir %s/ck --set checkpoint_every=1", 0, "/ck/step-000002.tgckpt ("},
        {"run %s/p.tgp --checkpoint-dir %s/ck", 1,
         "/ck: the checkpoint folder already holds checkpoints (the newest step-000002.tgckpt): resume from them with "
         "--resume"},
        {"run %s/p.tgp --resume %s/ck/step-000001.tgckpt", 1,
         "/ck: the checkpoint folder holds step-000002.tgckpt, past step 1 resumed from: give --checkpoint-dir another "
         "folder"},
        {"run %s/p.tgp --resume %s/ck/step-000001.tgckpt --checkpoint-dir %s/ck2 --set checkpoint_every=1", 0,
         "/ck/step-000001.tgckpt at step 1 of 2"},
        {"run %s/p.tgp --resume %s/ck", 0, "at step 2 of 2"},
        {"run %s/p.tgp --resume %s/ck --set seed=5", 1, "seed"},
    };
    expect_all(cases, sizeof cases / sizeof cases[0]);
    /* No step left to take: the profile has no captured step to compare with. */
    char line[2048];
    snprintf(line, sizeof line, "run %s/p.tgp --resume %s/ck --profile", test_dir, test_dir);
    tg_cli_run r = tg_test_cli_line(test_dir, line, NULL);
    CHECK(r.status == 0 && r.err && strstr(r.err, "profile (ops launched one by one, mean of") &&
              !strstr(r.err, "the captured step took"),
          "%s: %d %s", line, r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
    char path[800];
    snprintf(path, sizeof path, "%s/ck2/step-000002.tgckpt", test_dir);
    struct stat st;
    CHECK(stat(path, &st) == 0, "%s missing: the resumed run's end was not checkpointed", path);
}

/* What a run reports: frozen parameters, length buckets, an LM's perplexity, the loop
 * trace, the profile into the metrics file. */
TG_TEST(test_cli_main_run_reports) {
    if (cpu_build_only()) return;
    test_dir = tg_test_tmpdir();
    const char *dir = test_dir;
    char line[2048], path[800];
    snprintf(line, sizeof line,
             "run " DEMO " --set steps=3 --set batch=4 --set seq=16 --set freeze=bert.embeddings.* "
             "--set seq_buckets=8,16 --metrics %s/m.jsonl --profile",
             dir);
    setenv("TUNEGRAPH_HOST_TRACE", "1", 1);
    tg_cli_run r = tg_test_cli_line(test_dir, line, NULL);
    unsetenv("TUNEGRAPH_HOST_TRACE");
    CHECK(r.status == 0, "%s: %d %s", line, r.status, r.err ? r.err : "");
    static const char *const says[] = {"batch 4 x seq 16 (length buckets 8,16), 3 steps (", "parameters trainable, ", " frozen",
                                       "loop trace (thread CPU us per step after the first): in tg_trainer_step",
                                       "thread trace (CPU us per step after the first, by thread): ",
                                       "(with length buckets)", "profile (ops launched one by one, mean of",
                                       "eval on 400 examples: loss ", ", accuracy "};
    for (size_t i = 0; r.err && i < sizeof says / sizeof says[0]; i++)
        CHECK(strstr(r.err, says[i]), "stderr lacks '%s': %s", says[i], r.err);
    tg_cli_run_free(&r);
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    char *m = tg_test_read_file(path, NULL);
    CHECK(m && strstr(m, "\"profile_op\": ") && strstr(m, "\"profile_op_index\": ") && strstr(m, "\"summary\": true"),
          "metrics: %s", m ? m : "(none)");
    free(m);

    snprintf(line, sizeof line, "run " DEMO_LM " --set steps=1 --set batch=4 --set seq=16");
    r = tg_test_cli_line(test_dir, line, NULL);
    CHECK(r.status == 0 && r.err && strstr(r.err, "eval on 200 examples: loss ") && strstr(r.err, ", perplexity ") &&
              !strstr(r.err, "accuracy"),
          "%s: %d %s", line, r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
}

/* Failures that end the process from a replica's thread run in the CLI binary: the CUDA
 * communicators of a CPU build, with two replicas. */
TG_TEST(test_cli_main_replica_failures) {
    if (cpu_build_only()) return;
    test_dir = tg_test_tmpdir();
    char cli_path[4096], cmd[8192], err_path[800];
    REQUIRE(realpath(tg_test_cli(), cli_path), "%s", tg_test_cli());
    snprintf(err_path, sizeof err_path, "%s/e.txt", test_dir);
    snprintf(cmd, sizeof cmd,
             "%s run " DEMO " --set steps=1 --set batch=4 --set seq=16 --set data_parallel=2 --device cuda "
             "--metrics %s/m.jsonl 2>%s",
             cli_path, test_dir, err_path);
    int st = system(cmd);
    char *err = tg_test_read_file(err_path, NULL);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1 && err && !strncmp(err, "tunegraph: ", 11), "exit %d: %s",
          WIFEXITED(st) ? WEXITSTATUS(st) : -1, err ? err : "");
    /* The metrics file holds the error. */
    char path[800];
    snprintf(path, sizeof path, "%s/m.jsonl", test_dir);
    char *m = tg_test_read_file(path, NULL);
    CHECK(m && strstr(m, "\"event\": \"error\""), "metrics: %s", m ? m : "(none)");
    free(m);
    free(err);
}

/* Data parallelism on the CPU: the follower replicas take their steps, hand over their part
 * of each checkpoint, profile with replica 0 and resume from the same checkpoint. */
TG_TEST(test_cli_main_data_parallel_checkpoints) {
    if (cpu_build_only()) return;
    test_dir = tg_test_tmpdir();
    static const cli_case cases[] = {
        {"compile " DEMO " -o %s/p.tgp --set steps=2 --set batch=4 --set seq=16 --set data_parallel=2", 0, NULL},
        {"run %s/p.tgp --checkpoint-dir %s/ck --set checkpoint_every=1 --profile --threads 1", 0,
         "/ck/step-000002.tgckpt ("},
        {"run %s/p.tgp --resume %s/ck/step-000001.tgckpt --checkpoint-dir %s/ck2 --set checkpoint_every=1", 0,
         "at step 1 of 2"},
        {"run %s/p.tgp --resume %s/ck/step-000002.tgckpt --checkpoint-dir %s/ck3", 0, "at step 2 of 2"},
    };
    expect_all(cases, sizeof cases / sizeof cases[0]);
    /* The resumed run's last step is checkpointed in its folder (both replicas' parts). */
    char path[800];
    snprintf(path, sizeof path, "%s/ck2/step-000002.tgckpt", test_dir);
    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_size > 1000, "%s missing", path);
}

/* The job's own checkpoint_dir (a run key), and a checkpoint resumed from by a path
 * without a folder: its folder is the current one. */
TG_TEST(test_cli_main_checkpoint_folders) {
    if (cpu_build_only()) return;
    test_dir = tg_test_tmpdir();
    char cwd[1024], dir[800], line[2048], text[2048];
    REQUIRE(getcwd(cwd, sizeof cwd), "getcwd");
    /* Absolute data paths: the plan runs from another folder below. */
    snprintf(text, sizeof text, "model = tiny-bert\nnum_labels = 2\nbatch = 4\nseq = 16\nsteps = 2\n"
                                "train_data = %s/" TRAIN_DATA "\n", cwd);
    snprintf(dir, sizeof dir, "%s/abs.job", test_dir);
    REQUIRE(tg_test_write_file(dir, text) == 0, "%s", dir);
    static const cli_case cases[] = {
        {"compile %s/abs.job -o %s/p.tgp", 0, NULL},
        {"run %s/p.tgp --set checkpoint_dir=%s/job-ck --set checkpoint_every=2", 0, "/job-ck/step-000002.tgckpt ("},
    };
    expect_all(cases, sizeof cases / sizeof cases[0]);
    snprintf(dir, sizeof dir, "%s/job-ck", test_dir);
    REQUIRE(chdir(dir) == 0, "%s", dir);
    snprintf(line, sizeof line, "run %s/p.tgp --resume step-000002.tgckpt", test_dir);
    tg_cli_run r = tg_test_cli_line(test_dir, line, NULL);
    int back = chdir(cwd);
    REQUIRE(back == 0, "chdir back to %s", cwd);
    CHECK(r.status == 0 && r.err && strstr(r.err, "resumed from step-000002.tgckpt at step 2 of 2"), "%s: %d %s", line,
          r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
}

/* Failures after the training: the weights cannot be written, the metrics file cannot be
 * put in place. The run exits 1 naming the file. */
TG_TEST(test_cli_main_run_late_failures) {
    if (cpu_build_only()) return;
    test_dir = tg_test_tmpdir();
    static const cli_case cases[] = {
        {"compile " DEMO " -o %s/p.tgp --set steps=1 --set batch=4 --set seq=16", 0, NULL},
        {"run %s/p.tgp --save /dev/full", 1, "tunegraph: /dev/full: cannot write the safetensors file"},
        {"run %s/p.tgp --save /dev/full --checkpoint-dir %s/ck --metrics %s/m.jsonl", 1, "/dev/full"},
        {"run %s/p.tgp --metrics /dev/full", 1, "/dev/full"},
    };
    expect_all(cases, sizeof cases / sizeof cases[0]);
    /* The failed run's metrics end with its error. */
    char path[800];
    snprintf(path, sizeof path, "%s/m.jsonl", test_dir);
    char *m = tg_test_read_file(path, NULL);
    CHECK(m && strstr(m, "{\"event\": \"error\", \"message\": \"/dev/full: cannot write the safetensors file"),
          "metrics: %s", m ? m : "(none)");
    free(m);
}

/* An LM eval set whose rows are one token each has nothing to count: no loss, no
 * perplexity, and the run says why. The loader thread switched off changes nothing else. */
TG_TEST(test_cli_main_eval_nothing_counted) {
    if (cpu_build_only()) return;
    test_dir = tg_test_tmpdir();
    char path[800];
    snprintf(path, sizeof path, "%s/eval.jsonl", test_dir);
    REQUIRE(tg_test_write_file(path, "{\"input_ids\": [5]}\n{\"input_ids\": [7]}\n") == 0, "%s", path);
    setenv("TUNEGRAPH_LOADER_THREAD", "0", 1);
    expect("run " DEMO_LM " --set steps=1 --set batch=4 --set seq=16 --set eval_data=%s/eval.jsonl --metrics %s/m.jsonl",
           0, "eval on 2 examples: no tokens to count in eval_data, so no loss or perplexity");
    setenv("TUNEGRAPH_LOADER_THREAD", "1", 1);
    expect("run " DEMO_LM " --set steps=1 --set batch=4 --set seq=16", 0, "trained 1 steps");
    unsetenv("TUNEGRAPH_LOADER_THREAD");
    snprintf(path, sizeof path, "%s/m.jsonl", test_dir);
    char *m = tg_test_read_file(path, NULL);
    CHECK(m && strstr(m, "\"eval_loss\": null, \"eval_loss_error\": \"no tokens to count in eval_data\""), "metrics: %s",
          m ? m : "(none)");
    free(m);
}

/* data convert's option errors, each a usage error naming the option and the value. */
TG_TEST(test_cli_main_data_convert_options) {
    if (cpu_build_only()) return;
    test_dir = tg_test_tmpdir();
    static const cli_case cases[] = {
        {"data convert in.csv -o out --tokenizer", 2, "tunegraph: --tokenizer needs a value"},
        {"data convert in.csv -o", 2, "tunegraph: -o needs a value"},
        {"data convert in.csv --format", 2, "tunegraph: --format needs a value"},
        {"data convert in.csv --format xml", 2,
         "--format must be csv, tsv, jsonl, squad, text, folders, instruct, idx or images, got 'xml'"},
        {"data convert in.csv --seq 1", 2, "--seq needs a whole number from 2 to 4194304, got '1'"},
        {"data convert in.csv --seq 4194305", 2, "--seq needs a whole number from 2 to 4194304, got '4194305'"},
        {"data convert in.csv --seq 12x", 2, "--seq needs a whole number from 2 to 4194304, got '12x'"},
        {"data convert in.csv --seq 99999999999999999999", 2, "--seq needs a whole number from 2 to 4194304"},
        {"data convert in.csv --doc-stride -1", 2, "--doc-stride needs a whole number >= 0, got '-1'"},
        {"data convert in.csv --eval-fraction 1", 2, "--eval-fraction needs a number in [0, 1), got '1'"},
        {"data convert in.csv --eval-fraction -0.1", 2, "--eval-fraction needs a number in [0, 1), got '-0.1'"},
        {"data convert in.csv --eval-fraction 0.1x", 2, "--eval-fraction needs a number in [0, 1), got '0.1x'"},
        {"data convert in.csv --eval-fraction nan", 2, "--eval-fraction needs a number in [0, 1), got 'nan'"},
        {"data convert in.csv --seed -1", 2, "--seed needs a whole number from 0 to 2^64-1, got '-1'"},
        {"data convert in.csv --seed 7x", 2, "--seed needs a whole number from 0 to 2^64-1, got '7x'"},
        {"data convert in.csv --seed 99999999999999999999", 2, "--seed needs a whole number from 0 to 2^64-1"},
        {"data convert in.csv --bogus", 2, "tunegraph: unknown option --bogus"},
        {"data convert -o out --tokenizer t", 2, "tunegraph: missing INPUT"},
        {"data convert in.csv --tokenizer t", 2, "tunegraph: missing -o OUTDIR"},
        {"data convert in.csv -o out", 2, "tunegraph: missing --tokenizer PATH"},
        {"data convert in.csv -o out --tokenizer t --seed 3", 2, "--seed picks the eval split: give --eval-fraction too"},
        {"data convert in.csv -o out --tokenizer %s/none.txt --seed 3 --eval-fraction 0.5 --text-column a "
         "--pair-column b --label-column c --labels x,y --doc-stride 8 --seq 32 --format csv --skip-invalid",
         1, "none.txt"},
        {"data dump", 2, "tunegraph: missing SET"},
        {"data dump a.jsonl b.jsonl", 2, "tunegraph: data dump takes one SET, got a second: b.jsonl"},
        {"data dump a.jsonl -o", 2, "tunegraph: -o needs a value"},
        {"data dump a.jsonl --json", 2, "tunegraph: unknown option --json"},
    };
    expect_all(cases, sizeof cases / sizeof cases[0]);
}

/* The last allocations of a compile (the plan's path, the inputs the output may not
 * replace, the plan file's writing) failed one at a time: exit 1 with an out-of-memory
 * message, and no plan file. */
TG_TEST(test_cli_main_compile_out_of_memory) {
    if (cpu_build_only()) return;
    test_dir = tg_test_tmpdir();
    char job[800], plan[800], line[2048];
    snprintf(job, sizeof job, "%s/j.job", test_dir);
    snprintf(plan, sizeof plan, "%s/j.tgp", test_dir);
    char cwd[600], text[2048];
    REQUIRE(getcwd(cwd, sizeof cwd), "getcwd");
    snprintf(text, sizeof text, "model = tiny-bert\nnum_labels = 2\nbatch = 4\nseq = 16\nsteps = 1\n"
                                "train_data = %s/" TRAIN_DATA "\n", cwd);
    REQUIRE(tg_test_write_file(job, text) == 0, "%s", job);
    for (int with_o = 0; with_o < 2; with_o++) {
        if (with_o) snprintf(line, sizeof line, "compile %s -o %s", job, plan);
        else snprintf(line, sizeof line, "compile %s", job);
        tg_alloc_fail_after(-1);
        tg_cli_run r = tg_test_cli_line(test_dir, line, NULL);
        const long total = tg_alloc_fail_after(-1);
        REQUIRE(r.status == 0, "%s: %d %s", line, r.status, r.err ? r.err : "");
        tg_cli_run_free(&r);
        int failed = 0;
        for (long k = total > 40 ? total - 40 : 0; k < total; k++) {
            remove(plan);
            tg_alloc_fail_after(k);
            r = tg_test_cli_line(test_dir, line, NULL);
            tg_alloc_fail_after(-1);
            struct stat st;
            if (r.status == 0) {
                CHECK(stat(plan, &st) == 0, "%s succeeded without a plan", line);
            } else {
                failed++;
                CHECK(r.status == 1 && r.err &&
                          (strstr(r.err, "out of memory") || strstr(r.err, "Cannot allocate memory")),
                      "%s, allocation %ld: exit %d: %s", line, k, r.status, r.err ? r.err : "");
                CHECK(stat(plan, &st) != 0, "%s, allocation %ld: a failed compile left its plan", line, k);
            }
            tg_cli_run_free(&r);
        }
        CHECK(failed > 0, "%s: none of the last 40 of %ld allocations failed the compile", line, total);
    }
}

/* Help and version from the CLI binary itself: standard output, exit 0. */
TG_TEST(test_cli_main_binary_help_and_version) {
    if (cpu_build_only()) return;
    test_dir = tg_test_tmpdir();
    char cli_path[4096], cmd[8192], out_path[800];
    REQUIRE(realpath(tg_test_cli(), cli_path), "%s", tg_test_cli());
    snprintf(out_path, sizeof out_path, "%s/o.txt", test_dir);
    static const char *const words[] = {"--version", "version", "-h", "--help", "help"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s %s >%s 2>/dev/null", cli_path, words[i], out_path);
        int st = system(cmd);
        char *out = tg_test_read_file(out_path, NULL);
        const char *want = i < 2 ? TG_VERSION_STRING "\n" : "usage:\n";
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && out && !strncmp(out, want, strlen(want)), "%s: exit %d, '%s'",
              words[i], WIFEXITED(st) ? WEXITSTATUS(st) : -1, out ? out : "");
        free(out);
    }
}

/* Reads the SigIgn and SigCgt masks of process pid once it runs the CLI (its exec done:
 * until then it has this process's handlers); 0 on success. */
static int signal_masks(pid_t pid, unsigned long long *ignored, unsigned long long *caught) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
    FILE *c = fopen(path, "r");
    int is_cli = c && fgets(line, sizeof line, c) && !strcmp(line, "tunegraph\n");
    if (c) fclose(c);
    if (!is_cli) return -1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "SigIgn: %llx", ignored) == 1) found |= 1;
        if (sscanf(line, "SigCgt: %llx", caught) == 1) found |= 2;
    }
    fclose(f);
    return found == 3 ? 0 : -1;
}

/* A signal the caller ignores (nohup) stays ignored; the others get the CLI's handler. The
 * run waits on a FIFO as its training data while its handlers are read, then fails on what
 * comes through it, ending normally. */
TG_TEST(test_cli_main_ignored_signal_stays_ignored) {
    if (cpu_build_only()) return;
    test_dir = tg_test_tmpdir();
    char cli_path[4096], fifo[800], err_path[800], setting[900];
    REQUIRE(realpath(tg_test_cli(), cli_path), "%s", tg_test_cli());
    snprintf(fifo, sizeof fifo, "%s/train.fifo", test_dir);
    snprintf(err_path, sizeof err_path, "%s/e.txt", test_dir);
    snprintf(setting, sizeof setting, "train_data=%s", fifo);
    REQUIRE(mkfifo(fifo, 0600) == 0, "mkfifo %s", fifo);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0, "fork");
    if (pid == 0) {
        /* Whatever the suite was started with (a background job starts with SIGINT
         * ignored): the others at their defaults, so only SIGHUP is ignored. */
        signal(SIGINT, SIG_DFL), signal(SIGTERM, SIG_DFL), signal(SIGPIPE, SIG_DFL);
        signal(SIGHUP, SIG_IGN);
        int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, STDERR_FILENO);
        execl(cli_path, "tunegraph", "run", DEMO, "--set", "steps=1", "--set", setting, (char *)NULL);
        _exit(127);
    }
    unsigned long long ignored = 0, caught = 0;
    const unsigned long long bit_hup = 1ull << (SIGHUP - 1), bit_int = 1ull << (SIGINT - 1),
                             bit_term = 1ull << (SIGTERM - 1), bit_pipe = 1ull << (SIGPIPE - 1);
    int seen = 0;
    for (int i = 0; i < 2000 && !seen; i++) { /* up to 20 s for the handlers to be set */
        seen = signal_masks(pid, &ignored, &caught) == 0 && (caught & bit_int);
        if (!seen) usleep(10000);
    }
    CHECK(seen, "the run's handlers never appeared");
    CHECK((ignored & bit_hup) && !(caught & bit_hup), "SIGHUP: ignored %d, caught %d", !!(ignored & bit_hup),
          !!(caught & bit_hup));
    CHECK((caught & bit_term) && (caught & bit_pipe), "SIGTERM caught %d, SIGPIPE caught %d", !!(caught & bit_term),
          !!(caught & bit_pipe));
    /* Feed the FIFO something that is not JSON once the run opens it (up to 60 s), unless
     * the run ended before. */
    int fd = -1, st = 0, ended = 0;
    for (int i = 0; i < 6000 && fd < 0 && !ended; i++) {
        fd = open(fifo, O_WRONLY | O_NONBLOCK);
        if (fd < 0) {
            ended = waitpid(pid, &st, WNOHANG) == pid;
            if (!ended) usleep(10000);
        }
    }
    if (fd >= 0) {
        int wrote = (int)write(fd, "not json\n", 9);
        close(fd);
        CHECK(wrote == 9, "write to the FIFO");
    } else if (!ended) {
        kill(pid, SIGKILL);
    }
    if (!ended) waitpid(pid, &st, 0);
    char *err = tg_test_read_file(err_path, NULL);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1 && err && strstr(err, "train.fifo"), "exit %d: %s",
          WIFEXITED(st) ? WEXITSTATUS(st) : -1, err ? err : "");
    free(err);
}

/* A model folder whose weights hold every parameter: the run reports them all loaded and
 * none newly initialised. */
TG_TEST(test_cli_main_run_reports_loaded_weights) {
    if (cpu_build_only()) return;
    test_dir = tg_test_tmpdir();
    char path[800], cwd[600], text[2048];
    snprintf(path, sizeof path, "%s/model", test_dir);
    REQUIRE(mkdir(path, 0755) == 0, "%s", path);
    snprintf(path, sizeof path, "%s/model/config.json", test_dir);
    char *config = tg_test_read_file("models/presets/tiny-bert/config.json", NULL);
    REQUIRE(config && tg_test_write_file(path, config) == 0, "%s", path);
    free(config);
    REQUIRE(getcwd(cwd, sizeof cwd), "getcwd");
    snprintf(text, sizeof text, "model = %s/model\nnum_labels = 2\nbatch = 4\nseq = 16\nsteps = 1\n"
                                "train_data = %s/" TRAIN_DATA "\n", test_dir, cwd);
    snprintf(path, sizeof path, "%s/j.job", test_dir);
    REQUIRE(tg_test_write_file(path, text) == 0, "%s", path);
    static const cli_case cases[] = {
        {"run " DEMO " --set steps=1 --set batch=4 --set seq=16 --save %s/model/model.safetensors", 0, NULL},
        {"run %s/j.job", 0, "/model/model.safetensors (41 trainable, 0 frozen, 0 buffers; 0 newly initialised)"},
    };
    expect_all(cases, sizeof cases / sizeof cases[0]);
}

/* Runs tunegraph_cli_main on `line` (as tg_test_cli_line(test_dir, , NULL) does) with stderr on a terminal (a pty):
 * its status, and what the terminal received into *text (malloc'd). */
static int cli_on_terminal(const char *line, char **text) {
    *text = NULL;
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) || unlockpt(master)) return -1;
    int slave = open(ptsname(master), O_RDWR | O_NOCTTY);
    if (slave < 0) return -1;
    char words[4096], *argv[64];
    int argc = 0;
    argv[argc++] = "tunegraph";
    snprintf(words, sizeof words, line, test_dir, test_dir, test_dir);
    for (char *w = strtok(words, " "); w && argc < 63; w = strtok(NULL, " ")) argv[argc++] = w;
    argv[argc] = NULL;
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    dup2(slave, STDERR_FILENO);
    int status = tunegraph_cli_main(argc, argv);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(slave);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    fcntl(master, F_SETFL, O_NONBLOCK);
    for (ssize_t n; buf && len + 1 < cap && (n = read(master, buf + len, cap - len - 1)) > 0;) len += (size_t)n;
    if (buf) buf[len] = 0;
    close(master);
    *text = buf;
    return status;
}

/* On a terminal the progress line is redrawn in place (\r), and a checkpoint's line starts
 * on a line of its own. */
TG_TEST(test_cli_main_progress_on_a_terminal) {
    if (cpu_build_only()) return;
    test_dir = tg_test_tmpdir();
    expect("compile " DEMO " -o %s/p.tgp --set steps=2 --set batch=4 --set seq=16", 0, NULL);
    char *text = NULL;
    int status = cli_on_terminal("run %s/p.tgp --checkpoint-dir %s/ck --set checkpoint_every=1", &text);
    CHECK(status == 0, "exit %d: %s", status, text ? text : "");
    CHECK(text && strstr(text, "\rstep 1/2  loss ") && strstr(text, "\rstep 2/2  loss ") &&
              strstr(text, "\ncheckpoint ") && strstr(text, "/ck/step-000002.tgckpt ("),
          "terminal: %s", text ? text : "(none)");
    free(text);
}
