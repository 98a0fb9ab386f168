/* runtime/nvtx.h: the calls work in any build (no-ops without CUDA, ranges in a GPU build,
 * as tg_nvtx_built says), and a run that trains, evaluates, writes checkpoints, saves and
 * profiles pops every range it pushes, on every thread (the loader's included), having
 * pushed at least a launch and a wait range per step. */
#include <stdio.h>
#include <string.h>

#include "runtime/executor.h"
#include "runtime/nvtx.h"
#include "tests/cli_in_process.h"
#include "tests/harness.h"

TG_TEST(test_nvtx_calls_count_in_any_build) {
    CHECK(tg_nvtx_built() == tg_cuda_built(), "ranges built %d, CUDA built %d", tg_nvtx_built(), tg_cuda_built());
    long pushed0, popped0, pushed, popped;
    tg_nvtx_counts(&pushed0, &popped0);
    tg_nvtx_push("test outer");
    char longest[2 * TG_NVTX_NAME_MAX];
    memset(longest, 'x', sizeof longest - 1);
    longest[sizeof longest - 1] = '\0';
    tg_nvtx_pushf("test step %d %s", 7, longest); /* cut to TG_NVTX_NAME_MAX - 1 bytes */
    tg_nvtx_counts(&pushed, &popped);
    CHECK(pushed - pushed0 == 2 && popped == popped0, "pushed %ld, popped %ld", pushed - pushed0, popped - popped0);
    tg_nvtx_pop();
    tg_nvtx_pop();
    tg_nvtx_counts(&pushed, &popped);
    CHECK(pushed - pushed0 == 2 && popped - popped0 == 2, "pushed %ld, popped %ld", pushed - pushed0, popped - popped0);
}

int tg_test_nvtx_run(const char *device, long *pushed_out);
/* Shared with tests/gpu/test_cuda_nvtx.c: the demo job on `device` with eval, checkpoints,
 * --save and --profile; 1 when it ran and its ranges balance; *pushed_out (when not NULL)
 * the ranges it pushed. */
int tg_test_nvtx_run(const char *device, long *pushed_out) {
    const char *dir = tg_test_tmpdir();
    char line[1024];
    const int steps = 4;
    snprintf(line, sizeof line,
             "run examples/demo-classify.job --device %s --set steps=%d --set batch=4 --set seq=16 --set "
             "checkpoint_every=2 --checkpoint-dir %s/ck --save %s/w.safetensors --metrics %s/m.jsonl --profile",
             device, steps, dir, dir, dir);
    long pushed0, popped0, pushed, popped;
    tg_nvtx_counts(&pushed0, &popped0);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    tg_nvtx_counts(&pushed, &popped);
    if (pushed_out) *pushed_out = pushed - pushed0;
    const int ran = CHECK(r.status == 0, "%s: exit %d: %s", line, r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
    /* Each step's launch and wait; then compile, executor open, weights and data load, the
     * eval, 2 checkpoints (gather and write), the save and the profile. */
    return ran && CHECK(pushed - pushed0 >= 2 * steps + 10 && pushed - pushed0 == popped - popped0,
                        "%ld ranges pushed, %ld popped", pushed - pushed0, popped - popped0);
}

TG_TEST(test_nvtx_ranges_balance_over_a_run) { tg_test_nvtx_run("cpu", NULL); }
