/* Instruction data for `data convert --format instruct`: Stanford Alpaca's records and
 * prompt templates.
 *
 * A record is a JSON object {"instruction": "...", "input": "...", "output": "..."}:
 * instruction and output are required strings (an empty instruction is refused), input is
 * optional (a string, or null for none). The keys "id", "text", "source" and "category"
 * are left alone (tatsu-lab/alpaca's copy carries "text", the rendered example); any
 * other key, a key named twice, or a field of another type is refused, naming the file,
 * the line (and the record's index in an array) and the field. A file holds JSON Lines
 * (one record per line, blank lines left out), or one JSON array of records when its
 * first byte past blanks (and a UTF-8 byte order mark) is '[', as alpaca_data.json is.
 * Text must be UTF-8: a record that is not is refused, or with skip_invalid counted and
 * left out (the records of an array are delimited before they are parsed, so one record
 * can be left out of an array too).
 *
 * A template is text with the placeholders {instruction}, {input} and {output}, and {{
 * and }} for literal braces; {instruction} and {output} appear exactly once, {input} at
 * most once, both before {output}. Rendered, the text before {output} is the prompt, and the output followed by
 * the text after {output} the response. Alpaca's two templates end with {output}; a
 * record whose input is empty or absent takes the one without an input, as Alpaca's
 * training code does. */
#ifndef TUNEGRAPH_INSTRUCT_H
#define TUNEGRAPH_INSTRUCT_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "datasets/text_rows.h"

/* Stanford Alpaca's templates (tatsu-lab/stanford_alpaca's PROMPT_DICT, torchtune's
 * AlpacaToMessages), {output} where the response goes. */
extern const char tg_alpaca_prompt_input[];
extern const char tg_alpaca_prompt_no_input[];

/* Reads a file of alpaca records (buf[0..len), NUL after it; `name` in messages) into
 * rows: the text is the instruction, the pair the input (absent when it is empty, null or
 * missing), the label the output. */
int tg_text_read_instruct(const char *name, const char *buf, size_t len, int skip_invalid, tg_text_rows *rows,
                          tg_err *err);

typedef struct tg_instruct_template {
    const char *text;  /* not owned */
    size_t len;
    int has_input;     /* whether {input} appears */
} tg_instruct_template;

/* Checks template text (`name` in messages: "NAME: byte N: ..."): UTF-8, the placeholders
 * as above, and no other brace. */
int tg_instruct_template_check(const char *name, const char *text, size_t len, tg_instruct_template *t, tg_err *err);

/* A growing byte buffer the renderer writes into; NUL-terminated after a render. */
typedef struct tg_instruct_text {
    char *s;
    size_t n, cap;
} tg_instruct_text;

/* Renders a record through a checked template: the prompt and the response. input may be
 * NULL (none). Fails only out of memory. */
int tg_instruct_render(const tg_instruct_template *t, const char *instruction, size_t instruction_len,
                       const char *input, size_t input_len, const char *output, size_t output_len,
                       tg_instruct_text *prompt, tg_instruct_text *response, tg_err *err);
void tg_instruct_text_free(tg_instruct_text *b);

#endif
