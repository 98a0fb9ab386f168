/* Eval accuracy, macro-F1 and loss on fixtures with a known answer (runtime/trainer.c's eval): a
 * classifier whose weight is zero gives every row the logits of its bias, so the argmax,
 * the correct count and the cross entropy are known here; five rows in batches of two
 * end in a padded batch of one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "compiler/compile.h"
#include "compiler/job.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

enum { ROWS = 5, CLASSES = 3 };
/* The eval rows' labels: two of class 0, one of 1, two of 2 (each prediction below gets
 * a different count right). */
static const int k_labels[ROWS] = {0, 2, 1, 2, 0};

static int open_fixture(tg_plan *plan, tg_trainer *tr) {
    const char *dir = tg_test_tmpdir();
    char path[1024], rows[1024] = "";
    for (int r = 0; r < ROWS; r++) {
        char line[128];
        /* Rows of different lengths: the batches pad them too. */
        snprintf(line, sizeof line, "{\"input_ids\": [1, %d, %d, %d, 2], \"label\": %d}\n", 10 + r, 20 + r, 30 + r,
                 k_labels[r]);
        if (r == 3) snprintf(line, sizeof line, "{\"input_ids\": [1, 7, 2], \"label\": %d}\n", k_labels[r]);
        strcat(rows, line);
    }
    snprintf(path, sizeof path, "%s/eval.jsonl", dir);
    if (!CHECK(tg_test_write_file(path, rows) == 0, "eval")) return 0;
    snprintf(path, sizeof path, "%s/train.jsonl", dir);
    if (!CHECK(tg_test_write_file(path, "{\"input_ids\": [1, 5, 2], \"label\": 1}\n") == 0, "train")) return 0;
    snprintf(path, sizeof path, "%s/job.txt", dir);
    if (!CHECK(tg_test_write_file(path, "model = tiny-bert\nnum_labels = 3\nbatch = 2\nseq = 8\nsteps = 1\n"
                                        "train_data = train.jsonl\neval_data = eval.jsonl\n") == 0,
               "job"))
        return 0;
    tg_err err = {{0}};
    tg_job job;
    if (!CHECK(tg_job_load(path, NULL, 0, &job, &err) == 0, "%s", err.msg)) return 0;
    if (!CHECK(tg_compile(&job, plan, &err) == 0, "%s", err.msg)) return 0;
    tg_trainer_options o = {.device = tg_test_device(), .load_data = 1};
    if (!CHECK(tg_trainer_open(tr, plan, &o, &err) == 0, "%s", err.msg)) {
        tg_plan_free(plan);
        return 0;
    }
    return 1;
}

/* Sets the classifier to weight 0 and bias `bias`: every row's logits are the bias. */
static int set_classifier(tg_trainer *tr, const tg_plan *plan, const float bias[CLASSES]) {
    int w = tg_test_tensor_named(plan, "classifier.weight"), b = tg_test_tensor_named(plan, "classifier.bias");
    if (!CHECK(w >= 0 && b >= 0, "no classifier tensors")) return 0;
    int64_t n = tg_tensor_numel(&plan->tensors[w]);
    float *zero = calloc((size_t)n, sizeof *zero);
    tg_err err = {{0}};
    int ok = CHECK(zero && tg_trainer_write(tr, w, zero, &err) == 0 && tg_trainer_write(tr, b, bias, &err) == 0, "%s",
                   err.msg);
    free(zero);
    return ok;
}

/* What the eval must report with every row's logits equal to `bias`: the first of equal
 * maxima is the prediction (torch.argmax), and the loss the mean of -log softmax. */
static void expect_eval(tg_trainer *tr, const float bias[CLASSES], int want_correct, const char *what) {
    double lse = 0, loss = 0;
    for (int c = 0; c < CLASSES; c++) lse += exp((double)bias[c]);
    lse = log(lse);
    for (int r = 0; r < ROWS; r++) loss += lse - bias[k_labels[r]];
    loss /= ROWS;
    tg_eval_stats ev;
    tg_err err = {{0}};
    REQUIRE(tg_trainer_eval(tr, &ev, &err) == 0, "%s: %s", what, err.msg);
    CHECK(ev.examples == ROWS && ev.counted == ROWS, "%s: examples %d counted %lld", what, ev.examples,
          (long long)ev.counted);
    CHECK(fabs(ev.accuracy - (double)want_correct / ROWS) < 1e-12, "%s: accuracy %.9g, want %d/%d", what, ev.accuracy,
          want_correct, ROWS);
    CHECK(fabs(ev.loss - loss) < 1e-6, "%s: loss %.9g, want %.9g", what, ev.loss, loss);
    CHECK(ev.perplexity == -1.0, "%s: perplexity %g in a classification eval", what, ev.perplexity);
    /* Every row predicts the same class P, right for the rows labelled P: P's F1 is
     * 2 tp / (2 tp + fp) and the other classes' 0 (labels, no predictions), all three
     * classes counted (scikit-learn's f1_score, average="macro"). */
    const double macro = 2.0 * want_correct / (2.0 * want_correct + (ROWS - want_correct)) / CLASSES;
    CHECK(fabs(ev.macro_f1 - macro) < 1e-12, "%s: macro-F1 %.12g, want %.12g", what, ev.macro_f1, macro);
}

