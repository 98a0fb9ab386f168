/* The text readers of `data convert`: CSV/TSV (RFC 4180), JSONL text, folder trees, plain
 * text lines, label names, UTF-8 checks and SQuAD JSON. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "datasets/csv.h"
#include "datasets/labels.h"
#include "datasets/squad.h"
#include "datasets/text_rows.h"
#include "datasets/utf8.h"
#include "tests/harness.h"
#include "tests/text_fixtures.h"

/* All rows of a CSV text as "a|b|c" lines joined by '\n' (fields may hold newlines). */
static int csv_rows(const char *text, char delim, char *out, size_t n, tg_err *err) {
    tg_csv c;
    tg_csv_init(&c, "t.csv", text, strlen(text), delim);
    size_t at = 0;
    out[0] = 0;
    int rc;
    while ((rc = tg_csv_next(&c, err)) == 1) {
        for (int32_t i = 0; i < c.n_fields; i++)
            at += (size_t)snprintf(out + at, n - at, "%s%.*s", i ? "|" : "", (int)c.fields[i].len, c.fields[i].p);
        at += (size_t)snprintf(out + at, n - at, "\n");
    }
    tg_csv_free(&c);
    return rc;
}

static void expect_csv_error(const char *text, const char *want) {
    char out[1024];
    tg_err err = {{0}};
    CHECK(csv_rows(text, ',', out, sizeof out, &err) == -1, "accepted: %s", text);
    CHECK(strstr(err.msg, want) != NULL, "message '%s' lacks '%s'", err.msg, want);
}

