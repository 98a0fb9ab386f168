#include "datasets/convert.h"
#include "base/alloc.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "datasets/eval_split.h"
#include "datasets/file_bytes.h"
#include "datasets/convert_images.h"
#include "datasets/instruct.h"
#include "datasets/labels.h"
#include "datasets/qa_features.h"
#include "datasets/shard_writer.h"
#include "datasets/squad.h"
#include "datasets/squad_eval.h"
#include "datasets/text_rows.h"
#include "plan/plan.h"

static const char *const format_names[] = {"auto", "csv", "tsv", "jsonl", "squad", "text", "folders", "instruct", "idx",
                                           "images"};

int tg_input_format_parse(const char *name) {
    for (int i = 1; i < (int)(sizeof format_names / sizeof *format_names); i++)
        if (!strcmp(name, format_names[i])) return i;
    return -1;
}

const char *tg_input_format_name(int format) {
    return format >= 0 && format < (int)(sizeof format_names / sizeof *format_names) ? format_names[format] : "?";
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcasecmp(s + n - k, suffix);
}

static int format_of(const char *path, tg_err *err) {
    struct stat st;
    if (stat(path, &st) != 0) return tg_fail(err, "%s: cannot open: no such file or folder", path);
    if (S_ISDIR(st.st_mode)) return TG_INPUT_FOLDERS;
    if (ends_with(path, ".csv")) return TG_INPUT_CSV;
    if (ends_with(path, ".tsv") || ends_with(path, ".tab")) return TG_INPUT_TSV;
    if (ends_with(path, ".jsonl")) return TG_INPUT_JSONL;
    if (ends_with(path, ".json")) return TG_INPUT_SQUAD;
    if (ends_with(path, ".txt")) return TG_INPUT_TEXT;
    return tg_fail(err, "%s: cannot tell the format from the name (--format csv|tsv|jsonl|squad|text|folders|instruct|idx|images)",
                   path);
}

/* ---- conversion state ---------------------------------------------------------- */

typedef struct converter {
    const tg_convert_options *opt;
    const tg_text_encoder *enc;
    tg_convert_report *rep;
    tg_shard_writer *w;
    int32_t seq;
    int32_t *chunk[TG_SPLIT_COUNT]; /* lm: the record being filled per split */
    int32_t chunk_n[TG_SPLIT_COUNT];
} converter;

static int add(converter *C, int split, const tg_shard_record *rec, tg_err *err) {
    if (tg_shard_writer_add(C->w, split, rec, err)) return -1;
    C->rep->records[split]++;
    C->rep->tokens[split] += rec->len;
    return 0;
}

/* The record of one encoding; token types only when any is nonzero. */
static int add_encoding(converter *C, int split, const tg_encoding *e, int32_t label, tg_err *err) {
    tg_shard_record rec = {.len = e->n_real, .input_ids = e->ids, .label = label};
    int any = 0;
    for (int32_t i = 0; i < e->n_real && !any; i++) any = e->type_ids[i] != 0;
    if (any) rec.token_type_ids = e->type_ids;
    return add(C, split, &rec, err);
}

/* lm: appends ids to the split's record in the making, writing each full one. */
static int lm_feed(converter *C, int split, const int32_t *ids, int32_t n, tg_err *err) {
    while (n > 0) {
        int32_t take = C->seq - C->chunk_n[split] < n ? C->seq - C->chunk_n[split] : n;
        memcpy(C->chunk[split] + C->chunk_n[split], ids, (size_t)take * sizeof *ids);
        C->chunk_n[split] += take;
        ids += take;
        n -= take;
        if (C->chunk_n[split] == C->seq) {
            tg_shard_record rec = {.len = C->seq, .input_ids = C->chunk[split]};
            if (add(C, split, &rec, err)) return -1;
            C->chunk_n[split] = 0;
        }
    }
    return 0;
}

static int lm_finish(converter *C, tg_err *err) {
    for (int s = 0; s < TG_SPLIT_COUNT; s++) {
        /* One token predicts nothing: such a tail is dropped. */
        if (C->chunk_n[s] >= 2) {
            tg_shard_record rec = {.len = C->chunk_n[s], .input_ids = C->chunk[s]};
            if (add(C, s, &rec, err)) return -1;
        }
        C->chunk_n[s] = 0;
    }
    return 0;
}

/* ---- rows (csv, tsv, jsonl, folders, text) ---------------------------------------- */

