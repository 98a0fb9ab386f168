/* The progress of a long command on stderr: on a terminal one line kept up to date, else a
 * plain line now and then, and nothing for commands that end within a few seconds. */
#ifndef TUNEGRAPH_CLI_PROGRESS_H
#define TUNEGRAPH_CLI_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

/* On a terminal the line is redrawn at most every CLI_PROGRESS_TTY_S after the first
 * CLI_PROGRESS_QUIET_S; elsewhere a line every CLI_PROGRESS_LOG_S after the first
 * CLI_PROGRESS_QUIET_S. */
#define CLI_PROGRESS_QUIET_S 2.0
#define CLI_PROGRESS_TTY_S 0.25
#define CLI_PROGRESS_LOG_S 10.0

typedef struct cli_progress {
    const char *what;  /* the units counted: "rows", "questions" */
    int tty;
    double start_s, shown_s;
    int shown;         /* a line was printed (a terminal's needs ending) */
} cli_progress;

/* Seconds as h:mm:ss, rounded to the nearest second, the hours unbounded. */
void cli_format_hms(double s, char *buf, size_t len);

/* "what: DONE/TOTAL (P%), T tokens, R tokens/s, ETA h:mm:ss" for `elapsed_s` of work. */
void cli_progress_text(char *buf, size_t len, const char *what, int64_t done, int64_t total, int64_t tokens,
                       double elapsed_s);

void cli_progress_init(cli_progress *p, const char *what, int tty);
/* The work so far; prints when a line is due. */
void cli_progress_update(cli_progress *p, int64_t done, int64_t total, int64_t tokens);
/* Ends a terminal's line (before the command's own report). */
void cli_progress_end(cli_progress *p);

#endif
