/* Checkpoints in and out of the command line: `tunegraph export` (a Hugging Face model
 * folder from saved weights), `tunegraph predict` (eval logits as JSON Lines), `run
 * --save-dir` (the export at the end of a run), and the Hugging Face style report of what
 * a run's weights load found missing and unexpected. */
#ifndef TUNEGRAPH_CLI_EXPORT_H
#define TUNEGRAPH_CLI_EXPORT_H

#include <stdio.h>

#include "base/output_paths.h"
#include "plan/plan.h"
#include "runtime/trainer.h"

int cmd_export(int argc, char **argv);
int cmd_predict(int argc, char **argv);

/* `run`'s export options: --save-dir DIR [--labels a,b,c] [--tokenizer PATH] [--dtype
 * fp32|bf16] [--force]. */
typedef struct run_export {
    const char *save_dir;
    const char *labels_text;
    const char *tokenizer;
    int force, bf16;
    char **labels;   /* labels_text split at commas (malloc'd) */
    int n_labels;
} run_export;

/* Takes run's export options out of argv (argc shrinks); 0, or 2 after a usage message. */
int run_export_args(int *argc, char **argv, run_export *ex);
void run_export_free(run_export *ex);
/* Before the run reads anything: the export can be made (tg_hf_export_check), and leaves
 * the files the run reads (the job or plan `input`, the model's, the data) and writes
 * (`outputs`) alone. */
int run_export_check(const run_export *ex, const tg_plan *plan, const char *input, const char *input_what,
                     const tg_named_path *outputs, int n_outputs, tg_err *err);
/* After the run: the trainer's weights as a Hugging Face folder. */
int run_export_write(const run_export *ex, tg_trainer *tr, tg_err *err);

/* Hugging Face's lines about the tensors a trainer's weights lacked or did not use (none
 * when everything matched), to `out`. */
void print_weights_report(FILE *out, const tg_trainer *tr);

#endif
