/* `tunegraph run --artifact DIR`, in process on the demo job's tiny BERT on the CPU: the
 * job as written and resolved, the plan file (the same bytes as compiling the job again),
 * the environment, the metrics, the profile, the plots, and a manifest that lists every
 * file with its size and xxh64; a plan given as input, a run that fails, the refusals; and
 * the manifest reader's refusals (cli/artifact_manifest.c). */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "api/front.h"
#include "cli/artifact_manifest.h"
#include "plan/plan_file.h"
#include "tests/cli_in_process.h"
#include "tests/harness.h"

#define ARTIFACT_JOB "examples/demo-classify.job"
#define ARTIFACT_SETS "--set steps=3 --set batch=4 --set seq=16 --threads 1"

/* The xxh64 of a whole file as 16 hex digits into hex; its size, or -1. */
static long file_hash(const char *path, char hex[17]) {
    long len = 0;
    char *data = tg_test_read_file(path, &len);
    if (!data) return -1;
    snprintf(hex, 17, "%016llx", (unsigned long long)XXH64(data, (size_t)len, 0));
    free(data);
    return len;
}

/* Counts the regular files under dir/rel, manifest.json at the top left out. */
static int count_files(const char *dir, const char *rel) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    DIR *d = opendir(path);
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || (!rel[0] && !strcmp(e->d_name, "manifest.json"))) continue;
        char sub[1200], full[2400];
        snprintf(sub, sizeof sub, "%s%s", rel, e->d_name);
        snprintf(full, sizeof full, "%s/%s", dir, sub);
        struct stat st;
        if (stat(full, &st)) continue;
        if (S_ISDIR(st.st_mode)) {
            strcat(sub, "/");
            n += count_files(dir, sub);
        } else {
            n++;
        }
    }
    closedir(d);
    return n;
}

/* The manifest of artifact dir: every listed file's size and hash, and every file listed. */
static json_t *check_artifact_manifest(const char *dir) {
    char path[1200];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    json_error_t jerr;
    json_t *m = json_load_file(path, 0, &jerr);
    if (!CHECK(m, "%s: %s", path, jerr.text)) return NULL;
    CHECK(!strcmp(json_string_value(json_object_get(m, "format")), "tunegraph-artifact") &&
              json_integer_value(json_object_get(m, "version")) == 1,
          "manifest header");
    json_t *f;
    size_t i;
    json_array_foreach(json_object_get(m, "files"), i, f) {
        const char *name = json_string_value(json_object_get(f, "path"));
        char hex[17];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        const long len = file_hash(path, hex);
        CHECK(len >= 0 && json_integer_value(json_object_get(f, "bytes")) == len, "%s: %ld bytes", name, len);
        CHECK(len >= 0 && !strcmp(hex, json_string_value(json_object_get(f, "xxh64"))), "%s: hash %s", name, hex);
    }
    CHECK((int)json_array_size(json_object_get(m, "files")) == count_files(dir, ""), "the manifest lists %zu of %d files",
          json_array_size(json_object_get(m, "files")), count_files(dir, ""));
    return m;
}

/* The `why` of the manifest's absent entry for `what`, or NULL. */
static const char *absent_why(json_t *m, const char *what) {
    json_t *a;
    size_t i;
    json_array_foreach(json_object_get(m, "absent"), i, a) if (!strcmp(json_string_value(json_object_get(a, "what")), what))
        return json_string_value(json_object_get(a, "why"));
    return NULL;
}

