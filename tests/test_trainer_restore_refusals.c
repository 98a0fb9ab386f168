/* What tg_trainer_restore refuses in a checkpoint of the same job (runtime/trainer.c), one
 * change at a time, each with its message: a state record that does not fit the run, a
 * tensor the plan does not have (or of another replica), a tensor missing or of another
 * dtype or shape, a step counter that disagrees with the record, a sampler position
 * outside an epoch, and a trainer that has stepped already; what the checkpoint records
 * before any step; and the restore that succeeds after all of them. A ZeRO-1 replica (rank
 * 0 and 1) names its own optimizer slices when they are missing or of another shape. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/front.h"
#include "compiler/compile.h"
#include "compiler/job.h"
#include "runtime/comm.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

typedef struct run {
    tg_plan plan;
    tg_trainer tr;
    int open;
} run;

/* tiny-bert classifying 24 sentiment rows, batch 4, seq 32, 8 steps, no loader thread. */
static int open_run(run *r) {
    memset(r, 0, sizeof *r);
    const char *dir = tg_test_tmpdir();
    char cmd[1200], job[700];
    snprintf(cmd, sizeof cmd, "head -n 24 examples/data/sentiment-train.jsonl > '%s/train.jsonl'", dir);
    if (!CHECK(system(cmd) == 0, "%s", cmd)) return 0;
    snprintf(job, sizeof job, "%s/job.job", dir);
    if (!CHECK(tg_test_write_file(job, "model = tiny-bert\ntask = classify\nbatch = 4\nseq = 32\nsteps = 8\n"
                                       "train_data = train.jsonl\n") == 0,
               "write %s", job))
        return 0;
    tg_err err;
    if (!CHECK(tg_front_compile_file(job, NULL, 0, &r->plan, &err) == 0, "%s", err.msg)) return 0;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 2, .load_data = 1, .no_loader_thread = 1};
    if (!CHECK(tg_trainer_open(&r->tr, &r->plan, &o, &err) == 0, "%s", err.msg)) {
        tg_plan_free(&r->plan);
        return 0;
    }
    r->open = 1;
    return 1;
}

static void close_run(run *r) {
    if (r->open) tg_trainer_close(&r->tr), tg_plan_free(&r->plan);
    r->open = 0;
}

static int find_tensor(const tg_checkpoint *ck, const char *name) {
    for (int i = 0; i < ck->n_tensors; i++)
        if (!strcmp(ck->tensors[i].name, name)) return i;
    return -1;
}

enum {
    C_REPLICAS, C_TOTAL, C_STEP_PAST, C_EXAMPLES, C_SAMPLER_SEED, C_DROPOUT_SEED, C_UNKNOWN, C_STATE_REPLICA,
    C_VALUE_REPLICA, C_VALUE_MISSING, C_STATE_MISSING, C_SHAPE, C_DTYPE, C_NDIM, C_COUNTER, C_SAMPLER_POS, C_COUNT
};

