/* base/output_paths.c in the library: what tg_output_resolve makes of links, folders and
 * long names (a table of cases and the errno each gives), and what tg_outputs_check refuses
 * (a table of outputs and inputs, each with the message it must give), its shortened long
 * paths, and its allocations failing in turn. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/output_paths.h"
#include "tests/harness.h"

static char root[PATH_MAX];     /* this test's folder, resolved */

static const char *at(const char *name) {
    static char buf[64][PATH_MAX + 64];
    static int k;
    k = (k + 1) % 64;
    snprintf(buf[k], sizeof buf[k], "%s/%s", root, name);
    return buf[k];
}

static int setup(void) {
    if (!realpath(tg_test_tmpdir(), root)) return 0;
    int ok = tg_test_write_file(at("file"), "x") == 0 && tg_test_write_file(at("input.jsonl"), "{}\n") == 0;
    ok = ok && mkdir(at("sub"), 0755) == 0;
    ok = ok && symlink("file", at("to_file")) == 0 && symlink("to_file", at("to_to_file")) == 0;
    ok = ok && symlink("missing_target", at("dangling")) == 0 && symlink("sub/deeper", at("into_sub")) == 0;
    ok = ok && symlink(at("file"), at("absolute")) == 0 && symlink("input.jsonl", at("to_input")) == 0;
    ok = ok && symlink("loop_b", at("loop_a")) == 0 && symlink("loop_a", at("loop_b")) == 0;
    ok = ok && symlink("nowhere/x", at("to_missing_dir")) == 0;
    ok = ok && mkfifo(at("fifo"), 0644) == 0;
    /* A link whose target, joined to the folder, passes PATH_MAX. */
    static char long_target[PATH_MAX];
    memset(long_target, 'a', PATH_MAX - 10);
    for (int i = 200; i < PATH_MAX - 10; i += 201) long_target[i] = '/';
    long_target[PATH_MAX - 10] = 0;
    ok = ok && symlink(long_target, at("to_long")) == 0;
    return ok;
}

