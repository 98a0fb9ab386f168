/* Benchmark artifacts (cli/artifact.h). */
#include "cli/artifact.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "api/front.h"
#include "base/alloc.h"
#include "base/atomic_file.h"
#include "base/json_strict.h"
#include "base/text_file.h"
#include "base/version.h"
#include "cli/environment.h"
#include "cli/metrics_read.h"
#include "cli/plot.h"
#include "cli/usage.h"
#include "plan/inspect.h"
#include "plan/plan_file.h"
#include "runtime/executor.h"
#include "runtime/preflight.h"

#define ARTIFACT_MANIFEST_MAX_BYTES (64u << 20)
#define ARTIFACT_METRICS_MAX_BYTES (1ull << 32)

struct artifact {
    char *dir;
    char command[16];
    json_t *absent;
    int failed; /* an absent entry could not be recorded */
    char job_xxh64[17], plan_xxh64[17], plan_fingerprint[17];
};

const char *artifact_dir(const artifact *a) { return a->dir; }

void artifact_free(artifact *a) {
    if (!a) return;
    free(a->dir);
    json_decref(a->absent);
    free(a);
}

/* Whether folder `dir` holds nothing: 1, 0, or -1 when it cannot be listed. */
static int folder_empty(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int empty = 1;
    for (struct dirent *e; empty && (e = readdir(d));) empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    return empty;
}

int artifact_make_folders(const char *dir) {
    char *copy = tg_strdup(dir);
    if (!copy) return ENOMEM;
    int rc = 0;
    for (char *slash = strchr(copy + 1, '/'); slash && !rc; slash = strchr(slash + 1, '/')) {
        *slash = 0;
        if (mkdir(copy, 0777) && errno != EEXIST) rc = errno;
        *slash = '/';
    }
    if (!rc && mkdir(copy, 0777) && errno != EEXIST) rc = errno;
    free(copy);
    return rc;
}

int artifact_open(artifact **out, const char *dir, const char *command, tg_err *err) {
    *out = NULL;
    if (!*dir) return tg_fail(err, "--artifact: the folder name is empty");
    const int made = artifact_make_folders(dir);
    if (made) return tg_fail(err, "%s: cannot create the artifact folder: %s", dir, strerror(made));
    const int empty = folder_empty(dir);
    if (empty < 0) return tg_fail(err, "%s: cannot list the artifact folder: %s", dir, strerror(errno));
    if (!empty)
        return tg_fail(err, "%s: the artifact folder is not empty: give a new or empty folder (its manifest lists "
                            "one artifact's files)",
                       dir);
    artifact *a = tg_calloc(1, sizeof *a);
    if (!a || !(a->dir = tg_strdup(dir)) || !(a->absent = json_array())) {
        artifact_free(a);
        return tg_fail(err, "%s: out of memory", dir);
    }
    snprintf(a->command, sizeof a->command, "%s", command);
    *out = a;
    return 0;
}

/* DIR/name's folders, made where missing. */
static int make_parents(const char *path, tg_err *err) {
    char *copy = tg_strdup(path);
    if (!copy) return tg_fail(err, "out of memory");
    int rc = 0;
    for (char *slash = strchr(copy + 1, '/'); slash && !rc; slash = strchr(slash + 1, '/')) {
        *slash = 0;
        if (mkdir(copy, 0777) && errno != EEXIST) rc = tg_fail(err, "%s: cannot create the folder: %s", copy, strerror(errno));
        *slash = '/';
    }
    free(copy);
    return rc;
}

int artifact_write(artifact *a, const char *name, const void *data, size_t len, tg_err *err) {
    char *path;
    if (tg_asprintf(&path, "%s/%s", a->dir, name) < 0) return tg_fail(err, "out of memory");
    int rc = make_parents(path, err);
    if (!rc) rc = tg_write_file_atomic(path, &(tg_chunk){data, len}, 1, "artifact file", err);
    free(path);
    return rc;
}

/* The whole of file `path` into *data (malloc'd), at most `max` bytes. */
static int read_whole(const char *path, size_t max, const char *what, char **data, size_t *len, tg_err *err) {
    return tg_read_text_file(path, max, what, data, len, err);
}

int artifact_copy(artifact *a, const char *name, const char *src, const char *what, tg_err *err) {
    char *data;
    size_t len;
    if (read_whole(src, ARTIFACT_METRICS_MAX_BYTES, what, &data, &len, err)) return -1;
    int rc = artifact_write(a, name, data, len, err);
    free(data);
    return rc;
}

