/* The export of a Hugging Face folder (runtime/hf_export.c), at its edges: where the
 * tokenizer comes from (the model's folder in each form, a file named without a folder)
 * and the tokenizer files it refuses (a dangling link, a folder, a file that cannot be read,
 * a device), output folders it refuses ('/', a link loop, none named), the files to keep
 * that lie inside it or do not, the padding id a BERT config without one gets, and every
 * allocation of an export failed in turn with nothing left beside the folder; an output
 * folder written into during the export; permissions (without root). */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/alloc.h"
#include "runtime/hf_export.h"
#include "tests/harness.h"

#define CHECK_MSG(err, s) CHECK(strstr((err).msg, (s)) != NULL, "message '%s' lacks '%s'", (err).msg, (s))

static char *join(const char *dir, const char *name) {
    char *s;
    return asprintf(&s, "%s/%s", dir, name) < 0 ? NULL : s;
}

static int bert_plan(tg_plan *p) { return tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, p); }

TG_TEST(test_runtime_hf_export_model_class) {
    tg_plan p;
    memset(&p, 0, sizeof p);
    p.model.arch = TG_ARCH_GPT2, p.train.task = TG_TASK_CLASSIFY;
    CHECK(!strcmp(tg_hf_model_class(&p), "GPT2ForSequenceClassification"), "gpt2 classifier");
    p.model.arch = TG_ARCH_BERT, p.train.task = TG_TASK_LM;
    CHECK(!strcmp(tg_hf_model_class(&p), "the model"), "bert lm: %s", tg_hf_model_class(&p));
}

/* With no tokenizer named, the model's folder is searched when there is one: its weights'
 * folder (".", "/", or a path's), or the source named as a path; a folder without tokenizer
 * files, a source that is a file, or one not there gives no tokenizer and no error. */
TG_TEST(test_runtime_hf_export_model_folder_tokenizer) {
    tg_plan p;
    if (!bert_plan(&p)) return;
    const char *root = tg_test_tmpdir();
    char *out = join(root, "out"), *model = join(root, "model"), *vocab = join(root, "model/vocab.txt"),
         *weights = join(root, "model/model.safetensors"), *file = join(root, "file.txt");
    REQUIRE(mkdir(model, 0755) == 0 && tg_test_write_file(vocab, "[PAD]\n") == 0 &&
                tg_test_write_file(file, "x") == 0,
            "setup");
    const tg_hf_export_options o = {out, NULL, NULL, 0, 0, 0};
    tg_err err = {{0}};
    const char *const weights_forms[] = {"model.safetensors", "/model.safetensors", weights};
    for (int i = 0; i < 3; i++) {
        snprintf(p.model.weights, sizeof p.model.weights, "%s", weights_forms[i]);
        CHECK(tg_hf_export_check(&p, &o, NULL, 0, &err) == 0, "weights %s: %s", weights_forms[i], err.msg);
    }
    p.model.weights[0] = 0;
    const char *const sources[] = {model, file, "no/such/model"};
    for (int i = 0; i < 3; i++) {
        snprintf(p.model.source, sizeof p.model.source, "%s", sources[i]);
        CHECK(tg_hf_export_check(&p, &o, NULL, 0, &err) == 0, "source %s: %s", sources[i], err.msg);
    }
    /* the model folder's vocab.txt is copied: the export holds it */
    tg_weights_image img;
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
    tg_weights_init(&img, 1);
    snprintf(p.model.source, sizeof p.model.source, "%s", model);
    REQUIRE(tg_hf_export(&img, &o, &err) == 0, "%s", err.msg);
    char *copied = join(out, "vocab.txt");
    char *text = tg_test_read_file(copied, NULL);
    CHECK(text && !strcmp(text, "[PAD]\n") && tg_test_count_files(out) == 3, "copied vocab: %s, %d files",
          text ? text : "(none)", tg_test_count_files(out));
    free(text);
    tg_weights_image_free(&img);
    free(out), free(model), free(vocab), free(weights), free(file), free(copied);
    tg_plan_free(&p);
}

/* Tokenizer files the export cannot copy, each named: a link to nothing, a folder under a
 * tokenizer file's name, something that is neither file nor folder; and a file that reads
 * with an error midway (a link to this process's memory, which is unmapped at 0). */
