#include "runtime/hf_export.h"
#include "base/alloc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/atomic_file.h"
#include "base/text_file.h"
#include "models/model_config.h"
#include "runtime/lora_export.h"

const char *const tg_hf_tokenizer_files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                             "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt", NULL};
#define MAX_TOKENIZER_FILES 7

const char *tg_hf_model_class(const tg_plan *plan) {
    const char *name = tg_hf_architecture(plan->model.arch, plan->train.task);
    return name ? name : "the model";
}

/* out_dir as found: missing, an empty folder, or a folder with entries. */
enum { OUT_ABSENT, OUT_EMPTY, OUT_FULL };

typedef struct export_plan {
    char *out;    /* out_dir resolved: links followed, its folder absolute */
    char *parent; /* the folder that holds it */
    int out_state;
    char *tokenizer[MAX_TOKENIZER_FILES];      /* the files to copy */
    const char *tokenizer_name[MAX_TOKENIZER_FILES];
    int n_tokenizer;
} export_plan;

static void export_plan_free(export_plan *p) {
    free(p->out);
    free(p->parent);
    for (int i = 0; i < p->n_tokenizer; i++) free(p->tokenizer[i]);
    memset(p, 0, sizeof *p);
}

/* The folder the model came from (its weights' folder, or the source named as a path);
 * NULL for a preset or when out of memory. */
static char *model_folder(const tg_plan *plan) {
    const tg_model_config *c = &plan->model;
    const char *file = c->weights[0] ? c->weights : NULL;
    if (!file) return strchr(c->source, '/') ? tg_strdup(c->source) : NULL;
    const char *slash = strrchr(file, '/');
    if (!slash) return tg_strdup(".");
    return slash == file ? tg_strdup("/") : tg_strndup(file, (size_t)(slash - file));
}

/* 1 for a regular file this process can read; 0 with err set otherwise. */
static int readable_file(const char *path, const char *what, tg_err *err) {
    struct stat st;
    if (stat(path, &st) != 0) return tg_fail(err, "%s %s: cannot look at it: %s", what, path, strerror(errno)), 0;
    if (!S_ISREG(st.st_mode)) return tg_fail(err, "%s %s: not a regular file", what, path), 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tg_fail(err, "%s %s: cannot be read: %s", what, path, strerror(errno)), 0;
    close(fd);
    return 1;
}

static int add_tokenizer_file(export_plan *p, const char *folder, const char *name, tg_err *err) {
    char *path;
    if (tg_asprintf(&path, "%s%s%s", folder ? folder : "", folder ? "/" : "", name) < 0) return tg_fail(err, "out of memory");
    p->tokenizer[p->n_tokenizer] = path;
    p->tokenizer_name[p->n_tokenizer++] = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
    return readable_file(path, "tokenizer file", err) ? 0 : -1;
}

/* The tokenizer files to copy: o->tokenizer's (a file or a folder), else the model
 * folder's. */
static int find_tokenizer(const tg_plan *plan, const tg_hf_export_options *o, export_plan *p, tg_err *err) {
    static const char list[] = "tokenizer.json, tokenizer_config.json, special_tokens_map.json, added_tokens.json, "
                               "vocab.txt, vocab.json, merges.txt";
    char *folder = o->tokenizer ? NULL : model_folder(plan);
    const char *src = o->tokenizer ? o->tokenizer : folder;
    if (!src) return 0; /* a preset: no tokenizer */
    struct stat st;
    int rc = 0;
    if (stat(src, &st) != 0) {
        rc = o->tokenizer ? tg_fail(err, "tokenizer %s: cannot look at it: %s", src, strerror(errno)) : 0;
    } else if (S_ISDIR(st.st_mode)) {
        for (int i = 0; tg_hf_tokenizer_files[i] && !rc; i++) {
            char *path;
            if (tg_asprintf(&path, "%s/%s", src, tg_hf_tokenizer_files[i]) < 0) {
                rc = tg_fail(err, "out of memory");
                break;
            }
            struct stat f;
            int there = lstat(path, &f) == 0;
            free(path);
            if (there) rc = add_tokenizer_file(p, src, tg_hf_tokenizer_files[i], err);
        }
        if (!rc && p->n_tokenizer == 0 && o->tokenizer)
            rc = tg_fail(err, "tokenizer %s: the folder holds none of the files Hugging Face loads a tokenizer from (%s)",
                         src, list);
    } else if (o->tokenizer && S_ISREG(st.st_mode)) {
        const char *base = strrchr(src, '/') ? strrchr(src, '/') + 1 : src;
        int known = 0;
        for (int i = 0; tg_hf_tokenizer_files[i]; i++) known |= !strcmp(base, tg_hf_tokenizer_files[i]);
        rc = known ? add_tokenizer_file(p, NULL, src, err)
                   : tg_fail(err,
                             "tokenizer %s: Hugging Face loads a tokenizer from files named %s; '%s' is none of them "
                             "(name the folder that holds them, or rename the file)",
                             src, list, base);
    } else if (o->tokenizer) {
        rc = tg_fail(err, "tokenizer %s: neither a file nor a folder", src);
    }
    free(folder);
    return rc;
}

