/* The GEMM algorithm cache file: the algorithms kernels/gemm.cu chose per shape, kept per GPU
 * model and cuBLASLt version so that later runs skip the tuning pass's timings. */
#include <cublasLt.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "base/atomic_file.h"
#include "runtime/cuda/cuda_exec_internal.h"

/* The GEMM algorithm cache file for the model of GPU `device` and this cuBLASLt version, in
 * $TUNEGRAPH_CACHE_DIR,
 * else $XDG_CACHE_HOME/tunegraph, else ~/.cache/tunegraph; 0 when there is no such folder
 * to use. */
static int gemm_cache_path(int device, char *path, size_t len) {
    char dir[600] = "";
    const char *env = getenv("TUNEGRAPH_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (env && env[0]) snprintf(dir, sizeof dir, "%s", env);
    else if (xdg && xdg[0]) snprintf(dir, sizeof dir, "%s/tunegraph", xdg);
    else if (home && home[0]) snprintf(dir, sizeof dir, "%s/.cache/tunegraph", home);
    else return 0;
    char gpu[256] = "gpu";
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) snprintf(gpu, sizeof gpu, "%s", prop.name);
    for (char *c = gpu; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9'))) *c = '-';
    snprintf(path, len, "%s/gemm-%s-cublasLt%zu.bin", dir, gpu, cublasLtGetVersion());
    return 1;
}

void tg_cuda_gemm_cache_load(tg_cuda_exec *x) {
    char path[1024];
    if (!gemm_cache_path(x->device, path, sizeof path)) return;
    FILE *f = fopen(path, "rb");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = n > 0 ? malloc((size_t)n) : NULL;
    /* A damaged or foreign file is ignored: the algorithms are chosen again and rewritten. */
    if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) tg_gemm_cache_import(x->ctx.gemm_cache, buf, (size_t)n);
    free(buf);
    fclose(f);
}

/* Writes the cache when this run chose algorithms the file did not have. */
void tg_cuda_gemm_cache_save(tg_cuda_exec *x) {
    char path[1024];
    if (!x->ctx.gemm_cache || !tg_gemm_cache_new_entries(x->ctx.gemm_cache) ||
        !gemm_cache_path(x->device, path, sizeof path))
        return;
    for (char *c = path + 1; *c; c++) /* mkdir -p of the folder */
        if (*c == '/') {
            *c = 0;
            if (mkdir(path, 0755) != 0 && errno != EEXIST) return;
            *c = '/';
        }
    void *bytes;
    size_t len;
    if (tg_gemm_cache_export(x->ctx.gemm_cache, &bytes, &len)) return;
    tg_chunk chunk = {bytes, len};
    tg_err err;
    if (tg_write_file_atomic(path, &chunk, 1, "GEMM algorithm cache", &err))
        fprintf(stderr, "tunegraph: warning: %s\n", err.msg); /* a cache: the run itself succeeded */
    free(bytes);
}