TG_TEST(test_runtime_hf_export_bad_tokenizer_files) {
    tg_plan p;
    if (!bert_plan(&p)) return;
    const char *root = tg_test_tmpdir();
    char *out = join(root, "out"), *dangling = join(root, "dangling"), *dangling_vocab = join(root, "dangling/vocab.txt"),
         *dir = join(root, "dir"), *dir_vocab = join(root, "dir/vocab.json"), *mem = join(root, "mem"),
         *mem_vocab = join(root, "mem/merges.txt");
    REQUIRE(mkdir(dangling, 0755) == 0 && symlink("nothing-here", dangling_vocab) == 0 && mkdir(dir, 0755) == 0 &&
                mkdir(dir_vocab, 0755) == 0 && mkdir(mem, 0755) == 0 && symlink("/proc/self/mem", mem_vocab) == 0,
            "setup");
    tg_hf_export_options o = {out, dangling, NULL, 0, 0, 0};
    tg_err err = {{0}};
    CHECK(tg_hf_export_check(&p, &o, NULL, 0, &err) == -1, "a dangling link accepted");
    CHECK_MSG(err, "tokenizer file ");
    CHECK_MSG(err, "dangling/vocab.txt: cannot look at it: No such file or directory");
    o.tokenizer = dir;
    CHECK(tg_hf_export_check(&p, &o, NULL, 0, &err) == -1, "a folder accepted as vocab.json");
    CHECK_MSG(err, "dir/vocab.json: not a regular file");
    o.tokenizer = "/dev/null";
    CHECK(tg_hf_export_check(&p, &o, NULL, 0, &err) == -1, "/dev/null accepted");
    CHECK_MSG(err, "tokenizer /dev/null: neither a file nor a folder");

    tg_weights_image img;
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
    tg_weights_init(&img, 1);
    o.tokenizer = mem;
    CHECK(tg_hf_export(&img, &o, &err) == -1, "an unreadable tokenizer file copied");
    CHECK_MSG(err, "mem/merges.txt: cannot read: ");
    CHECK(access(out, F_OK) != 0 && tg_test_count_files(root) == 3, "a failed export left %d entries",
          tg_test_count_files(root));
    tg_weights_image_free(&img);
    free(out), free(dangling), free(dangling_vocab), free(dir), free(dir_vocab), free(mem), free(mem_vocab);
    tg_plan_free(&p);
}

/* A tokenizer file named without a folder (in the working folder) is copied under its name. */
TG_TEST(test_runtime_hf_export_tokenizer_file_here) {
    tg_plan p;
    if (!bert_plan(&p)) return;
    const char *root = tg_test_tmpdir();
    tg_weights_image img;
    tg_err err = {{0}};
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
    tg_weights_init(&img, 1);
    char cwd[PATH_MAX];
    REQUIRE(getcwd(cwd, sizeof cwd) && chdir(root) == 0, "chdir");
    const tg_hf_export_options o = {"out", "tokenizer.json", NULL, 0, 0, 0};
    const int wrote = tg_test_write_file("tokenizer.json", "{\"version\": \"1.0\"}");
    const int rc = tg_hf_export(&img, &o, &err);
    char *text = tg_test_read_file("out/tokenizer.json", NULL);
    const int files = tg_test_count_files("out");
    REQUIRE(chdir(cwd) == 0, "chdir back");
    CHECK(wrote == 0 && rc == 0 && text && !strcmp(text, "{\"version\": \"1.0\"}") && files == 3,
          "rc %d '%s', %d files", rc, rc ? err.msg : "", files);
    free(text);
    /* the same file by its full path */
    char *tok = join(root, "tokenizer.json"), *out2 = join(root, "out2"), *copied = join(root, "out2/tokenizer.json");
    const tg_hf_export_options o2 = {out2, tok, NULL, 0, 0, 0};
    CHECK(tg_hf_export(&img, &o2, &err) == 0, "%s", err.msg);
    text = tg_test_read_file(copied, NULL);
    CHECK(text && !strcmp(text, "{\"version\": \"1.0\"}"), "copy by full path: %s", text ? text : "(none)");
    free(text), free(tok), free(out2), free(copied);
    tg_weights_image_free(&img);
    tg_plan_free(&p);
}

/* Output folders refused by what their path is, and the files to keep: inside the folder
 * (the folder itself), beside it under a longer name, missing, or not named. */