TG_TEST(test_trainer_restore_refusals) {
    run a, b;
    if (!open_run(&a)) return;
    tg_err err = {{0}};
    tg_checkpoint ck;
    /* Before any step: step 0, the sampler where it starts, and the state with it. */
    REQUIRE(tg_trainer_checkpoint(&a.tr, &ck, 1, &err) == 0, "%s", err.msg);
    CHECK(ck.state.step == 0 && ck.state.sampler_epoch == 0 && ck.state.sampler_pos == 0 && ck.state.total_steps == 8 &&
              ck.state.replicas == 1 && ck.state.sampler_examples == 24,
          "before any step: step %d, epoch %d, pos %d", ck.state.step, ck.state.sampler_epoch, ck.state.sampler_pos);
    tg_checkpoint_free(&ck);
    tg_step_stats s;
    for (int i = 0; i < 4; i++) REQUIRE(tg_trainer_step(&a.tr, &s, &err) == 0, "step %d: %s", i + 1, err.msg);
    REQUIRE(tg_trainer_checkpoint(&a.tr, &ck, 1, &err) == 0, "%s", err.msg);
    /* A trainer that has stepped resumes nothing. */
    CHECK(tg_trainer_restore(&a.tr, &ck, "ck4", &err) == -1 &&
              strstr(err.msg, "ck4: a trainer that has taken steps cannot resume a checkpoint"),
          "stepped trainer: %s", err.msg);
    const tg_plan *p = &a.plan;
    /* Copies: the names outlive the first run's plan. */
    char m_name[TG_NAME_MAX], v_name[TG_NAME_MAX], step_name[TG_NAME_MAX];
    snprintf(m_name, sizeof m_name, "%s", p->tensors[p->io.m_all].name);
    snprintf(v_name, sizeof v_name, "%s", p->tensors[p->io.v_all].name);
    snprintf(step_name, sizeof step_name, "%s", p->tensors[p->io.step].name);
    /* The first value tensor: the first tensor of the checkpoint, a matrix. */
    const int value = 0;
    char value_name[TG_NAME_MAX];
    snprintf(value_name, sizeof value_name, "%s", ck.tensors[value].name);
    const int m = find_tensor(&ck, m_name), v = find_tensor(&ck, v_name), step = find_tensor(&ck, step_name);
    REQUIRE(m > 0 && v > 0 && step > 0 && v == ck.n_tensors - 1, "m %d, v %d, step %d of %d", m, v, step, ck.n_tensors);
    REQUIRE(ck.tensors[value].ndim == 2, "the first tensor, %s, has %d dimensions", value_name, ck.tensors[value].ndim);
    char shape_now[96], state_msg[256];
    snprintf(shape_now, sizeof shape_now, "[%lld,%lld]", (long long)ck.tensors[value].shape[0],
             (long long)ck.tensors[value].shape[1]);
    snprintf(state_msg, sizeof state_msg, "does not fit this run (8 steps, 1 replicas, 24 examples) or its seed");
    close_run(&a);
    if (!open_run(&b)) {
        tg_checkpoint_free(&ck);
        return;
    }
    for (int c = 0; c < C_COUNT; c++) {
        const tg_checkpoint_state saved = ck.state;
        tg_checkpoint_tensor *t0 = &ck.tensors[value], *tm = &ck.tensors[m];
        const tg_checkpoint_tensor saved0 = *t0, saved_m = *tm, saved_last = ck.tensors[ck.n_tensors - 1];
        const int n = ck.n_tensors;
        char want[512], also[256] = "";
        switch (c) {
        case C_REPLICAS:
            ck.state.replicas = 2;
            snprintf(want, sizeof want, "ck: the state record (step 4 of 8, 2 replicas, 24 examples) %s", state_msg);
            break;
        case C_TOTAL:
            ck.state.total_steps = 9;
            snprintf(want, sizeof want, "(step 4 of 9, 1 replicas, 24 examples) %s", state_msg);
            break;
        case C_STEP_PAST:
            ck.state.step = 9;
            snprintf(want, sizeof want, "(step 9 of 8, 1 replicas, 24 examples) %s", state_msg);
            break;
        case C_EXAMPLES:
            ck.state.sampler_examples = 23;
            snprintf(want, sizeof want, "(step 4 of 8, 1 replicas, 23 examples) %s", state_msg);
            break;
        case C_SAMPLER_SEED:
            ck.state.sampler_seed++;
            snprintf(want, sizeof want, "(step 4 of 8, 1 replicas, 24 examples) %s", state_msg);
            break;
        case C_DROPOUT_SEED:
            ck.state.dropout_seed++;
            snprintf(want, sizeof want, "(step 4 of 8, 1 replicas, 24 examples) %s", state_msg);
            break;
        case C_UNKNOWN:
            snprintf(t0->name, sizeof t0->name, "no.such.tensor");
            snprintf(want, sizeof want, "ck: tensor 'no.such.tensor' (replica -1) is not part of this plan's training state");
            break;
        case C_STATE_REPLICA:
            tm->replica = 0; /* one replica keeps no slices of its own */
            snprintf(want, sizeof want, "ck: tensor '%s' (replica 0) is not part of this plan's training state", m_name);
            break;
        case C_VALUE_REPLICA:
            t0->replica = 0;
            snprintf(want, sizeof want, "ck: tensor '%s' (replica 0) is not part of this plan's training state",
                     value_name);
            break;
        case C_VALUE_MISSING: /* the value's place taken by the last tensor, the last dropped */
            *t0 = saved_last;
            ck.n_tensors--;
            snprintf(want, sizeof want, "ck: tensor '%s' is missing from the checkpoint", value_name);
            break;
        case C_STATE_MISSING:
            ck.n_tensors--;
            snprintf(want, sizeof want, "ck: tensor '%s' is missing from the checkpoint", v_name);
            break;
        case C_SHAPE:
            t0->shape[0]++;
            snprintf(want, sizeof want, "ck: tensor '%s' is f32 [%lld,%lld] in the checkpoint, the plan needs f32 %s",
                     value_name, (long long)t0->shape[0], (long long)t0->shape[1], shape_now);
            break;
        case C_DTYPE:
            t0->dtype = TG_I32;
            snprintf(want, sizeof want, "ck: tensor '%s' is i32 %s in the checkpoint, the plan needs f32 %s", value_name,
                     shape_now, shape_now);
            break;
        case C_NDIM:
            t0->ndim = 1;
            snprintf(want, sizeof want, "ck: tensor '%s' is f32 [%lld] in the checkpoint, the plan needs f32 %s",
                     value_name, (long long)t0->shape[0], shape_now);
            break;
        case C_COUNTER:
            ck.state.dropout_counter++;
            snprintf(want, sizeof want, "ck: tensor '%s' is ", step_name);
            snprintf(also, sizeof also, ", the state record's dropout counter %llu (file corrupt)",
                     (unsigned long long)ck.state.dropout_counter);
            break;
        case C_SAMPLER_POS:
            ck.state.sampler_pos = 1000;
            snprintf(want, sizeof want, "ck: batch sampler: epoch %d, position 1000 is outside an epoch of 6 batches",
                     ck.state.sampler_epoch);
            break;
        }
        memset(&err, 0, sizeof err);
        const int rc = tg_trainer_restore(&b.tr, &ck, "ck", &err);
        CHECK(rc == -1 && strstr(err.msg, want) && strstr(err.msg, also), "case %d: rc %d, '%s'\n    want '%s'%s", c, rc,
              err.msg, want, also);
        ck.state = saved;
        *t0 = saved0, *tm = saved_m;
        ck.n_tensors = n;
        ck.tensors[n - 1] = saved_last;
        CHECK(b.tr.steps_done == 0 && b.tr.launched == 0, "case %d moved the trainer", c);
    }
    /* Unchanged, it resumes at step 4, and the next step is the 5th. */
    CHECK(tg_trainer_restore(&b.tr, &ck, "ck", &err) == 0, "restore: %s", err.msg);
    CHECK(b.tr.steps_done == 4 && b.tr.launched == 4 && b.tr.filled == 4 && b.tr.cur == 4 % b.tr.n_staging,
          "restored: done %d, launched %lld", b.tr.steps_done, (long long)b.tr.launched);
    CHECK(tg_trainer_step(&b.tr, &s, &err) == 0 && s.step == 5, "step 5: %s (step %d)", err.msg, s.step);
    close_run(&b);
    /* A record at the run's last step fits it (nothing is left to take). */
    if (open_run(&b)) {
        ck.state.step = 8;
        CHECK(tg_trainer_restore(&b.tr, &ck, "ck", &err) == 0 && b.tr.steps_done == 8,
              "a record at step 8 of 8: %s (done %d)", err.msg, b.tr.steps_done);
        close_run(&b);
    }
    tg_checkpoint_free(&ck);
}