TG_TEST(test_output_resolve_table) {
    REQUIRE(setup(), "setup");
    static char too_long[PATH_MAX + 8];
    memset(too_long, 'b', sizeof too_long - 1);
    too_long[sizeof too_long - 1] = 0;
    const struct {
        const char *path;
        int rc;
        const char *want; /* the resolved name, for rc 0 */
    } cases[] = {
        {at("file"), 0, at("file")},
        {at("new_name"), 0, at("new_name")},
        {at("to_file"), 0, at("file")},
        {at("to_to_file"), 0, at("file")},
        {at("absolute"), 0, at("file")},
        {at("dangling"), 0, at("missing_target")},
        {at("into_sub"), 0, at("sub/deeper")},
        {at("sub/../file"), 0, at("file")},
        {"", ENOENT, NULL},
        {too_long, ENAMETOOLONG, NULL},
        {at("sub/"), EISDIR, NULL},
        {at("."), EISDIR, NULL},
        {at("nowhere/x"), ENOENT, NULL},
        {at("to_missing_dir"), ENOENT, NULL},
        {at("file/x"), ENOTDIR, NULL},
        {at("loop_a"), ELOOP, NULL},
        {at("to_long"), ENAMETOOLONG, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = (char *)"unset";
        const int rc = tg_output_resolve(cases[i].path, &out);
        CHECK(rc == cases[i].rc, "case %zu (%.60s): rc %d (%s), want %d", i, cases[i].path, rc, strerror(rc),
              cases[i].rc);
        if (cases[i].rc == 0)
            CHECK(out && !strcmp(out, cases[i].want), "case %zu: '%s', want '%s'", i, out ? out : "(null)",
                  cases[i].want);
        else CHECK(out == NULL, "case %zu: a name came back with an error", i);
        if (rc == 0) free(out);
    }
    /* A bare name resolves in the working folder; "/x" in the root. */
    char *out = NULL, cwd[PATH_MAX], want[PATH_MAX + 16];
    REQUIRE(getcwd(cwd, sizeof cwd), "getcwd");
    snprintf(want, sizeof want, "%s/bare_name", cwd);
    CHECK(tg_output_resolve("bare_name", &out) == 0 && out && !strcmp(out, want), "bare: %s", out ? out : "(null)");
    free(out);
    CHECK(tg_output_resolve("/tg-no-such-file", &out) == 0 && out && !strcmp(out, "/tg-no-such-file"), "root: %s",
          out ? out : "(null)");
    free(out);
    /* Each allocation failing in turn: ENOMEM, nothing else. */
    for (long k = 0; k < 32; k++) {
        tg_alloc_fail_after(k);
        const int rc = tg_output_resolve(at("to_to_file"), &out);
        tg_alloc_fail_after(-1);
        if (rc == 0) {
            CHECK(k >= 3 && out && !strcmp(out, at("file")), "resolved with %ld allocations: %s", k, out);
            free(out);
            break;
        }
        CHECK(rc == ENOMEM && out == NULL, "allocation %ld failing: rc %d", k, rc);
    }
}

static void expect_refused(const tg_named_path *outs, int n_outs, const tg_named_path *ins, int n_ins,
                           const char *want, const char *what) {
    tg_err err = {{0}};
    const int rc = tg_outputs_check(outs, n_outs, ins, n_ins, &err);
    CHECK(rc == -1 && strstr(err.msg, want), "%s: rc %d, '%s'\n    want '%s'", what, rc, err.msg, want);
}

TG_TEST(test_outputs_check_table) {
    REQUIRE(setup(), "setup");
    /* A socket to write to. */
    int sock = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    char sock_path[PATH_MAX];
    snprintf(sock_path, sizeof sock_path, "%s/sock", root);
    const int have_sock = sock >= 0 && strlen(sock_path) < sizeof addr.sun_path &&
                          (snprintf(addr.sun_path, sizeof addr.sun_path, "%s", sock_path), 1) &&
                          bind(sock, (struct sockaddr *)&addr, sizeof addr) == 0;
    static char too_long[PATH_MAX + 8], long_name[300], long_path[600];
    memset(too_long, 'b', sizeof too_long - 1);
    memset(long_name, 'n', sizeof long_name - 1);
    snprintf(long_path, sizeof long_path, "%s/%s", root, long_name);
    char msg[600];
    const tg_named_path in[] = {{at("input.jsonl"), "training data"}, {NULL, "eval data"}, {"", "weights"}};
    struct {
        tg_named_path out;
        const char *want;
    } cases[] = {
        {{"", "plan (-o)"}, "plan (-o): the path is empty"},
        {{NULL, "plan (-o)"}, "plan (-o): the path is empty"},
        {{too_long, "plan (-o)"}, "the path is longer than the system accepts"},
        {{long_path, "metrics"}, "the path is longer than the system accepts"},
        {{at("sub"), "plan (-o)"}, "is a folder; name a file"},
        {{at("sub/"), "plan (-o)"}, "is a folder; name a file"},
        {{at("new/"), "plan (-o)"}, "names a folder; name a file"},
        {{at("nowhere/x"), "metrics"}, "the folder "},
        {{at("file/x"), "metrics"}, "Not a directory"},
        {{at("loop_a"), "metrics"}, "Too many levels of symbolic links"},
        {{at("input.jsonl"), "plan (-o)"}, "would overwrite the training data "},
        {{at("to_input"), "plan (-o)"}, "would overwrite the training data "},
        /* A dangling link whose target, made absolute, is too long. */
        {{at("to_long"), "metrics"}, "the path is longer than the system accepts"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(msg, sizeof msg, "case %zu", i);
        expect_refused(&cases[i].out, 1, in, 3, cases[i].want, msg);
    }
    /* The missing folder is named, and the output: "metrics <path>: the folder <dir> does not exist". */
    tg_err err = {{0}};
    const tg_named_path missing = {at("nowhere/x"), "metrics"};
    tg_outputs_check(&missing, 1, NULL, 0, &err);
    snprintf(msg, sizeof msg, "metrics %s: the folder %s does not exist", at("nowhere/x"), at("nowhere"));
    CHECK(strstr(err.msg, msg) != NULL, "'%s'\n    want '%s'", err.msg, msg);
    /* A long path is shown by its start and end. */
    const tg_named_path long_out = {long_path, "metrics"};
    tg_outputs_check(&long_out, 1, NULL, 0, &err);
    snprintf(msg, sizeof msg, "...%s (%zu bytes): the path is longer", long_path + strlen(long_path) - 80,
             strlen(long_path));
    CHECK(strstr(err.msg, msg) && !strstr(err.msg, long_path), "long path shown as '%s'", err.msg);
    if (have_sock) expect_refused(&(tg_named_path){sock_path, "plan (-o)"}, 1, NULL, 0, "is a socket; name a file", "socket");
    if (sock >= 0) close(sock);
    /* Two outputs naming one file, existing or not, through a link or not. */
    const tg_named_path two_new[] = {{at("same_new"), "plan (-o)"}, {at("sub/../same_new"), "metrics"}};
    snprintf(msg, sizeof msg, "plan (-o) %s and metrics %s are the same file: each output needs a file of its own",
             at("same_new"), at("sub/../same_new"));
    expect_refused(two_new, 2, NULL, 0, msg, "two outputs, one new file");
    const tg_named_path two_old[] = {{at("file"), "plan (-o)"}, {at("to_file"), "metrics"}};
    expect_refused(two_old, 2, NULL, 0, "are the same file", "two outputs, one file through a link");
    const tg_named_path dangling_twice[] = {{at("dangling"), "plan (-o)"}, {at("missing_target"), "metrics"}};
    expect_refused(dangling_twice, 2, NULL, 0, "are the same file", "a dangling link and its target");
    /* What passes: new files, a FIFO and /dev/null (twice: devices hold nothing to destroy),
     * outputs apart from the inputs, inputs that are NULL or "" left out. */
    const tg_named_path fine[] = {{at("plan.tgp"), "plan (-o)"}, {at("fifo"), "metrics"}, {"/dev/null", "log"},
                                  {"/dev/null", "trace"}, {at("sub/new"), "save"}, {at("file"), "checkpoint"}};
    memset(&err, 0, sizeof err);
    CHECK(tg_outputs_check(fine, 6, in, 3, &err) == 0, "fine outputs refused: %s", err.msg);
    /* An input that cannot be resolved (its folder is missing) matches nothing. */
    const tg_named_path lost_in[] = {{at("nowhere/in.jsonl"), "training data"}};
    CHECK(tg_outputs_check(fine, 2, lost_in, 1, &err) == 0, "an unresolvable input: %s", err.msg);
    const tg_named_path dev_in[] = {{"/dev/null", "training data"}};
    CHECK(tg_outputs_check(&fine[2], 1, dev_in, 1, &err) == 0, "/dev/null in and out: %s", err.msg);
    /* A read-only folder, where the system has one (root writes anywhere else). */
    if (access("/proc/sys", W_OK) != 0) {
        snprintf(msg, sizeof msg, "plan (-o) /proc/sys/tg-new: cannot create files in the folder /proc/sys: %s",
                 strerror(errno));
        expect_refused(&(tg_named_path){"/proc/sys/tg-new", "plan (-o)"}, 1, NULL, 0, msg, "read-only folder");
    }
    /* Out of memory for the ids, then anywhere in the checks: refused, saying so. */
    for (long k = 0; k < 2; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = tg_outputs_check(fine, 2, in, 1, &err);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && strstr(err.msg, "out of memory checking 2 output and 1 input paths"), "allocation %ld: %s", k,
              err.msg);
    }
    const tg_named_path missing_and_new[] = {{at("nowhere/x"), "metrics"}};
    const tg_named_path linked[] = {{at("to_to_file"), "plan (-o)"}, {at("dangling"), "metrics"}};
    int refusals = 0;
    for (long k = 2; k < 64; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = tg_outputs_check(linked, 2, in, 1, &err);
        tg_alloc_fail_after(-1);
        if (rc == 0) break;
        refusals++;
        CHECK(strstr(err.msg, "out of memory") || strstr(err.msg, strerror(ENOMEM)), "allocation %ld: %s", k, err.msg);
    }
    CHECK(refusals > 4, "only %d allocations failed in the checks", refusals);
    /* A missing folder: refused either way, for memory until there is enough to name it. */
    int oom = 0;
    for (long k = 2; k < 12; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = tg_outputs_check(missing_and_new, 1, NULL, 0, &err);
        tg_alloc_fail_after(-1);
        const int for_memory = strstr(err.msg, "out of memory") || strstr(err.msg, strerror(ENOMEM));
        oom += for_memory;
        CHECK(rc == -1 && (for_memory || strstr(err.msg, "does not exist")), "missing folder, allocation %ld: %s", k,
              err.msg);
    }
    CHECK(oom >= 3, "%d of the missing folder's checks ran out of memory", oom);
}
