#include "cli/progress.h"

#include <stdio.h>

#include "base/clock.h"

void cli_format_hms(double s, char *buf, size_t len) {
    int t = (int)(s + 0.5);
    snprintf(buf, len, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
}

void cli_progress_text(char *buf, size_t len, const char *what, int64_t done, int64_t total, int64_t tokens,
                       double elapsed_s) {
    char eta[32] = "-";
    if (done > 0 && total >= done && elapsed_s > 0) cli_format_hms(elapsed_s / (double)done * (double)(total - done), eta, sizeof eta);
    snprintf(buf, len, "%s: %lld/%lld (%.1f%%), %lld tokens, %.0f tokens/s, ETA %s", what, (long long)done,
             (long long)total, total > 0 ? 100.0 * (double)done / (double)total : 0.0, (long long)tokens,
             elapsed_s > 0 ? (double)tokens / elapsed_s : 0.0, eta);
}

void cli_progress_init(cli_progress *p, const char *what, int tty) {
    *p = (cli_progress){.what = what, .tty = tty, .start_s = tg_wall_s()};
    p->shown_s = p->start_s;
}

void cli_progress_update(cli_progress *p, int64_t done, int64_t total, int64_t tokens) {
    const double now = tg_wall_s(), elapsed = now - p->start_s;
    if (elapsed < CLI_PROGRESS_QUIET_S || now - p->shown_s < (p->tty ? CLI_PROGRESS_TTY_S : CLI_PROGRESS_LOG_S)) return;
    char line[256];
    cli_progress_text(line, sizeof line, p->what, done, total, tokens, elapsed);
    fprintf(stderr, p->tty ? "\r%s   " : "%s\n", line);
    p->shown_s = now, p->shown = 1;
}

void cli_progress_end(cli_progress *p) {
    if (p->tty && p->shown) fputc('\n', stderr);
    p->shown = 0;
}