TG_TEST(test_values_eval_known_logits) {
    tg_plan plan;
    tg_trainer tr;
    if (!open_fixture(&plan, &tr)) return;
    /* A tie between classes 0 and 1: class 0 is predicted, right for the two rows of 0. */
    static const float tie[CLASSES] = {1.0f, 1.0f, 0.25f};
    if (set_classifier(&tr, &plan, tie)) expect_eval(&tr, tie, 2, "tie of 0 and 1");
    /* Class 1 above class 0 by one ulp: class 1 is predicted, right for one row. */
    float near[CLASSES] = {1.0f, nextafterf(1.0f, 2.0f), 0.25f};
    if (set_classifier(&tr, &plan, near)) expect_eval(&tr, near, 1, "class 1 one ulp above");
    /* Class 2 the clear maximum, by a margin that the loss feels. */
    static const float two[CLASSES] = {-1.5f, 0.5f, 2.0f};
    if (set_classifier(&tr, &plan, two)) expect_eval(&tr, two, 2, "class 2");
    /* The tie at the last two classes: class 1 is predicted. */
    static const float tie12[CLASSES] = {-3.0f, 0.75f, 0.75f};
    if (set_classifier(&tr, &plan, tie12)) expect_eval(&tr, tie12, 1, "tie of 1 and 2");
    tg_trainer_close(&tr);
    tg_plan_free(&plan);
}

/* With the initial random weights, every row has its own logits: the accuracy and the loss
 * equal what the batches' logits say, and the last batch hands over its one real row. */
typedef struct seen_logits {
    int batches, rows, correct, last_rows;
    int tp[CLASSES], fp[CLASSES], fn[CLASSES];
    double loss;
} seen_logits;

static int on_batch(void *ctx, const float *logits, int32_t first, int32_t rows, tg_err *err) {
    seen_logits *s = ctx;
    s->batches++, s->last_rows = rows;
    for (int r = 0; r < rows; r++) {
        const float *l = logits + (size_t)r * CLASSES;
        int best = 0;
        double m = l[0], sum = 0;
        for (int c = 1; c < CLASSES; c++) {
            if (l[c] > l[best]) best = c;
            if (l[c] > m) m = l[c];
        }
        for (int c = 0; c < CLASSES; c++) sum += exp((double)l[c] - m);
        int label = k_labels[first + r];
        s->loss += m + log(sum) - l[label];
        s->correct += best == label;
        if (best == label) s->tp[best]++;
        else s->fp[best]++, s->fn[label]++;
        s->rows++;
    }
    return 0;
}

TG_TEST(test_values_eval_from_logits) {
    tg_plan plan;
    tg_trainer tr;
    if (!open_fixture(&plan, &tr)) return;
    seen_logits s = {0};
    tg_eval_stats ev;
    tg_err err = {{0}};
    if (CHECK(tg_trainer_eval_logits(&tr, &ev, on_batch, &s, &err) == 0, "%s", err.msg)) {
        CHECK(s.batches == 3 && s.rows == ROWS && s.last_rows == 1, "%d batches, %d rows, last batch %d rows", s.batches,
              s.rows, s.last_rows);
        CHECK(fabs(ev.accuracy - (double)s.correct / ROWS) < 1e-12, "accuracy %.9g, the logits say %d/%d", ev.accuracy,
              s.correct, ROWS);
        CHECK(fabs(ev.loss - s.loss / ROWS) < 1e-6, "loss %.9g, the logits say %.9g", ev.loss, s.loss / ROWS);
        double f1 = 0;
        int counted = 0;
        for (int c = 0; c < CLASSES; c++)
            if (s.tp[c] + s.fp[c] + s.fn[c] > 0) f1 += 2.0 * s.tp[c] / (2 * s.tp[c] + s.fp[c] + s.fn[c]), counted++;
        CHECK(counted > 0 && fabs(ev.macro_f1 - f1 / counted) < 1e-12, "macro-F1 %.12g, the logits say %.12g",
              ev.macro_f1, counted ? f1 / counted : NAN);
    }
    tg_trainer_close(&tr);
    tg_plan_free(&plan);
}

/* An eval whose logits or per-class counts cannot be allocated fails with the message and
 * leaves the trainer's staging where it was (the next step takes the batch it would have). */
TG_TEST(test_values_eval_out_of_memory_keeps_staging) {
    tg_plan plan;
    tg_trainer tr;
    if (!open_fixture(&plan, &tr)) return;
    static const char *const what[2] = {"out of memory for the eval logits", "out of memory for the eval's per-class counts"};
    tg_step_stats st;
    tg_err step_err = {{0}};
    REQUIRE(tg_trainer_step(&tr, &st, &step_err) == 0, "%s", step_err.msg);
    tg_trainer_next_batch(&tr); /* the next batch staged: the eval must leave it there */
    for (int k = 0; k < 2; k++) {
        const int cur = tr.cur;
        tg_eval_stats ev;
        tg_err err = {{0}};
        tg_alloc_fail_after(-1);
        tg_alloc_fail_only(k);
        const int rc = tg_trainer_eval(&tr, &ev, &err);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && !strcmp(err.msg, what[k]) && tr.cur == cur, "allocation %d: rc %d, '%s', staging %d (was %d)",
              k, rc, err.msg, tr.cur, cur);
    }
    tg_eval_stats ev;
    tg_err err = {{0}};
    CHECK(tg_trainer_eval(&tr, &ev, &err) == 0 && ev.examples == ROWS, "%s", err.msg);
    tg_trainer_close(&tr);
    tg_plan_free(&plan);
}