TG_TEST(test_cli_artifact_of_a_run) {
    const char *dir = tg_test_tmpdir();
    char line[2048], path[1200], art[900], hex[17];
    snprintf(art, sizeof art, "%s/runs/a", dir); /* its parent is made too */
    snprintf(line, sizeof line, "run " ARTIFACT_JOB " " ARTIFACT_SETS " --profile --artifact %s", art);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    CHECK(strstr(r.err, "artifact ") && strstr(r.err, "(manifest.json lists its files)"), "stderr: %s", r.err);
    tg_cli_run_free(&r);
    json_t *m = check_artifact_manifest(art);
    REQUIRE(m, "no manifest");
    CHECK(!strcmp(json_string_value(json_object_get(m, "command")), "run"), "command");
    /* The job as written, byte for byte, and its hash. */
    snprintf(path, sizeof path, "%s/job.job", art);
    long len = file_hash(path, hex);
    char job_hex[17];
    CHECK(len > 0 && file_hash(ARTIFACT_JOB, job_hex) == len && !strcmp(hex, job_hex), "job.job is not the job");
    CHECK(!strcmp(json_string_value(json_object_get(m, "job_xxh64")), job_hex), "job_xxh64");
    /* The plan: the bytes compiling the job with the same overrides gives. */
    const char *sets[] = {"steps=3", "batch=4", "seq=16"};
    tg_plan plan;
    tg_err err = {{0}};
    REQUIRE(tg_front_compile_file(ARTIFACT_JOB, sets, 3, &plan, &err) == 0, "%s", err.msg);
    uint8_t *bytes;
    size_t n_bytes;
    REQUIRE(tg_plan_encode(&plan, &bytes, &n_bytes, &err) == 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/plan.tgp", art);
    long plan_len = 0;
    char *plan_file = tg_test_read_file(path, &plan_len);
    CHECK(plan_file && (size_t)plan_len == n_bytes && !memcmp(plan_file, bytes, n_bytes), "plan.tgp differs from the compile");
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH64(bytes, n_bytes, 0));
    CHECK(!strcmp(json_string_value(json_object_get(m, "plan_xxh64")), hex), "plan_xxh64");
    char fingerprint[17];
    snprintf(fingerprint, sizeof fingerprint, "%016llx", (unsigned long long)plan.fingerprint);
    CHECK(!strcmp(json_string_value(json_object_get(m, "plan_fingerprint")), fingerprint), "plan_fingerprint");
    free(plan_file), free(bytes);
    tg_plan_free(&plan);
    /* The job as resolved: the overrides and the plan's settings. */
    snprintf(path, sizeof path, "%s/job.resolved.json", art);
    json_t *resolved = json_load_file(path, 0, NULL);
    REQUIRE(resolved, "%s", path);
    json_t *overrides = json_object_get(resolved, "overrides");
    CHECK(json_array_size(overrides) == 3 && !strcmp(json_string_value(json_array_get(overrides, 1)), "batch=4"),
          "overrides");
    CHECK(json_integer_value(json_object_get(json_object_get(resolved, "train"), "batch")) == 4 &&
              json_integer_value(json_object_get(json_object_get(resolved, "run"), "steps")) == 3 &&
              !strcmp(json_string_value(json_object_get(json_object_get(resolved, "model"), "source")), "tiny-bert") &&
              !strcmp(json_string_value(json_object_get(resolved, "fingerprint")), fingerprint),
          "resolved settings");
    json_decref(resolved);
    /* The environment: the CPU, the kernel, the compiler; no GPU on a CPU run, and on a GPU
     * run (the default device where the suite runs on CUDA) the GPU's name from CUDA. */
    snprintf(path, sizeof path, "%s/environment.json", art);
    json_t *env = json_load_file(path, 0, NULL);
    REQUIRE(env, "%s", path);
    json_t *host = json_object_get(env, "host");
    CHECK(json_string_length(json_object_get(host, "kernel")) > 0 && json_integer_value(json_object_get(host, "cpus_online")) > 0,
          "host");
    CHECK(json_string_length(json_object_get(host, "cpu_model")) > 0 || absent_why(env, "host.cpu_model"), "cpu model");
    CHECK(!strncmp(json_string_value(json_object_get(json_object_get(env, "build"), "compiler")), "gcc ", 4) ||
              !strncmp(json_string_value(json_object_get(json_object_get(env, "build"), "compiler")), "clang ", 6),
          "compiler");
    if (tg_test_device())
        CHECK(!strcmp(json_string_value(json_object_get(env, "device")), "cuda") &&
                  json_string_length(json_object_get(json_object_get(env, "gpu"), "name")) > 0 && !absent_why(env, "gpu"),
              "gpu on a CUDA run");
    else
        CHECK(!strcmp(json_string_value(json_object_get(env, "device")), "cpu") && !json_object_get(env, "gpu") &&
                  absent_why(env, "gpu") && !strcmp(absent_why(env, "gpu"), "the run was on the CPU"),
              "gpu");
    json_decref(env);
    /* The metrics (three steps and the summary), the profile lines alone, the plots. */
    snprintf(path, sizeof path, "%s/metrics.jsonl", art);
    char *metrics = tg_test_read_file(path, NULL);
    CHECK(metrics && strstr(metrics, "{\"step\": 3,") && strstr(metrics, "\"summary\": true"), "metrics");
    free(metrics);
    snprintf(path, sizeof path, "%s/profile.jsonl", art);
    char *profile = tg_test_read_file(path, NULL);
    int lines = 0, profile_lines = 0;
    for (char *l = profile ? strtok(profile, "\n") : NULL; l; l = strtok(NULL, "\n"))
        lines++, profile_lines += !strncmp(l, "{\"profile_", 10);
    CHECK(lines > 0 && lines == profile_lines && profile_lines > 5, "profile.jsonl: %d lines, %d profile lines", lines,
          profile_lines);
    free(profile);
    static const char *const plots[] = {"plots/loss.svg", "plots/throughput.svg", "plots/phases.svg",
                                        "plots/kernel_groups.svg"};
    for (size_t k = 0; k < 4; k++) {
        snprintf(path, sizeof path, "%s/%s", art, plots[k]);
        struct stat st;
        CHECK(stat(path, &st) == 0 && st.st_size > 100, "%s", path);
    }
    CHECK(json_array_size(json_object_get(m, "absent")) == 0, "parts absent from a whole run");
    json_decref(m);
}

