/* The cost model's calibration file: the efficiency factors, launch term and (for the CPU)
 * measured peaks that `tunegraph calibrate` fitted on one device, cached on disk like the
 * GEMM algorithm cache so that `inspect --predict` and `run --profile` use them later.
 *
 * The file is text, one `key = value` a line in this order, and nothing else:
 *
 *   tunegraph cost calibration 1
 *   device = cpu                 (the cost model's key: cpu, h100, h200, ...)
 *   name = <the hardware>        (the CUDA device name or the CPU model; printable text)
 *   precision = fp32             (what the sweep trained in)
 *   threads = 2                  (the CPU executor's threads; 0 on a GPU)
 *   peak_tflops = 0.0812
 *   peak_gbps = 14.2
 *   link_gbps = 14.2
 *   launch_us = 2.15
 *   group.matmul = EFF_FLOPS EFF_BW SAMPLES   (one line per kernel group, in tg_op_group order)
 *   ...
 *   matmul_gflop_half = 2.4      (a matmul's FLOPs at half its eff_flops; 0: no shape term)
 *   attention.own = EFF_FORWARD EFF_BACKWARD WORK_HALF CAUSAL_FACTOR SAMPLES
 *   attention.cudnn = EFF_FORWARD EFF_BACKWARD WORK_HALF CAUSAL_FACTOR SAMPLES
 *   graph_launch_us = 4.1        (an op's launch term inside a captured step)
 *   update_overlap = 0.4         (the share of the deferred update's modelled hiding seen)
 *
 * with the header "tunegraph cost calibration 2"; a file of version 1 (the header's 1)
 * ends after the groups, and reads with the shape terms off, both attention backends at
 * the attention group's factor, the step's launch term the op-by-op one and the update's
 * hiding whole.
 *
 * The reader refuses anything else, naming the file, line and field. */
#ifndef TUNEGRAPH_COST_CALIBRATION_H
#define TUNEGRAPH_COST_CALIBRATION_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "plan/cost_model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TG_COST_CALIBRATION_HEADER "tunegraph cost calibration 2"
#define TG_COST_CALIBRATION_HEADER_V1 "tunegraph cost calibration 1"
/* The largest calibration file read (a valid one is under 1 KiB). */
#define TG_COST_CALIBRATION_MAX_BYTES 65536

typedef struct tg_cost_calibration {
    char device[TG_COST_KEY_MAX];
    char name[TG_COST_NAME_MAX];
    int32_t precision; /* tg_precision */
    int32_t threads;
    double peak_tflops, peak_gbps, link_gbps, launch_us;
    double eff_flops[TG_GROUP_COUNT], eff_bw[TG_GROUP_COUNT];
    int32_t samples[TG_GROUP_COUNT]; /* ops measured per group (0: the default factors kept) */
    double matmul_gflop_half;
    tg_cost_attention attention[TG_COST_ATTENTION_BACKENDS];
    double graph_launch_us, update_overlap;
} tg_cost_calibration;

/* Parses text[0..len) (no NUL needed); `path` names the file in messages. 0, or -1 with
 * "PATH:LINE: field 'KEY': what is wrong" (*c then unspecified). */
int tg_cost_calibration_parse(const char *text, size_t len, const char *path, tg_cost_calibration *c, tg_err *err);
/* The file's text for c (malloc'd, NUL-terminated, *len its length). 0, or -1 out of memory. */
int tg_cost_calibration_format(const tg_cost_calibration *c, char **text, size_t *len, tg_err *err);
/* Reads and parses the file at path. */
int tg_cost_calibration_read(const char *path, tg_cost_calibration *c, tg_err *err);
/* Writes the file at path atomically (a reader sees the old file or the new, never a part). */
int tg_cost_calibration_write(const char *path, const tg_cost_calibration *c, tg_err *err);

/* The cached file for device key `key`: $TUNEGRAPH_CACHE_DIR/cost-KEY.txt, else
 * $XDG_CACHE_HOME/tunegraph/cost-KEY.txt, else ~/.cache/tunegraph/cost-KEY.txt (the GEMM
 * cache's folder); the CPU's name carries its thread count (cost-cpu-threads4.txt), its
 * factors depending on it. 0, or -1 when no folder is named or the path is too long. */
int tg_cost_calibration_path(const char *key, int threads, char *path, size_t len);

/* The calibration from a fitted device (`samples` per group, as tg_cost_fit gives them). */
void tg_cost_calibration_of_device(const tg_cost_device *d, int precision, const int samples[TG_GROUP_COUNT],
                                   tg_cost_calibration *c);
/* Applies c to d (a tg_cost_device_builtin of c's device): its factors and launch term, and
 * its peaks on the CPU (a GPU keeps its datasheet peaks for the plan's precision). 0, or -1
 * when c is for another device. */
int tg_cost_device_apply(tg_cost_device *d, const tg_cost_calibration *c, tg_err *err);

#ifdef __cplusplus
}
#endif
#endif