static int read_rows(const tg_convert_options *o, int format, tg_text_rows *rows, tg_err *err) {
    const tg_text_columns cols = {.text = o->text_column ? o->text_column : "text",
                                  .pair = o->pair_column,
                                  .label = o->label_column ? o->label_column : "label",
                                  .label_required = o->label_column != NULL,
                                  .skip_invalid = o->skip_invalid};
    for (int32_t i = 0; i < o->n_inputs; i++) {
        const char *path = o->inputs[i];
        if (format == TG_INPUT_FOLDERS) {
            if (tg_text_read_folders(path, o->skip_invalid, rows, err)) return -1;
            continue;
        }
        char *buf;
        size_t len;
        if (tg_file_bytes(path, &buf, &len, err)) return -1;
        int rc = format == TG_INPUT_CSV        ? tg_text_read_csv(path, buf, len, ',', &cols, rows, err)
                 : format == TG_INPUT_TSV      ? tg_text_read_csv(path, buf, len, '\t', &cols, rows, err)
                 : format == TG_INPUT_JSONL    ? tg_text_read_jsonl(path, buf, len, &cols, rows, err)
                 : format == TG_INPUT_INSTRUCT ? tg_text_read_instruct(path, buf, len, o->skip_invalid, rows, err)
                                               : tg_text_read_lines(path, buf, len, o->skip_invalid, rows, err);
        free(buf);
        if (rc) return -1;
    }
    return 0;
}

/* Label ids for the rows: the given list, or the names found. */
static int label_rows(const tg_convert_options *o, const tg_text_rows *rows, tg_label_set *ls, int32_t **ids,
                      tg_err *err) {
    *ids = NULL;
    int64_t labelled = 0;
    for (int64_t i = 0; i < rows->n; i++) labelled += rows->rows[i].label >= 0;
    if (labelled == 0) {
        if (o->labels) return tg_fail(err, "--labels is given, but the rows have no labels");
        return 0;
    }
    char where[600];
    if (labelled < rows->n) {
        int64_t i = 0;
        while (rows->rows[i].label >= 0) i++; /* some row has none: labelled < n */
        tg_text_rows_where(rows, &rows->rows[i], where, sizeof where);
        return tg_fail(err, "%s: no label, but other rows have one", where);
    }
    if (o->labels ? tg_labels_parse_list(o->labels, ls, err) : tg_labels_collect(rows, ls, err)) return -1;
    if (!(*ids = tg_malloc((size_t)rows->n * sizeof **ids)))
        return tg_fail(err, "out of memory for the label ids of %lld rows", (long long)rows->n);
    for (int64_t i = 0; i < rows->n; i++) {
        const tg_text_row *r = &rows->rows[i];
        int32_t id = tg_labels_find(ls, tg_text_rows_at(rows, r->label), (size_t)r->label_len);
        if (id < 0) {
            char names[400] = "";
            size_t at = 0;
            for (int32_t k = 0; k < ls->n && at + 64 < sizeof names; k++)
                at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", k ? ", " : "", ls->names[k]);
            if (at + 64 >= sizeof names) snprintf(names + at, sizeof names - at, ", ...");
            tg_text_rows_where(rows, r, where, sizeof where);
            return tg_fail(err, "%s: unknown label name '%.*s' (--labels lists: %s)", where,
                           (int)(r->label_len > 80 ? 80 : r->label_len), tg_text_rows_at(rows, r->label), names);
        }
        (*ids)[i] = id;
    }
    return 0;
}

static int64_t tokens_so_far(const converter *C) { return C->rep->tokens[0] + C->rep->tokens[1]; }