/* ZeRO-1 over 2 replicas: each rank's checkpoint holds m and v of its slice (replica = the
 * rank); without its m, or with an m of another length, the restore names the tensor as
 * this replica's slice. No step runs, so one thread opens both ranks in turn. */
TG_TEST(test_trainer_restore_zero_slice_refusals) {
    tg_err err = {{0}};
    tg_job job;
    const char *sets[] = {"data_parallel=2", "zero_stage=1", "batch=2", "steps=2"};
    REQUIRE(tg_job_load("examples/demo-classify.job", sets, 4, &job, &err) == 0, "%s", err.msg);
    tg_plan plan;
    REQUIRE(tg_compile(&job, &plan, &err) == 0, "%s", err.msg);
    tg_cpu_comm_group *group;
    REQUIRE(tg_cpu_comm_group_create(&group, 2, &err) == 0, "%s", err.msg);
    const char *m_name = plan.tensors[plan.io.m_all].name;
    const int64_t slice = plan.tensors[plan.io.m_all].shape[0];
    for (int rank = 0; rank < 2; rank++) {
        tg_trainer tr;
        tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1, .no_loader_thread = 1,
                                .rank = rank, .comm = group};
        if (!CHECK(tg_trainer_open(&tr, &plan, &o, &err) == 0, "rank %d: %s", rank, err.msg)) continue;
        tg_checkpoint ck;
        if (CHECK(tg_trainer_checkpoint(&tr, &ck, 1, &err) == 0, "rank %d: %s", rank, err.msg)) {
            const tg_checkpoint_tensor *own = tg_checkpoint_find(&ck, m_name, rank);
            CHECK(own && own->ndim == 1 && own->shape[0] == slice && !tg_checkpoint_find(&ck, m_name, -1) &&
                      !tg_checkpoint_find(&ck, m_name, 1 - rank),
                  "rank %d: m of its slice only", rank);
            const int m = own ? (int)(own - ck.tensors) : -1;
            REQUIRE(m >= 0, "rank %d: no m", rank);
            const tg_checkpoint_tensor saved = ck.tensors[m], last = ck.tensors[ck.n_tensors - 1];
            char want[512];
            /* m missing: its place taken by the last tensor, the last dropped. */
            ck.tensors[m] = last;
            ck.n_tensors--;
            snprintf(want, sizeof want, "ck: tensor '%s' (this replica's slice) is missing from the checkpoint", m_name);
            memset(&err, 0, sizeof err);
            CHECK(tg_trainer_restore(&tr, &ck, "ck", &err) == -1 && !strcmp(err.msg, want), "rank %d, m missing: '%s'",
                  rank, err.msg);
            ck.n_tensors++;
            ck.tensors[ck.n_tensors - 1] = last;
            ck.tensors[m] = saved;
            /* m one element longer than the slice. */
            ck.tensors[m].shape[0] = slice + 1;
            snprintf(want, sizeof want, "ck: tensor '%s' is f32 [%lld] in the checkpoint, the plan needs f32 [%lld]",
                     m_name, (long long)slice + 1, (long long)slice);
            memset(&err, 0, sizeof err);
            CHECK(tg_trainer_restore(&tr, &ck, "ck", &err) == -1 && !strcmp(err.msg, want), "rank %d, m longer: '%s'",
                  rank, err.msg);
            ck.tensors[m] = saved;
            CHECK(tg_trainer_restore(&tr, &ck, "ck", &err) == 0 && tr.steps_done == 0, "rank %d, unchanged: %s", rank,
                  err.msg);
            tg_checkpoint_free(&ck);
        }
        tg_trainer_close(&tr);
    }
    tg_cpu_comm_group_destroy(group);
    tg_plan_free(&plan);
}

