/* libFuzzer target: instruction data (datasets/instruct.h). The first byte picks what the
 * rest is: bit 0 clear, a file of Alpaca records (JSON Lines or a JSON array; bit 1:
 * --skip-invalid): every row read holds a non-empty UTF-8 instruction, an input that is
 * absent or non-empty, and an output, all inside the arena, in the order of the file; bit 0
 * set, a prompt template: one that passes the check renders a record into a prompt that
 * holds the instruction and a response that starts with the output. */
#include <string.h>

#include "datasets/instruct.h"
#include "datasets/utf8.h"
#include "tests/fuzz/fuzz_input.h"

static void records(const char *buf, size_t len, int skip_invalid) {
    tg_text_rows rows = {0};
    tg_err err;
    if (tg_text_read_instruct("fuzz.jsonl", buf, len, skip_invalid, &rows, &err) != 0) {
        FUZZ_ASSERT(err.msg[0], "failed without a message");
        tg_text_rows_free(&rows);
        return;
    }
    int64_t last_line = 0, last_element = 0;
    for (int64_t i = 0; i < rows.n; i++) {
        const tg_text_row *r = &rows.rows[i];
        FUZZ_ASSERT(r->text >= 0 && r->text_len > 0 && r->text + r->text_len < rows.n_bytes, "row %lld instruction",
                    (long long)i);
        FUZZ_ASSERT(r->pair < 0 || (r->pair_len > 0 && r->pair + r->pair_len < rows.n_bytes), "row %lld input",
                    (long long)i);
        FUZZ_ASSERT(r->label >= 0 && r->label + r->label_len < rows.n_bytes, "row %lld output", (long long)i);
        FUZZ_ASSERT(tg_utf8_invalid_at(tg_text_rows_at(&rows, r->text), (size_t)r->text_len) < 0 &&
                        tg_utf8_invalid_at(tg_text_rows_at(&rows, r->label), (size_t)r->label_len) < 0,
                    "row %lld is not UTF-8", (long long)i);
        FUZZ_ASSERT(r->line >= last_line && (r->element == 0 || r->element > last_element), "row %lld out of order",
                    (long long)i);
        last_line = r->line;
        last_element = r->element;
    }
    tg_text_rows_free(&rows);
}

static void template(const char *buf, size_t len) {
    tg_instruct_template t;
    tg_err err;
    if (tg_instruct_template_check("fuzz.txt", buf, len, &t, &err) != 0) {
        FUZZ_ASSERT(err.msg[0], "failed without a message");
        return;
    }
    tg_instruct_text prompt = {0}, response = {0};
    FUZZ_ASSERT(tg_instruct_render(&t, "INSTR", 5, "INPUT", 5, "OUT", 3, &prompt, &response, &err) == 0, "%s", err.msg);
    FUZZ_ASSERT(strstr(prompt.s, "INSTR") && !strncmp(response.s, "OUT", 3), "rendered '%s' / '%s'", prompt.s,
                response.s);
    FUZZ_ASSERT(!t.has_input || strstr(prompt.s, "INPUT"), "the input is missing from '%s'", prompt.s);
    FUZZ_ASSERT(prompt.n <= len + 10 && response.n <= len + 3, "rendered %zu + %zu bytes from %zu", prompt.n,
                response.n, len);
    tg_instruct_text_free(&prompt);
    tg_instruct_text_free(&response);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *buf = (const char *)data + 1;
    if (data[0] & 1) template(buf, size - 1);
    else records(buf, size - 1, (data[0] & 2) != 0);
    return 0;
}