/* out_dir resolved, its state, and whether it may be written. */
static int resolve_out(const tg_hf_export_options *o, export_plan *p, tg_err *err) {
    if (!o->out_dir || !o->out_dir[0]) return tg_fail(err, "output folder: the path is empty");
    char *path = tg_strdup(o->out_dir);
    if (!path) return tg_fail(err, "out of memory");
    for (size_t n = strlen(path); n > 1 && path[n - 1] == '/';) path[--n] = 0; /* "out/" is the folder out */
    int e = tg_output_resolve(path, &p->out);
    free(path);
    if (e == EISDIR) return tg_fail(err, "output folder %s: names no folder of its own ('.', '..' or '/')", o->out_dir);
    if (e == ENOENT)
        return tg_fail(err, "output folder %s: the folder it goes in does not exist (the export creates only the last "
                            "part of the path)", o->out_dir);
    if (e) return tg_fail(err, "output folder %s: %s", o->out_dir, strerror(e));
    const char *slash = strrchr(p->out, '/'); /* resolved paths are absolute */
    p->parent = slash == p->out ? tg_strdup("/") : tg_strndup(p->out, (size_t)(slash - p->out));
    if (!p->parent) return tg_fail(err, "out of memory");
    struct stat st;
    if (lstat(p->out, &st) != 0) {
        if (errno != ENOENT) /* GCOVR_EXCL_BR_LINE: tg_output_resolve lstat'ed it; only a race gives another errno */
            return tg_fail(err, "output folder %s: cannot look at it: %s", o->out_dir, strerror(errno));
        p->out_state = OUT_ABSENT;
    } else if (!S_ISDIR(st.st_mode)) {
        return tg_fail(err, "output folder %s: something that is not a folder is there", o->out_dir);
    } else {
        DIR *d = opendir(p->out);
        if (!d) return tg_fail(err, "output folder %s: cannot list it: %s", o->out_dir, strerror(errno));
        p->out_state = OUT_EMPTY;
        for (struct dirent *ent; (ent = readdir(d));)
            if (strcmp(ent->d_name, ".") && strcmp(ent->d_name, "..")) p->out_state = OUT_FULL;
        closedir(d);
        if (p->out_state == OUT_FULL && !o->force)
            return tg_fail(err, "output folder %s: exists and is not empty (--force replaces it)", o->out_dir);
    }
    if (access(p->parent, W_OK | X_OK) != 0)
        return tg_fail(err, "output folder %s: cannot write in %s: %s", o->out_dir, p->parent, strerror(errno));
    return 0;
}

/* The head the plan trains, as config.json describes it. */
static tg_hf_head plan_head(const tg_plan *plan, const tg_hf_export_options *o) {
    const tg_model_config *c = &plan->model;
    tg_hf_head h = {plan->train.task, plan->train.num_labels, o->labels, c->pad_token_id, -1, -1};
    tg_model_config_special_ids(c->source, &h.bos_token_id, &h.eos_token_id);
    /* GPT-2 classification finds each row's last token by the padding id it trained with;
     * BERT and RoBERTa keep their config's (their embeddings' padding index). */
    const int decoder = c->arch == TG_ARCH_GPT2 || c->arch == TG_ARCH_LLAMA;
    if (decoder && plan->train.task == TG_TASK_CLASSIFY) h.pad_token_id = plan->train.pad_id;
    else if (!decoder && h.pad_token_id < 0) h.pad_token_id = plan->train.pad_id;
    if (c->arch == TG_ARCH_MOBILENET_V2) h.pad_token_id = -1; /* images: no tokens to pad */
    return h;
}