int artifact_absent(artifact *a, const char *what, const char *why) {
    json_t *e = json_object();
    int failed = !e;
    if (e) {
        tg_json_put(e, "what", json_string(what), &failed);
        tg_json_put(e, "why", json_string(why), &failed);
        tg_json_push(a->absent, e, &failed);
    }
    a->failed |= failed;
    return failed ? -1 : 0;
}

static void hex64(unsigned long long v, char out[17]) { snprintf(out, 17, "%016llx", v); }

int artifact_job(artifact *a, const char *input, tg_err *err) {
    char *data;
    size_t len;
    if (read_whole(input, 1u << 20, "job file", &data, &len, err)) return -1;
    int rc = artifact_write(a, "job.job", data, len, err);
    if (!rc) hex64(XXH64(data, len, 0), a->job_xxh64);
    free(data);
    return rc;
}

/* The plan's settings from its inspect JSON (the same fields `inspect --json` prints). */
static json_t *resolved_job(const char *input, const char *const *sets, int n_sets, const tg_plan *plan, tg_err *err) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        tg_fail(err, "out of memory");
        return NULL;
    }
    int rc = tg_plan_inspect(plan, f, 1, err);
    if (fclose(f) && !rc) rc = tg_fail(err, "out of memory inspecting the plan");
    json_error_t jerr;
    json_t *full = rc ? NULL : tg_json_loadb(text, len, 0, &jerr);
    free(text);
    if (!full) {
        if (!rc) tg_fail(err, "the plan's inspect JSON does not parse: %s", jerr.text);
        return NULL;
    }
    json_t *out = json_object(), *overrides = json_array();
    int failed = !out || !overrides;
    if (!failed) {
        tg_json_put(out, "input", json_string(input), &failed);
        for (int i = 0; i < n_sets; i++) tg_json_push(overrides, json_string(sets[i]), &failed);
        tg_json_put(out, "overrides", overrides, &failed);
        overrides = NULL;
        static const char *const keys[] = {"job_path", "fingerprint", "model", "train", "run", "recompute",
                                           "peak_bytes", "memory_estimate", "flops_per_step", "bytes_per_step"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            json_t *v = json_object_get(full, keys[k]);
            if (v) tg_json_put(out, keys[k], json_incref(v), &failed);
        }
    }
    json_decref(overrides);
    json_decref(full);
    if (failed) {
        json_decref(out);
        tg_fail(err, "out of memory");
        return NULL;
    }
    return out;
}

/* DIR/name: `v` as indented JSON (v is released). */
static int write_json(artifact *a, const char *name, json_t *v, tg_err *err) {
    char *text = v ? json_dumps(v, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(v);
    if (!text) return tg_fail(err, "out of memory writing %s", name);
    const size_t len = strlen(text);
    char *line = tg_realloc(text, len + 2); /* ends with a newline, as text files do */
    if (!line) {
        free(text);
        return tg_fail(err, "out of memory writing %s", name);
    }
    line[len] = '\n', line[len + 1] = 0;
    int rc = artifact_write(a, name, line, len + 1, err);
    free(line);
    return rc;
}

int artifact_plan(artifact *a, const char *prefix, const char *input, const char *const *sets, int n_sets,
                  const tg_plan *plan, tg_err *err) {
    char name[256];
    json_t *resolved = resolved_job(input, sets, n_sets, plan, err);
    snprintf(name, sizeof name, "%sjob.resolved.json", prefix);
    if (!resolved || write_json(a, name, resolved, err)) return -1;
    uint8_t *bytes;
    size_t len;
    if (tg_plan_encode(plan, &bytes, &len, err)) return -1;
    snprintf(name, sizeof name, "%splan.tgp", prefix);
    int rc = artifact_write(a, name, bytes, len, err);
    if (!rc && !prefix[0]) {
        hex64(XXH64(bytes, len, 0), a->plan_xxh64);
        hex64((unsigned long long)plan->fingerprint, a->plan_fingerprint);
    }
    free(bytes);
    return rc;
}

int artifact_environment(artifact *a, const char *device, tg_err *err) {
    json_t *env = environment_describe(device);
    if (!env) return tg_fail(err, "out of memory describing the environment");
    return write_json(a, "environment.json", env, err);
}

int artifact_hash_file(const char *path, unsigned long long *hash, unsigned long long *bytes, tg_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return tg_fail(err, "%s: cannot open: %s", path, strerror(errno));
    XXH64_state_t st;
    XXH64_reset(&st, 0);
    char buf[1 << 16];
    unsigned long long total = 0;
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        XXH64_update(&st, buf, n);
        total += n;
    }
    const int bad = ferror(f);
    fclose(f);
    if (bad) return tg_fail(err, "%s: cannot read: %s", path, strerror(errno));
    *hash = XXH64_digest(&st);
    *bytes = total;
    return 0;
}

