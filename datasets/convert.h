/* `data convert`: labelled text in (CSV, TSV, JSONL, a folder per label, SQuAD JSON, plain
 * text, instruction records), a shard set out (datasets/shard_writer.h).
 *
 * What each format gives:
 *   csv, tsv, jsonl  a record per row: the text column (and pair column) encoded with the
 *                    tokenizer's template, truncated to seq (longest first over a pair);
 *                    classify when the rows have labels (the label column: "label", or
 *                    the one named), else lm
 *   folders          ROOT/LABEL/FILE: a classify record per file
 *   squad            qa records: a window of the context per question, doc_stride apart
 *                    (datasets/qa_features.h)
 *   text             lm records: the lines encoded without template, each followed by the
 *                    separator (the tokenizer's eos token, else its sep token), joined and
 *                    cut into records of seq tokens; a last record of one token is dropped
 *   instruct         instruct records from Alpaca's instruction / input / output records
 *                    (datasets/instruct.h), one per record: the tokenizer's bos token
 *                    (when it has one), the prompt (the record through the template, up to
 *                    where the response goes), the response, then the eos token (else the
 *                    sep token, else none). Prompt and response are encoded apart, without
 *                    the tokenizer's template, so the record's prompt length (bos and
 *                    prompt) is exact. A record longer than seq keeps its prompt and eos
 *                    and loses the end of its response; one whose prompt leaves no room for
 *                    a response token is left out (counted in skipped_long), as is one
 *                    whose response encodes to no tokens (skipped_empty)
 *   idx              image records (datasets/idx.h) from one IDX images file and its labels
 *                    file (labels_path, else the file MNIST's naming puts beside it), plain
 *                    or gzip'd, one channel, resized to image_size x image_size when given
 *                    (bilinear, as torchvision's Resize with antialias off); labels "0" to
 *                    the largest label. No tokenizer: the encoder may be NULL
 *   images           image records from ROOT/LABEL/FILE, PNG and JPEG files, decoded to
 *                    image_channels channels and resized as idx's
 *                    (datasets/convert_images.h). No tokenizer
 * Label ids follow the sorted label names (datasets/labels.h) or the given list.
 * With eval_fraction F > 0, ceil(F x N) of the N units (rows, files, lines, or SQuAD
 * articles, so windows of one context stay together) go to the eval split, picked by a
 * shuffle seeded with `seed`; both splits keep the input order. */
#ifndef TUNEGRAPH_CONVERT_H
#define TUNEGRAPH_CONVERT_H

#include <stdint.h>

#include "base/error.h"
#include "datasets/text_encoder.h"

typedef enum tg_input_format {
    TG_INPUT_AUTO = 0,        /* from each input: .csv .tsv .jsonl .json (squad) .txt, a folder */
    TG_INPUT_CSV,
    TG_INPUT_TSV,
    TG_INPUT_JSONL,
    TG_INPUT_SQUAD,
    TG_INPUT_TEXT,
    TG_INPUT_FOLDERS,
    TG_INPUT_INSTRUCT,        /* never from the name: JSON Lines or a JSON array of records */
    TG_INPUT_IDX,             /* never from the name: MNIST's IDX images file (and labels file) */
    TG_INPUT_IMAGES           /* never from the name: a folder per label of PNG and JPEG files */
} tg_input_format;

#define TG_CONVERT_DEFAULT_SEQ 512
#define TG_CONVERT_DEFAULT_QA_SEQ 384
#define TG_CONVERT_DEFAULT_DOC_STRIDE 128

typedef struct tg_convert_options {
    const char *const *inputs;
    int32_t n_inputs;
    const char *outdir;
    int32_t format;           /* tg_input_format */
    const char *text_column;  /* NULL: "text" */
    const char *pair_column;  /* NULL: none */
    const char *label_column; /* NULL: "label" when the input has it */
    const char *labels;       /* "a,b,c": the label names in id order; NULL: from the data */
    int32_t seq;              /* 0: 512, squad 384 */
    int32_t doc_stride;       /* squad: context tokens shared by consecutive windows; < 0: 128 */
    double eval_fraction;     /* 0: no eval split */
    uint64_t seed;
    int32_t skip_invalid;     /* leave out text that is not UTF-8, counting it */
    const char *template_path; /* instruct: a prompt template file (datasets/instruct.h; one
                                  line end at its end dropped); NULL: Alpaca's two */
    const char *labels_path;  /* idx: the labels file; NULL: beside the images by MNIST's names */
    int32_t image_size;       /* idx, images: resize each image to this square size; 0: as stored */
    int32_t image_channels;   /* images: 1 or 3; 0: 3 */
    const char *command;      /* recorded in the manifest */
    int64_t frame_bytes, shard_bytes; /* 0: the writer's defaults */
    /* Called (when not NULL) after each row, file, line or question is encoded: the units
     * done, how many there are, and the tokens written so far. */
    void (*progress)(void *ctx, int64_t done, int64_t total, int64_t tokens);
    void *progress_ctx;
} tg_convert_options;

typedef struct tg_convert_report {
    int32_t format, task;     /* tg_input_format, tg_shard_task */
    int32_t seq;              /* the records' longest length */
    int64_t units;            /* rows, files, lines or questions read */
    int64_t records[2], tokens[2];
    int64_t skipped_invalid;  /* rows or files left out as not UTF-8 */
    int64_t skipped_empty;    /* rows that encode to no tokens (instruct: whose response does) */
    int64_t skipped_long;     /* instruct: records whose prompt leaves no room for a response */
    int64_t truncated;        /* instruct: records whose response was cut to fit seq */
    int64_t answered;         /* qa windows holding their answer */
    int32_t n_labels;
} tg_convert_report;

/* "csv" -> TG_INPUT_CSV ..., or -1. */
int tg_input_format_parse(const char *name);
const char *tg_input_format_name(int format);

int tg_convert(const tg_convert_options *opt, const tg_text_encoder *enc, tg_convert_report *rep, tg_err *err);

#endif
