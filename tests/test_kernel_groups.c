/* Kernel names to groups and a trace's sums (runtime/kernel_groups.h): every __global__
 * function of kernels/ has a group, mangled and library names find theirs, and the sums
 * of hand-made spans (groups, busy time as the union, communication beside other
 * kernels or alone) come out exact. Without a CUDA executor the trace refuses to start. */
#include <ctype.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/executor.h"
#include "runtime/kernel_groups.h"
#include "runtime/kernel_trace.h"
#include "tests/harness.h"

/* The names of the __global__ functions in one source: the identifier before the first
 * '(' after "__global__", "void" and any __launch_bounds__(...) (comments skipped). Calls
 * check_name for each; returns how many were found. */
static int scan_kernels(const char *path, int (*check_name)(const char *path, const char *name)) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)size + 1);
    if (!text || fread(text, 1, (size_t)size, f) != (size_t)size) {
        free(text);
        fclose(f);
        return -1;
    }
    text[size] = 0;
    fclose(f);
    int found = 0;
    for (char *p = strstr(text, "__global__"); p; p = strstr(p + 1, "__global__")) {
        char *q = p + strlen("__global__");
        for (;;) {
            while (isspace((unsigned char)*q)) q++;
            if (strncmp(q, "/*", 2) == 0) {
                char *end = strstr(q, "*/");
                q = end ? end + 2 : q + 2;
            } else if (strncmp(q, "void", 4) == 0 && !isalnum((unsigned char)q[4]) && q[4] != '_') {
                q += 4;
            } else if (strncmp(q, "__launch_bounds__", 17) == 0) {
                q += 17;
                int depth = 0;
                for (; *q; q++) {
                    if (*q == '(') depth++;
                    if (*q == ')' && --depth == 0) {
                        q++;
                        break;
                    }
                }
            } else
                break;
        }
        char name[128];
        int n = 0;
        while ((isalnum((unsigned char)q[n]) || q[n] == '_') && n < (int)sizeof name - 1) name[n] = q[n], n++;
        name[n] = 0;
        if (n > 0 && q[n] == '(') {
            found++;
            check_name(path, name);
        }
    }
    free(text);
    return found;
}

static int check_own_kernel(const char *path, const char *name) {
    const int g = tg_kernel_group_of(name);
    CHECK(g >= 0 && g < TG_GROUP_COUNT, "%s: kernel %s has no group (runtime/kernel_groups.c's table)", path, name);
    /* As a trace names it when it is a C++ template: _Z<length><name>I...E */
    char mangled[256];
    snprintf(mangled, sizeof mangled, "_Z%zu%sILi64E13__nv_bfloat16EvP7fa_args", strlen(name), name);
    CHECK(tg_kernel_group_of(mangled) == g, "%s: mangled %s -> %d, plain -> %d", path, mangled,
          tg_kernel_group_of(mangled), g);
    return 0;
}

TG_TEST(test_kernel_groups_every_own_kernel) {
    DIR *d = opendir("kernels");
    REQUIRE(d, "cannot open kernels/ (the suite runs from the repository root)");
    int files = 0, kernels = 0;
    for (struct dirent *e; (e = readdir(d));) {
        const size_t len = strlen(e->d_name);
        const int cu = len > 3 && strcmp(e->d_name + len - 3, ".cu") == 0;
        const int cuh = len > 4 && strcmp(e->d_name + len - 4, ".cuh") == 0;
        if (!cu && !cuh) continue;
        char path[512];
        snprintf(path, sizeof path, "kernels/%s", e->d_name);
        const int n = scan_kernels(path, check_own_kernel);
        CHECK(n >= 0, "cannot read %s", path);
        files++, kernels += n > 0 ? n : 0;
    }
    closedir(d);
    CHECK(files >= 10 && kernels >= 60, "only %d kernels in %d files found", kernels, files);
    /* A few by hand, where a prefix could take another's. */
    CHECK(tg_kernel_group_of("fa32_bwd_dq_kernel") == TG_GROUP_ATTENTION, "fa32");
    CHECK(tg_kernel_group_of("ln_bwd_cols_kernel") == TG_GROUP_NORM, "ln");
    CHECK(tg_kernel_group_of("norm_squares_kernel") == TG_GROUP_OPTIMIZER, "norm_squares");
    CHECK(tg_kernel_group_of("ce_fwd_rows") == TG_GROUP_LOSS, "ce");
    CHECK(tg_kernel_group_of("fill_kernel") == TG_GROUP_MEMORY, "fill");
    CHECK(tg_kernel_group_of("emb_scan_kernel") == TG_GROUP_EMBEDDING, "emb");
}

