/* `tunegraph data convert`: text datasets to shard sets (datasets/convert.h), with the
 * tokenizer of datasets/tokenizer.h. */
#ifndef TUNEGRAPH_CLI_DATA_CONVERT_H
#define TUNEGRAPH_CLI_DATA_CONVERT_H

/* argv: the words after "data" ("convert", its inputs and options). Exit status: 0 done,
 * 1 failed, 2 usage error. */
int cmd_data(int argc, char **argv);

#endif
