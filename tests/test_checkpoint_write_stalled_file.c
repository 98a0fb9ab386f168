/* A checkpoint write stopped part way (TUNEGRAPH_TEST_CHECKPOINT_STALL, runtime/checkpoint.c):
 * while it waits, the temporary file holds the header's place as 64 zero bytes (the header is
 * written last, so a file cut off there has no magic) followed by the start of the zstd
 * frame, and the message that it waits has reached stderr even when the program made stderr
 * fully buffered (as an embedding program may). */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/checkpoint.h"
#include "tests/harness.h"

typedef struct stalled_write {
    tg_checkpoint ck;
    const char *path;
    tg_err err;
    int rc;
    volatile int done;
} stalled_write;

static void *write_it(void *arg) {
    stalled_write *s = arg;
    s->rc = tg_checkpoint_write(&s->ck, s->path, &s->err);
    s->done = 1;
    return NULL;
}

static void ignore(int sig) { (void)sig; }

/* The bytes of the first temporary file of dir (malloc'd), NULL when there is none. */
static char *temp_file(const char *dir, long *len) {
    DIR *d = opendir(dir);
    char *text = NULL;
    for (struct dirent *e; d && !text && (e = readdir(d));) {
        if (!strstr(e->d_name, ".tmp.")) continue;
        char path[900];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        text = tg_test_read_file(path, len);
    }
    if (d) closedir(d);
    return text;
}

TG_TEST(test_checkpoint_write_stalled_file_contents) {
    const char *dir = tg_test_tmpdir();
    char path[700], log[700];
    snprintf(path, sizeof path, "%s/step-000003.tgckpt", dir);
    snprintf(log, sizeof log, "%s/stderr.txt", dir);
    stalled_write s = {.path = path};
    tg_checkpoint_init(&s.ck);
    s.ck.state = (tg_checkpoint_state){.step = 3, .total_steps = 4, .replicas = 1};
    float *w = malloc(64 * sizeof *w);
    for (int i = 0; i < 64; i++) w[i] = (float)i;
    REQUIRE(tg_checkpoint_add_tensor(&s.ck, "w", -1, TG_F32, 1, (const int64_t[]){64}, w, &s.err) == 0, "%s",
            s.err.msg);
    char want[800];
    snprintf(want, sizeof want, "tunegraph: %s: stalled part-written (TUNEGRAPH_TEST_CHECKPOINT_STALL), waiting for a "
                                "signal\n", path);

    struct sigaction sa = {.sa_handler = ignore}, old_sa;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &old_sa);
    static char stderr_buffer[4096];
    fflush(stderr);
    const int saved_stderr = dup(2), logfd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(logfd, 2);
    close(logfd);
    setvbuf(stderr, stderr_buffer, _IOFBF, sizeof stderr_buffer);
    setenv("TUNEGRAPH_TEST_CHECKPOINT_STALL", "3", 1);
    pthread_t t;
    pthread_create(&t, NULL, write_it, &s);
    /* Until the message is in the log (10 s at most): then the writer waits, or is about to. */
    char *said = NULL, *part = NULL;
    long part_len = 0;
    for (int polls = 0; polls < 1000 && !s.done; polls++) {
        usleep(10000);
        said = tg_test_read_file(log, NULL);
        if (said && !strcmp(said, want)) break;
        free(said);
        said = NULL;
    }
    const int stalled = said != NULL && !s.done;
    if (stalled) part = temp_file(dir, &part_len);
    for (int polls = 0; !s.done && polls < 500; polls++) { /* a signal ends the wait */
        pthread_kill(t, SIGTERM);
        usleep(10000);
    }
    pthread_join(t, NULL);
    fflush(stderr);
    setvbuf(stderr, NULL, _IONBF, 0);
    dup2(saved_stderr, 2);
    close(saved_stderr);
    unsetenv("TUNEGRAPH_TEST_CHECKPOINT_STALL");
    sigaction(SIGTERM, &old_sa, NULL);

    CHECK(stalled, "the message did not reach stderr while the write waited: '%s'", said ? said : "(none)");
    static const uint8_t zeros[64], zstd_magic[4] = {0x28, 0xb5, 0x2f, 0xfd};
    CHECK(!stalled || (part && part_len > 68 && !memcmp(part, zeros, 64) && !memcmp(part + 64, zstd_magic, 4)),
          "the part-written file: %ld bytes, starting %02x %02x", part_len, part ? (uint8_t)part[0] : 0,
          part ? (uint8_t)part[64] : 0);
    free(part);
    free(said);
    CHECK(s.rc == 0, "the stalled write: %s", s.err.msg);
    tg_checkpoint back;
    CHECK(tg_checkpoint_read(path, &back, &s.err) == 0 && back.state.step == 3 && back.n_tensors == 1 &&
              !memcmp(back.tensors[0].data, s.ck.tensors[0].data, 256),
          "after the stall: %s", s.err.msg);
    tg_checkpoint_free(&back);
    tg_checkpoint_free(&s.ck);
}