/* config.json's text for the plan (malloc'd); it checks the label names too. */
static char *config_text(const tg_plan *plan, const tg_hf_export_options *o, tg_err *err) {
    if (plan->train.task != TG_TASK_CLASSIFY && o->labels) {
        tg_fail(err, "labels: a %s plan has no classes to name", tg_task_name(plan->train.task));
        return NULL;
    }
    if (o->labels && o->n_labels != plan->train.num_labels) {
        tg_fail(err, "labels: %d names for a plan of num_labels %d", o->n_labels, plan->train.num_labels);
        return NULL;
    }
    const tg_hf_head head = plan_head(plan, o);
    char *text = tg_model_config_hf_json(&plan->model, &head, err);
    if (!text) tg_fail_context(err, "config.json");
    return text;
}

/* Whether `path` is `dir` or lies inside it (both resolved; dir is never "/", which
 * resolve_out refuses). */
static int inside(const char *path, const char *dir) {
    size_t n = strlen(dir);
    return !strncmp(path, dir, n) && (path[n] == 0 || path[n] == '/');
}

/* Every check of tg_hf_export_check; fills p. */
static int prepare(const tg_plan *plan, const tg_hf_export_options *o, const tg_named_path *keep, int n_keep,
                   export_plan *p, tg_err *err) {
    memset(p, 0, sizeof *p);
    char *text = config_text(plan, o, err);
    if (!text) return -1;
    free(text);
    if (resolve_out(o, p, err) || find_tokenizer(plan, o, p, err)) return -1;
    for (int i = 0; i < n_keep; i++) {
        if (!keep[i].path || !keep[i].path[0]) continue;
        char *resolved;
        if (tg_output_resolve(keep[i].path, &resolved)) continue; /* not there: nothing to lose */
        const int in = inside(resolved, p->out);
        free(resolved);
        if (in)
            return tg_fail(err, "output folder %s: the %s %s is inside it, and the export replaces the folder whole",
                           o->out_dir, keep[i].what, keep[i].path);
    }
    return 0;
}

int tg_hf_export_check(const tg_plan *plan, const tg_hf_export_options *o, const tg_named_path *keep, int n_keep,
                       tg_err *err) {
    export_plan p;
    int rc = prepare(plan, o, keep, n_keep, &p, err);
    export_plan_free(&p);
    return rc;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0; /* go on: remove what can be removed */
}

static void remove_tree(const char *path) { nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

static void sync_folder(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) { /* GCOVR_EXCL_BR_LINE: a folder just made or renamed into place opens */
        fsync(fd);
        close(fd);
    }
}

/* A new empty folder beside p->out: "<parent>/.<name>.tmp.<pid>.<n>" (malloc'd). */
static char *make_temp_folder(const export_plan *p, tg_err *err) {
    static atomic_uint serial;
    const char *name = strrchr(p->out, '/') + 1;
    const int keep = NAME_MAX - 40; /* room for the dot and the suffix */
    for (int tries = 0; tries < 100; tries++) {
        char *tmp;
        /* p->out up to its name ("/" included, also when the parent is "/"), then ".<name>..." */
        if (tg_asprintf(&tmp, "%.*s.%.*s.tmp.%ld.%u", (int)(name - p->out), p->out, keep, name, (long)getpid(),
                        atomic_fetch_add(&serial, 1)) < 0) {
            tg_fail(err, "%s: out of memory naming a temporary folder beside it", p->out);
            return NULL;
        }
        if (mkdir(tmp, 0777) == 0) return tmp;
        int e = errno;
        if (e != EEXIST) {
            tg_fail(err, "%s: cannot create the temporary folder: %s", tmp, strerror(e));
            free(tmp);
            return NULL;
        }
        free(tmp);
    }
    tg_fail(err, "%s: cannot create a temporary folder beside it", p->out);
    return NULL;
}

/* Tokenizer files are at most tens of megabytes; a bigger one is not a tokenizer file. */
#define TOKENIZER_FILE_MAX ((size_t)1 << 30)

/* Copies src to dst (atomically, as every file of the folder is written), through memory. */
static int copy_file(const char *src, const char *dst, tg_err *err) {
    char *data;
    size_t len;
    if (tg_read_text_file(src, TOKENIZER_FILE_MAX, "a tokenizer file", &data, &len, err)) return -1;
    const tg_chunk chunk = {data, len};
    const int rc = tg_write_file_atomic(dst, &chunk, 1, "tokenizer file", err);
    free(data);
    return rc;
}