TG_TEST(test_runtime_hf_export_output_paths) {
    tg_plan p;
    if (!bert_plan(&p)) return;
    const char *root = tg_test_tmpdir();
    char *out = join(root, "out"), *outx = join(root, "outx"), *loop = join(root, "loop");
    REQUIRE(mkdir(out, 0755) == 0 && tg_test_write_file(outx, "x") == 0 && symlink("loop", loop) == 0, "setup");
    tg_hf_export_options o = {NULL, NULL, NULL, 0, 0, 0};
    tg_err err = {{0}};
    CHECK(tg_hf_export_check(&p, &o, NULL, 0, &err) == -1, "no output folder accepted");
    CHECK_MSG(err, "output folder: the path is empty");
    o.out_dir = "/";
    CHECK(tg_hf_export_check(&p, &o, NULL, 0, &err) == -1, "/ accepted");
    CHECK_MSG(err, "output folder /: names no folder of its own ('.', '..' or '/')");
    o.out_dir = loop;
    CHECK(tg_hf_export_check(&p, &o, NULL, 0, &err) == -1, "a link loop accepted");
    CHECK_MSG(err, "loop: Too many levels of symbolic links");

    o.out_dir = out;
    char *missing = join(root, "no/such/file");
    const tg_named_path fine[] = {{NULL, "nothing"}, {outx, "a file beside it"}, {missing, "a missing file"}};
    CHECK(tg_hf_export_check(&p, &o, fine, 3, &err) == 0, "files outside refused: %s", err.msg);
    char *slashed = join(root, "out/");
    const tg_named_path itself[] = {{out, "metrics folder"}};
    CHECK(tg_hf_export_check(&p, &o, itself, 1, &err) == -1, "the folder itself kept");
    CHECK_MSG(err, "the metrics folder ");
    CHECK_MSG(err, "is inside it, and the export replaces the folder whole");
    free(out), free(outx), free(loop), free(missing), free(slashed);
    tg_plan_free(&p);
}

/* A BERT config without a padding id gets the plan's; its export says so in config.json. */
TG_TEST(test_runtime_hf_export_pad_id) {
    tg_plan p;
    if (!bert_plan(&p)) return;
    p.model.pad_token_id = -1;
    tg_weights_image img;
    tg_err err = {{0}};
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
    tg_weights_init(&img, 1);
    const char *root = tg_test_tmpdir();
    char *out = join(root, "out"), *config = join(root, "out/config.json");
    const tg_hf_export_options o = {out, NULL, NULL, 0, 0, 0};
    REQUIRE(tg_hf_export(&img, &o, &err) == 0, "%s", err.msg);
    json_error_t jerr;
    json_t *c = json_load_file(config, 0, &jerr);
    CHECK(c && json_integer_value(json_object_get(c, "pad_token_id")) == p.train.pad_id &&
              json_is_integer(json_object_get(c, "pad_token_id")),
          "pad_token_id in %s", config);
    json_decref(c);
    free(out), free(config);
    tg_weights_image_free(&img);
    tg_plan_free(&p);
}

/* Allocations of an export (with a tokenizer folder, over a full folder with force, bf16)
 * failed in turn: -1, a message that says so, the old folder as it was, and nothing left
 * beside it. The first 320 (the checks, config.json) and the last 100 (the files and the
 * commit) fail one by one, the many of the weights' header in between one in 16 (each
 * failure there writes and removes a folder). */
TG_TEST(test_runtime_hf_export_out_of_memory) {
    tg_plan p;
    if (!bert_plan(&p)) return;
    const char *root = tg_test_tmpdir();
    char *out = join(root, "out"), *tok = join(root, "tok"), *vocab = join(root, "tok/vocab.txt"),
         *tcfg = join(root, "tok/tokenizer_config.json");
    REQUIRE(mkdir(tok, 0755) == 0 && tg_test_write_file(vocab, "[PAD]\n") == 0 && tg_test_write_file(tcfg, "{}") == 0,
            "setup");
    tg_weights_image img;
    tg_err err = {{0}};
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
    tg_weights_init(&img, 1);
    const tg_hf_export_options o = {out, tok, NULL, 0, 1, 1};
    tg_alloc_fail_after(-1);
    REQUIRE(tg_hf_export(&img, &o, &err) == 0, "%s", err.msg);
    const long total = tg_alloc_fail_after(-1);
    REQUIRE(total > 10 && tg_test_count_files(out) == 4, "%ld allocations, %d files", total, tg_test_count_files(out));
    long tried = 0;
    for (long k = 0; k < total; k += k < 320 || k >= total - 100 ? 1 : 16, tried++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = tg_hf_export(&img, &o, &err);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && (strstr(err.msg, "out of memory") || strstr(err.msg, "Cannot allocate memory")),
              "allocation %ld of %ld failing: rc %d, '%s'", k, total, rc, err.msg);
        CHECK(tg_test_count_files(root) == 2 && tg_test_count_files(out) == 4,
              "allocation %ld failing left %d entries beside the export, %d in it", k, tg_test_count_files(root),
              tg_test_count_files(out));
    }
    printf("  tg_hf_export: %ld allocations, %ld failed in turn\n", total, tried);
    tg_weights_image_free(&img);
    free(out), free(tok), free(vocab), free(tcfg);
    tg_plan_free(&p);
}

