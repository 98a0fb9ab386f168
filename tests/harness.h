/* A small test runner: TG_TEST(name) registers a test; CHECK records a failure and
 * continues, REQUIRE stops the test. The runner prints one line per test and ends with
 * "N passed, N failed"; with TG_TEST_FAIL_FAST=1 it stops after the first failing test. */
#ifndef TUNEGRAPH_TEST_HARNESS_H
#define TUNEGRAPH_TEST_HARNESS_H

#include <stdint.h>

#include "base/error.h"
#include "plan/plan.h"

typedef void (*tg_test_fn)(void);
void tg_test_register(const char *name, const char *file, tg_test_fn fn);
int tg_test_check(int ok, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define TG_TEST(name)                                                              \
    static void name(void);                                                        \
    __attribute__((constructor)) static void name##_register(void) {               \
        tg_test_register(#name, __FILE__, name);                                   \
    }                                                                              \
    static void name(void)

#define CHECK(cond, ...) tg_test_check(!!(cond), __FILE__, __LINE__, __VA_ARGS__)
#define REQUIRE(cond, ...)                                                         \
    do {                                                                           \
        if (!CHECK(cond, __VA_ARGS__)) return;                                     \
    } while (0)

/* A fresh empty directory for this test (under $TMPDIR), removed at exit. */
const char *tg_test_tmpdir(void);
/* Writes text to path; returns 0 on success. */
int tg_test_write_file(const char *path, const char *text);
/* Reads a whole file (malloc'd, NUL-terminated); NULL on failure. */
char *tg_test_read_file(const char *path, long *len);
/* Number of entries in a directory (files left behind after a failed write). */
int tg_test_count_files(const char *dir);

/* ||a - b|| / max(||b||, tiny), in double; +inf if any element is NaN. */
double tg_rel_err(const float *a, const float *b, int64_t n);

/* The CLI the suite runs: $TG_TEST_CLI (the sanitizer build and device runs set it), else
 * ./build/gpu/tunegraph when the suite runs on CUDA, ./build/tunegraph otherwise. */
const char *tg_test_cli(void);

/* The executor the suite runs on: 1 (CUDA) when TG_TEST_DEVICE=cuda, else 0 (CPU). */
int tg_test_device(void);

/* ||a - b|| in double; +inf if any element is NaN. */
double tg_l2_diff(const float *a, const float *b, int64_t n);

/* Relative L2 error of parameters `got` against `want` after optimizer updates, leaving
 * out the elements whose gradient is nonzero but below `floor` in both grad_a and grad_b
 * (either may be NULL): such a gradient is rounding noise (attention key biases have a
 * true gradient of zero, since softmax ignores a shift shared by all keys), and AdamW's
 * m / sqrt(v) turns noise into a full +-lr step whose sign differs between two correct
 * implementations. The count left out is added to *left_out. */
double tg_rel_err_after_update(const float *got, const float *want, const float *grad_a, const float *grad_b,
                               int64_t n, double floor, int64_t *left_out);

/* Index of the tensor of plan p named `name`, or -1. */
int tg_test_tensor_named(const tg_plan *p, const char *name);
/* Compiles a preset for a small batch (2 x 16, one step) with the job defaults but task,
 * precision and data_parallel; 1 on success, else a failed CHECK and 0. */
int tg_test_compile_preset(const char *preset, int task, int precision, int data_parallel, tg_plan *p);
/* The same for batch x seq, one step; 1 on success, else a failed CHECK and 0. */
int tg_test_compile_sized(const char *preset, int task, int batch, int seq, int data_parallel, int precision,
                          tg_plan *p);
/* Compiles the BERT-base benchmark shape (bert-base-uncased, classify, bf16, batch 32 x
 * seq 128, one step) with the job defaults but share_grad_memory, recompute and
 * memory_limit: tg_compile_with_config's 0 or -1 (err says why), or -2 (a failed CHECK)
 * when the preset cannot be loaded. */
int tg_test_compile_bert_base_b32(int share_grad_memory, int recompute, uint64_t memory_limit, tg_plan *p, tg_err *err);
/* Trains job file `job_path` with the overrides `sets` on the CPU for `steps` steps: its
 * final parameters into *params (malloc'ed, *bytes long) and, when `shared` is not NULL,
 * the plan's grads_share_activations into *shared; 1 on success, else a failed CHECK
 * and 0. */
int tg_test_train_cpu(const char *job_path, const char *const *sets, int n_sets, int steps, float **params,
                      size_t *bytes, int *shared);
/* A float's bits, and the float of given bits. */
uint32_t tg_test_f32_bits(float f);
float tg_test_f32_of_bits(uint32_t u);
/* Deterministic uniform floats in [lo, hi) from a seed (xorshift). */
void tg_test_fill_uniform(float *x, int64_t n, uint64_t seed, float lo, float hi);
/* An op of the given kind, every slot -1 and every parameter 0. */
tg_op tg_test_op(int kind);
/* Advances a xorshift state (nonzero) and returns its high 32 bits. */
uint32_t tg_test_rand(uint64_t *state);

struct tg_trainer;
/* Fills the trainer's input tensors with a random batch drawn from *rng: token ids above
 * pad_id, row 1 padded from seq / 2, positions as the dataset code makes them (RoBERTa's
 * count from pad_id + 1), random token types where the model has more than one, and random
 * labels (LM: the next-token slots of the real tokens; classification: one per row). */
void tg_test_fill_random_inputs(struct tg_trainer *tr, const tg_plan *p, uint64_t *rng);

#endif