/* A run with its own --metrics: the file is copied into the artifact as it is. A plan file
 * given as input: no job.job, said in the manifest. */
TG_TEST(test_cli_artifact_own_metrics_and_plan_input) {
    const char *dir = tg_test_tmpdir();
    char line[2048], path[1200], art[900];
    snprintf(line, sizeof line, "compile " ARTIFACT_JOB " -o %s/p.tgp --set steps=2 --set batch=4 --set seq=16", dir);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "compile: %s", r.err);
    tg_cli_run_free(&r);
    snprintf(art, sizeof art, "%s/art", dir);
    snprintf(line, sizeof line, "run %s/p.tgp --threads 1 --metrics %s/m.jsonl --artifact %s", dir, dir, art);
    r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
    json_t *m = check_artifact_manifest(art);
    REQUIRE(m, "no manifest");
    char own_hex[17], copy_hex[17];
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    const long own = file_hash(path, own_hex);
    snprintf(path, sizeof path, "%s/metrics.jsonl", art);
    CHECK(own > 0 && file_hash(path, copy_hex) == own && !strcmp(own_hex, copy_hex), "metrics.jsonl is not --metrics's");
    const char *why = absent_why(m, "job.job");
    CHECK(why && !strcmp(why, "the run was given a plan file, not a job") && json_is_null(json_object_get(m, "job_xxh64")),
          "job.job absent: %s", why ? why : "(not said)");
    char plan_hex[17];
    snprintf(path, sizeof path, "%s/p.tgp", dir);
    const long plan_len = file_hash(path, plan_hex);
    snprintf(path, sizeof path, "%s/plan.tgp", art);
    CHECK(plan_len > 0 && file_hash(path, copy_hex) == plan_len && !strcmp(plan_hex, copy_hex),
          "the artifact's plan is not the plan run");
    json_decref(m);
}