/* The training examples a checkpoint was taken on, as the batches read them: a resume on
 * rows of the same ids refuses one label changed, and the same ids cut into rows otherwise
 * (their lengths), naming train_data.xxh64; the rows as they were resume. */
TG_TEST(test_trainer_restore_refuses_other_examples) {
    const char *dir = tg_test_tmpdir();
    char data[700], job[700];
    snprintf(data, sizeof data, "%s/rows.jsonl", dir);
    snprintf(job, sizeof job, "%s/job.job", dir);
    static const char *const rows[] = {
        "{\"input_ids\": [5, 6, 7], \"label\": 0}\n{\"input_ids\": [8, 9], \"label\": 1}\n"
        "{\"input_ids\": [10, 11], \"label\": 1}\n{\"input_ids\": [12], \"label\": 0}\n",
        "{\"input_ids\": [5, 6, 7], \"label\": 0}\n{\"input_ids\": [8, 9], \"label\": 0}\n"
        "{\"input_ids\": [10, 11], \"label\": 1}\n{\"input_ids\": [12], \"label\": 0}\n",
        "{\"input_ids\": [5, 6], \"label\": 0}\n{\"input_ids\": [7, 8, 9], \"label\": 1}\n"
        "{\"input_ids\": [10, 11], \"label\": 1}\n{\"input_ids\": [12], \"label\": 0}\n",
    };
    REQUIRE(tg_test_write_file(data, rows[0]) == 0 &&
                tg_test_write_file(job, "model = tiny-bert\ntask = classify\nbatch = 2\nseq = 8\nsteps = 2\n"
                                        "train_data = rows.jsonl\n") == 0,
            "write");
    tg_plan plan;
    tg_err err = {{0}};
    REQUIRE(tg_front_compile_file(job, NULL, 0, &plan, &err) == 0, "%s", err.msg);
    const tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1, .no_loader_thread = 1};
    tg_trainer t;
    REQUIRE(tg_trainer_open(&t, &plan, &o, &err) == 0, "%s", err.msg);
    tg_checkpoint ck;
    REQUIRE(tg_trainer_checkpoint(&t, &ck, 1, &err) == 0, "%s", err.msg);
    tg_trainer_close(&t);
    static const char *const what[] = {"the same rows", "one label changed", "the ids cut otherwise"};
    for (int k = 2; k >= 0; k--) {
        REQUIRE(tg_test_write_file(data, rows[k]) == 0, "write");
        REQUIRE(tg_trainer_open(&t, &plan, &o, &err) == 0, "%s: %s", what[k], err.msg);
        memset(&err, 0, sizeof err);
        const int rc = tg_trainer_restore(&t, &ck, "ck", &err);
        if (k == 0) CHECK(rc == 0, "%s: %s", what[k], err.msg);
        else
            CHECK(rc == -1 && strstr(err.msg, "ck: the checkpoint is of another job or plan: ") &&
                      strstr(err.msg, "train_data.xxh64") && !strstr(err.msg, "train_data.examples"),
                  "%s: rc %d, '%s'", what[k], rc, err.msg);
        tg_trainer_close(&t);
    }
    tg_checkpoint_free(&ck);
    tg_plan_free(&plan);
}