/* Writes the folder's files into tmp. */
static int write_files(const tg_weights_image *img, const tg_hf_export_options *o, const export_plan *p,
                       const char *tmp, tg_err *err) {
    char *config = config_text(img->plan, o, err), *path = NULL;
    if (!config) return -1;
    int rc = tg_asprintf(&path, "%s/config.json", tmp) < 0 ? tg_fail(err, "out of memory") : 0;
    const tg_chunk chunk = {config, strlen(config)};
    if (!rc) rc = tg_write_file_atomic(path, &chunk, 1, "config.json", err);
    free(config);
    free(path);
    path = NULL;
    if (!rc) rc = tg_asprintf(&path, "%s/model.safetensors", tmp) < 0 ? tg_fail(err, "out of memory") : 0;
    if (!rc) rc = tg_weights_save_hf(img, path, o->bf16, err);
    free(path);
    /* LoRA: the adapters alone as well, as PEFT saves them (model.safetensors has them
     * merged), in their own subfolder (TG_HF_ADAPTER_DIR says why). */
    tg_lora_pair *pairs = NULL;
    const int n_pairs = rc ? 0 : tg_lora_pairs(img->plan, &pairs, err);
    if (n_pairs < 0) rc = -1;
    if (!rc && n_pairs > 0) {
        path = NULL;
        if (tg_asprintf(&path, "%s/" TG_HF_ADAPTER_DIR, tmp) < 0) rc = tg_fail(err, "out of memory");
        else if (mkdir(path, 0777) != 0)
            rc = tg_fail(err, "%s: cannot create the adapter folder: %s", path, strerror(errno));
        if (!rc) rc = tg_lora_write_adapter(img, pairs, n_pairs, path, o->bf16, err);
        free(path);
    }
    free(pairs);
    for (int i = 0; i < p->n_tokenizer && !rc; i++) {
        path = NULL;
        rc = tg_asprintf(&path, "%s/%s", tmp, p->tokenizer_name[i]) < 0 ? tg_fail(err, "out of memory") : 0;
        if (!rc) rc = copy_file(p->tokenizer[i], path, err);
        free(path);
    }
    return rc;
}

/* Puts tmp in place of p->out: a rename over nothing or an empty folder; with force, an
 * exchange with the full folder (one atomic step), whose old entries are then removed. */
static int commit(const tg_hf_export_options *o, const export_plan *p, const char *tmp, int *keep_tmp, tg_err *err) {
    sync_folder(tmp);
    if (rename(tmp, p->out) == 0) {
        sync_folder(p->parent);
        return 0;
    }
    int e = errno;
    if (e != ENOTEMPTY && e != EEXIST)
        return tg_fail(err, "output folder %s: cannot move %s into place: %s", o->out_dir, tmp, strerror(e));
    if (!o->force) {
        *keep_tmp = 1;
        return tg_fail(err, "output folder %s: something was written into it during the export; it is left alone and "
                            "the export kept in %s", o->out_dir, tmp);
    }
    /* GCOVR_EXCL_BR_START: the fallback runs only on a file system without RENAME_EXCHANGE
     * (before Linux 3.15, some FUSE and network ones); tmpfs, ext4 and overlayfs have it */
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, p->out, RENAME_EXCHANGE) == 0) {
        sync_folder(p->parent);
        remove_tree(tmp); /* now the old folder */
        return 0;
    }
    /* A file system without exchange: the old folder steps aside first. */
    char *old;
    if (tg_asprintf(&old, "%s.old", tmp) < 0) return tg_fail(err, "out of memory");
    int rc = 0;
    if (rename(p->out, old) != 0) {
        rc = tg_fail(err, "output folder %s: cannot move it aside to replace it: %s", o->out_dir, strerror(errno));
    } else if (rename(tmp, p->out) != 0) {
        e = errno;
        rename(old, p->out); /* put it back */
        rc = tg_fail(err, "output folder %s: cannot move %s into place: %s", o->out_dir, tmp, strerror(e));
    } else {
        sync_folder(p->parent);
        remove_tree(old);
    }
    /* GCOVR_EXCL_BR_STOP */
    free(old);
    return rc;
}

int tg_hf_export(const tg_weights_image *img, const tg_hf_export_options *o, tg_err *err) {
    export_plan p;
    int rc = prepare(img->plan, o, NULL, 0, &p, err);
    char *tmp = rc ? NULL : make_temp_folder(&p, err);
    if (!rc && !tmp) rc = -1;
    if (!rc && write_files(img, o, &p, tmp, err)) {
        remove_tree(tmp);
        rc = -1;
    }
    if (!rc) {
        int keep_tmp = 0; /* someone wrote into out_dir meanwhile: the export stays where it is */
        rc = commit(o, &p, tmp, &keep_tmp, err);
        if (rc && !keep_tmp) remove_tree(tmp);
    }
    free(tmp);
    export_plan_free(&p);
    return rc;
}