/* Adds every regular file under DIR/rel (rel "" or ending in '/'), sorted by name, to the
 * files array; manifest.json at the top is left out. */
static int list_files(const char *dir, const char *rel, json_t *files, tg_err *err) {
    char *folder;
    if (tg_asprintf(&folder, "%s/%s", dir, rel) < 0) return tg_fail(err, "out of memory");
    struct dirent **names;
    const int n = scandir(folder, &names, NULL, alphasort);
    if (n < 0) {
        tg_fail(err, "%s: cannot list the artifact folder: %s", folder, strerror(errno));
        free(folder);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < n; i++) {
        const char *name = names[i]->d_name;
        char *sub = NULL, *path = NULL;
        struct stat st;
        if (!rc && strcmp(name, ".") && strcmp(name, "..") && !(!rel[0] && !strcmp(name, "manifest.json"))) {
            if (tg_asprintf(&sub, "%s%s", rel, name) < 0 || tg_asprintf(&path, "%s/%s", dir, sub) < 0)
                rc = tg_fail(err, "out of memory");
            else if (lstat(path, &st)) rc = tg_fail(err, "%s: %s", path, strerror(errno));
            else if (S_ISDIR(st.st_mode)) {
                char *deeper;
                if (tg_asprintf(&deeper, "%s/", sub) < 0) rc = tg_fail(err, "out of memory");
                else rc = list_files(dir, deeper, files, err), free(deeper);
            } else if (S_ISREG(st.st_mode)) {
                unsigned long long h, bytes;
                char hex[17];
                json_t *e = json_object();
                int failed = !e;
                rc = artifact_hash_file(path, &h, &bytes, err);
                if (!rc && e) {
                    hex64(h, hex);
                    tg_json_put(e, "path", json_string(sub), &failed);
                    tg_json_put(e, "bytes", json_integer((json_int_t)bytes), &failed);
                    tg_json_put(e, "xxh64", json_string(hex), &failed);
                    tg_json_push(files, e, &failed);
                    e = NULL;
                }
                json_decref(e);
                if (!rc && failed) rc = tg_fail(err, "out of memory");
            }
        }
        free(sub), free(path);
        free(names[i]);
    }
    free(names);
    free(folder);
    return rc;
}

static json_t *hash_or_null(const char *hex) { return hex[0] ? json_string(hex) : json_null(); }

int artifact_close(artifact *a, tg_err *err) {
    json_t *m = json_object(), *files = json_array();
    int failed = !m || !files || a->failed;
    int rc = 0;
    if (!failed) {
        tg_json_put(m, "format", json_string(ARTIFACT_FORMAT), &failed);
        tg_json_put(m, "version", json_integer(ARTIFACT_VERSION), &failed);
        tg_json_put(m, "command", json_string(a->command), &failed);
        tg_json_put(m, "tunegraph", json_string(TG_VERSION_STRING), &failed);
        tg_json_put(m, "job_xxh64", hash_or_null(a->job_xxh64), &failed);
        tg_json_put(m, "plan_xxh64", hash_or_null(a->plan_xxh64), &failed);
        tg_json_put(m, "plan_fingerprint", hash_or_null(a->plan_fingerprint), &failed);
        rc = list_files(a->dir, "", files, err);
        tg_json_put(m, "files", files, &failed);
        files = NULL;
        tg_json_put(m, "absent", json_incref(a->absent), &failed);
    }
    json_decref(files);
    if (!rc && failed) rc = tg_fail(err, "%s: out of memory writing the manifest", a->dir);
    if (!rc) rc = write_json(a, "manifest.json", m, err);
    else json_decref(m);
    artifact_free(a);
    return rc;
}