static int convert_rows(converter *C, const tg_text_rows *rows, const int32_t *label_ids, const uint8_t *in_eval,
                        tg_err *err) {
    const int lm_text = C->rep->task == TG_SHARD_LM && C->rep->format == TG_INPUT_TEXT;
    const tg_special_ids *sp = &C->enc->special;
    const int32_t separator = sp->eos >= 0 ? sp->eos : sp->sep;
    const tg_encode_options with_template = {.add_special_tokens = 1, .max_len = C->seq};
    const tg_encode_options plain = {.add_special_tokens = 0};
    char where[600];
    for (int64_t i = 0; i < rows->n; i++) {
        if (i && C->opt->progress) C->opt->progress(C->opt->progress_ctx, i, rows->n, tokens_so_far(C));
        const tg_text_row *r = &rows->rows[i];
        const int split = in_eval[i] ? TG_SPLIT_EVAL : TG_SPLIT_TRAIN;
        const tg_encoding *e;
        const char *pair = r->pair >= 0 ? tg_text_rows_at(rows, r->pair) : NULL;
        if (C->enc->encode(C->enc->ctx, tg_text_rows_at(rows, r->text), (size_t)r->text_len, pair,
                           (size_t)r->pair_len, lm_text ? &plain : &with_template, &e, err)) {
            tg_text_rows_where(rows, r, where, sizeof where);
            return tg_fail_context(err, "%s", where);
        }
        if (lm_text) {
            if (lm_feed(C, split, e->ids, e->n_real, err) ||
                (separator >= 0 && lm_feed(C, split, &separator, 1, err)))
                return -1;
            continue;
        }
        if (e->n_real == 0) { /* a template-less tokenizer on empty text */
            C->rep->skipped_empty++;
            continue;
        }
        if (add_encoding(C, split, e, label_ids ? label_ids[i] : -1, err)) {
            tg_text_rows_where(rows, r, where, sizeof where);
            return tg_fail_context(err, "%s", where);
        }
    }
    return lm_text ? lm_finish(C, err) : 0;
}

/* ---- instruct -------------------------------------------------------------------- */

/* The prompt templates of a conversion: Alpaca's two, or the one of --template for both. */
typedef struct templates {
    tg_instruct_template with_input, no_input;
    char *file; /* --template's bytes */
} templates;

static int templates_open(const tg_convert_options *o, templates *t, tg_err *err) {
    memset(t, 0, sizeof *t);
    if (!o->template_path) { /* Alpaca's own pass the check */
        (void)tg_instruct_template_check("", tg_alpaca_prompt_input, strlen(tg_alpaca_prompt_input), &t->with_input,
                                         err);
        (void)tg_instruct_template_check("", tg_alpaca_prompt_no_input, strlen(tg_alpaca_prompt_no_input),
                                         &t->no_input, err);
        return 0;
    }
    size_t len;
    if (tg_file_bytes(o->template_path, &t->file, &len, err)) return tg_fail_context(err, "--template");
    /* The line end that ends a text file is no part of the template. */
    if (len && t->file[len - 1] == '\n') {
        len--;
        if (len && t->file[len - 1] == '\r') len--;
    }
    if (tg_instruct_template_check(o->template_path, t->file, len, &t->with_input, err))
        return tg_fail_context(err, "--template");
    t->no_input = t->with_input;
    return 0;
}

static int convert_instruct(converter *C, const tg_text_rows *rows, const uint8_t *in_eval, const templates *tm,
                            tg_err *err) {
    const tg_special_ids *sp = &C->enc->special;
    const int32_t bos = sp->bos, eos = sp->eos >= 0 ? sp->eos : sp->sep;
    const int32_t nb = bos >= 0, ne = eos >= 0;
    const tg_encode_options plain = {.add_special_tokens = 0};
    int32_t *ids = C->chunk[TG_SPLIT_TRAIN]; /* seq tokens: the record being made */
    tg_instruct_text prompt = {0}, response = {0};
    char where[600];
    int rc = 0;
    for (int64_t i = 0; i < rows->n && !rc; i++) {
        if (i && C->opt->progress) C->opt->progress(C->opt->progress_ctx, i, rows->n, tokens_so_far(C));
        const tg_text_row *r = &rows->rows[i];
        const int split = in_eval[i] ? TG_SPLIT_EVAL : TG_SPLIT_TRAIN;
        const char *input = r->pair >= 0 ? tg_text_rows_at(rows, r->pair) : NULL;
        const tg_instruct_template *t = input ? &tm->with_input : &tm->no_input;
        tg_text_rows_where(rows, r, where, sizeof where);
        if (input && !t->has_input) {
            rc = tg_fail(err, "%s: the record has an input, but the template %s has no {input}", where,
                         C->opt->template_path);
            break;
        }
        const tg_encoding *e;
        if ((rc = tg_instruct_render(t, tg_text_rows_at(rows, r->text), (size_t)r->text_len, input,
                                     (size_t)r->pair_len, tg_text_rows_at(rows, r->label), (size_t)r->label_len,
                                     &prompt, &response, err)) ||
            (rc = C->enc->encode(C->enc->ctx, prompt.s, prompt.n, NULL, 0, &plain, &e, err))) {
            tg_fail_context(err, "%s", where);
            break;
        }
        const int32_t prompt_len = nb + e->n_real;
        if (prompt_len == 0) {
            rc = tg_fail(err, "%s: the prompt encodes to no tokens, and the tokenizer has no bos token to start it",
                         where);
            break;
        }
        /* Room for the response: seq less the prompt and the eos. */
        const int64_t room = (int64_t)C->seq - prompt_len - ne;
        if (room < 1) {
            C->rep->skipped_long++;
            continue;
        }
        if (nb) ids[0] = bos;
        if (e->n_real) memcpy(ids + nb, e->ids, sizeof *ids * (size_t)e->n_real);
        if ((rc = C->enc->encode(C->enc->ctx, response.s, response.n, NULL, 0, &plain, &e, err))) {
            tg_fail_context(err, "%s", where);
            break;
        }
        if (e->n_real == 0) {
            C->rep->skipped_empty++;
            continue;
        }
        int32_t keep = e->n_real;
        if (keep > room) {
            keep = (int32_t)room;
            C->rep->truncated++;
        }
        memcpy(ids + prompt_len, e->ids, sizeof *ids * (size_t)keep);
        if (ne) ids[prompt_len + keep] = eos;
        const tg_shard_record rec = {.len = prompt_len + keep + ne, .input_ids = ids, .prompt_len = prompt_len};
        if ((rc = add(C, split, &rec, err))) tg_fail_context(err, "%s", where);
    }
    tg_instruct_text_free(&prompt);
    tg_instruct_text_free(&response);
    return rc;
}

