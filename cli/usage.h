/* The CLI's one way to refuse a command line: the message, then the command's usage. */
#ifndef TUNEGRAPH_CLI_USAGE_H
#define TUNEGRAPH_CLI_USAGE_H

#include <stdio.h>

/* Prints "tunegraph[ COMMAND]: " + fmt (with arg) and the usage text on stderr; returns 2,
 * the exit status of a usage error. command NULL: no command in the prefix. */
static inline int cli_usage_error(const char *command, const char *usage, const char *fmt, const char *arg) {
    fprintf(stderr, command ? "tunegraph %s: " : "tunegraph: ", command);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", usage);
    return 2;
}

#endif