int artifact_verify(const char *dir, artifact_manifest *m, tg_err *err) {
    char *path, *text;
    size_t len;
    memset(m, 0, sizeof *m);
    if (tg_asprintf(&path, "%s/manifest.json", dir) < 0) return tg_fail(err, "out of memory");
    int rc = read_whole(path, ARTIFACT_MANIFEST_MAX_BYTES, "artifact manifest", &text, &len, err);
    if (!rc) {
        rc = artifact_manifest_parse(path, text, len, m, err);
        free(text);
    }
    free(path);
    for (int i = 0; i < m->n_files && !rc; i++) {
        const artifact_manifest_file *f = &m->files[i];
        unsigned long long h, bytes;
        if (tg_asprintf(&path, "%s/%s", dir, f->path) < 0) {
            rc = tg_fail(err, "out of memory");
            break;
        }
        if (artifact_hash_file(path, &h, &bytes, err)) rc = -1;
        else if (bytes != f->bytes)
            rc = tg_fail(err, "%s: %llu bytes, the artifact's manifest says %llu: the file changed after the artifact "
                              "was written",
                         path, bytes, (unsigned long long)f->bytes);
        else if (h != f->xxh64)
            rc = tg_fail(err, "%s: xxh64 %016llx, the artifact's manifest says %016llx: the file changed after the "
                              "artifact was written",
                         path, h, (unsigned long long)f->xxh64);
        free(path);
    }
    if (rc) artifact_manifest_free(m);
    return rc;
}

/* ---- run --artifact ----------------------------------------------------------------- */

static const char artifact_run_usage[] =
    "usage: tunegraph run PLAN|JOB [options] --artifact DIR   (tunegraph help lists run's options)\n";

/* run's options that take a value (cli/main.c and cli/export.c parse them): the scan below
 * skips their values to find the input. */
static int takes_value(const char *s) {
    static const char *const with_value[] = {"-o",           "--set",      "--metrics", "--device",   "--threads",
                                             "--save",       "--in-flight", "--resume", "--checkpoint-dir",
                                             "--save-dir",   "--labels",   "--tokenizer", "--dtype",
                                             "--nproc"};
    for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++)
        if (!strcmp(s, with_value[k])) return 1;
    return 0;
}

/* What the artifact records of the run's command line. */
typedef struct run_words {
    const char *input, *metrics, *device;
    const char *sets[64];
    int n_sets, profile;
} run_words;

static void scan_run_words(int argc, char **argv, run_words *w) {
    memset(w, 0, sizeof *w);
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        const char *value = takes_value(s) && i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(s, "--set") && value && w->n_sets < 64) w->sets[w->n_sets++] = value;
        else if (!strcmp(s, "--metrics") && value) w->metrics = value;
        else if (!strcmp(s, "--device") && value) w->device = value;
        else if (!strcmp(s, "--profile")) w->profile = 1;
        else if (s[0] != '-' && !w->input) w->input = s;
        if (value) i++;
    }
}

/* profile.jsonl: the metrics file's profile lines (profile_op, profile_group, ...). */
static int write_profile(artifact *a, const char *metrics_text, tg_err *err) {
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (!f) return tg_fail(err, "out of memory");
    for (const char *line = metrics_text; *line;) {
        const size_t n = strcspn(line, "\n");
        if (!strncmp(line, "{\"profile_", 10)) fprintf(f, "%.*s\n", (int)n, line);
        line += n + (line[n] == '\n');
    }
    int rc = fclose(f) ? tg_fail(err, "out of memory") : 0;
    if (!rc && len) rc = artifact_write(a, "profile.jsonl", out, len, err);
    else if (!rc) rc = artifact_absent(a, "profile.jsonl", "the metrics file has no profile lines (the run failed)");
    free(out);
    return rc;
}

/* The metrics, the profile and the plots from the run's metrics file at `path`. */
static int artifact_metrics(artifact *a, const char *path, int copy, int profile, tg_err *err) {
    char *text;
    size_t len;
    tg_err read_err;
    if (read_whole(path, ARTIFACT_METRICS_MAX_BYTES, "metrics file", &text, &len, &read_err)) {
        if (artifact_absent(a, "metrics.jsonl", read_err.msg)) return tg_fail(err, "out of memory");
        if (profile && artifact_absent(a, "profile.jsonl", "no metrics file")) return tg_fail(err, "out of memory");
        return artifact_absent(a, "plots", "no metrics file") ? tg_fail(err, "out of memory") : 0;
    }
    int rc = copy ? artifact_write(a, "metrics.jsonl", text, len, err) : 0;
    if (!rc && profile) rc = write_profile(a, text, err);
    metrics_series s;
    tg_err plot_err;
    if (!rc && metrics_read(path, text, len, &s, &plot_err)) rc = artifact_absent(a, "plots", plot_err.msg);
    else if (!rc) {
        metrics_series_free(&s);
        char *plots = NULL, *from = NULL;
        if (tg_asprintf(&plots, "%s/plots", a->dir) < 0 || tg_asprintf(&from, "%s", path) < 0)
            rc = tg_fail(err, "out of memory");
        else {
            char *plot_argv[] = {from, "-o", plots, NULL};
            if (cmd_plot(3, plot_argv)) rc = tg_fail(err, "%s: the plots could not be written (above)", plots);
        }
        free(plots), free(from);
    }
    free(text);
    return rc;
}

