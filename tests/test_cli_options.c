/* The CLI's numeric options and environment variables are parsed strictly: anything but
 * a whole number in range is a usage error (exit status 2) naming the option or variable
 * and the range. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/harness.h"

/* Runs `tunegraph run` on the demo job (one step on the CPU) with extra arguments and an
 * environment prefix; its exit status, and its stderr into *text (malloc'd). */
static int run_cli(const char *env, const char *args, char **text) {
    const char *dir = tg_test_tmpdir();
    char cmd[1600], path[700];
    snprintf(path, sizeof path, "%s/stderr.txt", dir);
    snprintf(cmd, sizeof cmd, "%s %s run examples/demo-classify.job --device cpu --set steps=1 %s 2>%s", env, tg_test_cli(),
             args, path);
    int st = system(cmd);
    *text = tg_test_read_file(path, NULL);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Each value (shell words) must be refused with status 2 and a message holding `want`
 * and the value as given. */
static void expect_refused(const char *option, const char *const *values, int n, const char *want) {
    for (int k = 0; k < n; k++) {
        char args[256], env[256] = "", quoted[128];
        /* The value as the message quotes it: the shell word without its quotes. */
        snprintf(quoted, sizeof quoted, "'%s'", values[k]);
        if (option[0] == '-') snprintf(args, sizeof args, "%s '%s'", option, values[k]);
        else snprintf(env, sizeof env, "%s='%s'", option, values[k]), args[0] = 0;
        char *text = NULL;
        int rc = run_cli(env, args, &text);
        CHECK(rc == 2, "%s '%s': exit status %d", option, values[k], rc);
        CHECK(text && strstr(text, want) && strstr(text, quoted), "%s '%s': message %s", option, values[k],
              text ? text : "(none)");
        free(text);
    }
}

static void expect_accepted(const char *env, const char *args) {
    char *text = NULL;
    int rc = run_cli(env, args, &text);
    CHECK(rc == 0, "'%s %s' refused (%d): %s", env, args, rc, text ? text : "(none)");
    free(text);
}

TG_TEST(test_cli_threads_strict) {
    static const char *const bad[] = {"abc", "4x", "", "-1", "1025", " 4", "99999999999999999999"};
    expect_refused("--threads", bad, (int)(sizeof bad / sizeof bad[0]),
                   "--threads needs a whole number from 0 to 1024 (0: one per core), got ");
    expect_accepted("", "--threads 2");
    expect_accepted("", "--threads 0");
}

TG_TEST(test_cli_in_flight_strict) {
    static const char *const bad[] = {"0", "15", "abc", "", "3x", "-2"};
    expect_refused("--in-flight", bad, (int)(sizeof bad / sizeof bad[0]),
                   "--in-flight needs a whole number from 1 to 14, got ");
    expect_accepted("", "--in-flight 14");
}

TG_TEST(test_cli_step_group_env_strict) {
    static const char *const bad[] = {"abc", "", "4x", "15", "-1"};
    expect_refused("TUNEGRAPH_STEP_GROUP", bad, (int)(sizeof bad / sizeof bad[0]),
                   "TUNEGRAPH_STEP_GROUP needs a whole number from 0 to 14 (0: the executor's choice), got ");
    expect_accepted("TUNEGRAPH_STEP_GROUP=2", "");
    expect_accepted("TUNEGRAPH_STEP_GROUP=0", "");
}

/* An option is one of the command's words, not any piece of one: "--se" (a prefix of
 * "--set") and "--threads2" are unknown options. */
TG_TEST(test_cli_option_words_exact) {
    static const char *const bad[] = {"--se", "--threads2", "--in", "-"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char *text = NULL;
        int rc = run_cli("", bad[k], &text);
        char want[64];
        snprintf(want, sizeof want, "unknown option %s", bad[k]);
        if (!strcmp(bad[k], "-")) /* a lone dash is an argument, not an option */
            CHECK(rc == 2 && text && strstr(text, "unexpected argument -"), "'-': %d %s", rc, text ? text : "");
        else
            CHECK(rc == 2 && text && strstr(text, want), "'%s': exit %d, message %s", bad[k], rc, text ? text : "(none)");
        free(text);
    }
}