/* ---- squad ---------------------------------------------------------------------- */

/* The SQuAD eval file of each split (datasets/squad_eval.h), written as the windows are. */
typedef struct qa_side {
    FILE *f[TG_SPLIT_COUNT];
    char *path[TG_SPLIT_COUNT]; /* allocated to fit: the writer's folder has no fixed bound here */
    int32_t contexts[TG_SPLIT_COUNT], questions[TG_SPLIT_COUNT], windows[TG_SPLIT_COUNT];
    int64_t last_paragraph[TG_SPLIT_COUNT]; /* the context written last, numbered over the files */
} qa_side;

typedef struct qa_sink_ctx {
    converter *C;
    int split;
    qa_side *side;
    const tg_qa_buffers *buf;
} qa_sink_ctx;

static int qa_sink(void *ctx, const tg_shard_record *rec, tg_err *err) {
    qa_sink_ctx *s = ctx;
    qa_side *d = s->side;
    const int k = s->split;
    if (add(s->C, k, rec, err) ||
        tg_squad_eval_put_window(d->f[k], d->path[k], d->questions[k] - 1, s->buf->window_at, s->buf->window_first,
                                 s->buf->window_count, err))
        return -1;
    d->windows[k]++;
    return 0;
}

/* The eval lines of question q before its windows: its context (once per context) and its id
 * and gold answers. */
static int qa_side_question(converter *C, qa_side *d, int split, const tg_squad *sq, const tg_squad_question *q,
                            int64_t paragraph, const tg_qa_context *ctx, tg_err *err) {
    if (!d->f[split]) {
        const char *folder = tg_shard_writer_folder(C->w), *name = tg_squad_eval_file_name(split);
        const size_t size = strlen(folder) + 1 + strlen(name) + 1;
        free(d->path[split]);
        if (!(d->path[split] = tg_malloc(size))) return tg_fail(err, "out of memory for the path of %s", name);
        snprintf(d->path[split], size, "%s/%s", folder, name);
        if (!(d->f[split] = fopen(d->path[split], "wbx"))) /* GCOVR_EXCL_BR_LINE: the writer's temporary folder is new and its own (mkdtemp) and holds no eval file yet; fopen needs one descriptor, as reading the input just before did */
            return tg_fail(err, "%s: cannot create: %s", d->path[split], strerror(errno));
        d->last_paragraph[split] = -1;
    }
    const tg_squad_paragraph *p = &sq->paragraphs[q->paragraph];
    if (d->last_paragraph[split] != paragraph) {
        if (tg_squad_eval_put_context(d->f[split], d->path[split], p->context, p->len, ctx->start, ctx->end, ctx->n,
                                      err))
            return -1;
        d->contexts[split]++;
        d->last_paragraph[split] = paragraph;
    }
    const int32_t n = q->n_answers;
    const char **texts = tg_malloc(sizeof *texts * (size_t)(n ? n : 1));
    size_t *lens = tg_malloc(sizeof *lens * (size_t)(n ? n : 1));
    int rc = texts && lens ? 0 : tg_fail(err, "out of memory for the %d answers of a question", n);
    for (int32_t i = 0; i < n && !rc; i++) {
        const tg_squad_answer *a = &sq->answers[q->first_answer + i];
        texts[i] = p->context + a->start;
        lens[i] = (size_t)(a->end - a->start);
    }
    if (!rc) rc = tg_squad_eval_put_question(d->f[split], d->path[split], q->id, d->contexts[split] - 1, texts, lens, n,
                                             err);
    free(texts), free(lens);
    if (rc) return -1;
    d->questions[split]++;
    return 0;
}