/* A folder at the top of the file system: its parent is "/" (checked only: as root the
 * check passes, otherwise "/" is not writable). */
TG_TEST(test_runtime_hf_export_top_level_folder) {
    tg_plan p;
    if (!bert_plan(&p)) return;
    char top[64];
    snprintf(top, sizeof top, "/tunegraph-export-check-%ld", (long)getpid());
    const tg_hf_export_options o = {top, NULL, NULL, 0, 0, 0};
    tg_err err = {{0}};
    const int rc = tg_hf_export_check(&p, &o, NULL, 0, &err);
    if (geteuid() == 0) CHECK(rc == 0, "%s: %s", top, err.msg);
    else CHECK(rc == -1 && strstr(err.msg, "cannot write in /: "), "%s: rc %d '%s'", top, rc, err.msg);
    CHECK(access(top, F_OK) != 0, "the check made %s", top);
    tg_plan_free(&p);
}

/* The temporary folder cannot be made: a path so long that its temporary name exceeds the
 * system's limit, and 100 temporary names in a row already taken (the next ones, read from
 * the message of an export stopped out of memory once it had made its folder). */
TG_TEST(test_runtime_hf_export_temp_folder_refused) {
    tg_plan p;
    if (!bert_plan(&p)) return;
    tg_weights_image img;
    tg_err err = {{0}};
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
    tg_weights_init(&img, 1);
    const char *root = tg_test_tmpdir();

    /* folders of 200-byte names, then the folder's own name: PATH_MAX - 10 bytes in all */
    char deep[PATH_MAX];
    size_t len = (size_t)snprintf(deep, sizeof deep, "%s", root);
    while (len + 201 <= PATH_MAX - 12) {
        deep[len++] = '/';
        memset(deep + len, 'd', 200);
        len += 200;
        deep[len] = 0;
        REQUIRE(mkdir(deep, 0755) == 0, "mkdir %zu", len);
    }
    deep[len++] = '/';
    while (len < PATH_MAX - 10) deep[len++] = 'o';
    deep[len] = 0;
    tg_hf_export_options o = {deep, NULL, NULL, 0, 0, 0};
    /* the message starts with the temporary name (its cause is past the 1024 bytes kept) */
    CHECK(tg_hf_export(&img, &o, &err) == -1, "a temporary name past PATH_MAX made (%zu bytes)", strlen(deep));
    CHECK(!strncmp(err.msg, root, strlen(root)) && strlen(err.msg) == sizeof err.msg - 1, "message '%.80s'", err.msg);
    *strrchr(deep, '/') = 0;
    CHECK(tg_test_count_files(deep) == 0, "%d entries beside the folder", tg_test_count_files(deep));

    char *out = join(root, "out");
    o = (tg_hf_export_options){out, NULL, NULL, 0, 0, 0};
    long pid = -1;
    unsigned serial = 0;
    for (long k = 0; k < 2000 && pid < 0; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = tg_hf_export(&img, &o, &err);
        tg_alloc_fail_after(-1);
        REQUIRE(rc == -1, "export with allocation %ld failing succeeded", k);
        const char *tmp = strstr(err.msg, "/.out.tmp.");
        if (tmp && sscanf(tmp, "/.out.tmp.%ld.%u", &pid, &serial) != 2) pid = -1;
    }
    REQUIRE(pid == (long)getpid(), "no temporary name in the messages");
    for (unsigned i = 1; i <= 100; i++) {
        char name[700];
        snprintf(name, sizeof name, "%s/.out.tmp.%ld.%u", root, pid, serial + i);
        REQUIRE(mkdir(name, 0755) == 0, "mkdir %s", name);
    }
    CHECK(tg_hf_export(&img, &o, &err) == -1, "an export with its temporary names taken");
    CHECK_MSG(err, "/out: cannot create a temporary folder beside it");
    CHECK(tg_test_count_files(root) == 101 && access(out, F_OK) != 0, "%d entries", tg_test_count_files(root));
    CHECK(tg_hf_export(&img, &o, &err) == 0 && tg_test_count_files(out) == 2, "the next name: %s", err.msg);
    free(out);
    tg_weights_image_free(&img);
    tg_plan_free(&p);
}

