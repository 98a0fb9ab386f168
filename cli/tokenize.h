/* `tunegraph tokenize`: text lines on stdin, token ids out. */
#ifndef TUNEGRAPH_CLI_TOKENIZE_H
#define TUNEGRAPH_CLI_TOKENIZE_H

/* argv: the arguments after "tokenize". Returns the process's exit status. */
int cmd_tokenize(int argc, char **argv);

#endif
