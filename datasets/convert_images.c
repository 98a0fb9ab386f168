#include "datasets/convert_images.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "datasets/eval_split.h"
#include "datasets/file_bytes.h"
#include "datasets/folder_names.h"
#include "datasets/gunzip.h"
#include "datasets/idx.h"
#include "datasets/image_decode.h"
#include "datasets/labels.h"
#include "datasets/shard_format.h"
#include "datasets/shard_writer.h"
#include "datasets/utf8.h"

/* The largest IDX file read once gunzipped (MNIST's training images are 47 MB). */
#define IDX_MAX_BYTES ((size_t)1 << 34)

/* ---- the records, shared by both formats ---------------------------------------------- */

typedef struct image_sink {
    tg_shard_writer *w;
    tg_convert_report *rep;
    int32_t channels, height, width;
    int64_t values;  /* channels x height x width */
    uint8_t *resized;
    int32_t *ids;    /* one image's values as the writer takes them */
} image_sink;

static int sink_open(image_sink *s, const tg_convert_options *o, tg_convert_report *rep, char **labels,
                     int32_t n_labels, int32_t channels, int32_t height, int32_t width, const char *what,
                     tg_err *err) {
    memset(s, 0, sizeof *s);
    s->rep = rep;
    s->channels = channels, s->height = height, s->width = width;
    s->values = (int64_t)channels * height * width;
    rep->seq = s->values <= TG_SHARD_SEQ_MAX ? (int32_t)s->values : 0;
    if (s->values > TG_SHARD_SEQ_MAX)
        return tg_fail(err, "%s: images of %d x %d x %d are more than %d values", what, channels, height, width,
                       TG_SHARD_SEQ_MAX);
    s->resized = tg_malloc((size_t)s->values);
    s->ids = tg_malloc((size_t)s->values * sizeof *s->ids);
    if (!s->resized || !s->ids) return tg_fail(err, "out of memory for an image of %d x %d x %d", channels, height, width);
    const tg_shard_set_desc desc = {.task = TG_SHARD_IMAGE,
                                    .seq = (int32_t)s->values,
                                    .n_labels = n_labels,
                                    .labels = labels,
                                    .vocab_size = 256,
                                    .command = o->command,
                                    .frame_bytes = o->frame_bytes,
                                    .shard_bytes = o->shard_bytes,
                                    .image_channels = channels,
                                    .image_height = height,
                                    .image_width = width};
    return tg_shard_writer_open(o->outdir, &desc, &s->w, err);
}

/* One image of the sink's channels, h x w (planes), resized to the sink's size. */
static int sink_add(image_sink *s, int split, const uint8_t *pixels, int32_t h, int32_t w, int32_t label, tg_err *err) {
    const uint8_t *img = pixels;
    if (h != s->height || w != s->width) {
        tg_image_resize_bilinear(pixels, s->channels, h, w, s->resized, s->height, s->width);
        img = s->resized;
    }
    for (int64_t k = 0; k < s->values; k++) s->ids[k] = img[k];
    const tg_shard_record rec = {.len = (int32_t)s->values, .input_ids = s->ids, .label = label};
    if (tg_shard_writer_add(s->w, split, &rec, err)) return -1;
    s->rep->records[split]++;
    s->rep->tokens[split] += s->values;
    return 0;
}

/* Commits the set when rc is 0, else throws the temporary folder away; returns rc or the
 * commit's failure. */
static int sink_close(image_sink *s, int rc, tg_err *err) {
    if (s->w) {
        if (!rc) rc = tg_shard_writer_commit(s->w, err);
        else tg_shard_writer_abort(s->w);
    }
    free(s->resized);
    free(s->ids);
    memset(s, 0, sizeof *s);
    return rc;
}

/* ---- idx -------------------------------------------------------------------------------- */

/* An IDX file's bytes, gunzipped when it starts with gzip's magic; `name` is how messages
 * name it then ("PATH (gunzipped)"). */
static int idx_file(const char *path, uint8_t **data, size_t *len, char *name, size_t name_cap, tg_err *err) {
    char *raw;
    size_t n;
    if (tg_file_bytes(path, &raw, &n, err)) return -1;
    if (!tg_is_gzip((const uint8_t *)raw, n)) {
        *data = (uint8_t *)raw, *len = n;
        snprintf(name, name_cap, "%s", path);
        return 0;
    }
    int rc = tg_gunzip((const uint8_t *)raw, n, path, IDX_MAX_BYTES, data, len, err);
    free(raw);
    snprintf(name, name_cap, "%s (gunzipped)", path);
    return rc;
}