TG_TEST(test_csv_rfc4180) {
    char out[1024];
    tg_err err = {{0}};
    /* Quoted delimiters, doubled quotes, a field over two lines, CRLF, a BOM, an empty
     * last field and blank lines between rows. */
    const char *text = "\xEF\xBB\xBFtext,label\r\n"
                       "\"a, b\",x\r\n"
                       "\r\n"
                       "\"say \"\"hi\"\"\",y\n"
                       "\"two\nlines\",\n"
                       "plain,\"\"\n"
                       "last,z";
    REQUIRE(csv_rows(text, ',', out, sizeof out, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(out, "text|label\na, b|x\nsay \"hi\"|y\ntwo\nlines|\nplain|\nlast|z\n"), "rows:\n%s", out);
    REQUIRE(csv_rows("a\tb\n\"x\ty\"\tz\n", '\t', out, sizeof out, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(out, "a|b\nx\ty|z\n"), "tsv rows:\n%s", out);
    /* A delimiter at the very end is one more, empty, field. */
    REQUIRE(csv_rows("a,b\n1,", ',', out, sizeof out, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(out, "a|b\n1|\n"), "rows:\n%s", out);
}

TG_TEST(test_csv_quoting_errors_name_line_and_column) {
    expect_csv_error("text,label\n\"never closed,x\nmore\n", "t.csv:2:1: unterminated quoted field");
    expect_csv_error("text,label\nab\"c,x\n", "t.csv:2:3: stray quote in an unquoted field");
    expect_csv_error("text,label\n\"ab\"c,x\n", "t.csv:2:5: unexpected 'c' after the closing quote");
    /* Lines inside a quoted field count: the error after it names the right line. */
    expect_csv_error("a,b\n\"x\ny\nz\",1\nbad\"q,2\n", "t.csv:5:4: stray quote");
}

static const tg_text_columns k_cols = {.text = "text", .label = "label"};

TG_TEST(test_csv_rows_by_column_name) {
    tg_text_rows rows = {0};
    tg_err err = {{0}};
    const char *text = "id,label,text,extra\n1,pos,good film,a\n2,neg,\"bad, long\",b\n";
    REQUIRE(tg_text_read_csv("r.csv", text, strlen(text), ',', &k_cols, &rows, &err) == 0, "%s", err.msg);
    REQUIRE(rows.n == 2, "%lld rows", (long long)rows.n);
    CHECK(!strcmp(tg_text_rows_at(&rows, rows.rows[1].text), "bad, long"), "text %s",
          tg_text_rows_at(&rows, rows.rows[1].text));
    CHECK(!strcmp(tg_text_rows_at(&rows, rows.rows[0].label), "pos"), "label");
    CHECK(rows.rows[1].line == 3 && rows.rows[1].pair < 0, "line %lld", (long long)rows.rows[1].line);
    tg_text_rows_free(&rows);

    /* A missing text column, a named label column the header lacks, a short row, a
     * duplicate header name. */
    struct {
        const char *text, *want;
        tg_text_columns cols;
    } bad[] = {
        {"body,label\nx,1\n", "r.csv: no column 'text' for the text (the header has 'body', 'label'", k_cols},
        {"text,y\nx,1\n", "r.csv: no column 'topic' for the label", {.text = "text", .label = "topic", .label_required = 1}},
        {"text,label\nx\n", "r.csv:2: row has 1 field, the header has 2", k_cols},
        {"text,text\nx,y\n", "r.csv:1: the header names column 'text' twice", k_cols},
        {"text,label\n\xff\xfe,1\n", "r.csv:2: column 'text' is not valid UTF-8 (byte 0xff at offset 0", k_cols},
        {"text,label\nx,\n", "r.csv:2: the label ('label') is empty", k_cols},
        {"", "r.csv: empty file", k_cols},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tg_text_rows r = {0};
        CHECK(tg_text_read_csv("r.csv", bad[i].text, strlen(bad[i].text), ',', &bad[i].cols, &r, &err) == -1,
              "accepted %s", bad[i].text);
        CHECK(strstr(err.msg, bad[i].want) != NULL, "message '%s' lacks '%s'", err.msg, bad[i].want);
        tg_text_rows_free(&r);
    }
    /* --skip-invalid leaves such rows out and counts them. */
    tg_text_columns skip = k_cols;
    skip.skip_invalid = 1;
    const char *mixed = "text,label\nok,1\n\xc3\x28,2\nfine,1\n";
    REQUIRE(tg_text_read_csv("r.csv", mixed, strlen(mixed), ',', &skip, &rows, &err) == 0, "%s", err.msg);
    CHECK(rows.n == 2 && rows.skipped_invalid == 1, "%lld rows, %lld skipped", (long long)rows.n,
          (long long)rows.skipped_invalid);
    tg_text_rows_free(&rows);
}

TG_TEST(test_jsonl_text_rows) {
    tg_text_rows rows = {0};
    tg_err err = {{0}};
    const tg_text_columns cols = {.text = "sentence", .pair = "other", .label = "label"};
    const char *text = "{\"sentence\": \"a\", \"other\": \"b\", \"label\": 3}\n\n{\"sentence\": \"c\\u00e9\", "
                       "\"other\": \"\", \"label\": \"x\"}\n";
    REQUIRE(tg_text_read_jsonl("d.jsonl", text, strlen(text), &cols, &rows, &err) == 0, "%s", err.msg);
    REQUIRE(rows.n == 2, "%lld rows", (long long)rows.n);
    CHECK(!strcmp(tg_text_rows_at(&rows, rows.rows[0].label), "3"), "integer label spelled out");
    CHECK(!strcmp(tg_text_rows_at(&rows, rows.rows[1].text), "c\xc3\xa9") && rows.rows[1].line == 3, "row 2");
    CHECK(rows.rows[1].pair_len == 0 && rows.rows[1].pair >= 0, "empty pair kept");
    tg_text_rows_free(&rows);
    struct {
        const char *text, *want;
    } bad[] = {
        {"{\"sentence\": \"a\", \"sentence\": \"b\", \"other\": \"c\"}\n", "d.jsonl:1: invalid JSON: duplicate object key"},
        {"{\"sentence\": 5, \"other\": \"c\"}\n", "d.jsonl:1: \"sentence\" (the text) must be a string"},
        {"{\"sentence\": \"a\"}\n", "d.jsonl:1: no \"other\" field for the pair text"},
        {"{\"sentence\": \"a\", \"other\": \"b\", \"label\": 1.5}\n", "\"label\" (the label) must be a string or an integer"},
        {"[1]\n", "d.jsonl:1: expected a JSON object"},
        {"{\"sentence\": \"\xe2\x82\", \"other\": \"b\"}\n", "d.jsonl:1: not valid UTF-8 (byte 0xe2 at column 15"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tg_text_rows r = {0};
        CHECK(tg_text_read_jsonl("d.jsonl", bad[i].text, strlen(bad[i].text), &cols, &r, &err) == -1, "accepted %s",
              bad[i].text);
        CHECK(strstr(err.msg, bad[i].want) != NULL, "message '%s' lacks '%s'", err.msg, bad[i].want);
        tg_text_rows_free(&r);
    }
}

TG_TEST(test_text_lines_rows) {
    tg_text_rows rows = {0};
    tg_err err = {{0}};
    const char *text = "first line\r\n\n   \nsecond\nthird";
    REQUIRE(tg_text_read_lines("c.txt", text, strlen(text), 0, &rows, &err) == 0, "%s", err.msg);
    REQUIRE(rows.n == 3, "%lld rows", (long long)rows.n);
    CHECK(!strcmp(tg_text_rows_at(&rows, rows.rows[0].text), "first line"), "CR dropped");
    CHECK(rows.rows[1].line == 4 && rows.rows[2].line == 5, "lines %lld %lld", (long long)rows.rows[1].line,
          (long long)rows.rows[2].line);
    tg_text_rows_free(&rows);
    CHECK(tg_text_read_lines("c.txt", "ok\nbad \xa3 here\n", 14, 0, &rows, &err) == -1, "invalid UTF-8 accepted");
    CHECK(strstr(err.msg, "c.txt:2: column 'text' is not valid UTF-8 (byte 0xa3 at offset 4") != NULL, "%s", err.msg);
    tg_text_rows_free(&rows);
}

static void put(const char *dir, const char *name, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    tg_test_write_file(path, text);
}

TG_TEST(test_folder_tree_rows) {
    char root[512], d[600];
    snprintf(root, sizeof root, "%s", tg_test_tmpdir());
    const char *labels[] = {"tech", "business", ".hidden"};
    for (int i = 0; i < 3; i++) {
        snprintf(d, sizeof d, "%s/%s", root, labels[i]);
        mkdir(d, 0755);
    }
    snprintf(d, sizeof d, "%s/tech", root);
    put(d, "b.txt", "chips");
    put(d, "a.txt", "phones\nand more");
    put(d, ".DS_Store", "junk");
    snprintf(d, sizeof d, "%s/business", root);
    put(d, "001.txt", "profits");
    snprintf(d, sizeof d, "%s/.hidden", root);
    put(d, "x.txt", "never read");
    put(root, "README", "a file at the top is not a label");
    tg_text_rows rows = {0};
    tg_err err = {{0}};
    char slash[600];
    snprintf(slash, sizeof slash, "%s/", root);
    REQUIRE(tg_text_read_folders(slash, 0, &rows, &err) == 0, "%s", err.msg);
    REQUIRE(rows.n == 3, "%lld rows", (long long)rows.n);
    /* Folders and files in byte order, whatever the file system lists first. */
    CHECK(!strcmp(tg_text_rows_at(&rows, rows.rows[0].label), "business"), "label 0");
    CHECK(!strcmp(tg_text_rows_at(&rows, rows.rows[1].text), "phones\nand more"), "a.txt before b.txt");
    CHECK(!strcmp(tg_text_rows_at(&rows, rows.rows[2].label), "tech"), "label 2");
    char where[700], want[700];
    tg_text_rows_where(&rows, &rows.rows[2], where, sizeof where);
    snprintf(want, sizeof want, "%s/tech/b.txt", root);
    CHECK(!strcmp(where, want), "where '%s'", where);
    tg_text_rows_free(&rows);

    /* A file in Latin-1 (as one BBC article is): refused by name, or left out and counted. */
    snprintf(d, sizeof d, "%s/tech", root);
    put(d, "c.txt", "a \xa3" "15m deal");
    CHECK(tg_text_read_folders(root, 0, &rows, &err) == -1, "Latin-1 accepted");
    snprintf(want, sizeof want, "%s/tech/c.txt: not valid UTF-8 (byte 0xa3 at offset 2", root);
    CHECK(strstr(err.msg, want) && strstr(err.msg, "--skip-invalid"), "message '%s'", err.msg);
    tg_text_rows_free(&rows);
    REQUIRE(tg_text_read_folders(root, 1, &rows, &err) == 0, "%s", err.msg);
    CHECK(rows.n == 3 && rows.skipped_invalid == 1, "%lld rows, %lld skipped", (long long)rows.n,
          (long long)rows.skipped_invalid);
    tg_text_rows_free(&rows);
    CHECK(tg_text_read_folders(d, 0, &rows, &err) == -1 && strstr(err.msg, "no label folders"), "%s", err.msg);
    tg_text_rows_free(&rows);
}

static void label_names(const tg_label_set *ls, char *out, size_t n) {
    size_t at = 0;
    out[0] = 0;
    for (int32_t i = 0; i < ls->n; i++) at += (size_t)snprintf(out + at, n - at, "%s%s", i ? "," : "", ls->names[i]);
}

TG_TEST(test_label_ids_follow_sorted_names) {
    tg_err err = {{0}};
    char names[256];
    struct {
        const char *labels[6];
        const char *want;
    } cases[] = {
        {{"neg", "pos", "neg", "neutral"}, "neg,neutral,pos"},
        {{"10", "2", "1", "2", "-3"}, "-3,1,2,10"},       /* whole numbers by value */
        {{"10", "2", "02"}, "02,10,2"},                   /* "02" is no plain number: bytes */
        {{"b", "B", "a"}, "B,a,b"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        tg_text_rows rows = {0};
        int32_t src;
        tg_text_rows_source(&rows, "x", &src, &err);
        for (int i = 0; i < 6 && cases[k].labels[i]; i++)
            tg_text_rows_add(&rows, src, i + 1, "t", 1, NULL, 0, cases[k].labels[i], strlen(cases[k].labels[i]), &err);
        tg_label_set ls;
        REQUIRE(tg_labels_collect(&rows, &ls, &err) == 0, "%s", err.msg);
        label_names(&ls, names, sizeof names);
        CHECK(!strcmp(names, cases[k].want), "case %zu: %s, want %s", k, names, cases[k].want);
        for (int32_t i = 0; i < ls.n; i++)
            CHECK(tg_labels_find(&ls, ls.names[i], strlen(ls.names[i])) == i, "find %s", ls.names[i]);
        CHECK(tg_labels_find(&ls, "nope", 4) == -1, "unknown found");
        tg_labels_free(&ls);
        tg_text_rows_free(&rows);
    }
    tg_label_set ls;
    REQUIRE(tg_labels_parse_list(" sports , tech,business", &ls, &err) == 0, "%s", err.msg);
    label_names(&ls, names, sizeof names);
    CHECK(!strcmp(names, "sports,tech,business"), "list order kept: %s", names);
    tg_labels_free(&ls);
    CHECK(tg_labels_parse_list("a,,b", &ls, &err) == -1 && strstr(err.msg, "--labels: name 2 of 'a,,b' is empty"),
          "%s", err.msg);
    CHECK(tg_labels_parse_list("a,b,a", &ls, &err) == -1 && strstr(err.msg, "'a' is listed twice"), "%s", err.msg);
}

TG_TEST(test_utf8_checks_and_offsets) {
    CHECK(tg_utf8_invalid_at("plain", 5) == -1, "ascii");
    const char *mixed = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80";
    CHECK(tg_utf8_invalid_at(mixed, strlen(mixed)) == -1, "2, 3 and 4 bytes");
    CHECK(tg_utf8_invalid_at(mixed, strlen(mixed) - 1) == 10, "an emoji cut short");
    CHECK(tg_utf8_invalid_at("a\xc0\xaf", 3) == 1, "overlong");
    CHECK(tg_utf8_invalid_at("ab\xed\xa0\x80", 5) == 2, "surrogate");
    CHECK(tg_utf8_invalid_at("\xf4\x90\x80\x80", 4) == 0, "past U+10FFFF");
    CHECK(tg_utf8_invalid_at("ok\xe2\x82", 4) == 2, "cut short");
    const char *s = "d\xc3\xa9j\xc3\xa0 vu";
    CHECK(tg_utf8_byte_offset(s, strlen(s), 0) == 0, "0");
    CHECK(tg_utf8_byte_offset(s, strlen(s), 2) == 3, "after the e-acute");
    CHECK(tg_utf8_byte_offset(s, strlen(s), 7) == (int64_t)strlen(s), "the end");
    CHECK(tg_utf8_byte_offset(s, strlen(s), 8) == -1, "past the end");
}

TG_TEST(test_squad_answers_become_byte_ranges) {
    tg_squad sq;
    tg_err err = {{0}};
    REQUIRE(tg_squad_parse("s.json", tg_test_squad_v2, strlen(tg_test_squad_v2), &sq, &err) == 0, "%s", err.msg);
    CHECK(sq.n_articles == 2 && sq.n_paragraphs == 2 && sq.n_questions == 3, "%d articles %d paragraphs %lld questions",
          sq.n_articles, sq.n_paragraphs, (long long)sq.n_questions);
    /* Character 21 is byte 22: the e-acute before it takes two bytes. */
    const tg_squad_question *q = &sq.questions[0];
    REQUIRE(q->n_answers == 1, "q1 answers %d", q->n_answers);
    const tg_squad_answer *a = &sq.answers[q->first_answer];
    const char *ctx = sq.paragraphs[0].context;
    CHECK(a->start == 22 && a->end == 26 && !memcmp(ctx + a->start, "1901", 4), "answer at %lld..%lld",
          (long long)a->start, (long long)a->end);
    CHECK(sq.questions[1].n_answers == 0, "impossible question answered");
    CHECK(!strcmp(sq.questions[2].id, "7") && sq.paragraphs[1].article == 1, "integer id and article");
    tg_squad_free(&sq);

    struct {
        const char *text, *want;
    } bad[] = {
        {"{\"data\": [{\"paragraphs\": [{\"context\": \"abc def\", \"qas\": [{\"id\": \"x1\", \"question\": \"q\", "
         "\"answers\": [{\"text\": \"def\", \"answer_start\": 3}]}]}]}]}",
         "s.json: data[0].paragraphs[0].qas[0] (id 'x1'): answer 'def' at character 3 is not in its context (the "
         "context there reads ' de')"},
        {"{\"data\": [{\"paragraphs\": [{\"context\": \"abc\", \"qas\": [{\"id\": \"x2\", \"question\": \"q\", "
         "\"answers\": [{\"text\": \"c\", \"answer_start\": 9}]}]}]}]}",
         "(id 'x2'): answer 'c' at character 9 is not in its context (the context has fewer characters)"},
        {"{\"data\": [{\"paragraphs\": [{\"context\": \"abc\", \"qas\": [{\"id\": \"x3\", \"question\": \"q\", "
         "\"answers\": [{\"text\": \"c\"}]}]}]}]}",
         "data[0].paragraphs[0].qas[0].answers[0] (id 'x3'): answer_start must be a whole number"},
        {"{\"data\": [{\"paragraphs\": [{\"qas\": []}]}]}", "s.json: data[0].paragraphs[0] has no \"context\""},
        {"{\"data\": [], \"data\": []}", "s.json:1:19: invalid JSON: duplicate object key"},
        {"{\"data\": []}", "s.json: no questions"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK(tg_squad_parse("s.json", bad[i].text, strlen(bad[i].text), &sq, &err) == -1, "accepted %s", bad[i].text);
        CHECK(strstr(err.msg, bad[i].want) != NULL, "message '%s' lacks '%s'", err.msg, bad[i].want);
    }
}
