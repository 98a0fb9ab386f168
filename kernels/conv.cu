/* The convolutional image model's ops (CONV2D, BATCHNORM, RELU6, GLOBAL_AVG_POOL and their
 * backwards, plan/ops.def) have no CUDA kernels yet: their launchers refuse, and
 * tg_cuda_op_has_kernel names them so that the executor refuses a plan holding one when it
 * opens, before it allocates anything (runtime/cuda/cuda_exec.c). The CPU reference runs
 * them (runtime/cpu/conv.c, batchnorm.c, elementwise.c). */
#include <ctype.h>
#include <stdio.h>

#include "kernels/cuda_common.cuh"

extern "C" int tg_cuda_op_has_kernel(int kind) {
    switch (kind) {
    case TG_OP_CONV2D:
    case TG_OP_CONV2D_BWD:
    case TG_OP_BATCHNORM:
    case TG_OP_BATCHNORM_BWD:
    case TG_OP_RELU6:
    case TG_OP_RELU6_BWD:
    case TG_OP_GLOBAL_AVG_POOL:
    case TG_OP_GLOBAL_AVG_POOL_BWD: return 0;
    default: return kind >= 0 && kind < TG_OP_COUNT;
    }
}

extern "C" int tg_cuda_op_refusal(int kind, char *msg, size_t len) {
    char upper[64];
    const char *name = tg_op_name(kind);
    size_t i = 0;
    for (; name[i] && i + 1 < sizeof upper; i++) upper[i] = (char)toupper((unsigned char)name[i]);
    upper[i] = 0;
    return snprintf(msg, len, "op %s has no CUDA kernel yet (run the plan on the CPU: --device cpu)", upper);
}

static int refuse(const tg_cuda_op_args *a, tg_err *err) {
    char msg[160];
    tg_cuda_op_refusal(a->op->kind, msg, sizeof msg);
    return tg_fail(err, "%s", msg);
}

int tg_launch_conv2d(const tg_cuda_op_args *a, tg_err *err) { return refuse(a, err); }
int tg_launch_conv2d_bwd(const tg_cuda_op_args *a, tg_err *err) { return refuse(a, err); }
int tg_launch_batchnorm(const tg_cuda_op_args *a, tg_err *err) { return refuse(a, err); }
int tg_launch_batchnorm_bwd(const tg_cuda_op_args *a, tg_err *err) { return refuse(a, err); }
int tg_launch_relu6(const tg_cuda_op_args *a, tg_err *err) { return refuse(a, err); }
int tg_launch_relu6_bwd(const tg_cuda_op_args *a, tg_err *err) { return refuse(a, err); }
int tg_launch_global_avg_pool(const tg_cuda_op_args *a, tg_err *err) { return refuse(a, err); }
int tg_launch_global_avg_pool_bwd(const tg_cuda_op_args *a, tg_err *err) { return refuse(a, err); }