int tg_convert_idx(const tg_convert_options *o, tg_convert_report *rep, tg_err *err) {
    rep->format = TG_INPUT_IDX;
    rep->task = TG_SHARD_IMAGE;
    if (o->n_inputs != 1) return tg_fail(err, "--format idx takes one images file, got %d inputs", o->n_inputs);
    if (o->text_column || o->pair_column || o->label_column || o->labels || o->template_path || o->seq ||
        o->doc_stride > 0 || o->skip_invalid || o->image_channels)
        return tg_fail(err, "--format idx takes --labels FILE, --image-size, --eval-fraction and --seed only");
    if (o->image_size < 0 || o->image_size > 4096) return tg_fail(err, "--image-size %d is outside 1 to 4096", o->image_size);
    const char *images_path = o->inputs[0];
    char beside[4096];
    const char *labels_path = o->labels_path;
    if (!labels_path) {
        if (tg_idx_labels_beside(images_path, beside, sizeof beside))
            return tg_fail(err, "%s: no labels file given (--labels FILE) and the name is not MNIST's "
                                "(...images-idx3-ubyte, whose labels are ...labels-idx1-ubyte)",
                           images_path);
        labels_path = beside;
    }
    uint8_t *ibuf = NULL, *lbuf = NULL;
    size_t ilen = 0, llen = 0;
    char iname[4200], lname[4200];
    tg_idx_images im = {0};
    int32_t n_labels_file = 0;
    const uint8_t *lab = NULL;
    uint8_t *in_eval = NULL;
    int64_t n_eval = 0;
    char names_buf[256][4];
    char *names[256];
    image_sink sink = {0};
    int rc = idx_file(images_path, &ibuf, &ilen, iname, sizeof iname, err);
    if (!rc) rc = tg_idx_parse_images(ibuf, ilen, iname, &im, err);
    if (!rc) rc = idx_file(labels_path, &lbuf, &llen, lname, sizeof lname, err);
    if (!rc) rc = tg_idx_parse_labels(lbuf, llen, lname, &n_labels_file, &lab, err);
    if (!rc && n_labels_file != im.n)
        rc = tg_fail(err, "%s: %d labels, the images file %s holds %d images", labels_path, n_labels_file, images_path,
                     im.n);
    int32_t n_labels = 0;
    for (int32_t i = 0; !rc && i < im.n; i++)
        if (lab[i] + 1 > n_labels) n_labels = lab[i] + 1;
    rep->units = im.n;
    rep->n_labels = n_labels;
    if (!rc) rc = tg_eval_split_pick(im.n, o->eval_fraction, o->seed, "images", &in_eval, &n_eval, err);
    for (int32_t i = 0; i < n_labels; i++) {
        snprintf(names_buf[i], sizeof names_buf[i], "%d", i);
        names[i] = names_buf[i];
    }
    const int32_t oh = o->image_size ? o->image_size : im.height, ow = o->image_size ? o->image_size : im.width;
    if (!rc) rc = sink_open(&sink, o, rep, names, n_labels, 1, oh, ow, images_path, err);
    const size_t in_px = (size_t)im.height * (size_t)im.width;
    for (int32_t i = 0; !rc && i < im.n; i++) {
        rc = sink_add(&sink, in_eval[i] ? TG_SPLIT_EVAL : TG_SPLIT_TRAIN, im.pixels + (size_t)i * in_px, im.height,
                      im.width, lab[i], err);
        if (!rc && o->progress) o->progress(o->progress_ctx, i + 1, im.n, rep->tokens[0] + rep->tokens[1]);
    }
    rc = sink_close(&sink, rc, err);
    free(in_eval);
    free(ibuf);
    free(lbuf);
    return rc;
}

/* ---- images: a folder per label ------------------------------------------------------- */

typedef struct image_files {
    char **paths;
    int32_t *labels;
    int64_t n, cap;
} image_files;

static void image_files_free(image_files *f) {
    for (int64_t i = 0; i < f->n; i++) free(f->paths[i]);
    free(f->paths);
    free(f->labels);
    memset(f, 0, sizeof *f);
}

static int image_files_add(image_files *f, const char *dir, const char *file, int32_t label, tg_err *err) {
    if (f->n == f->cap) {
        int64_t cap = f->cap ? 2 * f->cap : 256;
        char **p = tg_realloc(f->paths, (size_t)cap * sizeof *p);
        if (p) f->paths = p;
        int32_t *l = p ? tg_realloc(f->labels, (size_t)cap * sizeof *l) : NULL;
        if (!l) return tg_fail(err, "out of memory for the names of %lld files", (long long)cap);
        f->labels = l, f->cap = cap;
    }
    const size_t n = strlen(dir) + 1 + strlen(file) + 1;
    if (!(f->paths[f->n] = tg_malloc(n))) return tg_fail(err, "out of memory for a file name");
    snprintf(f->paths[f->n], n, "%s/%s", dir, file);
    f->labels[f->n++] = label;
    return 0;
}

