/* Whole compiled plans (compiler/compile.c and every pass it runs: model_build, autodiff
 * with backward_rules, precision, memory_plan, grad_writes, grad_buckets), as
 * `tunegraph inspect` prints them, compared byte for byte with tests/data/plan_text_*.txt:
 * each op with its operands and parameters, each tensor with its pool and offset, the pool
 * sizes. The jobs between them take each fusion on and off, freeze layers, split the data
 * over replicas with and without ZeRO, accumulate micro-batches, train in bf16 and fp16, and cover
 * every task, and an image model. The fingerprint (it hashes the version string) and the GPU and CPU memory
 * estimates (plan/memory_estimate.c, its own tests) are left out. After a deliberate change to what the compiler emits, TG_TEST_WRITE_EXPECTED=1
 * rewrites the files (review the diff). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "plan/inspect.h"
#include "tests/harness.h"

static const struct {
    const char *file, *job;
} k_plans[] = {
    {"tests/data/plan_text_gpt2_lm.txt", "model = tiny-gpt2\ntask = lm\nbatch = 2\nseq = 8\n"},
    {"tests/data/plan_text_gpt2_classify_unfused.txt",
     "model = tiny-gpt2\nbatch = 2\nseq = 8\nattention = unfused\nfuse_bias_grad = false\nfuse_gelu = false\n"
     "fuse_residual_layernorm = false\n"},
    {"tests/data/plan_text_bert_classify_frozen.txt",
     "model = tiny-bert\nbatch = 2\nseq = 8\nfreeze = bert.embeddings.*, bert.encoder.layer.0.*\n"},
    {"tests/data/plan_text_bert_unfused_frozen_bias.txt",
     "model = tiny-bert\nbatch = 2\nseq = 8\nattention = unfused\nfuse_qkv = false\nfuse_residual_layernorm = false\n"
     "freeze = *LayerNorm.bias, *layer.1.attention.self.key.*\n"},
    {"tests/data/plan_text_roberta_qa_bf16.txt", "model = tiny-roberta\ntask = qa\nbatch = 2\nseq = 8\nprecision = bf16\n"},
    {"tests/data/plan_text_bert_mlm_replicas_zero.txt",
     "model = tiny-bert\ntask = mlm\nbatch = 2\nseq = 8\ndata_parallel = 2\nzero_stage = 1\n"},
    {"tests/data/plan_text_gpt2_lm_accumulation_replicas.txt",
     "model = tiny-gpt2\ntask = lm\nbatch = 2\nseq = 8\ngrad_accumulation = 2\ndata_parallel = 2\noptimizer = adan\n"},
    {"tests/data/plan_text_bert_classify_fp16_frozen.txt",
     "model = tiny-bert\nbatch = 2\nseq = 8\nprecision = fp16\nfreeze = bert.embeddings.*\n"
     "loss_scale_init = 1024\nloss_scale_growth_interval = 100\n"},
    {"tests/data/plan_text_bert_classify_accumulation.txt",
     "model = tiny-bert\nbatch = 2\nseq = 8\ngrad_accumulation = 3\nfreeze = classifier.*\n"},
    /* The GELU backward's copy and the weight gradient after it (BERT), the GELU op before
     * the weight gradient (GPT-2's epilogue); the gradients shared in both. */
    {"tests/data/plan_text_bert_classify_recompute.txt", "model = tiny-bert\nbatch = 2\nseq = 8\nrecompute = gelu\n"},
    {"tests/data/plan_text_gpt2_lm_recompute_bf16.txt",
     "model = tiny-gpt2\ntask = lm\nbatch = 2\nseq = 8\nprecision = bf16\nrecompute = gelu\n"},
    /* Each layer's forward again before its backward (compiler/recompute.h): BERT with
     * dropout, fused; GPT-2 unfused (the softmax's dropout, heads split and merged, the
     * separate GELU, dropout and residual adds); Llama (RMSNorm, rotary, SwiGLU). */
    {"tests/data/plan_text_bert_classify_recompute_layers.txt",
     "model = tiny-bert\nbatch = 2\nseq = 8\nrecompute = layers\n"},
    {"tests/data/plan_text_gpt2_lm_unfused_recompute_layers.txt",
     "model = tiny-gpt2\ntask = lm\nbatch = 2\nseq = 8\nattention = unfused\nfuse_gelu = false\n"
     "fuse_residual_layernorm = false\nrecompute = layers\n"},
    {"tests/data/plan_text_llama_lm_recompute_layers.txt", "model = tiny-llama\ntask = lm\nbatch = 2\nseq = 8\nrecompute = layers\n"},
    /* torchvision's mobilenet_v2 on grey 32 x 32 images: convolutions (stem, depthwise,
     * pointwise), batch norms with their running statistics and their ReLU6 inside, the
     * residual adds, the pooling and the classifier, and their backwards (first writers
     * overwrite). */
    {"tests/data/plan_text_mobilenet_v2_grey.txt",
     "model = mobilenet_v2\nnum_labels = 10\nimage_channels = 1\nimage_size = 32\nwidth_mult = 0.25\nbatch = 2\n"},
};