/* A run that fails to compile still leaves an artifact saying what is missing and why. */
TG_TEST(test_cli_artifact_of_a_failed_run) {
    const char *dir = tg_test_tmpdir();
    char line[2048], art[900];
    snprintf(art, sizeof art, "%s/art", dir);
    snprintf(line, sizeof line, "run " ARTIFACT_JOB " --set lr=fast --artifact %s", art);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 1, "exit %d: %s", r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
    json_t *m = check_artifact_manifest(art);
    REQUIRE(m, "no manifest");
    const char *plan_why = absent_why(m, "plan.tgp"), *metrics_why = absent_why(m, "metrics.jsonl");
    CHECK(plan_why && strstr(plan_why, "--set lr=fast: key 'lr'"), "plan.tgp: %s", plan_why ? plan_why : "(not said)");
    CHECK(metrics_why && strstr(metrics_why, "metrics.jsonl"), "metrics.jsonl: %s", metrics_why ? metrics_why : "(not said)");
    CHECK(absent_why(m, "plots") != NULL, "plots not said absent");
    json_decref(m);
}

TG_TEST(test_cli_artifact_refusals) {
    const char *dir = tg_test_tmpdir();
    char line[2048], art[900], path[1200];
    snprintf(art, sizeof art, "%s/full", dir);
    mkdir(art, 0777);
    snprintf(path, sizeof path, "%s/old.txt", art);
    REQUIRE(tg_test_write_file(path, "x") == 0, "%s", path);
    snprintf(line, sizeof line, "run " ARTIFACT_JOB " " ARTIFACT_SETS " --artifact %s", art);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 1 && strstr(r.err, "full: the artifact folder is not empty: give a new or empty folder") &&
              !strstr(r.err, "trained"),
          "exit %d: %s", r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
    r = tg_test_cli_line(dir, "run " ARTIFACT_JOB " --artifact", NULL);
    CHECK(r.status == 2 && strstr(r.err, "tunegraph run: --artifact needs a folder"), "exit %d: %s", r.status, r.err);
    tg_cli_run_free(&r);
    snprintf(line, sizeof line, "run " ARTIFACT_JOB " --artifact %s/a --artifact %s/b", dir, dir);
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 2 && strstr(r.err, "tunegraph run: --artifact given twice"), "exit %d: %s", r.status, r.err);
    tg_cli_run_free(&r);
    /* A usage error of run itself leaves no artifact folder behind. */
    snprintf(line, sizeof line, "run " ARTIFACT_JOB " --bogus --artifact %s/u", dir);
    r = tg_test_cli_line(dir, line, NULL);
    snprintf(path, sizeof path, "%s/u", dir);
    struct stat st;
    CHECK(r.status == 2 && stat(path, &st) != 0, "exit %d, folder %s", r.status, stat(path, &st) ? "absent" : "left");
    tg_cli_run_free(&r);
}

