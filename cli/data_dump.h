/* `tunegraph data dump SET [-o FILE.jsonl]`: a shard set's split (OUTDIR, OUTDIR/train,
 * OUTDIR/eval) or a pre-tokenized JSONL file as JSON Lines, one record a line in record
 * order: {"input_ids": [...], "token_type_ids": [...] (records that have them), "label": N}
 * for classify, "start_position" and "end_position" for qa, input_ids alone for lm. The
 * output is a dataset tg_dataset_load takes (datasets/dataset.h). */
#ifndef TUNEGRAPH_CLI_DATA_DUMP_H
#define TUNEGRAPH_CLI_DATA_DUMP_H

/* argv: the words after "dump"; usage: the `data` usage text for usage errors. Exit
 * status: 0 done, 1 failed, 2 usage error. */
int cmd_data_dump(int argc, char **argv, const char *usage);

#endif