/* Someone writes into the (empty) output folder while the export runs: the folder is left
 * alone and the export kept under its temporary name, which the message gives. A thread
 * waits for the temporary folder to appear, then writes; a large tokenizer file keeps the
 * export busy meanwhile (if the export still wins, it is tried again). */
typedef struct intruder {
    const char *root, *out;
    atomic_int done;
    int wrote;
} intruder;

static void *intrude(void *arg) {
    intruder *in = arg;
    while (!atomic_load(&in->done)) {
        DIR *d = opendir(in->root);
        int seen = 0;
        for (struct dirent *e; d && (e = readdir(d));) seen |= !strncmp(e->d_name, ".out.tmp.", 9);
        if (d) closedir(d);
        if (seen) {
            char path[800];
            snprintf(path, sizeof path, "%s/late.txt", in->out);
            in->wrote = tg_test_write_file(path, "late") == 0;
            return NULL;
        }
    }
    return NULL;
}

TG_TEST(test_runtime_hf_export_folder_filled_meanwhile) {
    tg_plan p;
    if (!bert_plan(&p)) return;
    const char *root = tg_test_tmpdir();
    char *out = join(root, "out"), *tok = join(root, "tok"), *vocab = join(root, "tok/vocab.txt");
    REQUIRE(mkdir(tok, 0755) == 0, "tok");
    FILE *f = fopen(vocab, "w");
    REQUIRE(f, "vocab");
    for (int i = 0; i < 2000000; i++) fprintf(f, "token%d\n", i);
    REQUIRE(fclose(f) == 0, "vocab written");
    tg_weights_image img;
    tg_err err = {{0}};
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
    tg_weights_init(&img, 1);
    const tg_hf_export_options o = {out, tok, NULL, 0, 0, 0};
    int caught = 0;
    for (int attempt = 0; attempt < 5 && !caught; attempt++) {
        REQUIRE(mkdir(out, 0755) == 0, "out");
        intruder in = {root, out, 0, 0};
        pthread_t th;
        REQUIRE(pthread_create(&th, NULL, intrude, &in) == 0, "thread");
        memset(&err, 0, sizeof err);
        const int rc = tg_hf_export(&img, &o, &err);
        atomic_store(&in.done, 1);
        pthread_join(th, NULL);
        caught = rc == -1 && in.wrote;
        if (caught) {
            CHECK_MSG(err, "/out: something was written into it during the export; it is left alone and the export "
                           "kept in ");
            const char *kept = strstr(err.msg, "kept in ");
            char *copy = kept ? join(kept + 8, "vocab.txt") : NULL;
            char *late = join(out, "late.txt");
            CHECK(copy && access(copy, F_OK) == 0 && tg_test_count_files(out) == 1 && access(late, F_OK) == 0,
                  "the kept export or the folder: %s", err.msg);
            free(copy), free(late);
        } else {
            CHECK(rc == 0 || in.wrote, "export failed: %s", err.msg); /* the export won: try again */
            char cmd[1600];
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
            REQUIRE(system(cmd) == 0, "rm");
        }
    }
    CHECK(caught, "the output folder was never written into during an export");
    tg_weights_image_free(&img);
    free(out), free(tok), free(vocab);
    tg_plan_free(&p);
}

#ifdef TG_COVERAGE
void __gcov_dump(void);
#endif

/* Ends a forked child without the exit handlers (the parent's thread pools, which they
 * would stop, have no threads in the child); the coverage build writes its counts first. */
static void child_exit(int code) {
#ifdef TG_COVERAGE
    __gcov_dump();
#endif
    _exit(code);
}