TG_TEST(test_cli_artifact_manifest_reader) {
    static const char good[] =
        "{\"format\": \"tunegraph-artifact\", \"version\": 1, \"command\": \"run\", \"job_xxh64\": \"00112233445566ff\", "
        "\"plan_xxh64\": null, \"files\": [{\"path\": \"a/b.txt\", \"bytes\": 3, \"xxh64\": \"0123456789abcdef\"}], "
        "\"absent\": [{\"what\": \"plan.tgp\", \"why\": \"no plan\"}]}";
    artifact_manifest m;
    tg_err err = {{0}};
    REQUIRE(artifact_manifest_parse("m.json", good, strlen(good), &m, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(m.command, "run") && m.n_files == 1 && !strcmp(m.files[0].path, "a/b.txt") && m.files[0].bytes == 3 &&
              m.files[0].xxh64 == 0x0123456789abcdefull && !strcmp(m.job_xxh64, "00112233445566ff") && !m.plan_xxh64[0] &&
              m.n_absent == 1 && artifact_manifest_find(&m, "a/b.txt") == &m.files[0] && !artifact_manifest_find(&m, "b"),
          "parsed manifest");
    artifact_manifest_free(&m);
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"[]", "m.json: not a JSON object"},
        {"{", "m.json: not JSON: "},
        {"{\"format\": \"x\"}", "field 'format' is not \"tunegraph-artifact\""},
        {"{\"format\": \"tunegraph-artifact\", \"version\": 2}", "field 'version' is not 1"},
        {"{\"format\": \"tunegraph-artifact\", \"version\": 1, \"command\": \"plot\"}", "field 'command' is not"},
        {"{\"format\": \"tunegraph-artifact\", \"version\": 1, \"command\": \"run\"}", "field 'files' is not an array"},
        {"{\"format\": \"tunegraph-artifact\", \"version\": 1, \"command\": \"run\", \"files\": [], \"format\": 1}",
         "key 'format' appears twice"},
        {"{\"format\": \"tunegraph-artifact\", \"version\": 1, \"command\": \"run\", \"files\": [], \"job_xxh64\": \"ABC\"}",
         "field 'job_xxh64' is not 16 lower-case hex digits or null"},
        {"{\"format\": \"tunegraph-artifact\", \"version\": 1, \"command\": \"run\", \"files\": [], \"absent\": [1]}",
         "field 'absent'[0] is not an object with strings what and why"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        CHECK(artifact_manifest_parse("m.json", bad[k].text, strlen(bad[k].text), &m, &err) == -1 &&
                  strstr(err.msg, bad[k].want) && m.n_files == 0,
              "'%s': %s (want %s)", bad[k].text, err.msg, bad[k].want);
    }
    /* Paths that leave the folder, repeat, or name the manifest; bad sizes and hashes. */
    static const struct {
        const char *file, *want;
    } bad_files[] = {
        {"{\"path\": \"../x\", \"bytes\": 1, \"xxh64\": \"0123456789abcdef\"}", "'files'[0].path is not a relative path"},
        {"{\"path\": \"/etc/passwd\", \"bytes\": 1, \"xxh64\": \"0123456789abcdef\"}", "'files'[0].path is not a relative"},
        {"{\"path\": \"a//b\", \"bytes\": 1, \"xxh64\": \"0123456789abcdef\"}", "'files'[0].path is not a relative path"},
        {"{\"path\": \"a/./b\", \"bytes\": 1, \"xxh64\": \"0123456789abcdef\"}", "'files'[0].path is not a relative path"},
        {"{\"path\": \"manifest.json\", \"bytes\": 1, \"xxh64\": \"0123456789abcdef\"}", "'files'[0].path is not"},
        {"{\"path\": \"a\", \"bytes\": -1, \"xxh64\": \"0123456789abcdef\"}", "'files'[0].bytes is not a whole number"},
        {"{\"path\": \"a\", \"bytes\": 1, \"xxh64\": \"0123456789abcdeg\"}", "'files'[0].xxh64 is not 16 lower-case hex"},
        {"{\"path\": \"a\", \"bytes\": 1}", "'files'[0] is not an object of path, bytes and xxh64"},
        {"{\"path\": \"a\", \"bytes\": 1, \"xxh64\": \"0123456789abcdef\"}, "
         "{\"path\": \"a\", \"bytes\": 2, \"xxh64\": \"0123456789abcdef\"}",
         "'files'[1].path 'a' is listed twice"},
    };
    for (size_t k = 0; k < sizeof bad_files / sizeof bad_files[0]; k++) {
        char text[1024];
        snprintf(text, sizeof text,
                 "{\"format\": \"tunegraph-artifact\", \"version\": 1, \"command\": \"sweep\", \"files\": [%s]}",
                 bad_files[k].file);
        CHECK(artifact_manifest_parse("m.json", text, strlen(text), &m, &err) == -1 && strstr(err.msg, bad_files[k].want) &&
                  m.n_files == 0 && !m.files,
              "'%s': %s (want %s)", bad_files[k].file, err.msg, bad_files[k].want);
    }
    CHECK(artifact_path_ok("plots/loss.svg") && !artifact_path_ok("") && !artifact_path_ok("a/") &&
              !artifact_path_ok("a/..") && !artifact_path_ok("a\\b"),
          "artifact_path_ok");
}