/* Ends and closes the eval files; with ok 0 just closes them. Frees the paths. */
static int qa_side_close(qa_side *d, int ok, tg_err *err) {
    int rc = 0;
    for (int s = 0; s < TG_SPLIT_COUNT; s++) {
        if (d->f[s]) {
            if (ok && !rc)
                rc = tg_squad_eval_put_end(d->f[s], d->path[s], d->contexts[s], d->questions[s], d->windows[s], err);
            if (fclose(d->f[s]) != 0 && ok && !rc)
                rc = tg_fail(err, "%s: write error: %s", d->path[s], strerror(errno));
            d->f[s] = NULL;
        }
        free(d->path[s]);
        d->path[s] = NULL;
    }
    return rc;
}

static int convert_squad(converter *C, tg_err *err) {
    const tg_convert_options *o = C->opt;
    const int32_t stride = o->doc_stride >= 0 ? o->doc_stride : TG_CONVERT_DEFAULT_DOC_STRIDE;
    if (stride >= C->seq) return tg_fail(err, "--doc-stride %d must be smaller than --seq %d", stride, C->seq);
    tg_squad *files = tg_calloc((size_t)o->n_inputs, sizeof *files);
    if (!files) return tg_fail(err, "out of memory for %d SQuAD files", o->n_inputs);
    int rc = 0;
    int64_t articles = 0;
    for (int32_t i = 0; i < o->n_inputs && !rc; i++) {
        char *buf;
        size_t len;
        if ((rc = tg_file_bytes(o->inputs[i], &buf, &len, err))) break;
        rc = tg_squad_parse(o->inputs[i], buf, len, &files[i], err);
        free(buf);
        articles += files[i].n_articles;
        C->rep->units += files[i].n_questions;
    }
    uint8_t *in_eval = NULL;
    int64_t n_eval;
    if (!rc) rc = tg_eval_split_pick(articles, o->eval_fraction, o->seed, "articles", &in_eval, &n_eval, err);
    tg_qa_context ctx = {0};
    tg_qa_buffers buf = {0};
    qa_side side = {0};
    int64_t windows = 0, article_base = 0, paragraph_base = 0, asked = 0;
    for (int32_t f = 0; f < o->n_inputs && !rc; f++) {
        const tg_squad *sq = &files[f];
        int32_t encoded = -1;
        for (int64_t k = 0; k < sq->n_questions && !rc; k++, asked++) {
            if (asked && o->progress) o->progress(o->progress_ctx, asked, C->rep->units, tokens_so_far(C));
            const tg_squad_question *q = &sq->questions[k];
            const tg_squad_paragraph *p = &sq->paragraphs[q->paragraph];
            if (q->paragraph != encoded) {
                if ((rc = tg_qa_encode_context(C->enc, p->context, p->len, &ctx, err))) {
                    tg_fail_context(err, "%s: %s (context)", o->inputs[f], q->path);
                    break;
                }
                encoded = q->paragraph;
            }
            /* run_qa strips the question's leading blanks. */
            const char *text = q->text;
            size_t len = q->len;
            while (len && (*text == ' ' || *text == '\t' || *text == '\n' || *text == '\r' || *text == '\f' ||
                           *text == '\v'))
                text++, len--;
            int64_t a_start = -1, a_end = -1;
            if (q->n_answers) {
                a_start = sq->answers[q->first_answer].start;
                a_end = sq->answers[q->first_answer].end;
            }
            const int split = in_eval[article_base + p->article] ? TG_SPLIT_EVAL : TG_SPLIT_TRAIN;
            qa_sink_ctx sink = {C, split, &side, &buf};
            if ((rc = qa_side_question(C, &side, split, sq, q, paragraph_base + q->paragraph, &ctx, err)) ||
                (rc = tg_qa_features(C->enc, text, len, &ctx, a_start, a_end, C->seq, stride, &buf, qa_sink, &sink,
                                     &windows, &C->rep->answered, err)))
                tg_fail_context(err, "%s: %s (id '%s')", o->inputs[f], q->path, q->id);
        }
        article_base += sq->n_articles;
        paragraph_base += sq->n_paragraphs;
    }
    if (qa_side_close(&side, !rc, err)) rc = -1;
    tg_qa_context_free(&ctx);
    tg_qa_buffers_free(&buf);
    free(in_eval);
    for (int32_t i = 0; i < o->n_inputs; i++) tg_squad_free(&files[i]);
    free(files);
    return rc;
}

