/* tg_csv_free (datasets/csv.c) gives back all three buffers a reader grows (the row's
 * fields, their scratch offsets and the scratch of quoted fields) and leaves the reader
 * zeroed, so a second free is harmless. A reader freed without a row read, or after an
 * error in the middle of a row, frees as well. The bytes in use (glibc's mallinfo2) are the
 * same after a thousand readers as before them; the sanitizer build, whose allocator
 * mallinfo2 does not see, has its leak check at exit for that instead. */
#include <malloc.h>
#include <stdio.h>
#include <string.h>

#include "datasets/csv.h"
#include "tests/harness.h"

/* Reads every row of text with a fresh reader and frees it; 1 if all rows read (or the
 * error came, when want_error), and the reader was zeroed by the free. */
static int read_and_free(const char *text, int want_error, tg_err *err) {
    tg_csv c;
    tg_csv_init(&c, "t.csv", text, strlen(text), ',');
    int rc;
    while ((rc = tg_csv_next(&c, err)) == 1) {}
    const int grown = c.fields && c.scratch_at && c.cap_fields > 0;
    tg_csv_free(&c);
    static const tg_csv zero;
    const int zeroed = !memcmp(&c, &zero, sizeof c);
    if (zeroed) tg_csv_free(&c); /* again: nothing left to free */
    if (want_error && rc == -1)
        rc = strcmp(err->msg, "t.csv:1:8: stray quote in an unquoted field (quote the whole field and write the quote "
                              "twice)") ? -2 : -1;
    return rc == (want_error ? -1 : 0) && grown && zeroed;
}

/* Bytes malloc has handed out and not had back; 0 where the allocator is not glibc's (the
 * sanitizer build). */
static size_t in_use(void) {
#if defined(__SANITIZE_ADDRESS__)
    return 0;
#else
    return mallinfo2().uordblks;
#endif
}

TG_TEST(test_csv_free_gives_back_every_buffer) {
    /* 20 fields (the field arrays grow past 16), two of them quoted (the scratch) */
    const char *rows = "a,\"b\"\"c\",c,d,e,f,g,h,i,j,k,l,m,n,o,p,q,r,s,\"t,u\"\nx,y\n";
    /* a quote in an unquoted field: an error after three fields of the row */
    const char *bad = "a,\"b\",c\"d\n";
    tg_err err = {{0}};
    /* the first rounds fill malloc's caches of freed blocks; those count as in use */
    for (int k = 0; k < 20; k++) {
        REQUIRE(read_and_free(rows, 0, &err), "rows: %s", err.msg);
        REQUIRE(read_and_free(bad, 1, &err), "row with an error: '%s'", err.msg);
    }
    const size_t before = in_use();
    int ok = 1;
    for (int k = 0; k < 1000; k++) {
        ok &= read_and_free(rows, 0, &err);
        ok &= read_and_free(bad, 1, &err);
    }
    const size_t after = in_use();
    CHECK(ok, "a reader read wrongly or was not zeroed by tg_csv_free: '%s'", err.msg);
    /* a buffer kept each time would be 2000 blocks, over 256 KiB */
    CHECK(after <= before + 4096, "%zu bytes in use after 2000 readers, %zu before", after, before);
    /* a reader that read nothing has nothing to give back */
    tg_csv c;
    tg_csv_init(&c, "t.csv", "", 0, ',');
    tg_csv_free(&c);
    CHECK(c.fields == NULL && c.scratch_at == NULL && c.scratch == NULL && c.name == NULL, "reader not zeroed");
}