/* Permissions: a tokenizer file that cannot be read, an output folder that cannot be
 * listed, a parent that cannot be written. Checked in a child process; as root, one whose
 * real and effective user is 65534 (nobody), which root's permissions do not let through
 * (the saved root user comes back before it exits, to write its coverage counts). */
static int permission_checks(const tg_plan *p, char *const paths[5]) {
    char *tok = paths[0], *inner = paths[1], *parent_ro = paths[2];
    int bad = 0;
    tg_hf_export_options o = {paths[3], tok, NULL, 0, 0, 0};
    tg_err err = {{0}};
    bad += !CHECK(tg_hf_export_check(p, &o, NULL, 0, &err) == -1, "an unreadable tokenizer file accepted");
    bad += !CHECK_MSG(err, "tok/vocab.txt: cannot be read: Permission denied");
    o = (tg_hf_export_options){inner, NULL, NULL, 0, 0, 0};
    bad += !CHECK(tg_hf_export_check(p, &o, NULL, 0, &err) == -1, "an unlistable folder accepted");
    bad += !CHECK_MSG(err, "locked/out: cannot list it: Permission denied");
    o = (tg_hf_export_options){paths[4], NULL, NULL, 0, 0, 0};
    bad += !CHECK(tg_hf_export_check(p, &o, NULL, 0, &err) == -1, "a read-only parent accepted");
    char want[900];
    snprintf(want, sizeof want, "output folder %s: cannot write in %s: Permission denied", paths[4], parent_ro);
    bad += !CHECK(!strcmp(err.msg, want), "'%s'\n    want '%s'", err.msg, want);
    return bad;
}

TG_TEST(test_runtime_hf_export_permissions) {
    tg_plan p;
    if (!bert_plan(&p)) return;
    char root[] = "/tmp/tg_export_perm_XXXXXX";
    REQUIRE(mkdtemp(root) && chmod(root, 0777) == 0, "mkdtemp"); /* writable for the child */
    char *out = join(root, "out"), *tok = join(root, "tok"), *vocab = join(root, "tok/vocab.txt"),
         *locked = join(root, "locked"), *inner = join(root, "locked/out"), *ro = join(root, "ro"),
         *ro_out = join(root, "ro/out");
    REQUIRE(mkdir(tok, 0755) == 0 && tg_test_write_file(vocab, "x\n") == 0 && chmod(vocab, 0) == 0 &&
                mkdir(locked, 0755) == 0 && mkdir(inner, 0) == 0 && chmod(inner, 0) == 0 && mkdir(ro, 0555) == 0 &&
                chmod(ro, 0555) == 0,
            "setup");
    char *const paths[5] = {tok, inner, ro, out, ro_out};
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) {
        const int root_user = geteuid() == 0;
        if (root_user && (setresgid(65534, 65534, 0) || setresuid(65534, 65534, 0))) _exit(2);
        const int bad = permission_checks(&p, paths);
        if (root_user && (setresuid(0, 0, 0) || setresgid(0, 0, 0))) _exit(3);
        child_exit(bad ? 1 : 0);
    }
    int st = -1;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the checks in the child: status %#x", st);
    chmod(inner, 0755), chmod(vocab, 0644);
    unlink(vocab), rmdir(tok), rmdir(inner), rmdir(locked), rmdir(ro), rmdir(root);
    CHECK(access(root, F_OK) != 0, "%s left behind", root);
    free(out), free(tok), free(vocab), free(locked), free(inner), free(ro), free(ro_out);
    tg_plan_free(&p);
}

/* config.json's text that cannot be made (its first allocation failing) is named in the
 * message, by the check and by the export, and nothing is written. */
TG_TEST(test_runtime_hf_export_config_text_out_of_memory) {
    tg_plan p;
    if (!bert_plan(&p)) return;
    const char *root = tg_test_tmpdir();
    char *out = join(root, "out");
    const tg_hf_export_options o = {out, NULL, NULL, 0, 0, 0};
    tg_weights_image img;
    tg_err err = {{0}};
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
    tg_alloc_fail_after(0);
    int rc = tg_hf_export_check(&p, &o, NULL, 0, &err);
    tg_alloc_fail_after(-1);
    CHECK(rc == -1 && !strcmp(err.msg, "config.json: out of memory"), "check: rc %d, '%s'", rc, err.msg);
    memset(&err, 0, sizeof err);
    tg_alloc_fail_after(0);
    rc = tg_hf_export(&img, &o, &err);
    tg_alloc_fail_after(-1);
    CHECK(rc == -1 && !strcmp(err.msg, "config.json: out of memory") && tg_test_count_files(root) == 0,
          "export: rc %d, '%s', %d entries", rc, err.msg, tg_test_count_files(root));
    tg_weights_image_free(&img);
    free(out);
    tg_plan_free(&p);
}