/* ---- the whole conversion ----------------------------------------------------------- */

int tg_convert(const tg_convert_options *o, const tg_text_encoder *enc, tg_convert_report *rep, tg_err *err) {
    memset(rep, 0, sizeof *rep);
    if (o->n_inputs < 1) return tg_fail(err, "no input");
    if (!(o->eval_fraction >= 0 && o->eval_fraction < 1))
        return tg_fail(err, "--eval-fraction %g is outside [0, 1)", o->eval_fraction);
    int format = o->format;
    if (format != TG_INPUT_AUTO && (format < TG_INPUT_CSV || format > TG_INPUT_IMAGES))
        return tg_fail(err, "unknown input format %d", format);
    if (format == TG_INPUT_IDX) return tg_convert_idx(o, rep, err);
    if (format == TG_INPUT_IMAGES) return tg_convert_image_folders(o, rep, err);
    if (o->labels_path || o->image_size || o->image_channels)
        return tg_fail(err, "--labels FILE, --image-size and --channels are for image inputs (idx, images)");
    for (int32_t i = 0; i < o->n_inputs && format == TG_INPUT_AUTO; i++) {
        int f = format_of(o->inputs[i], err);
        if (f < 0) return -1;
        if (i == 0) rep->format = f;
        else if (f != rep->format)
            return tg_fail(err, "%s: a %s input among %s inputs (convert one format at a time, or give --format)",
                           o->inputs[i], tg_input_format_name(f), tg_input_format_name(rep->format));
        if (i == o->n_inputs - 1) format = rep->format;
    }
    rep->format = format;
    const int tabular = format == TG_INPUT_CSV || format == TG_INPUT_TSV || format == TG_INPUT_JSONL;
    if ((o->text_column || o->pair_column || o->label_column) && !tabular)
        return tg_fail(err, "--text-column, --pair-column and --label-column are for csv, tsv and jsonl inputs, not %s",
                       tg_input_format_name(format));
    if (o->labels && !(tabular || format == TG_INPUT_FOLDERS))
        return tg_fail(err, "--labels is for labelled inputs (csv, tsv, jsonl, folders), not %s",
                       tg_input_format_name(format));
    if (o->doc_stride >= 0 && format != TG_INPUT_SQUAD && o->doc_stride != 0)
        return tg_fail(err, "--doc-stride is for squad inputs, not %s", tg_input_format_name(format));
    if (o->template_path && format != TG_INPUT_INSTRUCT)
        return tg_fail(err, "--template is for instruct inputs, not %s", tg_input_format_name(format));
    const int32_t seq = o->seq ? o->seq : format == TG_INPUT_SQUAD ? TG_CONVERT_DEFAULT_QA_SEQ : TG_CONVERT_DEFAULT_SEQ;
    if (seq < 2 || seq > TG_SHARD_SEQ_MAX) return tg_fail(err, "--seq %d is outside 2 to %d", seq, TG_SHARD_SEQ_MAX);
    rep->seq = seq;
    if (enc->vocab_size < 1) return tg_fail(err, "the tokenizer has no vocabulary");

    converter C = {.opt = o, .enc = enc, .rep = rep, .seq = seq};
    templates tm = {0};
    tg_text_rows rows = {0};
    tg_label_set labels = {0};
    int32_t *label_ids = NULL;
    uint8_t *in_eval = NULL;
    int64_t n_eval = 0;
    int rc = format == TG_INPUT_INSTRUCT ? templates_open(o, &tm, err) : 0;
    if (!rc && format == TG_INPUT_SQUAD) {
        rep->task = TG_SHARD_QA;
    } else if (!rc) {
        rc = read_rows(o, format, &rows, err);
        rep->skipped_invalid = rows.skipped_invalid;
        rep->units = rows.n;
        if (!rc && rows.n == 0) {
            rc = tg_fail(err, "%s%s: no examples%s", o->inputs[0], o->n_inputs > 1 ? " and the other inputs" : "",
                         rows.skipped_invalid ? " (every one was left out as not UTF-8)" : "");
        }
        if (!rc && format != TG_INPUT_INSTRUCT) rc = label_rows(o, &rows, &labels, &label_ids, err);
        rep->task = label_ids ? TG_SHARD_CLASSIFY : format == TG_INPUT_INSTRUCT ? TG_SHARD_INSTRUCT : TG_SHARD_LM;
        rep->n_labels = labels.n;
        if (!rc) {
            const char *what = format == TG_INPUT_FOLDERS    ? "files"
                               : format == TG_INPUT_TEXT     ? "lines"
                               : format == TG_INPUT_INSTRUCT ? "records"
                                                             : "rows";
            rc = tg_eval_split_pick(rows.n, o->eval_fraction, o->seed, what, &in_eval, &n_eval, err);
        }
    }
    if (!rc) {
        const tg_shard_set_desc desc = {
            .task = rep->task,
            .seq = seq,
            .doc_stride = format == TG_INPUT_SQUAD ? (o->doc_stride >= 0 ? o->doc_stride : TG_CONVERT_DEFAULT_DOC_STRIDE) : 0,
            .n_labels = labels.n,
            .labels = labels.names,
            .tokenizer_identity = enc->identity,
            .tokenizer_family = enc->family == TG_TOKENIZER_WORDPIECE     ? "wordpiece"
                                : enc->family == TG_TOKENIZER_BPE_GPT2    ? "bpe-gpt2"
                                : enc->family == TG_TOKENIZER_BPE_ROBERTA ? "bpe-roberta"
                                : enc->family == TG_TOKENIZER_BPE_LLAMA   ? "bpe-llama"
                                                                          : "unknown",
            .vocab_size = enc->vocab_size,
            .command = o->command,
            .frame_bytes = o->frame_bytes,
            .shard_bytes = o->shard_bytes};
        rc = tg_shard_writer_open(o->outdir, &desc, &C.w, err);
    }
    for (int s = 0; s < TG_SPLIT_COUNT && !rc; s++)
        if (!(C.chunk[s] = tg_malloc((size_t)seq * sizeof *C.chunk[s])))
            rc = tg_fail(err, "out of memory for a record of %d tokens", seq);
    if (!rc)
        rc = format == TG_INPUT_SQUAD      ? convert_squad(&C, err)
             : format == TG_INPUT_INSTRUCT ? convert_instruct(&C, &rows, in_eval, &tm, err)
                                           : convert_rows(&C, &rows, label_ids, in_eval, err);
    if (!rc && rep->records[TG_SPLIT_TRAIN] + rep->records[TG_SPLIT_EVAL] == 0 && format == TG_INPUT_INSTRUCT)
        rc = tg_fail(err, "%s: no records: every one was left out (%lld whose prompt leaves no room for a response in "
                          "--seq %d, %lld whose response encodes to no tokens)",
                     o->inputs[0], (long long)rep->skipped_long, seq, (long long)rep->skipped_empty);
    if (!rc && rep->records[TG_SPLIT_TRAIN] + rep->records[TG_SPLIT_EVAL] == 0)
        rc = tg_fail(err, "%s: no records (every row encoded to no tokens)", o->inputs[0]);
    if (!rc && o->eval_fraction > 0 && rep->records[TG_SPLIT_EVAL] == 0)
        rc = tg_fail(err, "the eval split came out empty (its lines made less than one record; lower --seq or raise "
                          "--eval-fraction)");
    if (!rc && rep->records[TG_SPLIT_TRAIN] == 0)
        rc = tg_fail(err, "the train split came out empty (lower --seq or --eval-fraction)");
    if (C.w) {
        if (!rc) rc = tg_shard_writer_commit(C.w, err);
        else tg_shard_writer_abort(C.w);
    }
    for (int s = 0; s < TG_SPLIT_COUNT; s++) free(C.chunk[s]);
    free(tm.file);
    free(in_eval);
    free(label_ids);
    tg_labels_free(&labels);
    tg_text_rows_free(&rows);
    return rc;
}