/* Drops the lines that start with one of the prefixes, in place. */
static void drop_lines(char *text, const char *const *prefixes, int n) {
    char *w = text;
    for (const char *r = text; *r;) {
        const char *nl = strchr(r, '\n');
        size_t len = nl ? (size_t)(nl - r) + 1 : strlen(r);
        int drop = 0;
        for (int i = 0; i < n; i++) drop |= !strncmp(r, prefixes[i], strlen(prefixes[i]));
        if (!drop) memmove(w, r, len), w += len;
        r += len;
    }
    *w = 0;
}

static char *plan_text(const char *job_text, tg_err *err) {
    char full[1024];
    snprintf(full, sizeof full, "%strain_data = t.jsonl\nsteps = 1\n", job_text);
    tg_job job;
    if (tg_job_parse_text(full, "j.job", "", NULL, 0, &job, err)) return NULL;
    tg_plan plan;
    if (tg_compile(&job, &plan, err)) return NULL;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    int rc = f ? tg_plan_inspect(&plan, f, 0, err) : -1;
    if (f) fclose(f);
    tg_plan_free(&plan);
    if (rc) free(text), text = NULL;
    static const char *const volatile_lines[] = {"fingerprint: ", "memory estimate, "};
    if (text) drop_lines(text, volatile_lines, 2);
    return text;
}

TG_TEST(test_compiler_plan_text_whole_plans) {
    const int write = getenv("TG_TEST_WRITE_EXPECTED") != NULL;
    for (size_t i = 0; i < sizeof k_plans / sizeof *k_plans; i++) {
        tg_err err = {{0}};
        char *got = plan_text(k_plans[i].job, &err);
        if (!CHECK(got, "%s: %s", k_plans[i].file, err.msg)) continue;
        if (write) {
            FILE *f = fopen(k_plans[i].file, "w");
            CHECK(f && fputs(got, f) >= 0 && fclose(f) == 0, "cannot write %s", k_plans[i].file);
            free(got);
            continue;
        }
        long want_len = 0;
        char *want = tg_test_read_file(k_plans[i].file, &want_len);
        if (CHECK(want, "cannot read %s", k_plans[i].file)) {
            size_t at = 0, line = 1;
            for (; got[at] && got[at] == want[at]; at++) line += got[at] == '\n';
            const char *g0 = got + at, *w0 = want + at;
            while (g0 > got && g0[-1] != '\n') g0--, w0--;
            CHECK(got[at] == want[at], "%s line %zu differs:\n got: %.300s\nwant: %.300s", k_plans[i].file, line, g0,
                  w0);
        }
        free(got), free(want);
    }
}

/* Length buckets: the bucket plan below the plan's own length is compiled, op for op and
 * tensor for tensor the plan's, at its own length, sharing the plan's pools. */
TG_TEST(test_compiler_plan_text_bucket_plans) {
    tg_job job;
    tg_err err = {{0}};
    REQUIRE(tg_job_parse_text("model = tiny-bert\nbatch = 2\nseq_buckets = 8, 16\ntrain_data = t\nsteps = 1\n", "j.job",
                              "", NULL, 0, &job, &err) == 0,
            "%s", err.msg);
    tg_plan plan;
    REQUIRE(tg_compile(&job, &plan, &err) == 0, "%s", err.msg);
    const tg_plan *b = plan.buckets;
    if (CHECK(b && plan.train.n_buckets == 2 && plan.train.seq == 16, "%d buckets", plan.train.n_buckets)) {
        CHECK(b->train.seq == 8 && b->n_ops == plan.n_ops && b->n_tensors == plan.n_tensors && b->n_ops > 0 &&
                  !memcmp(b->phase_begin, plan.phase_begin, sizeof plan.phase_begin) &&
                  !memcmp(b->pool_bytes, plan.pool_bytes, sizeof plan.pool_bytes) && b->fingerprint == plan.fingerprint,
              "bucket 0: seq %d, %d ops, %d tensors", b->train.seq, b->n_ops, b->n_tensors);
        const int ids = plan.io.input_ids;
        CHECK(ids >= 0 && b->n_tensors > ids && b->tensors[ids].shape[1] == 8 && plan.tensors[ids].shape[1] == 16 &&
                  b->tensors[ids].bytes == 64,
              "input ids [2, %lld] in the bucket", ids >= 0 && b->n_tensors > ids ? (long long)b->tensors[ids].shape[1] : -1LL);
    }
    tg_plan_free(&plan);
}