/* ROOT's label folders (named and ordered in *labels) and their files, label by label. */
static int list_image_files(const char *root, tg_label_set *labels, image_files *files, tg_err *err) {
    tg_folder_names folders;
    if (tg_folder_list(root, 1, &folders, err)) return -1;
    int rc = 0;
    if (folders.n == 0) rc = tg_fail(err, "%s: no label folders (the layout is %s/LABEL/FILE, one folder per label)", root, root);
    for (size_t i = 0; !rc && i < folders.n; i++)
        if (tg_utf8_invalid_at(folders.v[i], strlen(folders.v[i])) >= 0)
            rc = tg_fail(err, "%s/%s: the folder's name is not UTF-8, so it cannot name a label", root, folders.v[i]);
    if (!rc && folders.n > INT32_MAX) rc = tg_fail(err, "%s: too many label folders", root);
    if (!rc) rc = tg_labels_of_names((const char *const *)folders.v, (int32_t)folders.n, labels, err);
    tg_folder_names_free(&folders);
    char dir[4096];
    for (int32_t id = 0; !rc && id < labels->n; id++) {
        if (snprintf(dir, sizeof dir, "%s/%s", root, labels->names[id]) >= (int)sizeof dir) {
            rc = tg_fail(err, "%s/%s: path too long", root, labels->names[id]);
            break;
        }
        tg_folder_names in;
        if ((rc = tg_folder_list(dir, 0, &in, err))) break;
        if (in.n == 0)
            rc = tg_fail(err, "%s: no image files (every label folder needs at least one; names starting with '.' "
                              "are left out)",
                         dir);
        for (size_t j = 0; !rc && j < in.n; j++) rc = image_files_add(files, dir, in.v[j], id, err);
        tg_folder_names_free(&in);
    }
    return rc ? -1 : 0;
}

int tg_convert_image_folders(const tg_convert_options *o, tg_convert_report *rep, tg_err *err) {
    rep->format = TG_INPUT_IMAGES;
    rep->task = TG_SHARD_IMAGE;
    if (o->n_inputs != 1) return tg_fail(err, "--format images takes one folder (ROOT/LABEL/FILE), got %d inputs", o->n_inputs);
    if (o->text_column || o->pair_column || o->label_column || o->labels || o->labels_path || o->template_path ||
        o->seq || o->doc_stride > 0 || o->skip_invalid)
        return tg_fail(err, "--format images takes --image-size, --channels, --eval-fraction and --seed only");
    if (o->image_size < 0 || o->image_size > 4096) return tg_fail(err, "--image-size %d is outside 1 to 4096", o->image_size);
    const int32_t channels = o->image_channels ? o->image_channels : 3;
    if (channels != 1 && channels != 3) return tg_fail(err, "--channels %d: images have 1 or 3", channels);
    /* "data/" names files as "data/x/y", as the text folders reader does. */
    size_t rlen = strlen(o->inputs[0]);
    while (rlen > 1 && o->inputs[0][rlen - 1] == '/') rlen--;
    char root[4096];
    if (rlen >= sizeof root) return tg_fail(err, "%s: path too long", o->inputs[0]);
    memcpy(root, o->inputs[0], rlen);
    root[rlen] = 0;

    tg_label_set labels = {0};
    image_files files = {0};
    uint8_t *in_eval = NULL;
    int64_t n_eval = 0;
    image_sink sink = {0};
    int rc = list_image_files(root, &labels, &files, err);
    rep->units = files.n;
    rep->n_labels = labels.n;
    if (!rc) rc = tg_eval_split_pick(files.n, o->eval_fraction, o->seed, "images", &in_eval, &n_eval, err);
    for (int64_t i = 0; !rc && i < files.n; i++) {
        const char *path = files.paths[i];
        char *bytes;
        size_t len;
        tg_image im = {0};
        rc = tg_file_bytes(path, &bytes, &len, err);
        if (!rc) {
            rc = tg_image_decode((const uint8_t *)bytes, len, path, channels, &im, err);
            free(bytes);
        }
        if (!rc && !sink.w) {
            const int32_t oh = o->image_size ? o->image_size : im.height, ow = o->image_size ? o->image_size : im.width;
            rc = sink_open(&sink, o, rep, labels.names, labels.n, channels, oh, ow, path, err);
        }
        if (!rc && !o->image_size && (im.height != sink.height || im.width != sink.width))
            rc = tg_fail(err, "%s: %d x %d pixels, the images before it are %d x %d (give --image-size N to resize "
                              "them all to N x N)",
                         path, im.width, im.height, sink.width, sink.height);
        if (!rc) rc = sink_add(&sink, in_eval[i] ? TG_SPLIT_EVAL : TG_SPLIT_TRAIN, im.pixels, im.height, im.width,
                               files.labels[i], err);
        tg_image_free(&im);
        if (!rc && o->progress) o->progress(o->progress_ctx, i + 1, files.n, rep->tokens[0] + rep->tokens[1]);
    }
    rc = sink_close(&sink, rc, err);
    free(in_eval);
    image_files_free(&files);
    tg_labels_free(&labels);
    return rc;
}