/* The first allocations of an export (the checks, config.json, the paths of the files)
 * failing one at a time while the later ones succeed: each either stops the export with
 * "out of memory", the old folder as it was and nothing beside it (never a file written
 * under a path that could not be made), or is one the export does without (the folder then
 * written whole). */
TG_TEST(test_runtime_hf_export_single_allocation_failures) {
    tg_plan p;
    if (!bert_plan(&p)) return;
    const char *root = tg_test_tmpdir();
    char *out = join(root, "out");
    tg_weights_image img;
    tg_err err = {{0}};
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
    tg_weights_init(&img, 1);
    const tg_hf_export_options o = {out, NULL, NULL, 0, 1, 0};
    REQUIRE(tg_hf_export(&img, &o, &err) == 0, "%s", err.msg);
    const int files = tg_test_count_files(out);
    long failed = 0, bare = 0;
    for (long k = 0; k < 320; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_only(k);
        const int rc = tg_hf_export(&img, &o, &err);
        tg_alloc_fail_after(-1);
        CHECK(tg_test_count_files(root) == 1 && tg_test_count_files(out) == files,
              "allocation %ld failing alone (rc %d) left %d entries beside the export, %d in it", k, rc,
              tg_test_count_files(root), tg_test_count_files(out));
        if (rc == 0) continue;
        failed++;
        bare += !strcmp(err.msg, "out of memory");
        CHECK(strstr(err.msg, "out of memory") || strstr(err.msg, "Cannot allocate memory"),
              "allocation %ld failing alone: '%s'", k, err.msg);
    }
    /* the paths of config.json and model.safetensors among them, whose message is bare */
    CHECK(failed > 150 && bare >= 2, "%ld of 320 single failures stopped the export, %ld said just 'out of memory'",
          failed, bare);
    tg_weights_image_free(&img);
    free(out);
    tg_plan_free(&p);
}

/* A tokenizer file that is there but that open(2) refuses, even to root: with no file
 * descriptor left (RLIMIT_NOFILE at the lowest free one), "cannot be read" with the
 * cause, whether named itself or found in a folder. */
TG_TEST(test_runtime_hf_export_tokenizer_open_refused) {
    tg_plan p;
    if (!bert_plan(&p)) return;
    const char *root = tg_test_tmpdir();
    char *out = join(root, "out"), *tok = join(root, "tok"), *vocab = join(root, "tok/vocab.txt");
    REQUIRE(mkdir(tok, 0755) == 0 && tg_test_write_file(vocab, "x\n") == 0, "setup");
    struct rlimit was;
    REQUIRE(getrlimit(RLIMIT_NOFILE, &was) == 0, "getrlimit");
    const int lowest = dup(0);
    REQUIRE(lowest >= 0, "dup");
    close(lowest);
    const char *const named[] = {vocab, tok};
    for (int i = 0; i < 2; i++) {
        tg_hf_export_options o = {out, named[i], NULL, 0, 0, 0};
        tg_err err = {{0}};
        struct rlimit none = was;
        none.rlim_cur = (rlim_t)lowest;
        REQUIRE(setrlimit(RLIMIT_NOFILE, &none) == 0, "setrlimit");
        const int rc = tg_hf_export_check(&p, &o, NULL, 0, &err);
        setrlimit(RLIMIT_NOFILE, &was);
        char want[1200];
        snprintf(want, sizeof want, "tokenizer file %s: cannot be read: %s", vocab, strerror(EMFILE));
        CHECK(rc == -1 && !strcmp(err.msg, want), "%s: rc %d '%s', want '%s'", named[i], rc, err.msg, want);
        /* with descriptors again it passes */
        CHECK(tg_hf_export_check(&p, &o, NULL, 0, &err) == 0, "%s: %s", named[i], err.msg);
    }
    free(out), free(tok), free(vocab);
    tg_plan_free(&p);
}