int artifact_run(int argc, char **argv, cli_command_fn run) {
    /* Without --artifact, run as it is: nothing allocated here that could fail first. */
    int asked = 0;
    for (int i = 0; i < argc && !asked; i++) {
        asked = !strcmp(argv[i], "--artifact");
        if (takes_value(argv[i])) i++;
    }
    if (!asked) return run(argc, argv);
    const char *dir = NULL;
    char **args = tg_calloc((size_t)argc + 3, sizeof *args);
    if (!args) {
        fprintf(stderr, "tunegraph run: out of memory\n");
        return 1;
    }
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--artifact")) {
            args[n++] = argv[i];
            if (takes_value(argv[i]) && i + 1 < argc) args[n++] = argv[++i]; /* a value "--artifact" stays a value */
            continue;
        }
        const char *why = i + 1 >= argc ? "--artifact needs a folder" : dir ? "--artifact given twice" : NULL;
        if (why) {
            free(args);
            return cli_usage_error("run", artifact_run_usage, "%s", why);
        }
        dir = argv[++i];
    }
    if (!dir) {
        free(args);
        return run(argc, argv);
    }
    run_words w;
    scan_run_words(n, args, &w);
    tg_err err = {{0}};
    artifact *a;
    char *metrics_path = NULL;
    if (artifact_open(&a, dir, "run", &err)) {
        free(args);
        fprintf(stderr, "tunegraph run: %s\n", err.msg);
        return 1;
    }
    if (!w.metrics) {
        if (tg_asprintf(&metrics_path, "%s/metrics.jsonl", dir) < 0) {
            artifact_free(a);
            free(args);
            fprintf(stderr, "tunegraph run: out of memory\n");
            return 1;
        }
        args[n++] = "--metrics";
        args[n++] = metrics_path;
    }
    args[n] = NULL;
    const char *device = w.device ? w.device : tg_default_device() == TG_DEVICE_CUDA ? "cuda" : "cpu";
    /* On a GPU, run plans recompute = auto for the memory the GPU has free: read it as run
     * does (the CUDA context in place), before the run, for the artifact's plan. */
    uint64_t available = 0;
    char source[64];
    tg_err ignored;
    if (!strcmp(device, "cuda") && tg_device_free_memory(TG_DEVICE_CUDA, 0, &available, source, sizeof source, &ignored))
        available = 0;
    const int status = run(n, args);
    if (status == 2) { /* a usage error: nothing ran */
        artifact_free(a);
        rmdir(dir);
        free(metrics_path), free(args);
        return status;
    }
    int rc = 0;
    tg_plan plan;
    tg_err plan_err;
    const int from_plan = w.input && tg_plan_file_sniff(w.input);
    int have_plan = 0;
    if (!w.input) rc = tg_fail(&err, "no input to record");
    else if (from_plan)
        have_plan = !tg_plan_read(w.input, &plan, &plan_err) &&
                    (!tg_front_set_run(&plan, w.sets, w.n_sets, w.input, &plan_err) || (tg_plan_free(&plan), 0));
    else have_plan = !tg_front_compile_file_for(w.input, w.sets, w.n_sets, available, &plan, &plan_err);
    if (!rc && from_plan) rc = artifact_absent(a, "job.job", "the run was given a plan file, not a job");
    else if (!rc) rc = artifact_job(a, w.input, &err);
    if (!rc && have_plan) rc = artifact_plan(a, "", w.input, w.sets, w.n_sets, &plan, &err);
    else if (!rc) rc = artifact_absent(a, "plan.tgp", plan_err.msg);
    if (have_plan) tg_plan_free(&plan);
    if (!rc) rc = artifact_environment(a, device, &err);
    if (!rc) rc = artifact_metrics(a, w.metrics ? w.metrics : metrics_path, w.metrics != NULL, w.profile, &err);
    if (!rc) {
        rc = artifact_close(a, &err);
        if (!rc) fprintf(stderr, "artifact %s (manifest.json lists its files)\n", dir);
    } else {
        artifact_free(a);
    }
    if (rc) fprintf(stderr, "tunegraph run: artifact: %s\n", err.msg);
    free(metrics_path), free(args);
    return status ? status : rc ? 1 : 0;
}
