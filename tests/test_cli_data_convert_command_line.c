/* The command line `tunegraph data convert` records in the set's manifest (cli/data_convert.c,
 * command_line): each word as a shell takes it back, one with anything but [A-Za-z0-9_./=:,+-]
 * single-quoted and its quotes written '\''. A word of quotes alone needs all the room the
 * text's buffer sets aside for a word (4 bytes a character and 3 more); forty of them, the
 * inputs' names, would overrun it were each given less (the sanitizer build sees it). Runs in
 * this process, through the CLI that tests/test_cli_metrics.c compiles in, from the test's
 * folder (relative names). */
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "datasets/shard_manifest.h"
#include "tests/cli_in_process.h"
#include "tests/harness.h"

int tunegraph_cli_main(int argc, char **argv);

#define N_QUOTED 40

TG_TEST(test_cli_data_convert_command_line_quotes) {
    const char *dir = tg_test_tmpdir();
    char path[1000];
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    REQUIRE(tg_test_write_file(path, "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n") == 0, "%s", path);
    static char names[N_QUOTED][N_QUOTED + 1];
    char *argv[N_QUOTED + 16];
    int argc = 0;
    argv[argc++] = "tunegraph";
    argv[argc++] = "data";
    argv[argc++] = "convert";
    for (int k = 0; k < N_QUOTED; k++) {
        memset(names[k], '\'', (size_t)k + 1);
        names[k][k + 1] = 0;
        snprintf(path, sizeof path, "%s/%s", dir, names[k]);
        REQUIRE(tg_test_write_file(path, "hello world\n") == 0, "%s", path);
        argv[argc++] = names[k];
    }
    char *tail[] = {"-o", "set", "--tokenizer", "vocab.txt", "--format", "text", "--seq", "8"};
    for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++) argv[argc++] = tail[i];
    argv[argc] = NULL;

    char cwd[PATH_MAX], err_path[1000];
    REQUIRE(getcwd(cwd, sizeof cwd), "getcwd");
    snprintf(err_path, sizeof err_path, "%s/err.txt", dir);
    fflush(stderr);
    int saved = dup(STDERR_FILENO), fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(saved >= 0 && fd >= 0 && chdir(dir) == 0, "%s", dir);
    dup2(fd, STDERR_FILENO);
    close(fd);
    const int status = tunegraph_cli_main(argc, argv);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    const int back = chdir(cwd);
    REQUIRE(back == 0, "cannot go back to %s", cwd);
    char *said = tg_test_read_file(err_path, NULL);
    CHECK(status == 0 && said && strstr(said, "tunegraph: wrote set: lm, 15 train records (120 tokens) from 40 lines\n"), "exit %d: %s", status,
          said ? said : "(nothing)");
    free(said);

    /* What the command line must read: each name quoted, each of its quotes as '\''. */
    static char want[16384];
    size_t n = (size_t)snprintf(want, sizeof want, "tunegraph data convert");
    for (int k = 0; k < N_QUOTED; k++) {
        n += (size_t)snprintf(want + n, sizeof want - n, " '");
        for (int q = 0; q <= k; q++) n += (size_t)snprintf(want + n, sizeof want - n, "'\\''");
        n += (size_t)snprintf(want + n, sizeof want - n, "'");
    }
    snprintf(want + n, sizeof want - n, " -o set --tokenizer vocab.txt --format text --seq 8");
    snprintf(path, sizeof path, "%s/set/manifest.json", dir);
    long len = 0;
    char *text = tg_test_read_file(path, &len);
    REQUIRE(text, "%s", path);
    tg_shard_manifest m;
    tg_err err = {{0}};
    if (CHECK(tg_shard_manifest_parse(text, (size_t)len, path, &m, &err) == 0, "%s", err.msg)) {
        CHECK(m.command && !strcmp(m.command, want), "command\n%s\nwant\n%s", m.command ? m.command : "(none)", want);
        tg_shard_manifest_free(&m);
    }
    free(text);
}

/* Which bytes a word may hold and stay unquoted ([A-Za-z0-9] and _./=:,+-, each of them
 * here), and in a quoted word which stay as they are (a blank, '~' 0x7E, printable ASCII)
 * and which become '?' (a tab, 0x1F, DEL 0x7F, bytes past ASCII); an empty word is ''. */
TG_TEST(test_cli_data_convert_command_line_bytes) {
    const char *dir = tg_test_tmpdir();
    char path[1000];
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    REQUIRE(tg_test_write_file(path, "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n") == 0, "%s", path);
    static const char plain[] = "aZ09_./=:,+-.csv", odd[] = "s p\t\x1f\x7f~\xc3\xa9.txt";
    snprintf(path, sizeof path, "%s/aZ09_.", dir); /* the folder of the plain word's file */
    REQUIRE(mkdir(path, 0755) == 0, "%s", path);
    snprintf(path, sizeof path, "%s/%s", dir, plain);
    REQUIRE(tg_test_write_file(path, "text,label\nhello,a\nworld,b\n") == 0, "%s", path);
    snprintf(path, sizeof path, "%s/%s", dir, odd);
    REQUIRE(tg_test_write_file(path, "text,label\nhello world,a\n") == 0, "%s", path);
    char *argv[] = {"tunegraph", "data", "convert", (char *)plain, (char *)odd, "-o", "set", "--tokenizer", "vocab.txt",
                    "--format", "csv", "--seq", "8", "--labels", "a,b", NULL};
    char cwd[PATH_MAX];
    REQUIRE(getcwd(cwd, sizeof cwd) && chdir(dir) == 0, "%s", dir);
    tg_cli_run r = tg_test_cli_argv(".", 15, argv, NULL);
    const int back = chdir(cwd);
    REQUIRE(back == 0, "cannot go back to %s", cwd);
    CHECK(r.status == 0 && r.err &&
              !strcmp(r.err, "tunegraph: wrote set: classify with 2 labels, 3 train records (10 tokens) from 3 rows\n"),
          "exit %d: %s", r.status, r.err ? r.err : "(nothing)");
    tg_cli_run_free(&r);
    snprintf(path, sizeof path, "%s/set/manifest.json", dir);
    long len = 0;
    char *text = tg_test_read_file(path, &len);
    REQUIRE(text, "%s", path);
    tg_shard_manifest m;
    tg_err err = {{0}};
    static const char want[] = "tunegraph data convert aZ09_./=:,+-.csv 's p???~??.txt' -o set --tokenizer vocab.txt "
                               "--format csv --seq 8 --labels a,b";
    if (CHECK(tg_shard_manifest_parse(text, (size_t)len, path, &m, &err) == 0, "%s", err.msg)) {
        CHECK(m.command && !strcmp(m.command, want), "command\n%s\nwant\n%s", m.command ? m.command : "(none)", want);
        tg_shard_manifest_free(&m);
    }
    free(text);
}