/* The token types are part of the examples too: the same ids and labels with one token's
 * type changed, or with no token types, are other examples (train_data.xxh64). */
TG_TEST(test_trainer_restore_refuses_other_token_types) {
    const char *dir = tg_test_tmpdir();
    char data[700], job[700];
    snprintf(data, sizeof data, "%s/rows.jsonl", dir);
    snprintf(job, sizeof job, "%s/job.job", dir);
    static const char *const rows[] = {
        "{\"input_ids\": [5, 6, 7], \"token_type_ids\": [0, 0, 1], \"label\": 0}\n"
        "{\"input_ids\": [8, 9], \"token_type_ids\": [0, 1], \"label\": 1}\n",
        "{\"input_ids\": [5, 6, 7], \"token_type_ids\": [0, 1, 1], \"label\": 0}\n"
        "{\"input_ids\": [8, 9], \"token_type_ids\": [0, 1], \"label\": 1}\n",
        "{\"input_ids\": [5, 6, 7], \"label\": 0}\n{\"input_ids\": [8, 9], \"label\": 1}\n",
    };
    REQUIRE(tg_test_write_file(data, rows[0]) == 0 &&
                tg_test_write_file(job, "model = tiny-bert\ntask = classify\nbatch = 2\nseq = 8\nsteps = 2\n"
                                        "train_data = rows.jsonl\n") == 0,
            "write");
    tg_plan plan;
    tg_err err = {{0}};
    REQUIRE(tg_front_compile_file(job, NULL, 0, &plan, &err) == 0, "%s", err.msg);
    const tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1, .no_loader_thread = 1};
    tg_trainer t;
    REQUIRE(tg_trainer_open(&t, &plan, &o, &err) == 0, "%s", err.msg);
    tg_checkpoint ck;
    REQUIRE(tg_trainer_checkpoint(&t, &ck, 1, &err) == 0, "%s", err.msg);
    tg_trainer_close(&t);
    static const char *const what[] = {"the same rows", "one token type changed", "no token types"};
    for (int k = 2; k >= 0; k--) {
        REQUIRE(tg_test_write_file(data, rows[k]) == 0, "write");
        REQUIRE(tg_trainer_open(&t, &plan, &o, &err) == 0, "%s: %s", what[k], err.msg);
        memset(&err, 0, sizeof err);
        const int rc = tg_trainer_restore(&t, &ck, "ck", &err);
        if (k == 0) CHECK(rc == 0, "%s: %s", what[k], err.msg);
        else
            CHECK(rc == -1 && strstr(err.msg, "ck: the checkpoint is of another job or plan: ") &&
                      strstr(err.msg, "train_data.xxh64") && !strstr(err.msg, "train_data.examples"),
                  "%s: rc %d, '%s'", what[k], rc, err.msg);
        tg_trainer_close(&t);
    }
    tg_checkpoint_free(&ck);
    tg_plan_free(&plan);
}

/* A checkpoint tensor named as one of the plan's activations (no value, no optimizer or
 * step state): refused by name, as a tensor of no training state. */
TG_TEST(test_trainer_restore_refuses_an_activation) {
    run r;
    if (!open_run(&r)) return;
    tg_err err = {{0}};
    tg_checkpoint ck;
    REQUIRE(tg_trainer_checkpoint(&r.tr, &ck, 1, &err) == 0, "%s", err.msg);
    const tg_tensor *x = &r.plan.tensors[r.plan.io.logits];
    float *buf = calloc((size_t)tg_tensor_numel(x), sizeof(float));
    if (CHECK(buf && tg_checkpoint_add_tensor(&ck, x->name, -1, TG_F32, x->ndim, x->shape, buf, &err) == 0, "%s",
              err.msg)) {
        char want[300];
        snprintf(want, sizeof want, "ck: tensor '%s' (replica -1) is not part of this plan's training state", x->name);
        CHECK(tg_trainer_restore(&r.tr, &ck, "ck", &err) == -1 && !strcmp(err.msg, want), "'%s'\n    want '%s'",
              err.msg, want);
    }
    tg_checkpoint_free(&ck);
    close_run(&r);
}