TG_TEST(test_kernel_groups_library_names) {
    static const struct {
        const char *name;
        int group;
    } cases[] = {
        {"ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", TG_GROUP_COMM},
        {"_Z24ncclDevKernel_Broadcast_RING_LL24ncclDevKernelArgsStorageILm4096EE", TG_GROUP_COMM},
        {"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__"
         "5x_cublas",
         TG_GROUP_MATMUL},
        {"nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NNT", TG_GROUP_MATMUL},
        {"splitKreduce_kernel", TG_GROUP_MATMUL}, /* not the loss's ce_ */
        {"_ZN7cutlass6KernelI...", TG_GROUP_MATMUL},
        {"cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_kernel0_0",
         TG_GROUP_ATTENTION},
        {"fmha_cutlassF_bf16_aligned_64x64_rf_sm80", TG_GROUP_ATTENTION}, /* attention's rules before cutlass's */
        {"_ZN8cublasLt8epilogue4impl22globalKernelBgradAB_v2ILi8ELi128E13__nv_bfloat16ffEEviiiPKT1_iPT2_ll",
         TG_GROUP_MATMUL},
        {"memset32", TG_GROUP_MEMORY},
        {"some_unknown_kernel", -1},
        {"", -1},
        {"_Z", -1},
        {"_Z999", -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int g = tg_kernel_group_of(cases[i].name);
        CHECK(g == cases[i].group, "%s -> %d, want %d", cases[i].name, g, cases[i].group);
    }
    CHECK(tg_kernel_group_of(NULL) == -1, "NULL");
}

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * (fabs(b) + 1); }

TG_TEST(test_kernel_groups_trace_sums) {
    tg_err err;
    tg_kernel_trace_summary s;
    /* ms as ns x 1e6, unsorted: matmul [0, 10], attention [10, 15], an optimizer span inside
     * the matmul's [2, 4], communication [5, 20] and [30, 32], other [40, 41]. Over 2 steps. */
    tg_kernel_span spans[] = {
        {5000000, 20000000, TG_GROUP_COMM}, {10000000, 15000000, TG_GROUP_ATTENTION},
        {0, 10000000, TG_GROUP_MATMUL},     {2000000, 4000000, TG_GROUP_OPTIMIZER},
        {30000000, 32000000, TG_GROUP_COMM}, {40000000, 41000000, -1},
    };
    REQUIRE(tg_kernel_trace_summarize(spans, 6, 2, &s, &err) == 0, "%s", err.msg);
    CHECK(s.steps == 2 && s.kernels == 6, "steps %d kernels %lld", s.steps, (long long)s.kernels);
    CHECK(near(s.group_ms[TG_GROUP_MATMUL], 5) && near(s.group_ms[TG_GROUP_ATTENTION], 2.5) &&
              near(s.group_ms[TG_GROUP_OPTIMIZER], 1) && near(s.group_ms[TG_GROUP_COMM], 8.5) && near(s.other_ms, 0.5),
          "groups %g %g %g %g other %g", s.group_ms[TG_GROUP_MATMUL], s.group_ms[TG_GROUP_ATTENTION],
          s.group_ms[TG_GROUP_OPTIMIZER], s.group_ms[TG_GROUP_COMM], s.other_ms);
    /* busy: [0, 20] + [30, 32] + [40, 41] = 23 ms over 2 steps */
    CHECK(near(s.busy_ms, 11.5), "busy %g", s.busy_ms);
    /* communication beside the others: [5, 15] of [5, 20]; alone [15, 20] and [30, 32]; the
     * other span counts as other work */
    CHECK(near(s.comm_hidden_ms, 5) && near(s.comm_exposed_ms, 3.5), "hidden %g exposed %g", s.comm_hidden_ms,
          s.comm_exposed_ms);
    CHECK(spans[0].start == 0 && spans[5].start == 40000000, "sorted by start");
    /* Overlapping communication spans merge before they are matched. */
    tg_kernel_span two[] = {{0, 10, TG_GROUP_COMM}, {5, 15, TG_GROUP_COMM}, {12, 20, TG_GROUP_MATMUL}};
    REQUIRE(tg_kernel_trace_summarize(two, 3, 1, &s, &err) == 0, "%s", err.msg);
    CHECK(near(s.comm_hidden_ms, 3e-6) && near(s.comm_exposed_ms, 12e-6) && near(s.busy_ms, 20e-6),
          "hidden %g exposed %g busy %g", s.comm_hidden_ms, s.comm_exposed_ms, s.busy_ms);
    /* Nothing traced, or no steps: zeros. */
    REQUIRE(tg_kernel_trace_summarize(spans, 0, 2, &s, &err) == 0 && s.busy_ms == 0 && s.kernels == 0, "empty");
    REQUIRE(tg_kernel_trace_summarize(spans, 6, 0, &s, &err) == 0 && s.busy_ms == 0, "no steps");
}

TG_TEST(test_kernel_trace_needs_a_gpu_build) {
    if (tg_cuda_built()) {
        printf("    skipped: a GPU build (tests/gpu/test_cuda_kernel_trace.c traces kernels)\n");
        return;
    }
    tg_err err;
    tg_kernel_span *spans = (tg_kernel_span *)&err;
    int64_t n = 7;
    CHECK(tg_kernel_trace_start(&err) == -1 && strstr(err.msg, "no CUDA executor"), "start: %s", err.msg);
    CHECK(tg_kernel_trace_stop(&spans, &n, &err) == -1 && !spans && n == 0 && strstr(err.msg, "no CUDA executor"),
          "stop: %s", err.msg);
}
